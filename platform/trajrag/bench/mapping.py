"""``trajrag bench mapping``: per-step cost of the navigation map stack (one CPU core).

A frontier-exploration agent (nearest reachable frontier as the waypoint, the A* local policy)
drives the grid simulator through the benchmark home (``trajrag.bench.sim.bench_scene``) with the
oracle segmenter at the configured camera size (640x480 by default). Timed per step: oracle
segmentation, ``SemanticMapper.update``, ``find_frontiers`` and ``LocalPolicy.act`` (which
includes the A* replans). Separately, ``astar`` is timed corner to corner across a fully explored
20 m x 20 m map of 5 m rooms joined by 1 m doors (a large home's worth of explored map).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from trajrag.bench.sim import bench_scene, one_core
from trajrag.config import Settings
from trajrag.mapping.astar import astar
from trajrag.mapping.frontiers import find_frontiers
from trajrag.mapping.local_policy import LocalPolicy, PolicyConfig
from trajrag.mapping.semantic_map import SemanticMap, SemanticMapper, dilate_disk
from trajrag.perception.oracle import OracleSegmenter
from trajrag.world.frames import Pose2D
from trajrag.world.interface import Action
from trajrag.world.sim import GridSimulator

_FULL_STEPS = 500
_QUICK_STEPS = 60
_ASTAR_REPEATS = 10
_SAME_WAYPOINT_M = 0.5  # a frontier whose representative moved less than this is the same target
_VOCABULARY = ("chair", "sofa", "plant", "bed", "toilet", "tv_monitor")  # habitat-lab HM3D goals


def run(args: argparse.Namespace, settings: Settings) -> dict:
    """Run the benchmark; returns milliseconds per call (mean, p50, p95) for each stage."""
    steps = _QUICK_STEPS if getattr(args, "quick", False) else _FULL_STEPS
    with one_core():
        timings, info = _explore(steps, settings)
        timings["astar_20m"] = _astar_20m(settings.policy)
    result = {name: ms_summary(values) for name, values in timings.items()}
    result.update(info)
    return result


def ms_summary(seconds: list[float]) -> dict:
    """Mean, p50 and p95 milliseconds of wall times in seconds, and their count."""
    ms = 1000.0 * np.asarray(seconds)
    return {
        "mean_ms": round(float(ms.mean()), 3),
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p95_ms": round(float(np.percentile(ms, 95)), 3),
        "calls": int(ms.size),
    }


def _explore(steps: int, settings: Settings) -> tuple[dict[str, list[float]], dict]:
    """Frontier exploration for ``steps`` steps; per-stage wall times in seconds."""
    sim = GridSimulator(settings.sim)
    scene = bench_scene(settings.procedural)
    mapping_cfg = settings.mapping
    segmenter = OracleSegmenter(_VOCABULARY, scene.categories, settings.perception, seed=0)
    mapper = SemanticMapper(mapping_cfg, sim.intrinsics, _VOCABULARY)
    turn = math.radians(sim.cfg.turn_angle_deg)
    policy = LocalPolicy(settings.policy, sim.cfg.forward_step, turn)
    cells = np.argwhere(scene.traversable)
    start = Pose2D(*scene.to_xy(cells[len(cells) // 2]), 0.0)
    obs = sim.reset(scene, start)
    mapper.reset(start)
    times: dict[str, list[float]] = {"segment": [], "map_update": [], "frontiers": [], "policy": []}
    waypoint = None
    done: list[np.ndarray] = []  # waypoints reached or given up: not chosen again
    for _ in range(steps):
        t0 = time.perf_counter()
        masks = segmenter.segment(obs)
        t1 = time.perf_counter()
        mapper.update(obs.depth, masks, obs.pose)
        t2 = time.perf_counter()
        frontiers = find_frontiers(mapper.map, mapping_cfg, agent_xy=obs.pose.xy)
        t3 = time.perf_counter()
        times["segment"].append(t1 - t0)
        times["map_update"].append(t2 - t1)
        times["frontiers"].append(t3 - t2)
        targets = [f.centroid_xy for f in frontiers if not _near_any(f.centroid_xy, done)]
        action = Action.TURN_LEFT  # no frontier / waypoint done: look around
        if targets:
            if waypoint is None or not _near_any(waypoint, targets):
                waypoint = min(targets, key=lambda xy: float(np.linalg.norm(xy - obs.pose.xy)))
            t4 = time.perf_counter()
            decision = policy.act(mapper.map, obs.pose, waypoint)
            times["policy"].append(time.perf_counter() - t4)
            if decision.action is None:
                done.append(waypoint)
                waypoint = None
            else:
                action = decision.action
        obs = sim.step(action)
    sem = mapper.map
    info = {
        "scene": scene.name,
        "image": f"{sim.intrinsics.width}x{sim.intrinsics.height}",
        "pixel_stride": mapping_cfg.pixel_stride,
        "steps": steps,
        "explored_m2": round(float(sem.explored.sum()) * sem.cell_size**2, 2),
    }
    return times, info


def _near_any(xy: np.ndarray, others: list[np.ndarray]) -> bool:
    """Whether ``xy`` is within ``_SAME_WAYPOINT_M`` of any of ``others`` (metres)."""
    return any(float(np.linalg.norm(xy - o)) < _SAME_WAYPOINT_M for o in others)


def rooms_map(size_m: float, room_m: float, door_m: float, cell: float) -> SemanticMap:
    """A fully explored square of ``room_m`` rooms, 10 cm walls, one ``door_m`` door per wall."""
    n = int(round(size_m / cell))
    sem = SemanticMap.empty((n, n), ("chair",), cell, (0.0, 0.0))
    sem.explored[:] = True
    step, wall, door = int(round(room_m / cell)), 2, int(round(door_m / cell))
    for k in range(0, n + 1, step):
        k = min(k, n - wall)
        sem.obstacle[k : k + wall, :] = True
        sem.obstacle[:, k : k + wall] = True
    for k in range(step, n - 1, step):
        for m in range(0, n - step + 1, step):
            mid = m + step // 2
            sem.obstacle[k : k + wall, mid - door // 2 : mid + door // 2] = False
            sem.obstacle[mid - door // 2 : mid + door // 2, k : k + wall] = False
    return sem


def _astar_20m(cfg: PolicyConfig) -> list[float]:
    """A* corner to corner on ``rooms_map(20 m)`` with the policy's inflation (``cfg``: the
    ``policy`` section; seconds per call)."""
    sem = rooms_map(20.0, 5.0, 1.0, 0.05)
    blocked = dilate_disk(sem.obstacle, cfg.inflation_radius_m / sem.cell_size)
    n = sem.shape[0]
    start, goal = (20, 20), (n - 21, n - 21)
    times = []
    for _ in range(_ASTAR_REPEATS):
        t0 = time.perf_counter()
        path = astar(blocked, start, goal)
        times.append(time.perf_counter() - t0)
        if path is None:
            raise RuntimeError("bench mapping: no path across the 20 m rooms map (bench bug)")
    return times
