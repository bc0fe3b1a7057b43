"""Geodesic distances on a scene grid: shortest paths that stay on traversable cells.

The field is a multi-source Dijkstra (``scipy.sparse.csgraph``, compiled) over the traversable
cells, with edges to every neighbour ``(dr, dc)`` with ``max(|dr|, |dc|) <= r`` and
``gcd(dr, dc) = 1`` (r = 1: 8 neighbours, r = 2: 16, r = 3: 32). An edge exists only when its
two end cells *and every cell the segment between their centres touches* are traversable, so a
path never cuts a wall corner or slips through a diagonal gap. Longer edges make grid paths
closer to straight lines: on an open square the field overestimates the Euclidean distance by at
most 8.2 % (r = 1), 2.75 % (r = 2) or 1.3 % (r = 3); means 5.3 %, 1.3 %, 0.45 %
(``tests/test_episodes.py`` measures this). Habitat's navmesh geodesic is exact, and SPL divides
by this length, so the error inflates SPL by about the mean error; ``configs/episodes.yaml``
picks the neighbourhood.

Goal regions follow habitat-lab's ObjectNav: the success positions ("view points") are the
traversable cells within the success distance (1.0 m, TrajRAG paper) of any cell of an object of
the goal category, and the distance to goal is the geodesic distance to that region (0 inside).
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

import numpy as np
from scipy import ndimage
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra
from skimage.graph import MCP_Geometric

from trajrag.world.scene import Scene


# -- neighbourhood --------------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def neighbour_offsets(radius: int) -> tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]:
    """Half of the symmetric neighbourhood of ``radius`` cells: ``(dr, dc, touched)`` per edge.

    ``touched`` lists the cells (relative to the start cell) other than the two ends whose closed
    square the segment between the cell centres meets; corner contacts count, so a diagonal move
    needs both cells beside it. The other half of the neighbourhood is the negated offsets.
    """
    if radius < 1:
        raise ValueError(f"geodesic neighbourhood radius must be >= 1 cell, got {radius}")
    out = []
    for dr in range(0, radius + 1):
        for dc in range(-radius, radius + 1):
            if (dr == 0 and dc <= 0) or math.gcd(dr, dc) != 1:
                continue
            out.append((dr, dc, _touched_cells(dr, dc)))
    return tuple(out)


def _touched_cells(dr: int, dc: int) -> tuple[tuple[int, int], ...]:
    """Cells whose closed unit square (centred on integer points) meets the segment 0 -> (dr, dc)."""
    cells = set()
    n = max(abs(dr), abs(dc))
    # Exact test per candidate cell: the segment meets the square |r - i| <= 1/2, |c - j| <= 1/2
    # iff the parameter intervals for both coordinates overlap within [0, 1].
    for i in range(min(0, dr) - 1, max(0, dr) + 2):
        for j in range(min(0, dc) - 1, max(0, dc) + 2):
            lo, hi = 0.0, 1.0
            for target, delta in ((i, dr), (j, dc)):
                if delta == 0:
                    if abs(target) > 0.5:
                        lo, hi = 1.0, 0.0
                    continue
                a, b = (target - 0.5) / delta, (target + 0.5) / delta
                lo, hi = max(lo, min(a, b)), min(hi, max(a, b))
            if lo <= hi + 1e-12 * n:
                cells.add((i, j))
    cells.discard((0, 0))
    cells.discard((dr, dc))
    return tuple(sorted(cells))


def neighbourhood_size(radius: int) -> int:
    """Number of neighbours of a cell for a neighbourhood ``radius`` (8, 16, 32, ...)."""
    return 2 * len(neighbour_offsets(radius))


# -- fields ---------------------------------------------------------------------------------------
def geodesic_field(traversable: np.ndarray, sources: np.ndarray, cell_size: float, radius: int) -> np.ndarray:
    """Metres of the shortest path on ``traversable`` cells to the nearest ``sources`` cell.

    traversable, sources: bool (H, W); sources off the traversable cells are ignored.
    cell_size: metres per cell. radius: neighbourhood radius in cells (module doc;
    ``episodes.geodesic_neighbourhood_radius``). Returns float64 (H, W): 0 on sources, ``inf``
    where no source is reachable (and on every non-traversable cell).
    """
    traversable = np.asarray(traversable, dtype=bool)
    sources = np.asarray(sources, dtype=bool)
    if traversable.ndim != 2 or sources.shape != traversable.shape:
        raise ValueError(f"traversable {traversable.shape} and sources {sources.shape} must be equal 2D shapes")
    if not cell_size > 0:
        raise ValueError(f"cell_size must be > 0 metres, got {cell_size}")
    out = np.full(traversable.shape, np.inf)
    seeds = sources & traversable
    if not seeds.any():
        return out
    index, graph = _cached_graph(traversable, cell_size, radius)
    dist = dijkstra(graph, directed=False, indices=index[seeds], min_only=True)
    out[traversable] = dist
    return out


# The move graph depends only on the traversable grid: every category of a scene shares it.
_GRAPHS: OrderedDict = OrderedDict()
_GRAPH_CACHE_SIZE = 2  # one scene at a time, plus one being switched to


def _cached_graph(traversable: np.ndarray, cell_size: float, radius: int) -> tuple[np.ndarray, csr_matrix]:
    """(cell -> node index (H, W), graph) for a traversable grid, from a tiny LRU."""
    digest = hashlib.blake2b(np.packbits(traversable).tobytes(), digest_size=16)
    digest.update(repr((traversable.shape, float(cell_size), int(radius))).encode())
    key = digest.hexdigest()
    if key in _GRAPHS:
        _GRAPHS.move_to_end(key)
        return _GRAPHS[key]
    index = np.full(traversable.shape, -1, dtype=np.int64)
    n = int(traversable.sum())
    index[traversable] = np.arange(n)
    entry = (index, _grid_graph(traversable, index, n, cell_size, radius))
    _GRAPHS[key] = entry
    while len(_GRAPHS) > _GRAPH_CACHE_SIZE:
        _GRAPHS.popitem(last=False)
    return entry


def _grid_graph(traversable: np.ndarray, index: np.ndarray, n: int, cell_size: float,
                radius: int) -> csr_matrix:
    """Sparse undirected graph of the valid moves between traversable cells (weights in metres)."""
    h, w = traversable.shape
    pad = radius
    padded = np.zeros((h + 2 * pad, w + 2 * pad), dtype=bool)
    padded[pad:pad + h, pad:pad + w] = traversable

    def shifted(dr: int, dc: int) -> np.ndarray:
        return padded[pad + dr:pad + dr + h, pad + dc:pad + dc + w]

    rows, cols, weights = [], [], []
    for dr, dc, touched in neighbour_offsets(radius):
        ok = traversable & shifted(dr, dc)
        for tr, tc in touched:
            ok &= shifted(tr, tc)
        r, c = np.nonzero(ok)
        rows.append(index[r, c])
        cols.append(index[r + dr, c + dc])
        weights.append(np.full(r.size, math.hypot(dr, dc) * cell_size))
    return csr_matrix((np.concatenate(weights), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(n, n))


def path_to_goal(field: np.ndarray, start_cell: tuple[int, int] | np.ndarray,
                 radius: int, max_length_m: float = math.inf) -> list[tuple[int, int]]:
    """Cells ``(row, col)`` of a shortest path from ``start_cell`` down ``field`` to a 0 cell.

    Each step goes to the neighbour (same neighbourhood as the field) with the steepest descent
    per cell of move length; on a Dijkstra field that neighbour is a shortest-path predecessor,
    so the path length equals ``field[start]``. Moves whose touched cells are not all finite are
    skipped (the field is ``inf`` off the traversable cells). ``max_length_m`` stops early once
    the field has dropped by that much (metres; for short lookaheads). Returns ``[]`` if the
    start is unreachable (``inf``).
    """
    h, w = field.shape
    cell = (int(start_cell[0]), int(start_cell[1]))
    if not (0 <= cell[0] < h and 0 <= cell[1] < w) or not np.isfinite(field[cell]):
        return []
    moves = _signed_moves(radius)
    path = [cell]
    start_value = field[cell]
    for _ in range(h * w):
        value = field[cell]
        if value <= 0.0 or start_value - value >= max_length_m:
            break
        nxt = _steepest_neighbour(field, cell, moves)
        if nxt is None:
            break
        cell = nxt
        path.append(cell)
    return path


@functools.lru_cache(maxsize=8)
def _signed_moves(radius: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """All moves of the neighbourhood (both signs): offsets (K, 2), lengths (K,), touched cells."""
    offsets, touched = [], []
    for dr, dc, cells in neighbour_offsets(radius):
        for sign in (1, -1):
            offsets.append((sign * dr, sign * dc))
            touched.append(np.array([(sign * a, sign * b) for a, b in cells], dtype=np.int64).reshape(-1, 2))
    offsets_arr = np.array(offsets, dtype=np.int64)
    return offsets_arr, np.hypot(offsets_arr[:, 0], offsets_arr[:, 1]), touched


def _steepest_neighbour(field: np.ndarray, cell: tuple[int, int],
                        moves: tuple[np.ndarray, np.ndarray, list[np.ndarray]]) -> Optional[tuple[int, int]]:
    offsets, lengths, touched = moves
    h, w = field.shape
    targets = np.asarray(cell) + offsets
    inside = (targets[:, 0] >= 0) & (targets[:, 0] < h) & (targets[:, 1] >= 0) & (targets[:, 1] < w)
    values = np.full(len(offsets), np.inf)
    values[inside] = field[targets[inside, 0], targets[inside, 1]]
    rate = (field[cell] - values) / lengths
    for k in np.argsort(-rate):
        if not rate[k] > 0:
            return None
        cells = np.asarray(cell) + touched[k]
        if cells.size and not _all_finite(field, cells):
            continue
        return int(targets[k, 0]), int(targets[k, 1])
    return None


def _all_finite(field: np.ndarray, cells: np.ndarray) -> bool:
    h, w = field.shape
    if (cells[:, 0] < 0).any() or (cells[:, 0] >= h).any() or (cells[:, 1] < 0).any() or (cells[:, 1] >= w).any():
        return False
    return bool(np.isfinite(field[cells[:, 0], cells[:, 1]]).all())


# -- goal regions and the per-(scene, category) cache ---------------------------------------------
# How a goal region decides that a cell "sees" the object (``configs/episodes.yaml goal_region``).
GOAL_REGION_RULES = ("seen_path", "line_of_sight")


def goal_region(scene: Scene, category: str, success_distance: float, rule: str = "seen_path") -> np.ndarray:
    """bool (H, W): traversable cells within ``success_distance`` metres (Euclidean) of a cell of
    an object of ``category`` that they see, by ``rule`` (``GOAL_REGION_RULES``):

    * ``seen_path``: the path to the object through the scene's floor (cells with no wall) is no
      longer than the straight line to its nearest cell (up to the 8-neighbour grid's 8 % and one
      cell), so the region does not leak through a wall into the next room;
    * ``line_of_sight``: the straight line to some object cell within reach crosses no wall, as
      the renderer draws them (a cell with no floor and no object). Closer to habitat's ObjectNav
      view points (places the object is seen from) where ``seen_path`` measures against the wrong
      cell: an object cell behind a wall is the nearest, another one in sight is not.

    ``KeyError`` naming the scene if it has no such category; all-False if it has none of those
    objects; ``ValueError`` for an unknown rule."""
    if rule not in GOAL_REGION_RULES:
        raise ValueError(f"goal region rule must be one of {GOAL_REGION_RULES}, got {rule!r}")
    objects = scene.category_map == scene.category_id(category)
    if not objects.any():
        return np.zeros(scene.shape, dtype=bool)
    if rule == "line_of_sight":
        return _line_of_sight_region(scene, objects, success_distance)
    return _seen_path_region(scene, objects, success_distance)


def _seen_path_region(scene: Scene, objects: np.ndarray, success_distance: float) -> np.ndarray:
    euclid = ndimage.distance_transform_edt(~objects) * scene.cell_size
    near = euclid <= success_distance
    rows, cols = np.nonzero(near)
    r0, r1, c0, c1 = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
    open_cells = scene.not_wall & ~closed_corners(~scene.not_wall)
    costs = np.where((open_cells | objects)[r0:r1, c0:c1], 1.0, np.inf)
    through_floor, _ = MCP_Geometric(costs, fully_connected=True).find_costs(
        np.argwhere(objects[r0:r1, c0:c1]).tolist())
    window = euclid[r0:r1, c0:c1]
    seen = through_floor * scene.cell_size <= window * _GRID_DETOUR + scene.cell_size
    region = np.zeros(scene.shape, dtype=bool)
    region[r0:r1, c0:c1] = seen & near[r0:r1, c0:c1]
    return region & scene.traversable


def _line_of_sight_region(scene: Scene, objects: np.ndarray, success_distance: float) -> np.ndarray:
    """Cells within reach of an object cell with a clear straight line to it. Rays start on the
    object's outline only: a ray to an inner cell crosses an outline cell first, nearer."""
    wall = ~scene.not_wall
    wall |= closed_corners(wall)
    outline = np.argwhere(objects & ~ndimage.binary_erosion(objects))
    reach = int(math.floor(success_distance / scene.cell_size * (1.0 + _FLOAT_SLACK)))  # 1 m / 0.05 m: 20, not 19
    pad = reach + 1
    wall = np.pad(wall, pad, constant_values=True)
    seen = np.zeros(wall.shape, dtype=bool)
    for offset, samples in _ray_samples(reach):
        cells = outline[:, None, :] + samples[None, :, :] + pad
        clear = ~wall[cells[..., 0], cells[..., 1]].any(axis=1)
        ends = outline[clear] + offset + pad
        seen[ends[:, 0], ends[:, 1]] = True
    return seen[pad:-pad, pad:-pad] & scene.traversable


