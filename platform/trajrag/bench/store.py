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

Trajectories are real ``topo.trajectory.TopoPolarTrajectory`` objects. The generators here
(``synthetic_scene``, ``synthetic_trajectory``, ``perturb``) are also used by the memory tests.

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
import math
import os
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from trajrag.bench import work_dir, write_rename_ms
from trajrag.config import Settings
from trajrag.memory.matching import N_SECTORS, SECTOR_ANGLE
from trajrag.topo.labels import FREE, OBSTACLE, UNKNOWN
from trajrag.topo.trajectory import TopoPolarTrajectory

# The Gibson object channels (configs/gibson.yaml), as a plausible category vocabulary.
CATEGORIES = ("chair", "sofa", "plant", "bed", "toilet", "tv_monitor", "dining-table", "oven",
              "sink", "refrigerator", "book", "clock", "vase", "cup", "bottle")
GOALS = ("chair", "sofa", "plant", "bed", "toilet", "tv_monitor")
# Angular resolution of the synthetic world around a node: rays at any heading hit a 10-degree bin.
BINS = 36
# The synthetic homes (plausible shapes, not measured ones): junction jitter off the grid (m);
# chance that an edge closing a loop is kept; wall arcs per node and their width (bins); share
# of nodes that see no object; object arcs per node and their width (bins).
_NODE_JITTER_M = 0.2
_LOOP_EDGE_P = 0.3
_WALL_ARCS, _WALL_WIDTH = (1, 3), (4, 12)
_NO_OBJECT_P = 0.33
_OBJECT_ARCS, _OBJECT_WIDTH = (1, 3), (2, 5)
# Episode frames are offset by up to this much from the scene frame (m), as episode-specific maps.
_FRAME_OFFSET_M = 20.0
# Walk attempts before settling for a shorter one; steps per wanted node.
_WALK_TRIES, _WALK_STEPS_PER_NODE = 5, 4
# Corpus sizes (chunks) at which single inserts are timed, full and --quick.
_SIZES = {"1k": 1_000, "10k": 10_000, "100k": 100_000}
_QUICK_SIZES = {"1k": 1_000, "2k": 2_000}
# Single inserts timed at each size (p95 needs ~20 above it).
_TIMING_INSERTS = 200
_QUICK_TIMING_INSERTS = 50
# A new home every this many trajectories: the paper's corpus has ~2500 per HM3D scene; 100
# keeps homes (and groups) growing with the corpus, the harder case for the prefilter.
_CHUNKS_PER_SCENE = 100


@dataclass
class SyntheticScene:
    """A house-like junction graph: node positions (m), adjacency, labels in BINS absolute bins."""

    name: str
    node_xy: np.ndarray
    neighbours: list[list[int]]
    labels: np.ndarray  # (N, BINS) int16, bin b covers angles [b, b + 1) * 360 / BINS deg
    categories: tuple[str, ...] = field(default=CATEGORIES)


def synthetic_scene(rng: np.random.Generator, name: str, *, rows: tuple[int, int] = (4, 7),
                    spacing: tuple[float, float] = (1.5, 2.5)) -> SyntheticScene:
    """A jittered grid of junctions with a random spanning tree plus some loops.

    Around each node: 1-3 wall arcs (OBSTACLE), 0-3 object arcs of random categories, free
    elsewhere; about a third of the nodes see no object (corridor-like, less distinctive).
    """
    nr, nc = rng.integers(rows[0], rows[1] + 1, size=2)
    step = rng.uniform(*spacing)
    grid = np.stack(np.meshgrid(np.arange(nc), np.arange(nr)), -1).reshape(-1, 2).astype(float)
    xy = grid * step + rng.normal(0.0, _NODE_JITTER_M, size=grid.shape)
    n = len(xy)
    cand = [(i, j) for i in range(n) for j in range(i + 1, n)
            if np.abs(grid[i] - grid[j]).sum() == 1]
    order = rng.permutation(len(cand))
    parent = list(range(n))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    neighbours: list[list[int]] = [[] for _ in range(n)]
    for k in order:
        i, j = cand[k]
        ri, rj = find(i), find(j)
        if ri != rj or rng.random() < _LOOP_EDGE_P:
            parent[ri] = rj
            neighbours[i].append(j)
            neighbours[j].append(i)
    labels = np.full((n, BINS), FREE, dtype=np.int16)
    for k in range(n):
        for _ in range(rng.integers(_WALL_ARCS[0], _WALL_ARCS[1] + 1)):
            start, width = rng.integers(0, BINS), rng.integers(_WALL_WIDTH[0], _WALL_WIDTH[1] + 1)
            labels[k, (start + np.arange(width)) % BINS] = OBSTACLE
        n_obj = 0 if rng.random() < _NO_OBJECT_P else rng.integers(_OBJECT_ARCS[0], _OBJECT_ARCS[1] + 1)
        for _ in range(n_obj):
            start = rng.integers(0, BINS)
            width = rng.integers(_OBJECT_WIDTH[0], _OBJECT_WIDTH[1] + 1)
            labels[k, (start + np.arange(width)) % BINS] = rng.integers(0, len(CATEGORIES))
    return SyntheticScene(name, xy, neighbours, labels)


