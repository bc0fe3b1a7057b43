"""Procedural multi-room homes for ObjectNav, deterministic by seed.

A home is two rows of rooms on either side of a corridor, the layout of most single-storey flats
and bungalows: the *public* row (living room at the entrance end of the corridor, then dining room
and kitchen, or living | kitchen | dining) and the *private* row (bedrooms, bathrooms, office,
laundry, each opening onto the corridor; the master bedroom may own an en-suite bathroom and a
walk-in closet that open onto it only). Rows of different length leave an L-shaped footprint;
the whole plan is then turned by one of the 8 symmetries of the square, so corridors run either
way. Doors and wide openings are drawn along shared walls from the connection table in
``priors.py``; every room is reachable. Objects follow the room-type priors of ``priors.py`` (why
that matters is written there); an object that would block a door, cut a room in two or hide a
goal object from the agent is re-placed or dropped.

Grids follow ``scene.Scene``: 5 cm cells, ``floor`` = no wall, ``traversable`` = where the
agent's centre may stand, i.e. free floor (no wall, no object) whose distance to every blocked
cell centre is at least ``agent_radius + cell_size / 2``, restricted to the one connected
(4-neighbour) component that holds every door. Room boundaries are integer cell lines on which
walls are centred; every number comes from ``configs/procedural.yaml`` or the priors tables.

Only ``numpy.random.default_rng`` draws are used, in a fixed order, so the same seed gives
byte-identical arrays. A layout that fails a check is redrawn from ``default_rng([seed, k])``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import ndimage

from trajrag.world import priors
from trajrag.world.scene import NO_CATEGORY, NO_INSTANCE, Scene

_SIDES = ("S", "N", "W", "E")  # wall of a room: low row, high row, low col, high col
_OPPOSITE = {"S": "N", "N": "S", "W": "E", "E": "W"}


@dataclass
class ProceduralConfig:
    """Procedural home generator settings (values and sources in ``configs/procedural.yaml``).

    Lengths in metres unless noted; ``[min, max]`` pairs are uniform ranges.
    """

    cell_size: float
    agent_radius: float
    reach_distance: float
    floor_height: float
    wall_thickness: float
    margin: float
    home_side: list[float]
    l_shape_min_step: float
    door_width: list[float]
    opening_width: list[float]
    door_jamb: float
    door_near_corner_p: float
    door_keepout: float
    placement_attempts: int
    max_pocket_area: float
    max_retries: int
    split_offsets: dict[str, int]


class GenerationError(RuntimeError):
    """No valid home could be generated for a seed (after all retries)."""


class _Retry(Exception):
    """This draw failed a check; try again with a derived seed."""


# -- layout data --------------------------------------------------------------------------------
@dataclass
class _Room:
    """A rectangular room between wall centre lines ``r0 < r1`` (rows) and ``c0 < c1`` (cols)."""

    type: str
    name: str
    r0: int
    r1: int
    c0: int
    c1: int
    parent: int | None = None  # en-suite / closet: index of the bedroom it opens onto

    def interior(self, tw: int) -> tuple[int, int, int, int]:
        """Floor cells ``(r0, r1, c0, c1)`` (half-open) between this room's walls, ``tw`` cells thick."""
        lo, hi = tw - tw // 2, tw // 2
        return self.r0 + lo, self.r1 - hi, self.c0 + lo, self.c1 - hi


