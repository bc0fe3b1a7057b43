"""One config system: typed dataclasses, defaults in YAML under ``configs/``, dotted overrides.

Every stage declares its config as a dataclass *without* defaults in its own module; the values
live once, in ``configs/<section>.yaml``, next to a comment naming their source. ``load`` merges
the YAML over the dataclass schema (OmegaConf validates types) and then applies command-line
overrides such as ``sim.width=160``.

A section is registered in ``SECTIONS`` by name -> "module:DataclassName"; the YAML file is
``configs/<name>.yaml``.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any, Sequence, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

T = TypeVar("T")

SECTIONS: dict[str, str] = {
    "sim": "trajrag.world.sim:SimConfig",
    "procedural": "trajrag.world.procedural:ProceduralConfig",
    "episodes": "trajrag.world.episode_gen:EpisodeConfig",
    "oracle": "trajrag.agent.oracle:OracleConfig",
    "run": "trajrag.cli.run:RunConfig",
    "corpus": "trajrag.agent.collect:CorpusConfig",
    "bench": "trajrag.bench.world:BenchConfig",
    "navigator": "trajrag.agent.navigator:NavigatorConfig",
    "gibson": "trajrag.world.gibson:GibsonConfig",
    "perception": "trajrag.perception.oracle:PerceptionConfig",
    "mapping": "trajrag.mapping.semantic_map:MappingConfig",
    "policy": "trajrag.mapping.local_policy:PolicyConfig",
    "topo": "trajrag.topo.trajectory:TopoConfig",
    "memory": "trajrag.memory.grouping:MemoryConfig",
    "encoder": "trajrag.encoder:EncoderConfig",
    "corpus_job": "trajrag.distributed.corpus:CorpusJobConfig",
    "pipeline_bench": "trajrag.bench.pipeline:PipelineBenchConfig",
    "scale_bench": "trajrag.bench.scale:ScaleBenchConfig",
    "experience_bench": "trajrag.bench.experience:ExperienceBenchConfig",
    "llm": "trajrag.planners.llm:LLMConfig",
    "retrieval": "trajrag.retrieval.retriever:RetrievalConfig",
    "scoring": "trajrag.planners.scoring:ScoringConfig",
    "eval": "trajrag.cli.eval:EvalConfig",
    "audit": "trajrag.agent.decisions:AuditConfig",
    "value": "trajrag.planners.frontier_value:ValueConfig",
    "graphrag": "trajrag.planners.graphrag:GraphRAGConfig",
    "eval_job": "trajrag.distributed.evaluate:EvalJobConfig",
    "sweep": "trajrag.distributed.sweep:SweepConfig",
}


class ConfigError(ValueError):
    """A config file or override is missing, malformed or of the wrong type."""


def config_dir() -> Path:
    """The ``configs/`` folder: ``$TRAJRAG_CONFIG_DIR`` or the one beside the source root."""
    env = os.environ.get("TRAJRAG_CONFIG_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "configs"


def _schema(section: str) -> type:
    try:
        module_name, class_name = SECTIONS[section].split(":")
    except KeyError:
        raise ConfigError(f"unknown config section {section!r}; known: {sorted(SECTIONS)}") from None
    return getattr(importlib.import_module(module_name), class_name)


def load(section: str, overrides: Sequence[str] = ()) -> Any:
    """Load one section as its typed dataclass.

    ``overrides`` are ``section.key=value`` strings (``sim.width=160``); overrides for other
    sections (or without a section) are ignored, so one list can be passed to every section.
    """
    schema = _schema(section)
    path = config_dir() / f"{section}.yaml"
    if not path.is_file():
        raise ConfigError(f"config file {path} not found (section {section!r})")
    own = [o[len(section) + 1 :] for o in overrides if o.startswith(section + ".")]
    try:
        merged = OmegaConf.merge(
            OmegaConf.structured(schema),
            OmegaConf.load(path),
            OmegaConf.from_dotlist(list(own)),
        )
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path}: {exc}") from None


def from_dict(schema: type[T], values: dict) -> T:
    """Build a config dataclass from a plain dict (validated like a YAML file)."""
    assert is_dataclass(schema)
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), values))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{schema.__name__}: {exc}") from None


def to_dict(config: Any) -> dict:
    """A config dataclass as a plain dict (for logging to W&B or JSON)."""
    return OmegaConf.to_container(OmegaConf.structured(config))
