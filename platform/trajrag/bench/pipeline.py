"""``trajrag bench pipeline``: throughput of the platform jobs on Ray.

Now: ``corpus_traj_per_s_1`` and ``corpus_traj_per_s_2``, the corpus build
(``distributed.corpus.build_corpus_ray``) with 1 and 2 collector actors on the same small corpus
(``configs/pipeline_bench.yaml``), each into a fresh store in a temporary folder. The rate is
trajectories stored per second of the job's pipeline: actor start, collection, conversion and
inserts, without starting Ray and generating the episodes (paid once per job, not per
trajectory). ``eval_episodes_per_h_1/_2`` and ``serve_ms_p50/_p99`` (issue 7) come with the
evaluation and Serve jobs.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass

from trajrag import config


@dataclass
class PipelineBenchConfig:
    """``configs/pipeline_bench.yaml``: the corpus measured and its --quick variant."""

    corpus_scenes: str
    corpus_episodes_per_scene: int
    corpus_policy: str
    corpus_workers: list[int]
    quick_scenes: str
    quick_episodes_per_scene: int
    quick_policy: str
    quick_overrides: list[str]


def corpus_throughput(scenes: str, per_scene: int, policy: str, workers: list[int],
                      overrides: list[str], progress: bool = False) -> dict:
    """``corpus_traj_per_s_<n>`` for each collector count ``n`` (fresh stores), plus details."""
    from trajrag.distributed.corpus import build_corpus_ray

    result: dict = {}
    for n in workers:
        with tempfile.TemporaryDirectory(prefix="trajrag-bench-pipeline-") as tmp:
            summary = build_corpus_ray(scenes, per_scene, policy, os.path.join(tmp, "memory"),
                                       overrides, workers=n, progress=progress)
        pipeline_s = summary["seconds"]["pipeline"]
        result[f"corpus_traj_per_s_{n}"] = summary["collected"] / pipeline_s if pipeline_s > 0 else 0.0
        result[f"corpus_seconds_{n}"] = summary["seconds"]
        collected, cpu = max(summary["collected"], 1), summary["cpu_seconds"]
        # Per-core costs (CPU seconds of the actor processes): the basis of a capacity plan.
        result[f"corpus_collect_cpu_s_per_traj_{n}"] = cpu["collect_and_convert"] / collected
        result[f"corpus_insert_cpu_s_per_traj_{n}"] = cpu["insert"] / collected
    result["corpus_trajectories"] = summary["collected"]
    return result


def run(args: argparse.Namespace) -> dict:
    """One JSON object: ``corpus_traj_per_s_1``, ``corpus_traj_per_s_2`` and details."""
    from trajrag.distributed.corpus import ensure_ray

    cfg: PipelineBenchConfig = config.load("pipeline_bench", args.overrides)
    if args.quick:
        scenes, per_scene, policy = cfg.quick_scenes, cfg.quick_episodes_per_scene, cfg.quick_policy
        overrides = list(cfg.quick_overrides) + list(args.overrides)
    else:
        scenes, per_scene, policy = cfg.corpus_scenes, cfg.corpus_episodes_per_scene, cfg.corpus_policy
        overrides = list(args.overrides)
    # One Ray for all runs, with a logical CPU for each collector of the largest run.
    own_ray = ensure_ray(None, max(os.cpu_count() or 1, *cfg.corpus_workers))
    try:
        result = corpus_throughput(scenes, per_scene, policy, list(cfg.corpus_workers), overrides,
                                   progress=not args.json)
    finally:
        if own_ray:
            import ray

            ray.shutdown()
    result.update(corpus_scenes=scenes, corpus_episodes_per_scene=per_scene, corpus_policy=policy,
                  cpus=os.cpu_count())
    return result
