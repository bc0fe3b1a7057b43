"""One config system: typed dataclasses, defaults in YAML under ``configs/``, dotted overrides.

Every stage declares its config as a dataclass *without* defaults in its own module; the values
live once, in ``configs/<section>.yaml``, next to a comment naming their source. ``load`` merges
the YAML over the dataclass schema (OmegaConf validates types) and then applies command-line
overrides such as ``sim.width=160``.

A *preset* (``configs/presets/<name>.yaml``, ``--preset NAME`` on the command line) is a named
set of overrides across sections for one purpose, e.g. memories grouped by home; it expands to
the same dotted overrides, before any ``--set``, so a ``--set`` still wins.

A section is registered in ``SECTIONS`` by name -> "module:DataclassName"; the YAML file is
``configs/<name>.yaml``.

``load`` ignores the overrides of other sections, so the command line checks every override once
(``check_overrides``): a typo would otherwise be dropped without a word, and recorded as if applied.

An entry point (a command of ``trajrag.cli``, a ``jobs/`` script) makes one ``Settings`` of its
checked overrides (``settings``) and hands it down: stages read their typed sections from it
(``settings.sim``, ``settings.episodes``, ...) and never load a section themselves, so every
value a run uses honours its ``--set``. Ray actors, Serve replicas and Tune trials receive it
pickled from their driver.
"""

from __future__ import annotations

import difflib
import importlib
import json
import os
from dataclasses import is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

if TYPE_CHECKING:  # the section schemas live with their stages (some beside ray or torch)
    from trajrag.agent.collect import CorpusConfig
    from trajrag.agent.decisions import AuditConfig
    from trajrag.agent.navigator import NavigatorConfig
    from trajrag.agent.oracle import OracleConfig
    from trajrag.bench.build import BuildBenchConfig
    from trajrag.bench.experience import ExperienceBenchConfig
    from trajrag.bench.pipeline import PipelineBenchConfig
    from trajrag.bench.scale import ScaleBenchConfig
    from trajrag.bench.world import BenchConfig
    from trajrag.cli.eval import EvalConfig
    from trajrag.cli.run import RunConfig
    from trajrag.distributed.corpus import CorpusJobConfig
    from trajrag.distributed.evaluate import EvalJobConfig
    from trajrag.distributed.sweep import SweepConfig
    from trajrag.encoder import EncoderConfig
    from trajrag.mapping.local_policy import PolicyConfig
    from trajrag.mapping.semantic_map import MappingConfig
    from trajrag.memory.grouping import MemoryConfig
    from trajrag.perception.config import PerceptionConfig
    from trajrag.planners.embodied_rag import EmbodiedRAGConfig
    from trajrag.planners.frontier_value import ValueConfig
    from trajrag.planners.graphrag import GraphRAGConfig
    from trajrag.planners.llm import LLMConfig
    from trajrag.planners.navprobe import NavProbeConfig
    from trajrag.planners.scoring import ScoringConfig
    from trajrag.queries import QueryConfig
    from trajrag.retrieval.retriever import RetrievalConfig
    from trajrag.revisit import RevisitConfig
    from trajrag.topo.trajectory import TopoConfig
    from trajrag.world.episode_gen import EpisodeConfig
    from trajrag.world.gibson import GibsonConfig
    from trajrag.world.mp3d import Mp3dConfig
    from trajrag.world.procedural import ProceduralConfig
    from trajrag.world.sim import SimConfig

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
    "mp3d": "trajrag.world.mp3d:Mp3dConfig",
    "perception": "trajrag.perception.config:PerceptionConfig",
    "mapping": "trajrag.mapping.semantic_map:MappingConfig",
    "policy": "trajrag.mapping.local_policy:PolicyConfig",
    "topo": "trajrag.topo.trajectory:TopoConfig",
    "memory": "trajrag.memory.grouping:MemoryConfig",
    "encoder": "trajrag.encoder:EncoderConfig",
    "corpus_job": "trajrag.distributed.corpus:CorpusJobConfig",
    "pipeline_bench": "trajrag.bench.pipeline:PipelineBenchConfig",
    "build_bench": "trajrag.bench.build:BuildBenchConfig",
    "scale_bench": "trajrag.bench.scale:ScaleBenchConfig",
    "experience_bench": "trajrag.bench.experience:ExperienceBenchConfig",
    "llm": "trajrag.planners.llm:LLMConfig",
    "retrieval": "trajrag.retrieval.retriever:RetrievalConfig",
    "scoring": "trajrag.planners.scoring:ScoringConfig",
    "eval": "trajrag.cli.eval:EvalConfig",
    "audit": "trajrag.agent.decisions:AuditConfig",
    "value": "trajrag.planners.frontier_value:ValueConfig",
    "graphrag": "trajrag.planners.graphrag:GraphRAGConfig",
    "embodied_rag": "trajrag.planners.embodied_rag:EmbodiedRAGConfig",
    "navprobe": "trajrag.planners.navprobe:NavProbeConfig",
    "eval_job": "trajrag.distributed.evaluate:EvalJobConfig",
    "sweep": "trajrag.distributed.sweep:SweepConfig",
    "revisit": "trajrag.revisit:RevisitConfig",
    "queries": "trajrag.queries:QueryConfig",
}


