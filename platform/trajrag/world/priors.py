"""Room-type priors for procedural homes: which rooms a home has, how big they are, which rooms
open onto which, and which objects stand where. All of it is data, in the tables below.

Why priors matter. TrajRAG retrieves *experience*: trajectories from earlier episodes whose
topo-polar shape and semantic surroundings resemble the present one. Experience only transfers
to an unseen home if unseen homes share the regularities of the homes the memory was built in,
as real homes do: toilets are in bathrooms, bathrooms open off a corridor or a bedroom, beds sit
against a bedroom wall, the TV faces the sofa, chairs stand around a table, the kitchen lies
beside the dining room. A generator that scattered objects uniformly would give a memory with
nothing to generalise, and would make retrieval look useless for reasons that have nothing to do
with the method. So every home is drawn from the same tables (one distribution), and every home
is different (one draw per seed).

Sources. Room and furniture dimensions: Neufert, *Architects' Data* (4th ed.), living, sleeping,
kitchen and sanitary chapters, and common furniture catalogue sizes (a double bed 1.4-1.8 x
2.0 m, a sofa 1.8-2.4 x 0.9 m, a toilet 0.4 x 0.7 m). Room programmes, adjacencies and object
probabilities: our estimates of typical single-storey homes, in the spirit of ProcTHOR's
room-type priors (Deitke et al., NeurIPS 2022) and the HM3D / Gibson homes the ObjectNav
benchmarks use. Goal categories: habitat-lab's HM3D ObjectNav set.

Placement rules (``ObjectPrior.rule``); ``along`` is the footprint edge parallel to the wall or
anchor the object faces from, ``depth`` the edge away from it, ``gap`` a distance in metres:

- ``wall``: back against a random wall of the room, ``gap`` off it, anywhere along it.
- ``corner``: like ``wall`` but at one end of the wall, ``gap`` off both walls of the corner.
- ``centre``: centred in the room (long side parallel to the room's long side), moved by up to
  ``gap`` along each axis.
- ``facing``: against the wall opposite the anchor's wall, centred on the anchor (the TV facing
  the sofa or the bed), ``gap`` off the wall.
- ``front``: in front of the anchor, ``gap`` away from its front edge (the coffee table).
- ``around``: on the free sides of the anchor, facing it, ``gap`` from it and ``gap`` apart
  (chairs at a table or a desk).
- ``beside``: on the anchor's wall next to it, ``gap`` from it (nightstands beside the bed).
"""

from __future__ import annotations

from dataclasses import dataclass

# HM3D ObjectNav goal categories, habitat-lab names (habitat-lab objectnav_hm3d.yaml).
GOAL_CATEGORIES: tuple[str, ...] = ("chair", "bed", "plant", "toilet", "tv_monitor", "sofa")

# The fixed category vocabulary of every procedural scene: goal categories first (so their ids
# are 0..5 in every scene), then distractors. Category ids are indices into this tuple.
CATEGORIES: tuple[str, ...] = GOAL_CATEGORIES + (
    "table", "desk", "sink", "bathtub", "refrigerator", "oven", "counter",
    "wardrobe", "shelf", "cabinet", "nightstand", "washer",
)

RULES: tuple[str, ...] = ("wall", "corner", "centre", "facing", "front", "around", "beside")
ANCHORED_RULES: tuple[str, ...] = ("facing", "front", "around", "beside")


@dataclass(frozen=True)
class RoomPrior:
    """Size of one room type, metres.

    width: span along the corridor (the row the room sits in). depth: span across it; only the
    room type that sets its row's depth (``RowPrior.depth_from``) and the en-suite / closet
    split use it, the other rooms of a row share the row's depth.
    """

    room: str
    width: tuple[float, float]
    depth: tuple[float, float]


