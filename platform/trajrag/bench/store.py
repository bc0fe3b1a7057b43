"""``trajrag bench store``: insert latency of the TrajRAG memory at 1k, 10k and 100k chunks
(``--chunks N``: and at N, e.g. 350000), and where an insert's time goes.

The workload is synthetic topo-polar trajectories that look like the real ones (5-30 junction
nodes ~1.5-2.5 m apart on a house-sized graph, 12-sector vectors with walls, open space, objects
and unexplored sectors), each drawn in a random episode frame (random SE(2), a random start
heading) with position jitter and label noise, so that every insert exercises the full path:
prefilter, matching, redundancy, merge or new group, commit. Scenes arrive with the corpus (one
scene per ``chunks_per_scene`` trajectories), as when a collector fleet covers more homes.

The store is grown with ``insert_many`` (batched commits, as the corpus job's writer inserts) to
each size, then ``timing_inserts`` single ``insert`` calls are timed there, each one a full
LanceDB commit (``insert_ms_*``; ``insert_cpu_ms_*``: the process's CPU time, which other jobs'
load does not inflate), and as many inserts that join one batch committed after them
(``batched_insert_ms_*``: the writer's cost per trajectory, the batch's commit spread over it in
``batched_commit_ms_per_traj_*``; read ahead ``memory.lookahead`` at a time as ``insert_many``
reads ahead, each insert charged its share).

Before and after in one run (issue 51): the memory decides on its fast path
(``memory.fast_path``, as configured) and on the path before (``fast_path: false``) in turn, one
insert (one growth batch) each, on the same store: both group to the bit, so the store grows as
either would grow it, and the machine's load falls on both alike. ``reference_*`` keys are the
path before; ``speedup_*`` the ratio reference / configured. Growth: ``batch_insert_ms_per_traj_*``
and ``batch_insert_cpu_ms_per_traj_*`` (wall and process CPU per trajectory), and
``profile_ms_per_traj_SIZE``, the growth's ms per trajectory by the phases of
``memory.grouping.PHASES`` (``describe``, part of ``prepare``, stays 0: see below; the rest of a
trajectory's time is bookkeeping outside them); ``profile_single_insert_ms_SIZE``, the same split of a single
committed insert. ``summary_nodes_SIZE``: the nodes the prefilter searches (an inverted file from
``memory.ivf_min_nodes``). ``bytes_per_chunk`` is the chunks table's data bytes (LanceDB
``stats``) / rows after a compaction, embedding null.

Trajectories are real ``topo.trajectory.TopoPolarTrajectory`` objects, from the synthetic homes
of ``memory/synthetic.py``, each with its chunk text attached as the corpus job's collectors
attach it (``agent.collect``: the text is the collectors' work, not the single writer's;
``chunk_text_ms_per_traj`` says what it costs them), as ``trajrag bench build`` feeds them.

A single insert's commit is a few small LanceDB appends, each a handful of file writes and
renames, so on a slow disk the filesystem dominates: ``fs_write_rename_ms_SIZE`` times a 4 KiB
write + rename in the store's folder just before each size's timing inserts (see
``trajrag.bench.write_rename_ms``), and ``--workdir /dev/shm`` measures the same inserts on a
tmpfs, without the disk.

numpy's matrix products use every core by default; on a shared machine that makes the
prefilter several times slower. The writer limits them to ``memory.blas_threads`` during a
decision; ``OPENBLAS_NUM_THREADS=1`` (as Ray workers run) does so for the whole process. The
output records both, and ``blas_kernels``: the kernels OpenBLAS picked for this CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections import Counter
from typing import Callable

import numpy as np

from trajrag.bench import blas_kernels, load_average, work_dir, write_rename_ms
from trajrag.config import Settings
from trajrag.memory.grouping import PHASES, TrajectoryMemory
from trajrag.memory.prepare import chunk_description
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


class _Paths:
    """Inserts on the configured path and on the path before, in turn, each path's phase
    seconds (``TrajectoryMemory.seconds``) and times kept apart."""

    def __init__(self, memory: TrajectoryMemory, fast: bool) -> None:
        self.memory = memory
        self.order = (fast, False)
        self.seconds = {path: Counter() for path in self.order}

    def run(self, path: bool, insert: Callable[[], object]) -> tuple[float, float]:
        """(wall ms, process CPU ms) of ``insert()`` on ``path``; its phases go to ``path``'s."""
        self.memory.set_fast_path(path)
        before = Counter(self.memory.seconds)
        wall, cpu = time.perf_counter(), time.process_time()
        insert()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        self.seconds[path].update(self.memory.seconds - before)
        return wall * 1e3, cpu * 1e3

    def timed(self, work: "_Workload", n: int, *, commit: bool,
              window: int = 1) -> dict[bool, dict[str, list[float]]]:
        """About ``n`` inserts on each path, the paths alternating every ``window`` inserts (each
        committed, or left pending for one later commit); with ``window`` > 1 each window is read
        ahead first, as ``insert_many`` reads ahead (``TrajectoryMemory.read_ahead``, nothing on
        the path before), and each insert is charged its share of that. Per path, the ms of each."""
        times = {path: {"wall": [], "cpu": []} for path in self.order}
        for k in range(2 * max(n // window, 1)):
            path = self.order[k % 2]
            trajs = [work.next() for _ in range(window)]
            ahead = self.run(path, lambda: self.memory.read_ahead(trajs)) if window > 1 else (0.0, 0.0)
            for traj in trajs:
                wall, cpu = self.run(path, lambda: self.memory.insert(traj, commit=commit))
                times[path]["wall"].append(wall + ahead[0] / window)
                times[path]["cpu"].append(cpu + ahead[1] / window)
        return times


def _percentiles(out: dict, key: str, name: str, times: dict[bool, dict[str, list[float]]],
                 order: tuple[bool, bool]) -> None:
    """``KEY_ms_p50_NAME``, ``_p95_`` (wall) and ``KEY_cpu_ms_p50_NAME`` of both paths (the
    path before's prefixed ``reference_``), and ``speedup_KEY_p50_NAME``."""
    for path, prefix in zip(order, ("", "reference_")):
        wall, cpu = times[path]["wall"], times[path]["cpu"]
        out[f"{prefix}{key}_ms_p50_{name}"] = round(float(np.percentile(wall, 50)), 3)
        out[f"{prefix}{key}_ms_p95_{name}"] = round(float(np.percentile(wall, 95)), 3)
        out[f"{prefix}{key}_cpu_ms_p50_{name}"] = round(float(np.percentile(cpu, 50)), 3)
    out[f"speedup_{key}_p50_{name}"] = round(
        out[f"reference_{key}_ms_p50_{name}"] / out[f"{key}_ms_p50_{name}"], 3)


def _per_traj(seconds: Counter, n: int) -> dict[str, float]:
    """Phase seconds over ``n`` trajectories as ms per trajectory."""
    return {phase: round(seconds[phase] * 1e3 / max(n, 1), 3) for phase in PHASES}


class _Workload:
    """Trajectories for a growing corpus: scene ``s`` appears after ``s * chunks_per_scene`` draws,
    each with its chunk text attached, as the corpus job's collectors hand them to the writer
    (``agent.collect``); ``text_seconds``: the time that text took, the collectors' work."""

    def __init__(self, seed: int, chunks_per_scene: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.per_scene = chunks_per_scene
        self.scenes: list[SyntheticScene] = []
        self.drawn = 0
        self.text_seconds = 0.0

    def next(self) -> TopoPolarTrajectory:
        want = self.drawn // self.per_scene + 1
        while len(self.scenes) < want:
            self.scenes.append(synthetic_scene(self.rng, f"synthetic/{len(self.scenes):05d}"))
        scene = self.scenes[int(self.rng.integers(len(self.scenes)))]
        self.drawn += 1
        traj = synthetic_trajectory(scene, self.rng, f"bench/{self.drawn:07d}")
        start = time.perf_counter()
        traj.description = chunk_description(traj)
        self.text_seconds += time.perf_counter() - start
        return traj


def _grow(paths: _Paths, work: "_Workload", target: int, batch_size: int) -> dict:
    """Grow the memory to ``target`` chunks in batches of ``batch_size``, each path a batch in
    turn; per path: trajectories, wall and CPU ms, phase seconds."""
    grown = {path: {"n": 0, "wall": 0.0, "cpu": 0.0} for path in paths.order}
    before = {path: Counter(paths.seconds[path]) for path in paths.order}
    k = 0
    while paths.memory.n_chunks < target:
        path = paths.order[k % 2]
        batch = [work.next() for _ in range(min(target - paths.memory.n_chunks, batch_size))]
        wall, cpu = paths.run(path, lambda: paths.memory.insert_many(batch))
        row = grown[path]
        row["n"] += len(batch)
        row["wall"] += wall
        row["cpu"] += cpu
        k += 1
    for path in paths.order:
        grown[path]["seconds"] = paths.seconds[path] - before[path]
    return grown


def _size(out: dict, name: str, paths: _Paths, work: "_Workload", size: int, timing_inserts: int,
          batch_size: int, root: str, verbose: bool) -> None:
    """Grow to ``size`` (less the timed inserts), then time single and batched inserts there."""
    memory = paths.memory
    grown = _grow(paths, work, size - 4 * timing_inserts, batch_size)
    for path, prefix in zip(paths.order, ("", "reference_")):
        row = grown[path]
        if row["n"]:
            out[f"{prefix}batch_insert_ms_per_traj_{name}"] = round(row["wall"] / row["n"], 3)
            out[f"{prefix}batch_insert_cpu_ms_per_traj_{name}"] = round(row["cpu"] / row["n"], 3)
            out[f"{prefix}profile_ms_per_traj_{name}"] = _per_traj(row["seconds"], row["n"])
    if all(grown[path]["n"] for path in paths.order):
        out[f"speedup_batch_insert_cpu_{name}"] = round(
            out[f"reference_batch_insert_cpu_ms_per_traj_{name}"]
            / out[f"batch_insert_cpu_ms_per_traj_{name}"], 3)
    out[f"fs_write_rename_ms_{name}"] = write_rename_ms(root)
    before = Counter(paths.seconds[paths.order[0]])
    single = paths.timed(work, timing_inserts, commit=True)
    out[f"profile_single_insert_ms_{name}"] = _per_traj(paths.seconds[paths.order[0]] - before,
                                                         timing_inserts)
    batched = paths.timed(work, timing_inserts, commit=False, window=memory.cfg.lookahead)
    t0 = time.perf_counter()
    memory.flush()
    out[f"batched_commit_ms_per_traj_{name}"] = round(
        (time.perf_counter() - t0) * 1e3 / (2 * timing_inserts), 3)
    _percentiles(out, "insert", name, single, paths.order)
    _percentiles(out, "batched_insert", name, batched, paths.order)
    out[f"groups_{name}"] = memory.n_groups
    out[f"chunks_{name}"] = memory.n_chunks
    out[f"summary_nodes_{name}"] = memory.index.n_nodes
    if verbose:  # every figure of this size, so that a run cut short keeps the sizes it reached
        print(f"[bench store] {name}: {memory.n_chunks} chunks, {memory.n_groups} groups, p50 "
              f"{out[f'insert_ms_p50_{name}']} ms (before {out[f'reference_insert_ms_p50_{name}']}), "
              f"batched {out[f'batched_insert_ms_p50_{name}']} ms (before "
              f"{out[f'reference_batched_insert_ms_p50_{name}']}); "
              f"{json.dumps({k: v for k, v in out.items() if k.endswith(f'_{name}')}, sort_keys=True)}",
              flush=True)


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
                 "fast_path": cfg.fast_path, "blas_threads": cfg.blas_threads,
                 "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default"),
                 "blas_kernels": blas_kernels(),
                 "load_average": load_average()}
    try:
        memory = TrajectoryMemory(f"{root}/memory", cfg)
        paths = _Paths(memory, cfg.fast_path)
        work = _Workload(cfg.seed, _CHUNKS_PER_SCENE)
        for name, size in sizes.items():
            _size(out, name, paths, work, size, timing_inserts, cfg.batch_size, root, verbose)
        memory.store.compact(cfg.keep_versions)
        stats = corpus_stats(memory.store)
        out.update({"bytes_per_chunk": round(stats["bytes_per_chunk"], 1),
                    "summary_bytes_per_chunk": round(stats["summary_bytes_per_chunk"], 1),
                    "purity": stats["purity"], "completeness": stats["completeness"],
                    "actions": stats["actions"], "chunks": stats["chunks"],
                    "groups": stats["groups"], "load_average_end": load_average(),
                    "chunk_text_ms_per_traj": round(work.text_seconds * 1e3 / max(work.drawn, 1), 3)})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out
