"""``trajrag bench sim``: the World issue's figures in one JSON object.

Simulator steps/s at 640x480 and 160x120 on one core (``bench/sim.py``) plus the oracle's SR and
SPL on generated episodes of procedural val homes and of the Gibson train maps
(``agent/oracle.py``). The scene sets come from ``configs/bench.yaml``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from trajrag import config


@dataclass
class BenchConfig:
    """``configs/bench.yaml``: scene specs and episode counts of the benchmarks."""

    gibson_scenes: str
    oracle_procedural_scenes: str
    oracle_episodes_per_scene: int
    oracle_gibson_episodes_per_scene: int
    quick_episodes_per_scene: int
    seed: int


def gibson_scenes_path(cfg: BenchConfig) -> str:
    """The Gibson spec, a path relative to the repository root unless absolute."""
    path = Path(cfg.gibson_scenes)
    return str(path if path.is_absolute() else config.config_dir().parent / path)


def run(args: argparse.Namespace) -> dict:
    from trajrag.agent.oracle import oracle_benchmark
    from trajrag.bench import sim

    cfg: BenchConfig = config.load("bench", args.overrides)
    result = sim.run(args)
    per_scene = cfg.quick_episodes_per_scene if args.quick else cfg.oracle_episodes_per_scene
    procedural = oracle_benchmark(cfg.oracle_procedural_scenes, per_scene, cfg.seed, args.overrides)
    per_scene = cfg.quick_episodes_per_scene if args.quick else cfg.oracle_gibson_episodes_per_scene
    gibson = oracle_benchmark(gibson_scenes_path(cfg), per_scene, cfg.seed, args.overrides)
    result.update(
        oracle_sr=procedural["sr"], oracle_spl=procedural["spl"], oracle_episodes=procedural["episodes"],
        oracle_sr_gibson=gibson["sr"], oracle_spl_gibson=gibson["spl"], oracle_episodes_gibson=gibson["episodes"],
    )
    return result
