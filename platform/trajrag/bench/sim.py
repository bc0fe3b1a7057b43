"""``trajrag bench sim``: simulator throughput (steps per second, pinned to one CPU core).

A step is one ``GridSimulator.step`` (motion + collision check + rendering) on a random walk:
mostly MOVE_FORWARD, some turns, and a turn after every collision. The scene is the first
procedural training home (``trajrag.world.procedural``); ``hand_built_flat`` is a 12 m x 12 m
flat with four rooms and a few objects for tests that need no generator.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from dataclasses import replace
from typing import Iterator, Optional, Sequence

import numpy as np
from scipy.ndimage import binary_erosion

from trajrag.config import Settings
from trajrag.world.frames import Pose2D
from trajrag.world.interface import Action
from trajrag.world.procedural import ProceduralConfig, procedural_scenes
from trajrag.world.scene import NO_CATEGORY, Scene
from trajrag.world.sim import GridSimulator, SimConfig

# Random-walk action mix (a rough ObjectNav action histogram: mostly forward).
_WALK_P = {Action.MOVE_FORWARD: 0.7, Action.TURN_LEFT: 0.15, Action.TURN_RIGHT: 0.15}
_WARMUP_STEPS = 10  # first renders fill the buffers and the allocator's caches
_FULL_STEPS = 1000
_QUICK_STEPS = 100


@contextlib.contextmanager
def one_core() -> Iterator[None]:
    """Pin this process to one CPU core for the duration (where the OS allows it).

    numpy's element-wise kernels are single-threaded already; pinning also keeps BLAS and any
    stray thread pool from using a second core, so the number is a one-core number.
    """
    if not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def bench_scene(cfg: ProceduralConfig) -> Scene:
    """The benchmark scene: procedural training home 0 (``cfg``: the ``procedural`` section)."""
    return procedural_scenes("train", 1, cfg)[0]


def hand_built_flat(cell_size: float = 0.05) -> Scene:
    """A 12 m x 12 m flat: four rooms joined by 1 m doors, 10 cm walls, eight objects."""
    n = int(round(12.0 / cell_size))
    c = lambda metres: int(round(metres / cell_size))  # noqa: E731 - metres -> cells, local shorthand
    floor = np.zeros((n, n), dtype=bool)
    floor[c(0.1):n - c(0.1), c(0.1):n - c(0.1)] = True
    mid, half_wall = n // 2, c(0.05)
    floor[mid - half_wall:mid + half_wall, :] = False  # cross-shaped inner walls
    floor[:, mid - half_wall:mid + half_wall] = False
    for door in (c(3.0), n - c(3.0)):  # two doors in each inner wall
        floor[mid - half_wall:mid + half_wall, door - c(0.5):door + c(0.5)] = True
        floor[door - c(0.5):door + c(0.5), mid - half_wall:mid + half_wall] = True
    categories = ("chair", "bed", "plant", "toilet", "tv_monitor", "sofa", "table", "wardrobe")
    boxes = [(1.0, 1.0, 1.5, 1.5), (7.0, 1.0, 9.0, 2.6), (4.8, 4.8, 5.3, 5.3), (10.5, 10.5, 11.2, 11.0),
             (1.0, 11.0, 2.2, 11.5), (7.5, 8.0, 9.5, 9.0), (2.5, 7.5, 4.0, 8.5), (10.8, 3.5, 11.5, 5.0)]
    instance_map = np.zeros((n, n), dtype=np.int32)
    for i, (x0, y0, x1, y1) in enumerate(boxes, start=1):
        instance_map[c(y0):c(y1), c(x0):c(x1)] = i
    instance_category = np.array([NO_CATEGORY] + list(range(len(boxes))), dtype=np.int16)
    free = floor & (instance_map == 0)
    traversable = binary_erosion(free, iterations=c(0.18)) if c(0.18) > 0 else free
    return Scene(name="bench/hand_built_flat", categories=categories, traversable=traversable,
                 floor=floor, instance_map=instance_map, category_map=instance_category[instance_map],
                 instance_category=instance_category, cell_size=cell_size)


def _start_pose(scene: Scene, rng: np.random.Generator) -> Pose2D:
    rows, cols = np.nonzero(scene.traversable)
    k = int(rng.integers(len(rows)))
    xy = scene.to_xy(np.array([rows[k], cols[k]]))
    return Pose2D(float(xy[0]), float(xy[1]), float(rng.uniform(-np.pi, np.pi)))


def measure_steps_per_s(width: int, height: int, n_steps: int, scene: Scene, sim_cfg: SimConfig,
                        sensors: Sequence[str] = ("depth", "semantic"), seed: int = 0, clock: str = "wall") -> float:
    """Simulator steps per second at ``width`` x ``height`` pixels on one CPU core in ``scene``,
    the simulator the ``sim`` section ``sim_cfg`` with that size and ``sensors``.
    ``clock``: "wall" (elapsed time) or "cpu" (this process's CPU time, which leaves out time
    lost to other processes on a shared machine).
    """
    if n_steps < 1:
        raise ValueError(f"n_steps must be >= 1, got {n_steps}")
    timer = {"wall": time.perf_counter, "cpu": time.process_time}.get(clock)
    if timer is None:
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    cfg = replace(sim_cfg, width=width, height=height, sensors=list(sensors))
    rng = np.random.default_rng(seed)
    actions = rng.choice(list(_WALK_P), size=n_steps + _WARMUP_STEPS, p=list(_WALK_P.values()))
    sim = GridSimulator(cfg)
    with one_core():
        obs = sim.reset(scene, _start_pose(scene, rng))
        start = 0.0
        for i, action in enumerate(actions):
            if i == _WARMUP_STEPS:
                start = timer()
            obs = sim.step(Action.TURN_LEFT if obs.collided else Action(int(action)))
        elapsed = timer() - start
    return n_steps / elapsed


def run(args: argparse.Namespace, settings: Settings, scene: Optional[Scene] = None, suffix: str = "") -> dict:
    """The ``sim`` bench: steps/s at 640x480 and 160x120 (depth + semantic), one core, on ``scene``
    (default ``bench_scene``); ``suffix`` ends every key (a second scene's figures beside the first).

    ``steps_per_s_WxH`` is wall-clock; ``cpu_steps_per_s_WxH`` counts this process's CPU time
    only (the same on an idle machine; higher when other processes share the core).
    """
    quick = bool(getattr(args, "quick", False))
    n_steps = _QUICK_STEPS if quick else _FULL_STEPS
    scene = scene if scene is not None else bench_scene(settings.procedural)
    result: dict = {} if suffix else {"sim_scene": scene.name}
    for w, h in ((640, 480), (160, 120)):
        for prefix, clock in (("", "wall"), ("cpu_", "cpu")):
            rate = measure_steps_per_s(w, h, n_steps, scene, settings.sim, clock=clock)
            result[f"{prefix}steps_per_s_{w}x{h}{suffix}"] = round(rate, 1)
    return result