ROOM_SIZES: tuple[RoomPrior, ...] = (
    RoomPrior("living_room", width=(4.0, 5.5), depth=(3.8, 5.2)),
    RoomPrior("dining_room", width=(3.0, 4.0), depth=(3.8, 5.2)),
    RoomPrior("kitchen", width=(2.6, 3.6), depth=(3.8, 5.2)),
    RoomPrior("bedroom", width=(3.0, 4.2), depth=(3.2, 4.4)),
    RoomPrior("bathroom", width=(1.8, 2.6), depth=(2.0, 2.6)),
    RoomPrior("office", width=(2.6, 3.4), depth=(3.2, 4.4)),
    RoomPrior("laundry", width=(1.6, 2.2), depth=(3.2, 4.4)),
    # a walk-in closet fills what an en-suite leaves of the master bedroom's side strip
    RoomPrior("closet", width=(1.8, 2.6), depth=(1.4, 2.6)),
    # hallway width: 1.1-1.5 m lets two people pass (Neufert); depth = across the corridor
    RoomPrior("corridor", width=(0.0, 0.0), depth=(1.1, 1.5)),
)


@dataclass(frozen=True)
class ProgramPrior:
    """Which rooms a home has.

    bedrooms: (count, probability) pairs. ensuite_p: probability that the first (master)
    bedroom has an en-suite bathroom, when the home has two or more bedrooms. second_bathroom_from:
    a home with at least this many bedrooms gets a second corridor bathroom. optional: (room
    type, probability) of further rooms. kitchen_between_p: probability of the public row order
    living | kitchen | dining instead of living | dining | kitchen. movable: room types that
    may sit at the far end of the public row (beside the kitchen) to balance the two rows.
    droppable: room types removed, in this order, while the home is longer than allowed.
    """

    bedrooms: tuple[tuple[int, float], ...]
    ensuite_p: float
    second_bathroom_from: int
    optional: tuple[tuple[str, float], ...]
    kitchen_between_p: float
    movable: tuple[str, ...]
    droppable: tuple[str, ...]


PROGRAM = ProgramPrior(
    bedrooms=((1, 0.2), (2, 0.35), (3, 0.3), (4, 0.15)),
    ensuite_p=0.6,
    second_bathroom_from=3,
    optional=(("office", 0.5), ("laundry", 0.4)),
    kitchen_between_p=0.3,
    movable=("laundry", "bathroom", "office"),
    droppable=("laundry", "office", "bathroom", "bedroom"),
)


@dataclass(frozen=True)
class RowPrior:
    """The two rows of rooms on either side of the corridor: which room type sets the depth."""

    public_depth_from: str
    private_depth_from: str


ROWS = RowPrior(public_depth_from="living_room", private_depth_from="bedroom")


@dataclass(frozen=True)
class ConnectionPrior:
    """A pair of room types that may be connected where they share a wall.

    p: probability of a connection; opening_p: probability that it is a wide opening (open
    plan) rather than a door. Pairs not listed get no connection, except where a room would
    otherwise be unreachable (then a door to the corridor or a neighbour is added). An en-suite
    bathroom and a walk-in closet connect to their bedroom only.
    """

    a: str
    b: str
    p: float
    opening_p: float


CONNECTIONS: tuple[ConnectionPrior, ...] = (
    ConnectionPrior("corridor", "bedroom", p=1.0, opening_p=0.0),
    ConnectionPrior("corridor", "bathroom", p=1.0, opening_p=0.0),
    ConnectionPrior("corridor", "office", p=1.0, opening_p=0.0),
    ConnectionPrior("corridor", "laundry", p=1.0, opening_p=0.0),
    ConnectionPrior("corridor", "living_room", p=1.0, opening_p=0.6),
    ConnectionPrior("corridor", "dining_room", p=0.3, opening_p=0.3),
    ConnectionPrior("corridor", "kitchen", p=0.5, opening_p=0.2),
    ConnectionPrior("living_room", "dining_room", p=1.0, opening_p=0.7),
    ConnectionPrior("dining_room", "kitchen", p=1.0, opening_p=0.5),
    ConnectionPrior("living_room", "kitchen", p=0.8, opening_p=0.5),
    ConnectionPrior("kitchen", "laundry", p=0.5, opening_p=0.0),
    ConnectionPrior("living_room", "office", p=0.3, opening_p=0.0),
)