def sample_sectors(scene: SyntheticScene, nodes: np.ndarray, heading: float) -> np.ndarray:
    """Sector vectors (K, 12) of scene nodes for a reference heading in the scene frame (rad)."""
    angles = heading + math.pi / 2 + np.arange(N_SECTORS) * (2 * math.pi / N_SECTORS)
    bins = np.floor((angles % (2 * math.pi)) / (2 * math.pi) * BINS).astype(int) % BINS
    return scene.labels[np.asarray(nodes)][:, bins]


def random_walk(scene: SyntheticScene, rng: np.random.Generator, length: int,
                min_length: int = 5) -> np.ndarray:
    """A loop-free node sequence of ``min_length``-``length`` nodes where the graph allows: a walk
    to unvisited neighbours; at a dead end it steps back to a visited one and is loop-pruned as
    in the paper (the revisited node keeps its last occurrence, the loop since is dropped)."""
    best: list[int] = []
    for _ in range(_WALK_TRIES):
        path = [int(rng.integers(len(scene.node_xy)))]
        for _ in range(_WALK_STEPS_PER_NODE * length):
            if len(path) >= length:
                break
            options = scene.neighbours[path[-1]]
            fresh = [j for j in options if j not in path]
            nxt = int(rng.choice(fresh if fresh else options))
            if nxt in path:
                path = path[: path.index(nxt)]
            path.append(nxt)
        if len(path) > len(best):
            best = path
        if len(best) >= min_length:
            break
    return np.asarray(best)


def synthetic_trajectory(scene: SyntheticScene, rng: np.random.Generator, trajectory_id: str, *,
                         length: tuple[int, int] = (5, 30), label_noise: float = 0.05,
                         jitter_m: float = 0.05, frame_motion: bool = True,
                         unknown_rate: float = 0.05) -> TopoPolarTrajectory:
    """One trajectory: a walk, seen from a random start heading, in a random episode frame.

    The episode frame differs from the scene frame by a random SE(2) (``frame_motion``), as the
    paper's episode-specific world coordinates; the reference heading is expressed in it, so the
    sectors depend only on the heading relative to the scene.
    """
    nodes = random_walk(scene, rng, int(rng.integers(length[0], length[1] + 1)))
    heading = float(rng.uniform(-math.pi, math.pi))
    sectors = sample_sectors(scene, nodes, heading)
    sectors = add_label_noise(sectors, rng, label_noise, unknown_rate)
    xy = scene.node_xy[nodes] + rng.normal(0.0, jitter_m, size=(len(nodes), 2))
    phi, t = 0.0, np.zeros(2)
    if frame_motion:
        phi = float(rng.uniform(-math.pi, math.pi))
        t = rng.uniform(-_FRAME_OFFSET_M, _FRAME_OFFSET_M, size=2)
    R = np.array([[math.cos(phi), -math.sin(phi)], [math.sin(phi), math.cos(phi)]])
    return TopoPolarTrajectory(
        node_xy=xy @ R.T + t, sectors=sectors.astype(np.int16), categories=scene.categories,
        goal=str(rng.choice(GOALS)),
        reference_yaw=float((heading + phi + math.pi) % (2 * math.pi) - math.pi),
        success=bool(rng.random() < 0.6), episode_id=trajectory_id, scene_id=scene.name)


def add_label_noise(sectors: np.ndarray, rng: np.random.Generator, flip: float,
                    unknown: float) -> np.ndarray:
    """Replace a share ``flip`` of labels by random ones and ``unknown`` by UNKNOWN."""
    out = np.array(sectors, dtype=np.int16)
    r = rng.random(out.shape)
    choices = np.array([FREE, OBSTACLE, *range(len(CATEGORIES))], dtype=np.int16)
    flip_mask = r < flip
    out[flip_mask] = rng.choice(choices, size=int(flip_mask.sum()))
    out[(r >= flip) & (r < flip + unknown)] = UNKNOWN
    return out


def perturb(traj: TopoPolarTrajectory, rng: np.random.Generator, *, theta: float | None = None,
            shift_sectors: bool = True, label_noise: float = 0.0,
            episode_id: str | None = None) -> tuple[TopoPolarTrajectory, np.ndarray, np.ndarray]:
    """A copy moved by a random SE(2) (rotation ``theta`` if given), optionally noisy labels.

    With ``shift_sectors`` the reference heading is kept and the sector vectors are rolled by
    ``round(theta / 30 deg)`` (what a turned world looks like from the same reference);
    otherwise the reference heading turns with the frame and the sectors stay. Returns the copy
    and the (R, t) that maps the copy's frame back onto the original's.
    """
    theta = float(rng.uniform(-math.pi, math.pi)) if theta is None else theta
    t = rng.uniform(-_FRAME_OFFSET_M, _FRAME_OFFSET_M, size=2)
    R = np.array([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
    sectors = np.asarray(traj.sectors)
    ref = traj.reference_yaw
    if shift_sectors:
        sectors = np.roll(sectors, int(round(theta / SECTOR_ANGLE)), axis=1)
    else:
        ref = float((ref + theta + math.pi) % (2 * math.pi) - math.pi)
    if label_noise > 0:
        sectors = add_label_noise(sectors, rng, label_noise, 0.0)
    moved = replace(traj, node_xy=np.asarray(traj.node_xy) @ R.T + t, sectors=sectors,
                    reference_yaw=ref, episode_id=episode_id or traj.episode_id + "+moved")
    return moved, R.T, -R.T @ t


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
    from trajrag.memory.grouping import PHASES, TrajectoryMemory
    from trajrag.memory.stats import corpus_stats

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