class ConfigError(ValueError):
    """A config file or override is missing, malformed or of the wrong type."""


class Settings:
    """The whole configuration of one run of an entry point: each section of ``SECTIONS`` as its
    typed dataclass, an attribute of the same name (``settings.sim``, ``settings.episodes``, ...),
    read from ``configs/<section>.yaml`` with ``overrides`` on first use and then kept, so a
    command pays only for the sections it uses (some schemas live beside ray or torch).

    ``overrides``: the ``section.key=value`` text the entry point was given, checked
    (``check_overrides``), presets expanded; kept as the run's record (``run.json``). Read values
    from the sections, not from it. Sections are shared by everything handed this object: derive
    other settings (``with_overrides``, ``with_values``) or ``dataclasses.replace`` a section,
    never change one in place. Picklable: Ray actors, Serve replicas and Tune trials receive it
    from their driver, with the sections already read."""

    sim: SimConfig
    procedural: ProceduralConfig
    episodes: EpisodeConfig
    oracle: OracleConfig
    run: RunConfig
    corpus: CorpusConfig
    bench: BenchConfig
    navigator: NavigatorConfig
    gibson: GibsonConfig
    mp3d: Mp3dConfig
    perception: PerceptionConfig
    mapping: MappingConfig
    policy: PolicyConfig
    topo: TopoConfig
    memory: MemoryConfig
    encoder: EncoderConfig
    corpus_job: CorpusJobConfig
    pipeline_bench: PipelineBenchConfig
    build_bench: BuildBenchConfig
    scale_bench: ScaleBenchConfig
    experience_bench: ExperienceBenchConfig
    llm: LLMConfig
    retrieval: RetrievalConfig
    scoring: ScoringConfig
    eval: EvalConfig
    audit: AuditConfig
    value: ValueConfig
    graphrag: GraphRAGConfig
    embodied_rag: EmbodiedRAGConfig
    navprobe: NavProbeConfig
    eval_job: EvalJobConfig
    sweep: SweepConfig
    revisit: RevisitConfig
    queries: QueryConfig

    def __init__(self, overrides: Sequence[str] = ()) -> None:
        self.overrides: tuple[str, ...] = tuple(overrides)

    def __getattr__(self, name: str) -> Any:
        # Only called for an attribute not set yet: a section read for the first time.
        if name.startswith("_") or name not in SECTIONS:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r} (sections: {sorted(SECTIONS)})")
        section = load(name, self.__dict__.get("overrides", ()))
        self.__dict__[name] = section
        return section

    def with_overrides(self, more: Sequence[str], beneath: bool = False) -> "Settings":
        """These settings with the ``section.key=value`` overrides ``more`` (override lists that
        are config values themselves: ``run.overrides``, ``eval.variants``, ...) after their own
        (a later one wins), or before them with ``beneath`` (the entry point's own overrides still
        win). Sections are read again from the files."""
        return Settings([*more, *self.overrides] if beneath else [*self.overrides, *more])

    def with_values(self, values: Mapping[str, Any], beneath: bool = False) -> "Settings":
        """``with_overrides`` of dotted keys and their values (``{"retrieval.store": path}``),
        recorded in ``overrides`` as ``key=value`` (a path or string as it is, other values as
        JSON), as a ``--set`` of them would be."""
        return self.with_overrides([f"{key}={_override_text(value)}" for key, value in values.items()], beneath)

    def __repr__(self) -> str:
        return f"Settings(overrides={list(self.overrides)!r})"


def _override_text(value: Any) -> str:
    return str(value) if isinstance(value, (str, Path)) else json.dumps(value)


def settings(overrides: Sequence[str] = ()) -> Settings:
    """The ``Settings`` of an entry point from its checked overrides (``check_overrides``, presets
    expanded), made once there and handed down; nothing below ``cli/`` and ``jobs/`` calls this
    or ``load`` (``tests/test_settings_handed_down.py``)."""
    return Settings(overrides)


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
    own = [o[len(section) + 1 :] for o in overrides if o.startswith(section + ".")]
    merged = _merged(section, own)
    try:
        return OmegaConf.to_object(merged)
    except (OmegaConfBaseException, ValueError) as exc:  # ValueError: a schema's own check (__post_init__)
        raise ConfigError(f"{config_dir() / f'{section}.yaml'}: {_one_line(exc, section)}") from None