@dataclass(frozen=True)
class ObjectPrior:
    """One kind of furnishing of one room type.

    room: room type. item: name of the furnishing, unique within the room (anchors refer to it).
    category: semantic category (an entry of ``CATEGORIES``). count: (min, max) instances when
    the item is present. p: probability that it is present; items with ``p == 1`` and a goal
    category are required (a home where one cannot be placed is regenerated). along, depth:
    footprint ranges in metres (see the module docstring). rule: placement rule. gap: (min,
    max) metres, meaning given by the rule. anchor: item this one is placed relative to ("" if
    none); it must come earlier in the table, in the same room.
    """

    room: str
    item: str
    category: str
    count: tuple[int, int]
    p: float
    along: tuple[float, float]
    depth: tuple[float, float]
    rule: str
    gap: tuple[float, float]
    anchor: str


def _row(room, item, category, count, p, along, depth, rule, gap, anchor=""):
    return ObjectPrior(room, item, category, count, p, along, depth, rule, gap, anchor)


# THE object table. Rows are placed in this order within a room (anchors first, big before
# small, so the big pieces find their walls).
OBJECTS: tuple[ObjectPrior, ...] = (
    # living room: the sofa sets the scene, the TV faces it, plants like it here most
    _row("living_room", "sofa", "sofa", (1, 1), 1.0, (1.8, 2.4), (0.85, 1.0), "wall", (0.0, 0.1)),
    _row("living_room", "tv", "tv_monitor", (1, 1), 1.0, (1.0, 1.6), (0.35, 0.5), "facing", (0.0, 0.1), "sofa"),
    _row("living_room", "coffee_table", "table", (1, 1), 0.8, (0.9, 1.2), (0.5, 0.7), "front", (0.4, 0.55), "sofa"),
    _row("living_room", "armchair", "chair", (1, 2), 0.6, (0.75, 0.9), (0.75, 0.9), "corner", (0.05, 0.2)),
    _row("living_room", "plant", "plant", (1, 3), 1.0, (0.3, 0.5), (0.3, 0.5), "corner", (0.0, 0.15)),
    _row("living_room", "bookshelf", "shelf", (1, 2), 0.5, (0.8, 1.6), (0.3, 0.4), "wall", (0.0, 0.05)),
    _row("living_room", "side_cabinet", "cabinet", (1, 1), 0.3, (0.8, 1.4), (0.4, 0.5), "wall", (0.0, 0.05)),
    # dining room: the table in the middle, chairs around it
    _row("dining_room", "dining_table", "table", (1, 1), 1.0, (1.2, 2.0), (0.8, 1.0), "centre", (0.0, 0.3)),
    _row("dining_room", "dining_chair", "chair", (2, 6), 1.0, (0.42, 0.5), (0.42, 0.5), "around", (0.1, 0.2), "dining_table"),
    _row("dining_room", "sideboard", "cabinet", (1, 1), 0.5, (1.2, 1.8), (0.4, 0.5), "wall", (0.0, 0.05)),
    _row("dining_room", "plant", "plant", (1, 2), 0.5, (0.3, 0.5), (0.3, 0.5), "corner", (0.0, 0.15)),
    # kitchen: appliances and counters along the walls, sometimes a small table
    _row("kitchen", "fridge", "refrigerator", (1, 1), 1.0, (0.6, 0.9), (0.65, 0.75), "corner", (0.0, 0.05)),
    _row("kitchen", "counter", "counter", (1, 2), 1.0, (1.8, 3.0), (0.6, 0.65), "wall", (0.0, 0.02)),
    _row("kitchen", "stove", "oven", (1, 1), 1.0, (0.6, 0.76), (0.6, 0.65), "wall", (0.0, 0.02)),
    _row("kitchen", "kitchen_sink", "sink", (1, 1), 0.9, (0.6, 0.9), (0.55, 0.6), "wall", (0.0, 0.02)),
    _row("kitchen", "kitchen_table", "table", (1, 1), 0.3, (0.8, 1.2), (0.6, 0.8), "centre", (0.0, 0.2)),
    _row("kitchen", "stool", "chair", (1, 3), 1.0, (0.38, 0.45), (0.38, 0.45), "around", (0.1, 0.2), "kitchen_table"),
    _row("kitchen", "plant", "plant", (1, 1), 0.2, (0.25, 0.4), (0.25, 0.4), "corner", (0.0, 0.1)),
    # bedroom: the bed's head against a wall, nightstands beside it
    _row("bedroom", "bed", "bed", (1, 1), 1.0, (1.2, 1.8), (1.95, 2.1), "wall", (0.0, 0.05)),
    _row("bedroom", "nightstand", "nightstand", (1, 2), 0.8, (0.4, 0.5), (0.35, 0.45), "beside", (0.02, 0.1), "bed"),
    _row("bedroom", "wardrobe", "wardrobe", (1, 1), 0.8, (1.0, 2.0), (0.55, 0.65), "wall", (0.0, 0.05)),
    _row("bedroom", "dresser", "cabinet", (1, 1), 0.4, (0.8, 1.4), (0.45, 0.5), "wall", (0.0, 0.05)),
    _row("bedroom", "tv", "tv_monitor", (1, 1), 0.25, (0.8, 1.2), (0.3, 0.45), "facing", (0.0, 0.1), "bed"),
    _row("bedroom", "desk", "desk", (1, 1), 0.2, (1.0, 1.4), (0.55, 0.7), "wall", (0.0, 0.05)),
    _row("bedroom", "desk_chair", "chair", (1, 1), 1.0, (0.5, 0.6), (0.5, 0.6), "around", (0.05, 0.2), "desk"),
    _row("bedroom", "armchair", "chair", (1, 1), 0.2, (0.7, 0.85), (0.7, 0.85), "corner", (0.05, 0.2)),
    _row("bedroom", "plant", "plant", (1, 1), 0.3, (0.3, 0.45), (0.3, 0.45), "corner", (0.0, 0.15)),
    # bathroom: toilet, basin, often a bathtub in a corner
    _row("bathroom", "bathtub", "bathtub", (1, 1), 0.6, (1.5, 1.7), (0.7, 0.8), "corner", (0.0, 0.02)),
    _row("bathroom", "toilet", "toilet", (1, 1), 1.0, (0.38, 0.45), (0.65, 0.75), "wall", (0.0, 0.05)),
    _row("bathroom", "basin", "sink", (1, 2), 1.0, (0.5, 0.8), (0.4, 0.5), "wall", (0.0, 0.02)),
    _row("bathroom", "bathroom_cabinet", "cabinet", (1, 1), 0.3, (0.4, 0.8), (0.3, 0.4), "wall", (0.0, 0.02)),
    _row("bathroom", "plant", "plant", (1, 1), 0.1, (0.25, 0.35), (0.25, 0.35), "corner", (0.0, 0.05)),
    # office: desk with its chair, shelves
    _row("office", "desk", "desk", (1, 1), 1.0, (1.2, 1.6), (0.6, 0.75), "wall", (0.0, 0.05)),
    _row("office", "office_chair", "chair", (1, 1), 1.0, (0.5, 0.6), (0.5, 0.6), "around", (0.05, 0.2), "desk"),
    _row("office", "bookshelf", "shelf", (1, 2), 0.8, (0.8, 1.2), (0.3, 0.4), "wall", (0.0, 0.05)),
    _row("office", "sofa_bed", "sofa", (1, 1), 0.15, (1.6, 2.0), (0.8, 0.95), "wall", (0.0, 0.05)),
    _row("office", "plant", "plant", (1, 1), 0.5, (0.3, 0.5), (0.3, 0.5), "corner", (0.0, 0.15)),
    # laundry
    _row("laundry", "washer", "washer", (1, 2), 1.0, (0.6, 0.65), (0.6, 0.65), "wall", (0.0, 0.02)),
    _row("laundry", "utility_sink", "sink", (1, 1), 0.5, (0.5, 0.7), (0.45, 0.55), "wall", (0.0, 0.02)),
    _row("laundry", "utility_shelf", "shelf", (1, 1), 0.5, (0.6, 1.0), (0.3, 0.4), "wall", (0.0, 0.02)),
    # walk-in closet
    _row("closet", "closet_shelf", "shelf", (1, 2), 1.0, (0.8, 1.6), (0.4, 0.5), "wall", (0.0, 0.02)),
    # corridor: a narrow cabinet or a plant, never much
    _row("corridor", "hall_cabinet", "cabinet", (1, 1), 0.3, (0.6, 1.0), (0.25, 0.35), "wall", (0.0, 0.02)),
    _row("corridor", "plant", "plant", (1, 1), 0.3, (0.25, 0.4), (0.25, 0.4), "corner", (0.0, 0.05)),
)