def closed_corners(wall: np.ndarray) -> np.ndarray:
    """bool (H, W): the open cells of every 2x2 block whose other diagonal is two wall cells.

    Walls drawn as 8-connected staircases touch only at corners; a path or a sight line between
    such a pair would pass through the wall's corner. Treating the two open cells beside it as
    wall closes that pass (the diagonal corridor it would open is no cell wide)."""
    a, b, c, d = wall[:-1, :-1], wall[:-1, 1:], wall[1:, :-1], wall[1:, 1:]
    anti = b & c & ~a & ~d  # walls on the anti-diagonal: close a and d
    main = a & d & ~b & ~c  # walls on the main diagonal: close b and c
    closed = np.zeros_like(wall)
    closed[:-1, :-1] |= anti
    closed[1:, 1:] |= anti
    closed[:-1, 1:] |= main
    closed[1:, :-1] |= main
    return closed


@functools.lru_cache(maxsize=4)
def _ray_samples(reach: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Per offset within ``reach`` cells: the offset and the cells its ray passes, sampled every
    half cell from the first step after the object cell to the end cell."""
    out = []
    for dr in range(-reach, reach + 1):
        for dc in range(-reach, reach + 1):
            if (dr, dc) == (0, 0) or math.hypot(dr, dc) > reach:
                continue
            offset = np.array([dr, dc])
            t = np.linspace(0.0, 1.0, 2 * max(abs(dr), abs(dc)) + 1)[1:, None]
            out.append((offset, np.rint(t * offset).astype(np.int64)))
    return tuple(out)


# 8-neighbour grid paths are up to 8.2 % longer than the straight line (at 22.5 degrees): a
# path through the floor within this factor of the Euclidean distance is "in sight".
_GRID_DETOUR = 1.09


@dataclass(frozen=True)
class GoalField:
    """The geodesic distance (metres) to the goal region of one (scene, category).

    distance: float (H, W), 0 inside the region, ``inf`` where it cannot be reached.
    region: bool (H, W), the goal region (success positions).
    """

    scene_name: str
    category: str
    distance: np.ndarray
    region: np.ndarray
    cell_size: float
    radius: int

    def cell_distance(self, cell: np.ndarray | tuple[int, int]) -> float:
        """Field value at a ``(row, col)`` cell; ``inf`` off the grid."""
        r, c = int(cell[0]), int(cell[1])
        h, w = self.distance.shape
        if not (0 <= r < h and 0 <= c < w):
            return math.inf
        return float(self.distance[r, c])

    @property
    def reachable(self) -> bool:
        return bool(self.region.any())


class _LRU:
    """A tiny least-recently-used cache (fields are large; keep only a few)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: OrderedDict = OrderedDict()

    def get(self, key):
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key]
        return None

    def put(self, key, value) -> None:
        self.items[key] = value
        self.items.move_to_end(key)
        while len(self.items) > self.size:
            self.items.popitem(last=False)


