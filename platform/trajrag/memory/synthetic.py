"""Synthetic homes and the topo-polar trajectories walked in them, for the memory's tests and
benchmarks (``trajrag bench store`` / ``build``) and a development store of synthetic homes
(``encoder.data.synthetic_store``): no simulator, no mapping, seconds for thousands.

A home is a house-like junction graph (nodes ~1.5-2.5 m apart, loops) whose nodes see walls, open
space, objects and unexplored sectors around them; a trajectory is a walk on it, its 12-sector
vectors read from the home in a random episode frame (random SE(2), a random start heading) with
label noise, so that every insert exercises the memory's whole path (prefilter, matching,
redundancy, merge or new group). ``perturb`` moves a trajectory into another frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

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
