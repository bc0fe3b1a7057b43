"""``trajrag bench build``: trajectories per second into the memory, with 1 and N grouping writers.

The corpus job's writer side alone (``distributed.corpus.GroupingWriter``, with ``writers`` > 1
its shard actors, ``memory.shards``): pre-collected trajectories (``memory.synthetic``'s
homes, the chunk text attached as collectors attach it) go to the writer in batches of
``corpus_job.writer_batch`` with ``corpus_job.max_unacked_batches`` in flight, as fast as it
acknowledges them, into a fresh store, up to each size of ``build_bench.chunks`` (trajectories
fed; a few per cent are dropped as redundant). ``build_traj_per_s_<n>w_<size>`` is the rate over
the last ``window`` trajectories before that size (it falls as the store grows), and
``build_speedup_<n>w_<size>`` that rate over the single writer's in the same run (the machine is
shared, so only ratios within one run compare). A cluster's build time for a corpus is its size
over this rate, once the collectors deliver faster than it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from trajrag.bench import blas_kernels, load_average, work_dir
from trajrag.bench.store import _size_name, _Workload
from trajrag.config import Settings
from trajrag.ray_cluster import ensure_ray


@dataclass
class BuildBenchConfig:
    """configs/build_bench.yaml."""

    chunks: list[int]
    window: int
    writers: list[int]
    chunks_per_scene: int
    quick_chunks: list[int]
    quick_window: int


def _trajectories(n: int, seed: int, per_scene: int) -> list:
    """``n`` synthetic trajectories as collectors hand them over (chunk text attached)."""
    work = _Workload(seed, per_scene)
    return [work.next() for _ in range(n)]


def _feed(writer, trajs: list, batch: int, in_flight: int) -> list[tuple[int, float]]:
    """Send ``trajs`` in plan order, ``in_flight`` batches unacknowledged at most; returns
    (trajectories acknowledged, seconds since the start) after each acknowledgement."""
    import ray

    from trajrag.distributed.corpus import EpisodeItem

    pending: deque = deque()
    acked, sent, seq = [(0, 0.0)], 0, 0
    start = time.perf_counter()
    while sent < len(trajs) or pending:
        while sent < len(trajs) and len(pending) < in_flight:
            upto = min(sent + batch, len(trajs))
            items = [(f"bench/{i:07d}", EpisodeItem(i, "oracle", trajs[i])) for i in range(sent, upto)]
            pending.append((writer.write.remote(seq, items), upto))
            sent, seq = upto, seq + 1
        ref, upto = pending.popleft()
        ray.get(ref)
        acked.append((upto, time.perf_counter() - start))
    return acked


def _rate(acked: list[tuple[int, float]], size: int, window: int) -> float:
    """Trajectories per second over the last ``window`` acknowledged before ``size``."""
    counts = np.array([c for c, _ in acked])
    times = np.array([t for _, t in acked])
    b = int(np.searchsorted(counts, size))
    a = int(np.searchsorted(counts, max(size - window, 0)))
    a = min(a, b - 1)
    return float((counts[b] - counts[a]) / max(times[b] - times[a], 1e-9))


def run(args: argparse.Namespace, settings: Settings) -> dict:
    """Feed each writer count a fresh store; returns the JSON-able rates."""
    import ray

    from trajrag.distributed.corpus import GroupingWriter

    quick = bool(getattr(args, "quick", False))
    cfg, job, memory_cfg = settings.build_bench, settings.corpus_job, settings.memory
    sizes = sorted(set(cfg.quick_chunks if quick else cfg.chunks) | ({args.chunks} if getattr(args, "chunks", None) else set()))
    window = cfg.quick_window if quick else cfg.window
    verbose = not getattr(args, "json", False)
    out: dict = {"sizes": sizes, "window": window, "writer_batch": job.writer_batch,
                 "max_unacked_batches": job.max_unacked_batches, "cpus": os.cpu_count(),
                 "blas_kernels": blas_kernels(), "load_average": load_average()}
    own_ray = ensure_ray(None, max(cfg.writers) * job.shard_num_cpus + 1, quiet=True)
    trajs = _trajectories(sizes[-1], memory_cfg.seed, cfg.chunks_per_scene)
    writer_cls = ray.remote(GroupingWriter).options(num_cpus=0)
    root = work_dir(args, "trajrag-bench-build-")
    try:
        for n in cfg.writers:
            writer = writer_cls.remote(f"{root}/memory-{n}", memory_cfg, None, n, job.shard_num_cpus)
            ray.get(writer.ping.remote())
            acked = _feed(writer, trajs, job.writer_batch, job.max_unacked_batches)
            state = ray.get(writer.state.remote())
            ray.kill(writer)
            out[f"build_seconds_{n}w"] = round(acked[-1][1], 2)
            out[f"chunks_{n}w"], out[f"groups_{n}w"] = state["chunks"], state["groups"]
            for size in sizes:
                key = f"{n}w_{_size_name(size)}"
                out[f"build_traj_per_s_{key}"] = round(_rate(acked, size, window), 2)
                base = out[f"build_traj_per_s_{cfg.writers[0]}w_{_size_name(size)}"]
                out[f"build_speedup_{key}"] = round(out[f"build_traj_per_s_{key}"] / base, 3)
            if verbose:
                print(f"[bench build] {n} writer(s): {out[f'build_seconds_{n}w']} s for {len(trajs)} "
                      f"trajectories, " + ", ".join(f"{k}={v}" for k, v in out.items()
                                                    if k.startswith("build_traj_per_s_") and f"_{n}w_" in k),
                      flush=True)
        out["load_average_end"] = load_average()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if own_ray:
            ray.shutdown()
    return out