_CACHE: Optional[_LRU] = None


def _cache(size: int) -> _LRU:
    global _CACHE
    if _CACHE is None or _CACHE.size != size:
        _CACHE = _LRU(size)
    return _CACHE


def clear_cache() -> None:
    """Forget every cached goal field and move graph (for tests and memory-bound callers)."""
    global _CACHE
    _CACHE = None
    _GRAPHS.clear()


def scene_fingerprint(scene: Scene) -> str:
    """A short digest of the arrays a goal field depends on (two scenes may share a name)."""
    digest = hashlib.blake2b(digest_size=12)
    digest.update(repr((scene.shape, scene.cell_size)).encode())
    digest.update(np.packbits(scene.traversable).tobytes())
    digest.update(np.packbits(scene.floor).tobytes())  # goal regions look across the floor
    digest.update(np.packbits(scene.low_obstacle).tobytes())  # ... and over low obstacles
    digest.update(np.ascontiguousarray(scene.category_map).tobytes())
    digest.update(np.ascontiguousarray(scene.instance_map).tobytes())
    return digest.hexdigest()


def goal_field(scene: Scene, category: str, success_distance: float, radius: int,
               cache_size: int, rule: str = "seen_path") -> GoalField:
    """The ``GoalField`` of (scene, category), from an LRU of ``cache_size`` fields (``rule``: how
    the goal region decides what sees the object, ``goal_region``).

    Keyed by scene name, a digest of its grids, the category and the parameters, so every episode
    of one scene and category shares one Dijkstra run.
    """
    key = (scene.name, scene_fingerprint(scene), category, float(success_distance), int(radius), rule)
    cache = _cache(cache_size)
    hit = cache.get(key)
    if hit is not None:
        return hit
    region = goal_region(scene, category, success_distance, rule)
    distance = geodesic_field(scene.traversable, region, scene.cell_size, radius)
    for array in (distance, region):
        array.setflags(write=False)  # shared by every caller of the cache
    field = GoalField(scene.name, category, distance, region, scene.cell_size, int(radius))
    cache.put(key, field)
    return field