def room_size(room: str) -> RoomPrior:
    """The size prior of a room type (``KeyError`` naming the type if there is none)."""
    for row in ROOM_SIZES:
        if row.room == room:
            return row
    raise KeyError(f"no size prior for room type {room!r}")


def objects_for(room: str) -> tuple[ObjectPrior, ...]:
    """The object rows of one room type, in placement order."""
    return tuple(row for row in OBJECTS if row.room == room)


def connection(a: str, b: str) -> ConnectionPrior | None:
    """The connection prior of an unordered pair of room types, or None."""
    for row in CONNECTIONS:
        if {row.a, row.b} == {a, b} and (a != b or row.a == row.b):
            return row
    return None


def is_required(row: ObjectPrior) -> bool:
    """Whether a home must contain at least one instance of ``row``: a goal category that is
    always present (``p == 1``, ``count[0] >= 1``) and whose anchor, if any, is required too."""
    if row.category not in GOAL_CATEGORIES or row.p < 1.0 or row.count[0] < 1:
        return False
    if not row.anchor:
        return True
    anchor = next(r for r in OBJECTS if r.room == row.room and r.item == row.anchor)
    return anchor.p >= 1.0 and anchor.count[0] >= 1


def validate_tables() -> None:
    """Check the tables are consistent (categories known, anchors earlier, ranges ordered)."""
    room_types = {r.room for r in ROOM_SIZES}
    for row in OBJECTS:
        where = f"priors.OBJECTS row {row.room}/{row.item}"
        if row.room not in room_types:
            raise ValueError(f"{where}: unknown room type")
        if row.category not in CATEGORIES:
            raise ValueError(f"{where}: category {row.category!r} not in CATEGORIES")
        if row.rule not in RULES:
            raise ValueError(f"{where}: unknown rule {row.rule!r}")
        if (row.rule in ANCHORED_RULES) != bool(row.anchor):
            raise ValueError(f"{where}: rule {row.rule!r} and anchor {row.anchor!r} disagree")
        earlier = [r.item for r in OBJECTS[: OBJECTS.index(row)] if r.room == row.room]
        if row.anchor and row.anchor not in earlier:
            raise ValueError(f"{where}: anchor {row.anchor!r} must be an earlier item of the room")
        if row.item in earlier:
            raise ValueError(f"{where}: duplicate item")
        for name in ("count", "along", "depth", "gap"):
            lo, hi = getattr(row, name)
            if lo > hi or lo < 0:
                raise ValueError(f"{where}: {name} range {(lo, hi)} is not ordered/non-negative")
        if not 0.0 <= row.p <= 1.0:
            raise ValueError(f"{where}: probability {row.p} outside [0, 1]")
    for goal in GOAL_CATEGORIES:
        if not any(r.category == goal and is_required(r) for r in OBJECTS):
            raise ValueError(f"priors: goal category {goal!r} has no required row")
    for row in CONNECTIONS:
        if row.a not in room_types or row.b not in room_types:
            raise ValueError(f"priors.CONNECTIONS row {row.a}-{row.b}: unknown room type")


validate_tables()