@dataclass
class _Door:
    """An opening in the wall between rooms ``a`` and ``b``.

    axis "h": the wall is the row line ``line`` and the opening spans cols ``[s0, s1)``;
    axis "v": the wall is the col line ``line`` and the opening spans rows ``[s0, s1)``.
    """

    a: int
    b: int
    kind: str  # "door" or "opening"
    axis: str
    line: int
    s0: int
    s1: int

    def wall_cells(self, tw: int) -> tuple[slice, slice]:
        """The cells of the opening (through the whole wall thickness)."""
        across = slice(self.line - tw // 2, self.line - tw // 2 + tw)
        along = slice(self.s0, self.s1)
        return (across, along) if self.axis == "h" else (along, across)

    def portal(self) -> tuple[int, int]:
        """A cell in the middle of the opening, inside the wall."""
        mid = (self.s0 + self.s1) // 2
        return (self.line, mid) if self.axis == "h" else (mid, self.line)


@dataclass
class _Slot:
    """A room to lay out in a row: type, width along the row (m), en-suite strip width (m)."""

    room: str
    width: float
    ensuite: float = 0.0


@dataclass
class _Placed:
    """An object on the grid. ``side``/``u``/``v``: the wall it backs onto, its offset along that
    wall and off it (cells), None for free-standing objects."""

    item: str
    category: str
    room: int
    rect: tuple[int, int, int, int]
    side: str | None
    u: int = 0
    v: int = 0
    along: int = 0
    depth: int = 0


@dataclass
class _Grid:
    """Mutable generation state of one home."""

    cfg: ProceduralConfig
    rooms: list[_Room]
    doors: list[_Door]
    shape: tuple[int, int]
    floor: np.ndarray = field(init=False)
    clear: np.ndarray = field(init=False)  # cells from each cell centre to the nearest blocked centre
    reserved: np.ndarray = field(init=False)
    instance_map: np.ndarray = field(init=False)
    category_map: np.ndarray = field(init=False)
    placed: list[_Placed] = field(default_factory=list)


# -- unit helpers -------------------------------------------------------------------------------
def _cells(metres: float, cfg: ProceduralConfig) -> int:
    """Metres -> whole cells (rounded)."""
    return int(round(metres / cfg.cell_size))


def _draw(rng: np.random.Generator, lo_hi) -> float:
    """One uniform draw from a ``(min, max)`` pair."""
    return float(rng.uniform(lo_hi[0], lo_hi[1]))


def _wall_cells(cfg: ProceduralConfig) -> int:
    return max(1, _cells(cfg.wall_thickness, cfg))


def _clearance_cells(cfg: ProceduralConfig) -> float:
    """Least centre-to-centre distance (cells) from a traversable cell to a blocked cell: the
    agent radius plus half a cell, so the agent's disc never overlaps a blocked cell."""
    return cfg.agent_radius / cfg.cell_size + 0.5


# -- room programme and layout --------------------------------------------------------------------
def _sample_program(rng: np.random.Generator) -> tuple[list[_Slot], list[_Slot]]:
    """The rooms of one home as (public row, private row), before fitting to the size limits."""
    prog = priors.PROGRAM
    counts = [c for c, _ in prog.bedrooms]
    probs = np.array([p for _, p in prog.bedrooms], dtype=np.float64)
    n_bed = int(counts[rng.choice(len(counts), p=probs / probs.sum())])
    width = lambda room: _draw(rng, priors.room_size(room).width)  # noqa: E731
    master = _Slot("bedroom", width("bedroom"))
    if n_bed >= 2 and rng.random() < prog.ensuite_p:
        master.ensuite = width("bathroom")
    rest = [_Slot("bedroom", width("bedroom")) for _ in range(n_bed - 1)]
    rest.append(_Slot("bathroom", width("bathroom")))
    if n_bed >= prog.second_bathroom_from:
        rest.append(_Slot("bathroom", width("bathroom")))
    for room, p in prog.optional:
        if rng.random() < p:
            rest.append(_Slot(room, width(room)))
    rest = [rest[i] for i in rng.permutation(len(rest))]
    private = [master] + rest if rng.random() < 0.5 else rest + [master]
    order = ("living_room", "kitchen", "dining_room") if rng.random() < prog.kitchen_between_p \
        else ("living_room", "dining_room", "kitchen")
    public = [_Slot(room, width(room)) for room in order]
    return public, private


def _row_length(row: list[_Slot]) -> float:
    return sum(s.width + s.ensuite for s in row)


def _balance(public: list[_Slot], private: list[_Slot], cfg: ProceduralConfig) -> None:
    """Move service rooms to the far end of the public row while that shortens the home, and drop
    optional rooms while it is longer than ``home_side[1]`` (in place)."""
    prog = priors.PROGRAM
    while True:
        lp, lq = _row_length(public), _row_length(private)
        movable = [s for s in private if s.room in prog.movable and not s.ensuite]
        best = min(movable, key=lambda s: max(lp + s.width, lq - s.width), default=None)
        if best is not None and lq - lp > cfg.l_shape_min_step and max(lp + best.width, lq - best.width) < lq:
            private.remove(best)
            public.append(best)
            continue
        if max(lp, lq) <= cfg.home_side[1]:
            return
        row = public if lp > lq else private
        if not _drop_one(row, public + private):
            raise _Retry(f"rooms do not fit in {cfg.home_side[1]} m")


def _drop_one(row: list[_Slot], home: list[_Slot]) -> bool:
    """Remove one droppable room from ``row`` (in ``PROGRAM.droppable`` order), keeping at least
    one bedroom and one corridor bathroom in the home and the master suite intact."""
    for room in priors.PROGRAM.droppable:
        essential = room in ("bedroom", "bathroom")
        if essential and sum(1 for s in home if s.room == room) <= 1:
            continue
        for slot in reversed(row):
            if slot.room == room and not slot.ensuite:
                row.remove(slot)
                return True
    return False


def _row_bounds(row: list[_Slot], start: int, cfg: ProceduralConfig) -> list[int]:
    """Wall lines (cells) between the slots of a row, from ``start``; an en-suite strip counts
    as part of its bedroom's slot."""
    edges = np.cumsum([0.0] + [s.width + s.ensuite for s in row])
    return [start + _cells(e, cfg) for e in edges]


def _stretch(bounds: list[int], end: int) -> list[int]:
    """Scale a row's wall lines so that it ends at ``end`` (same start)."""
    start, old = bounds[0], bounds[-1]
    return [start + int(round((b - start) * (end - start) / (old - start))) for b in bounds]


def _layout(rng: np.random.Generator, cfg: ProceduralConfig) -> tuple[list[_Room], tuple[int, int]]:
    """Rooms (in cells, before the random symmetry) and the grid shape ``(H, W)``."""
    public, private = _sample_program(rng)
    _balance(public, private, cfg)
    lo_side = cfg.home_side[0]
    scale = max(1.0, lo_side / max(_row_length(public), _row_length(private)))
    for s in public + private:
        s.width *= scale
        s.ensuite *= scale
    dp = _draw(rng, priors.room_size(priors.ROWS.public_depth_from).depth)
    dq = _draw(rng, priors.room_size(priors.ROWS.private_depth_from).depth)
    dc = _draw(rng, priors.room_size("corridor").depth)
    if dp + dc + dq < lo_side:
        grow = (lo_side - dc) / (dp + dq)
        dp, dq = dp * grow, dq * grow

    m = _cells(cfg.margin, cfg)
    pb, qb = _row_bounds(public, m, cfg), _row_bounds(private, m, cfg)
    if abs(pb[-1] - qb[-1]) < _cells(cfg.l_shape_min_step, cfg):
        end = max(pb[-1], qb[-1])
        pb, qb = _stretch(pb, end), _stretch(qb, end)
    y0 = m
    y1 = y0 + _cells(dp, cfg)
    y2 = y1 + _cells(dc, cfg)
    y3 = y2 + _cells(dq, cfg)

    rooms: list[_Room] = []
    for slot, c0, c1 in zip(public, pb[:-1], pb[1:]):
        rooms.append(_Room(slot.room, "", y0, y1, c0, c1))
    moved_end = max([c1 for slot, c1 in zip(public, pb[1:]) if slot.room in priors.PROGRAM.movable], default=m)
    rooms.append(_Room("corridor", "", y1, y2, m, max(qb[-1], moved_end)))
    for slot, c0, c1 in zip(private, qb[:-1], qb[1:]):
        if not slot.ensuite:
            rooms.append(_Room(slot.room, "", y2, y3, c0, c1))
            continue
        rooms.extend(_master_suite(rng, slot, y2, y3, c0, c1, cfg, len(rooms)))
    _name_rooms(rooms)
    width = max(r.c1 for r in rooms) + m
    return rooms, (y3 + m, width)


def _master_suite(rng, slot: _Slot, y2: int, y3: int, c0: int, c1: int, cfg: ProceduralConfig,
                  index: int) -> list[_Room]:
    """A master bedroom with an en-suite bathroom in a side strip at the far end from the
    corridor, and a walk-in closet in front of it when the strip is deep enough."""
    strip = int(round((c1 - c0) * slot.ensuite / (slot.width + slot.ensuite)))
    left = rng.random() < 0.5
    bed = _Room("bedroom", "", y2, y3, c0 + strip, c1) if left else _Room("bedroom", "", y2, y3, c0, c1 - strip)
    sc0, sc1 = (c0, c0 + strip) if left else (c1 - strip, c1)
    bath_depth = _cells(_draw(rng, priors.room_size("bathroom").depth), cfg)
    closet_min = _cells(priors.room_size("closet").depth[0], cfg)
    out = [bed]
    if (y3 - y2) - bath_depth >= closet_min:
        out.append(_Room("bathroom", "", y3 - bath_depth, y3, sc0, sc1, parent=index))
        out.append(_Room("closet", "", y2, y3 - bath_depth, sc0, sc1, parent=index))
    else:
        out.append(_Room("bathroom", "", y2, y3, sc0, sc1, parent=index))
    return out


def _name_rooms(rooms: list[_Room]) -> None:
    """Names like ``bedroom_2`` (``corridor`` and other one-off rooms get ``_1`` too)."""
    seen: dict[str, int] = {}
    for room in rooms:
        seen[room.type] = seen.get(room.type, 0) + 1
        room.name = f"{room.type}_{seen[room.type]}"


# -- doors --------------------------------------------------------------------------------------
def _shared_wall(a: _Room, b: _Room) -> tuple[str, int, int, int] | None:
    """(axis, line, lo, hi) of the wall segment two rooms share, or None."""
    if a.r1 == b.r0 or a.r0 == b.r1:
        lo, hi = max(a.c0, b.c0), min(a.c1, b.c1)
        if hi > lo:
            return "h", (a.r1 if a.r1 == b.r0 else a.r0), lo, hi
    if a.c1 == b.c0 or a.c0 == b.c1:
        lo, hi = max(a.r0, b.r0), min(a.r1, b.r1)
        if hi > lo:
            return "v", (a.c1 if a.c1 == b.c0 else a.c0), lo, hi
    return None


def _make_door(rng, cfg: ProceduralConfig, a: int, b: int, wall, kind: str) -> _Door | None:
    """A door (or wide opening) at a random place on a shared wall; None if the wall is too short."""
    axis, line, lo, hi = wall
    jamb = _cells(cfg.door_jamb, cfg)
    room_for = hi - lo - 2 * jamb
    if room_for < _cells(cfg.door_width[0], cfg):
        return None
    width = min(_cells(_draw(rng, cfg.opening_width if kind == "opening" else cfg.door_width), cfg), room_for)
    if kind == "door" and rng.random() < cfg.door_near_corner_p:
        start = lo + jamb if rng.random() < 0.5 else hi - jamb - width
    else:
        start = lo + jamb + int(rng.integers(0, room_for - width + 1))
    return _Door(a, b, kind, axis, line, start, start + width)


def _connect(rng, rooms: list[_Room], cfg: ProceduralConfig) -> list[_Door]:
    """Doors from the connection priors, then doors for any room left unreachable."""
    walls = {}
    for i in range(len(rooms)):
        for j in range(i + 1, len(rooms)):
            wall = _shared_wall(rooms[i], rooms[j])
            if wall is not None:
                walls[(i, j)] = wall
    doors: list[_Door] = []
    for (i, j), wall in walls.items():
        a, b = rooms[i], rooms[j]
        if a.parent is not None or b.parent is not None:
            if a.parent == j or b.parent == i:
                door = _make_door(rng, cfg, i, j, wall, "door")
                doors.extend([door] if door else [])
            continue
        prior = priors.connection(a.type, b.type)
        if prior is not None and rng.random() < prior.p:
            kind = "opening" if rng.random() < prior.opening_p else "door"
            door = _make_door(rng, cfg, i, j, wall, kind)
            doors.extend([door] if door else [])
    _ensure_reachable(rng, rooms, walls, doors, cfg)
    return doors


def _ensure_reachable(rng, rooms, walls, doors, cfg) -> None:
    """Add corridor (or neighbour) doors until every room is reachable from the corridor."""
    corridor = next(i for i, r in enumerate(rooms) if r.type == "corridor")
    while True:
        reached = {corridor}
        frontier = [corridor]
        while frontier:
            k = frontier.pop()
            for d in doors:
                for x, y in ((d.a, d.b), (d.b, d.a)):
                    if x == k and y not in reached:
                        reached.add(y)
                        frontier.append(y)
        missing = [i for i in range(len(rooms)) if i not in reached]
        if not missing:
            return
        added = False
        for i in missing:
            if rooms[i].parent is not None:
                continue
            options = sorted((0 if rooms[j].type == "corridor" else 1, j) for j in reached
                             if rooms[j].parent is None and (min(i, j), max(i, j)) in walls)
            for _, j in options:
                door = _make_door(rng, cfg, min(i, j), max(i, j), walls[(min(i, j), max(i, j))], "door")
                if door is not None:
                    doors.append(door)
                    added = True
                    break
            if added:
                break
        if not added:
            raise _Retry(f"rooms {[rooms[i].name for i in missing]} cannot be connected")


# -- symmetry ------------------------------------------------------------------------------------
def _transform(rng, rooms: list[_Room], doors: list[_Door], shape: tuple[int, int]) -> tuple[int, int]:
    """Apply one of the 8 symmetries of the square to rooms and doors (in place); new shape."""
    k = int(rng.integers(8))
    h, w = shape
    if k & 1:
        for r in rooms:
            r.r0, r.r1, r.c0, r.c1 = r.c0, r.c1, r.r0, r.r1
        for d in doors:
            d.axis = "v" if d.axis == "h" else "h"
        h, w = w, h
    if k & 2:  # mirror rows
        for r in rooms:
            r.r0, r.r1 = h - r.r1, h - r.r0
        for d in doors:
            if d.axis == "h":
                d.line = h - d.line
            else:
                d.s0, d.s1 = h - d.s1, h - d.s0
    if k & 4:  # mirror cols
        for r in rooms:
            r.c0, r.c1 = w - r.c1, w - r.c0
        for d in doors:
            if d.axis == "v":
                d.line = w - d.line
            else:
                d.s0, d.s1 = w - d.s1, w - d.s0
    return h, w


# -- rasterising ---------------------------------------------------------------------------------
def _rasterise(grid: _Grid) -> None:
    """Floor (room interiors + door openings), door keep-out zones, and the wall clearance."""
    cfg, tw = grid.cfg, _wall_cells(grid.cfg)
    grid.floor = np.zeros(grid.shape, dtype=bool)
    for room in grid.rooms:
        r0, r1, c0, c1 = room.interior(tw)
        grid.floor[r0:r1, c0:c1] = True
    grid.reserved = np.zeros(grid.shape, dtype=bool)
    keep = _cells(cfg.door_keepout, cfg)
    for door in grid.doors:
        grid.floor[door.wall_cells(tw)] = True
        lo, hi = door.line - tw // 2 - keep, door.line - tw // 2 + tw + keep
        if door.axis == "h":
            grid.reserved[max(lo, 0):hi, door.s0:door.s1] = True
        else:
            grid.reserved[door.s0:door.s1, max(lo, 0):hi] = True
    grid.clear = ndimage.distance_transform_edt(grid.floor)
    grid.instance_map = np.zeros(grid.shape, dtype=np.int32)
    grid.category_map = np.full(grid.shape, NO_CATEGORY, dtype=np.int16)


def _rect_distance(rect, rows: slice, cols: slice) -> np.ndarray:
    """Centre-to-centre distance (cells) from each cell of the window to the nearest cell of rect."""
    r0, r1, c0, c1 = rect
    rr = np.arange(rows.start, rows.stop)
    cc = np.arange(cols.start, cols.stop)
    dy = np.maximum(np.maximum(r0 - rr, rr - (r1 - 1)), 0)
    dx = np.maximum(np.maximum(c0 - cc, cc - (c1 - 1)), 0)
    return np.hypot(dy[:, None], dx[None, :])


# -- furnishing ----------------------------------------------------------------------------------
class _Furnisher:
    """Places one home's objects room by room, keeping doors open and goals reachable."""

    def __init__(self, grid: _Grid):
        self.g = grid
        cfg = grid.cfg
        self.tw = _wall_cells(cfg)
        self.thr = _clearance_cells(cfg)
        self.reach = cfg.reach_distance / cfg.cell_size
        self.max_pocket = cfg.max_pocket_area / cfg.cell_size**2
        self.cat_id = {c: i for i, c in enumerate(priors.CATEGORIES)}
        self.base_clear = grid.clear.copy()
        pad = self.tw + int(math.ceil(self.thr)) + 1
        h, w = grid.shape
        self.crops, self.portals = [], []
        for k, room in enumerate(grid.rooms):
            r0, r1, c0, c1 = room.interior(self.tw)
            rows, cols = slice(max(r0 - pad, 0), min(r1 + pad, h)), slice(max(c0 - pad, 0), min(c1 + pad, w))
            self.crops.append((rows, cols))
            self.portals.append([(p[0] - rows.start, p[1] - cols.start)
                                 for p in (d.portal() for d in grid.doors if k in (d.a, d.b))])

    # geometry of a room's walls
    def _interior(self, k: int):
        return self.g.rooms[k].interior(self.tw)

    def _wall_length(self, k: int, side: str) -> int:
        r0, r1, c0, c1 = self._interior(k)
        return c1 - c0 if side in ("S", "N") else r1 - r0

    def _against(self, k: int, side: str, u: int, v: int, a: int, d: int):
        """Rect of an object ``a`` cells along wall ``side``, ``d`` deep, ``u`` along it, ``v`` off it."""
        r0, r1, c0, c1 = self._interior(k)
        if side == "S":
            return r0 + v, r0 + v + d, c0 + u, c0 + u + a
        if side == "N":
            return r1 - v - d, r1 - v, c0 + u, c0 + u + a
        if side == "W":
            return r0 + u, r0 + u + a, c0 + v, c0 + v + d
        return r0 + u, r0 + u + a, c1 - v - d, c1 - v

    def _on_wall(self, row, k, side, u, v, a, d) -> _Placed:
        return _Placed(row.item, row.category, k, self._against(k, side, u, v, a, d), side, u, v, a, d)

    # checks
    def _fits(self, k: int, rect) -> bool:
        """Inside the room, on free floor, off the door keep-out zones."""
        r0, r1, c0, c1 = rect
        i0, i1, j0, j1 = self._interior(k)
        if not (i0 <= r0 < r1 <= i1 and j0 <= c0 < c1 <= j1):
            return False
        window = (slice(r0, r1), slice(c0, c1))
        return not (self.g.instance_map[window].any() or self.g.reserved[window].any())

    def _keeps_room_open(self, k: int, cand: _Placed) -> bool:
        """With ``cand`` added, the room's doors stay in one traversable component, that component
        covers the room (bar nooks up to ``max_pocket_area``) and every goal object in the room
        has some of it within reach."""
        rows, cols = self.crops[k]
        clear = np.minimum(self.g.clear[rows, cols], _rect_distance(cand.rect, rows, cols))
        trav = clear >= self.thr
        labels, _ = ndimage.label(trav)
        ids = {int(labels[p]) for p in self.portals[k]}
        if len(ids) != 1 or 0 in ids:
            return False
        main = labels == ids.pop()
        r0, r1, c0, c1 = self._interior(k)
        inner = (slice(r0 - rows.start, r1 - rows.start), slice(c0 - cols.start, c1 - cols.start))
        if np.count_nonzero(trav[inner] & ~main[inner]) > self.max_pocket:
            return False
        goals = [p for p in self.g.placed if p.room == k and p.category in priors.GOAL_CATEGORIES] + [cand]
        for p in goals:
            if p.category in priors.GOAL_CATEGORIES and not (main & (_rect_distance(p.rect, rows, cols) <= self.reach)).any():
                return False
        return True

    def _try(self, k: int, cand: _Placed | None) -> bool:
        """Commit ``cand`` if it fits and keeps the room open."""
        if cand is None or not self._fits(k, cand.rect) or not self._keeps_room_open(k, cand):
            return False
        rows, cols = self.crops[k]
        self.g.clear[rows, cols] = np.minimum(self.g.clear[rows, cols], _rect_distance(cand.rect, rows, cols))
        r0, r1, c0, c1 = cand.rect
        self.g.placed.append(cand)
        self.g.instance_map[r0:r1, c0:c1] = len(self.g.placed)
        self.g.category_map[r0:r1, c0:c1] = self.cat_id[cand.category]
        return True

    # proposals, one per rule
    def _propose(self, rng, row, k: int, anchor: _Placed | None, index: int, attempt: int) -> _Placed | None:
        cfg = self.g.cfg
        a, d, gap = (_cells(_draw(rng, r), cfg) for r in (row.along, row.depth, row.gap))
        a, d = max(a, 1), max(d, 1)
        if row.rule == "centre":
            return self._centre(rng, row, k, a, d, gap)
        if row.rule in ("wall", "corner") or anchor is None:
            side = self._random_side(rng, k)
            length = self._wall_length(k, side)
            if length < a:
                return None
            if row.rule == "corner":
                u = gap if rng.random() < 0.5 else length - a - gap
            else:
                u = int(rng.integers(0, length - a + 1))
            return self._on_wall(row, k, side, u, gap, a, d)
        if anchor.side is None and row.rule != "facing":
            return None  # front / beside need the anchor's wall
        side = anchor.side if anchor.side is not None else self._random_side(rng, k)
        centre_u = self._centre_along(k, side, anchor.rect)
        shift = self._shift(rng, k, side, attempt)
        if row.rule == "facing":
            return self._on_wall(row, k, _OPPOSITE[side], centre_u - a // 2 + shift, gap, a, d)
        if row.rule == "front":
            return self._on_wall(row, k, side, centre_u - a // 2 + shift, anchor.v + anchor.depth + gap, a, d)
        # beside: alternate sides of the anchor for successive instances, then at random
        left = index % 2 == 0 if attempt == 0 else rng.random() < 0.5
        u = anchor.u - gap - a if left else anchor.u + anchor.along + gap
        return self._on_wall(row, k, side, u, anchor.v, a, d)

    def _random_side(self, rng, k: int) -> str:
        """A wall of room ``k``, chosen with probability proportional to its length."""
        lengths = np.array([self._wall_length(k, s) for s in _SIDES], dtype=np.float64)
        return _SIDES[int(rng.choice(4, p=lengths / lengths.sum()))]

    def _centre_along(self, k: int, side: str, rect) -> int:
        """Centre of ``rect`` as an offset along wall ``side`` of room ``k`` (cells)."""
        r0, _, c0, _ = self._interior(k)
        if side in ("S", "N"):
            return (rect[2] + rect[3]) // 2 - c0
        return (rect[0] + rect[1]) // 2 - r0

    def _shift(self, rng, k: int, side: str, attempt: int) -> int:
        """Sideways shift of an anchored object: none at first, then ever wider."""
        if attempt == 0:
            return 0
        spread = attempt * self._wall_length(k, side) // (2 * self.g.cfg.placement_attempts)
        return int(rng.integers(-spread, spread + 1))

    def _centre(self, rng, row, k: int, a: int, d: int, jitter: int) -> _Placed:
        """A free-standing object near the room centre, long side along the room's long side."""
        r0, r1, c0, c1 = self._interior(k)
        rc = (r0 + r1) // 2 + int(rng.integers(-jitter, jitter + 1))
        cc = (c0 + c1) // 2 + int(rng.integers(-jitter, jitter + 1))
        h, w = (a, d) if (r1 - r0) >= (c1 - c0) else (d, a)
        rect = (rc - h // 2, rc - h // 2 + h, cc - w // 2, cc - w // 2 + w)
        return _Placed(row.item, row.category, k, rect, None, along=a, depth=d)

    def _around(self, rng, row, k: int, anchor: _Placed, count: int) -> list[_Placed]:
        """Up to ``count`` objects facing the anchor from its sides, long sides first."""
        cfg = self.g.cfg
        a, d, gap = (max(_cells(_draw(rng, r), cfg), 1) for r in (row.along, row.depth, row.gap))
        r0, r1, c0, c1 = anchor.rect
        sides = []  # (length, slots) per anchor side
        for axis, lo, hi, near in (("r", c0, c1, r0 - gap - d), ("r", c0, c1, r1 + gap),
                                   ("c", r0, r1, c0 - gap - d), ("c", r0, r1, c1 + gap)):
            n = (hi - lo + gap) // (a + gap)
            start = lo + (hi - lo - (n * a + (n - 1) * gap)) // 2
            slots = []
            for i in range(n):
                s = start + i * (a + gap)
                slots.append((near, near + d, s, s + a) if axis == "r" else (s, s + a, near, near + d))
            sides.append((hi - lo, slots))
        order = sorted(range(4), key=lambda i: -sides[i][0])
        ranked = []
        for pair in (order[:2], order[2:]):
            first, second = sides[pair[0]][1], sides[pair[1]][1]
            for i in range(max(len(first), len(second))):
                ranked += ([first[i]] if i < len(first) else []) + ([second[i]] if i < len(second) else [])
        placed = []
        for rect in ranked:
            if len(placed) == count:
                break
            cand = _Placed(row.item, row.category, k, rect, None, along=a, depth=d)
            if self._try(k, cand):
                placed.append(cand)
        return placed

    def furnish(self, rng, k: int) -> None:
        """Place room ``k``'s objects from the priors table. If a required object finds no place
        (the TV's wall is all doors, say), clear the room and start it again; a room missing an
        always-present distractor (``p == 1``, a kitchen counter) is also redone, but accepted
        after half the attempts."""
        attempts = self.g.cfg.placement_attempts
        reason = ""
        for attempt in range(attempts):
            reason, n_missing = self._furnish_once(rng, k)
            if not reason and (n_missing == 0 or 2 * attempt >= attempts):
                return
            self._clear_room(k)
        raise _Retry(f"{self.g.rooms[k].name}: {reason}")

    def _furnish_once(self, rng, k: int) -> tuple[str, int]:
        """One pass over the room's table rows: (why a required object failed, or ""; how many
        always-present rows got no instance)."""
        items: dict[str, list[_Placed]] = {}
        n_missing = 0
        for row in priors.objects_for(self.g.rooms[k].type):
            anchor = (items.get(row.anchor) or [None])[0] if row.anchor else None
            if row.anchor and anchor is None:
                continue
            if rng.random() >= row.p:
                continue
            count = int(rng.integers(row.count[0], row.count[1] + 1))
            if row.rule == "around":
                placed = self._around(rng, row, k, anchor, count)
            else:
                placed = []
                for index in range(count):
                    for attempt in range(self.g.cfg.placement_attempts):
                        cand = self._propose(rng, row, k, anchor, index, attempt)
                        if self._try(k, cand):
                            placed.append(cand)
                            break
            if not placed and priors.is_required(row):
                return f"no room for its {row.item}", n_missing
            n_missing += int(not placed and row.p >= 1.0)
            items[row.item] = placed
        return "", n_missing

    def _clear_room(self, k: int) -> None:
        """Remove room ``k``'s objects and recompute the clearance around it. Rooms are furnished
        one after the other, so ``k``'s objects are the last ones and instance ids stay 1..n."""
        self.g.placed = [p for p in self.g.placed if p.room != k]
        r0, r1, c0, c1 = self._interior(k)
        self.g.instance_map[r0:r1, c0:c1] = NO_INSTANCE
        self.g.category_map[r0:r1, c0:c1] = NO_CATEGORY
        rows, cols = self.crops[k]
        clear = self.base_clear[rows, cols].copy()
        for p in self.g.placed:
            clear = np.minimum(clear, _rect_distance(p.rect, rows, cols))
        self.g.clear[rows, cols] = clear


# -- final checks and the Scene ------------------------------------------------------------------
def _final_traversable(grid: _Grid) -> np.ndarray:
    """Traversable cells from scratch, reduced to the component holding every door; raises
    ``_Retry`` if the doors are not connected, a room has no traversable floor or a goal object
    is out of reach."""
    cfg, tw = grid.cfg, _wall_cells(grid.cfg)
    free = grid.floor & (grid.instance_map == NO_INSTANCE)
    trav = ndimage.distance_transform_edt(free) >= _clearance_cells(cfg)
    labels, _ = ndimage.label(trav)
    ids = {int(labels[d.portal()]) for d in grid.doors}
    if len(ids) != 1 or 0 in ids:
        raise _Retry("doors are not in one traversable component")
    trav = labels == ids.pop()
    for room in grid.rooms:
        r0, r1, c0, c1 = room.interior(tw)
        if not trav[r0:r1, c0:c1].any():
            raise _Retry(f"{room.name} has no traversable floor")
    to_trav = ndimage.distance_transform_edt(~trav)
    reach = cfg.reach_distance / cfg.cell_size
    for p in grid.placed:
        r0, r1, c0, c1 = p.rect
        if p.category in priors.GOAL_CATEGORIES and to_trav[r0:r1, c0:c1].min() > reach:
            raise _Retry(f"{p.item} in {grid.rooms[p.room].name} is out of reach")
    present = {p.category for p in grid.placed}
    missing = [c for c in priors.GOAL_CATEGORIES if c not in present]
    if missing:
        raise _Retry(f"goal categories missing: {missing}")
    return trav


def _metres_box(cfg: ProceduralConfig, r0: int, r1: int, c0: int, c1: int) -> list[float]:
    """Cell rect -> ``[xmin, ymin, xmax, ymax]`` metres in the map frame (origin (0, 0))."""
    s = cfg.cell_size
    return [round(c0 * s, 4), round(r0 * s, 4), round(c1 * s, 4), round(r1 * s, 4)]


def _meta(grid: _Grid, seed: int, attempt: int) -> dict:
    """JSON-able provenance: seed, rooms, doors, objects (metres, map frame)."""
    cfg, tw, s = grid.cfg, _wall_cells(grid.cfg), grid.cfg.cell_size
    rooms = [{"name": r.name, "type": r.type, "bbox": _metres_box(cfg, *r.interior(tw)),
              "parent": None if r.parent is None else grid.rooms[r.parent].name} for r in grid.rooms]
    doors = []
    for d in grid.doors:
        mid = (d.s0 + d.s1) / 2.0
        x, y = (mid * s, d.line * s) if d.axis == "h" else (d.line * s, mid * s)
        doors.append({"rooms": [grid.rooms[d.a].name, grid.rooms[d.b].name], "kind": d.kind,
                      "center": [round(x, 4), round(y, 4)], "width": round((d.s1 - d.s0) * s, 4),
                      "wall_along": "x" if d.axis == "h" else "y"})
    objects = [{"id": i + 1, "item": p.item, "category": p.category, "room": grid.rooms[p.room].name,
                "bbox": _metres_box(cfg, *p.rect)} for i, p in enumerate(grid.placed)]
    h, w = grid.shape
    outer = [min(r.c0 for r in grid.rooms), min(r.r0 for r in grid.rooms),
             max(r.c1 for r in grid.rooms), max(r.r1 for r in grid.rooms)]
    return {"generator": "trajrag.world.procedural", "seed": int(seed), "attempt": attempt,
            "size_m": [round(w * s, 4), round(h * s, 4)],
            "footprint_bbox": [round(v * s, 4) for v in outer],
            "entrance": _entrance(grid), "rooms": rooms, "doors": doors, "objects": objects}


def _entrance(grid: _Grid) -> list[float]:
    """Where the (closed) front door would be, metres: the middle of the corridor's end wall on
    the living-room side, since the living room lies at the entrance end of the corridor."""
    tw, s = _wall_cells(grid.cfg), grid.cfg.cell_size
    corridor = next(r for r in grid.rooms if r.type == "corridor")
    living = next(r for r in grid.rooms if r.type == "living_room")
    r0, r1, c0, c1 = corridor.interior(tw)
    lr, lc = (living.r0 + living.r1) / 2.0, (living.c0 + living.c1) / 2.0
    if c1 - c0 >= r1 - r0:  # corridor runs along x: ends are its left and right walls
        col = corridor.c0 if abs(lc - corridor.c0) <= abs(lc - corridor.c1) else corridor.c1
        return [round(col * s, 4), round((r0 + r1) / 2.0 * s, 4)]
    row = corridor.r0 if abs(lr - corridor.r0) <= abs(lr - corridor.r1) else corridor.r1
    return [round((c0 + c1) / 2.0 * s, 4), round(row * s, 4)]


def _build(rng: np.random.Generator, cfg: ProceduralConfig) -> _Grid:
    """One draw of a home; raises ``_Retry`` when a check fails."""
    rooms, shape = _layout(rng, cfg)
    doors = _connect(rng, rooms, cfg)
    shape = _transform(rng, rooms, doors, shape)
    grid = _Grid(cfg, rooms, doors, shape)
    _rasterise(grid)
    furnisher = _Furnisher(grid)
    for k in range(len(rooms)):
        furnisher.furnish(rng, k)
    return grid


def _check_config(cfg: ProceduralConfig) -> None:
    """Clear errors for settings that cannot give a navigable home."""
    if cfg.cell_size <= 0 or cfg.agent_radius <= 0:
        raise ValueError(f"procedural config: cell_size {cfg.cell_size} and agent_radius {cfg.agent_radius} must be > 0")
    for key in ("home_side", "door_width", "opening_width"):
        lo_hi = getattr(cfg, key)
        if len(lo_hi) != 2 or not 0 < lo_hi[0] <= lo_hi[1]:
            raise ValueError(f"procedural config: {key} must be [min, max] with 0 < min <= max, got {lo_hi}")
    need = 2 * cfg.agent_radius + 2 * cfg.cell_size
    if cfg.door_width[0] < need:
        raise ValueError(f"procedural config: door_width min {cfg.door_width[0]} m < {need:.2f} m "
                         f"(2 * agent_radius + 2 cells): the agent could not pass a door")
    if _cells(cfg.margin, cfg) < _wall_cells(cfg):
        raise ValueError(f"procedural config: margin {cfg.margin} m must be at least wall_thickness "
                         f"{cfg.wall_thickness} m so the outer walls lie inside the grid")
    if cfg.max_retries < 1 or cfg.placement_attempts < 1:
        raise ValueError("procedural config: max_retries and placement_attempts must be >= 1")


def generate_home(seed: int, cfg: ProceduralConfig, name: str | None = None) -> Scene:
    """One procedural home, deterministic by ``seed`` (a non-negative int).

    Returns a ``Scene`` named ``name`` (default ``procedural/seed/<seed>``) with the fixed
    category vocabulary ``priors.CATEGORIES``; ``meta`` holds the seed, the retry that succeeded,
    rooms (type, interior bbox in metres), doors (centre, width) and objects. Raises
    ``GenerationError`` if no valid home is found in ``cfg.max_retries`` draws.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"procedural home seed must be a non-negative int, got {seed!r}")
    _check_config(cfg)
    reasons = []
    for attempt in range(cfg.max_retries):
        rng = np.random.default_rng(int(seed) if attempt == 0 else [int(seed), attempt])
        try:
            grid = _build(rng, cfg)
            traversable = _final_traversable(grid)
        except _Retry as exc:
            reasons.append(str(exc))
            continue
        instance_category = np.full(len(grid.placed) + 1, NO_CATEGORY, dtype=np.int16)
        for i, p in enumerate(grid.placed):
            instance_category[i + 1] = priors.CATEGORIES.index(p.category)
        return Scene(
            name=name or f"procedural/seed/{int(seed)}",
            categories=priors.CATEGORIES,
            traversable=traversable,
            floor=grid.floor,
            instance_map=grid.instance_map,
            category_map=grid.category_map,
            instance_category=instance_category,
            cell_size=cfg.cell_size,
            origin=(0.0, 0.0),
            floor_height=cfg.floor_height,
            meta=_meta(grid, int(seed), attempt),
        )
    raise GenerationError(f"procedural home seed {seed}: no valid home in {cfg.max_retries} draws; "
                          f"last failures: {reasons[-3:]}")


def split_seeds(split: str, n: int, cfg: ProceduralConfig) -> list[int]:
    """The seeds of the first ``n`` homes of ``split``; ``ValueError`` if the split is unknown or
    ``n`` is so large that its seed range would run into another split's."""
    if split not in cfg.split_offsets:
        raise ValueError(f"unknown split {split!r}; configs/procedural.yaml split_offsets has {sorted(cfg.split_offsets)}")
    if n < 0:
        raise ValueError(f"number of homes must be >= 0, got {n}")
    start = cfg.split_offsets[split]
    for other, offset in cfg.split_offsets.items():
        if other != split and start <= offset < start + n:
            raise ValueError(f"{n} {split} homes would reuse {other} seeds (offset {offset}); "
                             f"ask for fewer or move split_offsets in configs/procedural.yaml")
    return [start + i for i in range(n)]


def procedural_scenes(split: str, n: int, cfg: ProceduralConfig, start: int = 0) -> list[Scene]:
    """Homes ``start .. n - 1`` of ``split`` ("train", "val" or "test"), named
    ``procedural/<split>/<i:04d>``; seeds ``split_offsets[split] + i`` keep splits disjoint."""
    return [generate_home(seed, cfg, name=f"procedural/{split}/{i:04d}")
            for i, seed in enumerate(split_seeds(split, n, cfg)) if i >= start]