# -- shortest action paths (the discrete agent's shortest walk) ---------------------------------
# habitat-lab's counterpart is get_action_shortest_path (habitat/datasets/utils.py) with its
# ShortestPathFollower; its episode generator drops episodes the follower cannot finish.

@dataclass(frozen=True)
class Motion:
    """The simulator's motion model, as ``world/sim.py`` applies it: MOVE_FORWARD of
    ``forward_step`` metres if the segment is free (no sliding: a walk free without it is free with
    ``sim.allow_sliding`` too), turns of ``turn`` radians, collision samples at most
    ``collision_step_cells`` cells apart."""

    forward_step: float
    turn: float
    collision_step_cells: float

    def __post_init__(self) -> None:
        # The planner treats headings as a cycle of n turns; that needs turn * n == 360 degrees.
        if self.forward_step <= 0 or not 0 < self.turn <= math.pi or \
                abs(self.n_headings * self.turn - 2.0 * math.pi) > 1e-6 * 2.0 * math.pi:
            raise ValueError(f"motion model: need forward_step > 0 and a turn angle dividing 360 degrees, "
                             f"got forward_step={self.forward_step} m, turn={math.degrees(self.turn):.4g} deg")

    @classmethod
    def from_sim_config(cls, sim_cfg) -> "Motion":
        """From a ``SimConfig`` (``configs/sim.yaml``)."""
        return cls(float(sim_cfg.forward_step), math.radians(sim_cfg.turn_angle_deg),
                   float(sim_cfg.collision_step_cells))

    @property
    def n_headings(self) -> int:
        """Distinct headings reachable by turning (12 for 30 degrees)."""
        return max(1, int(round(2.0 * math.pi / self.turn)))


