"""``trajrag bench store``: insert latency of the TrajRAG memory at 1k, 10k and 100k chunks
(``--chunks N``: and at N, e.g. 350000), and where an insert's time goes.

The workload is synthetic topo-polar trajectories that look like the real ones (5-30 junction
nodes ~1.5-2.5 m apart on a house-sized graph, 12-sector vectors with walls, open space, objects
and unexplored sectors), each drawn in a random episode frame (random SE(2), a random start
heading) with position jitter and label noise, so that every insert exercises the full path:
prefilter, matching, redundancy, merge or new group, commit. Scenes arrive with the corpus (one
scene per ``chunks_per_scene`` trajectories), as when a collector fleet covers more homes.

The store is grown with ``insert_many`` (batched commits, as the corpus job's writer inserts) to
each size (``batch_insert_cpu_ms_per_traj_*``: the process's CPU time per trajectory, which a
shared machine's load does not inflate), then ``timing_inserts`` single ``insert`` calls are
timed there, each one a full LanceDB commit (``insert_ms_*``), and as many inserts that join one
batch committed after them
(``batched_insert_ms_*``: the writer's cost per trajectory, the batch's commit spread over it in
``batched_commit_ms_per_traj_*``). ``profile_ms_per_traj_SIZE`` splits the growth to that size by
the phases of ``memory.grouping.PHASES`` (ms per trajectory; ``describe`` is part of ``prepare``,
and the rest of a trajectory's time is bookkeeping outside them). ``bytes_per_chunk`` is the
chunks table's data bytes (LanceDB ``stats``) / rows after a compaction, embedding null.

Trajectories are real ``topo.trajectory.TopoPolarTrajectory`` objects, from the synthetic homes
of ``memory/synthetic.py``.

A single insert's commit is a few small LanceDB appends, each a handful of file writes and
renames, so on a slow disk the filesystem dominates: ``fs_write_rename_ms_SIZE`` times a 4 KiB
write + rename in the store's folder just before each size's timing inserts (see
``trajrag.bench.write_rename_ms``), and ``--workdir /dev/shm`` measures the same inserts on a
tmpfs, without the disk.

numpy's matrix products use every core by default; on a shared machine that makes the
prefilter several times slower. Run with ``OPENBLAS_NUM_THREADS=1`` (as Ray workers do with
``OMP_NUM_THREADS=1``) for per-worker numbers; the output records the setting.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections import Counter

import numpy as np

from trajrag.bench import work_dir, write_rename_ms
from trajrag.config import Settings
from trajrag.memory.grouping import PHASES, TrajectoryMemory
from trajrag.memory.stats import corpus_stats
from trajrag.memory.synthetic import SyntheticScene, synthetic_scene, synthetic_trajectory
from trajrag.topo.trajectory import TopoPolarTrajectory

# Corpus sizes (chunks) at which single inserts are timed, full and --quick.
_SIZES = {"1k": 1_000, "10k": 10_000, "100k": 100_000}
_QUICK_SIZES = {"1k": 1_000, "2k": 2_000}
# Single inserts timed at each size (p95 needs ~20 above it).
_TIMING_INSERTS = 200
_QUICK_TIMING_INSERTS = 50
# A new home every this many trajectories: the paper's corpus has ~2500 per HM3D scene; 100
# keeps homes (and groups) growing with the corpus, the harder case for the prefilter.
_CHUNKS_PER_SCENE = 100


def _size_name(chunks: int) -> str:
    """350000 -> '350k' (the suffix of the JSON keys)."""
    return f"{chunks // 1000}k" if chunks % 1000 == 0 else str(chunks)


def _timed_inserts(memory, work: "_Workload", n: int, *, commit: bool) -> list[float]:
    """ms of each of ``n`` inserts (each committed, or left pending for one later commit)."""
    times = []
    for _ in range(n):
        traj = work.next()
        t0 = time.perf_counter()
        memory.insert(traj, commit=commit)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


class _Workload:
    """Trajectories for a growing corpus: scene ``s`` appears after ``s * chunks_per_scene`` draws."""

    def __init__(self, seed: int, chunks_per_scene: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.per_scene = chunks_per_scene
        self.scenes: list[SyntheticScene] = []
        self.drawn = 0

    def next(self) -> TopoPolarTrajectory:
        want = self.drawn // self.per_scene + 1
        while len(self.scenes) < want:
            self.scenes.append(synthetic_scene(self.rng, f"synthetic/{len(self.scenes):05d}"))
        scene = self.scenes[int(self.rng.integers(len(self.scenes)))]
        self.drawn += 1
        return synthetic_trajectory(scene, self.rng, f"bench/{self.drawn:07d}")


def run(args: argparse.Namespace, settings: Settings) -> dict:
    """Grow a store to each size, time single inserts there; returns the JSON-able results."""
    quick = bool(getattr(args, "quick", False))
    cfg = settings.memory
    sizes = dict(_QUICK_SIZES if quick else _SIZES)
    largest = getattr(args, "chunks", None)
    if largest:
        sizes = {name: size for name, size in sizes.items() if size < largest}
        sizes[_size_name(largest)] = largest
    timing_inserts = _QUICK_TIMING_INSERTS if quick else _TIMING_INSERTS
    verbose = not getattr(args, "json", False)
    root = work_dir(args, "trajrag-bench-store-")
    out: dict = {"chunks_per_scene": _CHUNKS_PER_SCENE, "timing_inserts": timing_inserts,
                 "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default")}
    try:
        memory = TrajectoryMemory(f"{root}/memory", cfg)
        work = _Workload(cfg.seed, _CHUNKS_PER_SCENE)
        for name, size in sizes.items():
            start, cpu, grown, before = time.perf_counter(), time.process_time(), 0, Counter(memory.seconds)
            while memory.n_chunks < size - 2 * timing_inserts:
                need = size - 2 * timing_inserts - memory.n_chunks
                batch = [work.next() for _ in range(min(need, cfg.batch_size))]
                grown += len(batch)
                memory.insert_many(batch)
            if grown:
                out[f"batch_insert_ms_per_traj_{name}"] = round(
                    (time.perf_counter() - start) * 1e3 / grown, 3)
                out[f"batch_insert_cpu_ms_per_traj_{name}"] = round(
                    (time.process_time() - cpu) * 1e3 / grown, 3)
                out[f"profile_ms_per_traj_{name}"] = {
                    phase: round((memory.seconds[phase] - before[phase]) * 1e3 / grown, 3)
                    for phase in PHASES}
            out[f"fs_write_rename_ms_{name}"] = write_rename_ms(root)
            single = _timed_inserts(memory, work, timing_inserts, commit=True)
            batched = _timed_inserts(memory, work, timing_inserts, commit=False)
            t0 = time.perf_counter()
            memory.flush()
            out[f"insert_ms_p50_{name}"] = round(float(np.percentile(single, 50)), 3)
            out[f"insert_ms_p95_{name}"] = round(float(np.percentile(single, 95)), 3)
            out[f"batched_insert_ms_p50_{name}"] = round(float(np.percentile(batched, 50)), 3)
            out[f"batched_insert_ms_p95_{name}"] = round(float(np.percentile(batched, 95)), 3)
            out[f"batched_commit_ms_per_traj_{name}"] = round(
                (time.perf_counter() - t0) * 1e3 / timing_inserts, 3)
            out[f"groups_{name}"] = memory.n_groups
            out[f"chunks_{name}"] = memory.n_chunks
            if verbose:
                print(f"[bench store] {name}: {memory.n_chunks} chunks, {memory.n_groups} groups, "
                      f"p50 {out[f'insert_ms_p50_{name}']} ms, batched "
                      f"{out[f'batched_insert_ms_p50_{name}']} ms, growth ms per trajectory by "
                      f"phase {out.get(f'profile_ms_per_traj_{name}')}", flush=True)
        memory.store.compact(cfg.keep_versions)
        stats = corpus_stats(memory.store)
        out.update({"bytes_per_chunk": round(stats["bytes_per_chunk"], 1),
                    "summary_bytes_per_chunk": round(stats["summary_bytes_per_chunk"], 1),
                    "purity": stats["purity"], "completeness": stats["completeness"],
                    "actions": stats["actions"], "chunks": stats["chunks"],
                    "groups": stats["groups"]})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out