def _merged(section: str, own: Sequence[str] = ()) -> DictConfig:
    """``configs/<section>.yaml`` over its schema, with ``own`` dotted overrides (``key=value``,
    the section's name stripped) on top; unconverted, so free-form mappings stay ``dict``."""
    schema = _schema(section)
    path = config_dir() / f"{section}.yaml"
    if not path.is_file():
        raise ConfigError(f"config file {path} not found (section {section!r})")
    try:
        return OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.load(path), OmegaConf.from_dotlist(list(own)))
    except (OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(f"{path}: {_one_line(exc, section)}") from None


def _one_line(exc: Exception, section: str) -> str:
    """An OmegaConf error as one line: its first line and the dotted key it is about (OmegaConf
    adds the key and the object type on lines of their own)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    key = getattr(exc, "full_key", None)
    return f"{text} (key {section}.{key})" if key else text


def check_overrides(overrides: Sequence[str]) -> None:
    """Check command-line overrides before anything runs: each is ``SECTION.KEY=VALUE`` with a
    ``configs/SECTION.yaml``, a dotted ``KEY`` that file has, and a ``VALUE`` of the key's type.
    ``ConfigError`` names the first bad override and the closest keys.

    Under a free-form mapping (a ``dict`` field, e.g. ``eval.variants`` or ``sim.object_heights``)
    any name is a key: ``--set eval.variants.mine=[...]`` adds an entry.
    """
    by_section: dict[str, list[str]] = {}
    for override in overrides:
        key, equals, _ = override.partition("=")
        section, dot, rest = key.partition(".")
        if not equals or not dot or not section or not rest:
            raise ConfigError(f"override {override!r}: expected SECTION.KEY=VALUE, e.g. sim.width=160")
        if section not in SECTIONS or not (config_dir() / f"{section}.yaml").is_file():
            close = difflib.get_close_matches(section, sorted(SECTIONS), n=3)
            hint = f"; did you mean {' or '.join(f'{c}.{rest}' for c in close)}?" if close else ""
            raise ConfigError(f"override {override!r}: no config section {section!r} "
                              f"(no {config_dir() / (section + '.yaml')}){hint}")
        by_section.setdefault(section, []).append(override)
    for section, own in by_section.items():
        tree = _merged(section)
        for override in own:
            _check_key(tree, section, override)
        try:
            load(section, own)  # the values: types and the schema's own checks
        except ConfigError as exc:
            raise ConfigError(f"override {_culprit(section, own)}: {exc}") from None


def _culprit(section: str, own: list[str]) -> str:
    """The override of ``own`` that fails on its own (a schema check may need two together)."""
    for override in own:
        try:
            load(section, [override])
        except ConfigError:
            return repr(override)
    return " + ".join(map(repr, own))


def _check_key(tree: DictConfig, section: str, override: str) -> None:
    """``ConfigError`` unless the override's dotted key is in ``tree`` (or under a free-form mapping)."""
    key = override.partition("=")[0]
    node: Any = tree
    for part in key.split(".")[1:]:
        if isinstance(node, DictConfig) and OmegaConf.get_type(node) is dict:
            return  # a free-form mapping (names -> values): any name is a key
        if isinstance(node, DictConfig) and part in node.keys():
            node = _child(node, part)
        elif isinstance(node, ListConfig) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            close = difflib.get_close_matches(key, [f"{section}.{k}" for k in _dotted_keys(tree)], n=3)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise ConfigError(f"override {override!r}: {config_dir() / (section + '.yaml')} has no key "
                              f"{key!r}{hint}")


def _child(node: DictConfig, name: Any) -> Any:
    """``node[name]``; None for a value that cannot be read yet (missing, an interpolation)."""
    try:
        return node[name]
    except OmegaConfBaseException:
        return None


def _dotted_keys(node: DictConfig, prefix: str = "") -> list[str]:
    """Every key of ``node``, nested ones dotted (mappings and their leaves)."""
    keys = []
    for name in node.keys():
        child = _child(node, name)
        keys.append(f"{prefix}{name}")
        if isinstance(child, DictConfig):
            keys += _dotted_keys(child, f"{prefix}{name}.")
    return keys


def presets_dir() -> Path:
    """``configs/presets/``: named sets of overrides (module doc)."""
    return config_dir() / "presets"


def preset_overrides(names: Sequence[str]) -> list[str]:
    """The ``section.key=value`` overrides of the presets ``names``, in order, each checked
    against its section's schema (an unknown section or key is an error, not ignored)."""
    overrides: list[str] = []
    for name in names:
        path = presets_dir() / f"{name}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in presets_dir().glob("*.yaml"))
            raise ConfigError(f"unknown preset {name!r} (no {path}); known: {known}")
        try:
            tree = OmegaConf.to_container(OmegaConf.load(path))
        except OmegaConfBaseException as exc:
            raise ConfigError(f"{path}: {exc}") from None
        if not isinstance(tree, dict) or not all(isinstance(v, dict) for v in tree.values()):
            raise ConfigError(f"{path}: expected a mapping of section -> {{key: value}}")
        own = [f"{key}={value}" for key, value in dotted(tree)]
        try:
            check_overrides(own)
        except ConfigError as exc:
            raise ConfigError(f"preset {name!r} ({path}): {exc}") from None
        overrides += own
    return overrides


def dotted(tree: dict, prefix: str = "") -> list[tuple[str, str]]:
    """Leaves of a nested mapping as (dotted key, value in override syntax)."""
    leaves: list[tuple[str, str]] = []
    for key, value in tree.items():
        if isinstance(value, dict):
            leaves += dotted(value, f"{prefix}{key}.")
        else:
            leaves.append((f"{prefix}{key}", json.dumps(value) if not isinstance(value, str) else value))
    return leaves


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