# Relative slack for float noise in "segment length / sample spacing" (not a tuning knob): the
# default 0.25 m step over 0.025 m spacing is an exact integer, so the simulator's ceil() lands on
# either side of it depending on the last bit of the segment length.
_FLOAT_SLACK = 1e-9


def segments_free(scene: Scene, start: np.ndarray, ends: np.ndarray, spacing_cells: float) -> np.ndarray:
    """bool (K,): whether each segment ``start -> ends[k]`` (map frame, m; equal lengths) stays
    on traversable cells under the simulator's rule (``GridSimulator.segment_is_free``:
    ``ceil(length / spacing) + 1`` evenly spaced samples, both ends included). Where float noise
    could make the simulator draw one sample more or fewer, both sample sets are checked."""
    start = np.asarray(start, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64).reshape(-1, 2)
    if not len(ends):
        return np.zeros(0, dtype=bool)
    ratio = float(np.max(np.linalg.norm(ends - start, axis=1))) / (spacing_cells * scene.cell_size)
    counts = {int(math.ceil(ratio * (1.0 - _FLOAT_SLACK))) + 1, int(math.ceil(ratio * (1.0 + _FLOAT_SLACK))) + 1}
    t = np.concatenate([np.linspace(0.0, 1.0, n) for n in sorted(counts)])[None, :, None]
    points = start[None, None, :] + t * (ends[:, None, :] - start[None, None, :])
    cells = scene.to_cell(points)
    h, w = scene.shape
    inside = (cells[..., 0] >= 0) & (cells[..., 0] < h) & (cells[..., 1] >= 0) & (cells[..., 1] < w)
    free = np.zeros(cells.shape[:2], dtype=bool)
    free[inside] = scene.traversable[cells[..., 0][inside], cells[..., 1][inside]]
    return free.all(axis=1)


