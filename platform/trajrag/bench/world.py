"""``trajrag bench sim``: the World issue's figures in one JSON object.

Simulator steps/s at 640x480 and 160x120 on one core (``bench/sim.py``), on a procedural home and
on the largest MP3D home, plus the oracle's SR and SPL on generated episodes of procedural val
homes, of the Gibson train maps and of the MP3D scans (``agent/oracle.py``). The scene sets come
from ``configs/bench.yaml``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from trajrag import config
from trajrag.agent.oracle import oracle_benchmark
from trajrag.bench import sim
from trajrag.config import Settings
from trajrag.world.datasets import load_scenes


@dataclass
class BenchConfig:
    """``configs/bench.yaml``: scene specs and episode counts of the benchmarks."""

    gibson_scenes: str
    mp3d_scenes: str
    oracle_procedural_scenes: str
    oracle_episodes_per_scene: int
    oracle_gibson_episodes_per_scene: int
    oracle_mp3d_episodes_per_scene: int
    quick_episodes_per_scene: int
    seed: int


def gibson_scenes_path(cfg: BenchConfig) -> str:
    """The Gibson spec, a path relative to the repository root unless absolute."""
    return _from_repo(cfg.gibson_scenes)


def _from_repo(spec: str) -> str:
    path = Path(spec)
    return str(path if path.is_absolute() else config.config_dir().parent / path)


def run(args: argparse.Namespace, settings: Settings) -> dict:
    cfg = settings.bench
    result = sim.run(args, settings)
    per_scene = cfg.quick_episodes_per_scene if args.quick else cfg.oracle_episodes_per_scene
    procedural = oracle_benchmark(cfg.oracle_procedural_scenes, per_scene, cfg.seed, settings)
    per_scene = cfg.quick_episodes_per_scene if args.quick else cfg.oracle_gibson_episodes_per_scene
    gibson = oracle_benchmark(gibson_scenes_path(cfg), per_scene, cfg.seed, settings)
    mp3d_spec = _from_repo(cfg.mp3d_scenes)
    largest = max(load_scenes(mp3d_spec, settings), key=lambda scene: int(scene.traversable.sum()))
    result.update(sim.run(args, settings, scene=largest, suffix="_largest_mp3d"), largest_mp3d_scene=largest.name,
                  largest_mp3d_traversable_m2=round(float(largest.traversable.sum()) * largest.cell_size ** 2, 1))
    per_scene = cfg.quick_episodes_per_scene if args.quick else cfg.oracle_mp3d_episodes_per_scene
    mp3d = oracle_benchmark(mp3d_spec, per_scene, cfg.seed, settings)
    result.update(
        oracle_sr=procedural["sr"], oracle_spl=procedural["spl"], oracle_episodes=procedural["episodes"],
        oracle_sr_gibson=gibson["sr"], oracle_spl_gibson=gibson["spl"], oracle_episodes_gibson=gibson["episodes"],
        oracle_sr_mp3d=mp3d["sr"], oracle_spl_mp3d=mp3d["spl"], oracle_episodes_mp3d=mp3d["episodes"],
    )
    return result