def _step_checker(scene: Scene, steps: np.ndarray, spacing_cells: float):
    """For the fixed step vectors ``steps`` (K, 2): a function of a start position (m) giving
    ``segments_free`` of every step and the ``scene.to_cell`` of every step's end, with the
    sample offsets computed once (the planner calls it for every expanded position, so it keeps
    to a few whole-array operations; the arithmetic is ``segments_free``'s and ``to_cell``'s)."""
    ratio = float(np.max(np.linalg.norm(steps, axis=1))) / (spacing_cells * scene.cell_size)
    counts = {int(math.ceil(ratio * (1.0 - _FLOAT_SLACK))) + 1, int(math.ceil(ratio * (1.0 + _FLOAT_SLACK))) + 1}
    t = np.concatenate([np.linspace(0.0, 1.0, n) for n in sorted(counts)])
    offsets = t[None, :, None] * steps[:, None, :]  # (K, samples, 2) metres
    origin = np.asarray(scene.origin, dtype=np.float64)
    shape = np.array(scene.shape[::-1])  # (cols, rows): the order of (x, y)
    # Off-grid samples read a blocked cell: pad the grid by one cell all round and clip into it.
    padded = np.pad(scene.traversable, 1, constant_values=False)

    def free_and_ends(start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cells = np.floor(((start - origin) + offsets) / scene.cell_size).astype(np.int64)  # (K, S, [col, row])
        cells = np.minimum(np.maximum(cells, -1, out=cells), shape, out=cells) + 1  # np.clip costs 3x more here
        free = padded[cells[..., 1], cells[..., 0]].all(axis=1)
        ends = np.floor(((start + steps) - origin) / scene.cell_size).astype(np.int64)[:, ::-1]  # (row, col)
        return free, ends

    return free_and_ends


@dataclass
class ActionPath:
    """A walk of forward steps: per step the heading index (turn steps counter-clockwise from
    the start yaw) and the position (m) after it; ``complete`` if it ends in the goal region."""

    headings: list[int]
    positions: list[np.ndarray]
    complete: bool
    expansions: int

    @property
    def length(self) -> float:
        """Number of forward steps (multiply by the step length for metres)."""
        return len(self.headings)


def shortest_action_path(scene: Scene, goal: GoalField, start_xy: np.ndarray, start_yaw: float,
                         motion: Motion, heuristic_weight: float, turn_cost_m: float,
                         max_expansions: int) -> Optional[ActionPath]:
    """The shortest walk of forward steps from a pose into ``goal.region``.

    A* over positions reached by ``motion.forward_step`` steps along the reachable headings
    (``start_yaw`` + k * turn), each step checked with ``segments_free``; heuristic = the geodesic
    field times ``heuristic_weight``; cost = metres walked + ``turn_cost_m`` per turn (a
    tie-break); goal test = the position's cell is in the goal region. Positions are merged per
    grid cell (first best arrival kept). After ``max_expansions`` the walk to the expanded
    position nearest the goal is returned with ``complete=False``. ``None`` if the start cannot
    reach the goal region at all (unreachable field, or no complete walk and no progress).
    """
    n = motion.n_headings
    yaws = start_yaw + motion.turn * np.arange(n)
    steps = motion.forward_step * np.stack([np.cos(yaws), np.sin(yaws)], axis=1)
    field = goal.distance
    start_cell = tuple(int(v) for v in scene.to_cell(start_xy))
    if not (scene.in_bounds(np.array(start_cell)) and np.isfinite(field[start_cell])):
        return None
    free_and_ends = _step_checker(scene, steps, motion.collision_step_cells)
    pos = {start_cell: np.asarray(start_xy, dtype=np.float64)}
    heading = {start_cell: 0}
    parent: dict = {start_cell: None}
    g = {start_cell: 0.0}
    closed: set = set()
    counter = 0
    heap = [(heuristic_weight * field[start_cell], counter, start_cell)]
    best_cell, best_h = start_cell, field[start_cell]
    expansions = 0
    goal_cell = None
    while heap and expansions < max_expansions:
        _, _, cell = heapq.heappop(heap)
        if cell in closed:
            continue
        closed.add(cell)
        if goal.region[cell]:
            goal_cell = cell
            break
        expansions += 1
        if field[cell] < best_h:
            best_cell, best_h = cell, field[cell]
        here = pos[cell]
        free, cells = free_and_ends(here)
        k0 = heading[cell]
        for k in free.nonzero()[0].tolist():
            nxt = tuple(cells[k].tolist())
            if nxt in closed:
                continue
            turns = abs((k - k0 + n // 2) % n - n // 2)
            cost = g[cell] + motion.forward_step + turn_cost_m * turns
            if cost < g.get(nxt, math.inf):
                g[nxt], pos[nxt], heading[nxt], parent[nxt] = cost, here + steps[k], k, cell
                counter += 1
                heapq.heappush(heap, (cost + heuristic_weight * field[nxt], counter, nxt))
    end = goal_cell if goal_cell is not None else best_cell
    if goal_cell is None and (not heap or end == start_cell):
        return None  # searched everything reachable (or made no progress): the goal is out of reach
    headings, positions = [], []
    while parent[end] is not None:
        headings.append(heading[end])
        positions.append(pos[end])
        end = parent[end]
    return ActionPath(headings[::-1], positions[::-1], goal_cell is not None, expansions)
