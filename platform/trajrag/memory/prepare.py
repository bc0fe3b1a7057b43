"""What an insert accepts: a trajectory checked and mapped to the store's labels (``prepare``),
the key and text of its chunk, and the chunks-table row it becomes.

A trajectory is anything with ``TopoPolarLike``'s fields (``topo.trajectory.TopoPolarTrajectory``
or a collector's record); optional fields (``trajectory_id``, ``scene_id``, ``policy``,
``success``, ``description``, ``place``) are read when present. With ``summary_geometry: map``
the nodes matched and fused are those of the map the walk was made in (``traj.place``), not the
walked ones (see ``memory.grouping``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterable, Protocol, Sequence

import numpy as np

from trajrag.memory.matching import N_SECTORS
from trajrag.memory.schema import MAP_COLUMNS, utc_now
from trajrag.memory.se2 import Transform2D
from trajrag.topo.describe import describe
from trajrag.topo.labels import FREE, OBSTACLE, UNKNOWN
from trajrag.topo.trajectory import TopoPolarTrajectory

# memory.summary_geometry: summaries of the walked nodes (the paper) or of the walks' maps.
GEOMETRY_WALK, GEOMETRY_MAP = "walk", "map"


class TopoPolarLike(Protocol):
    """The fields of ``topo.trajectory.TopoPolarTrajectory`` that the memory reads."""

    node_xy: np.ndarray  # float (K, 2) metres, map frame
    sectors: np.ndarray  # int (K, 12) labels, category ids index ``categories``
    edges: np.ndarray  # int (K - 1, 2)
    categories: Sequence[str]
    goal: str
    reference_yaw: float  # radians


@dataclass
class Nodes:
    """Nodes that are matched against summaries and fused into them (store label ids)."""

    node_xy: np.ndarray
    sectors: np.ndarray
    edges: np.ndarray
    reference_yaw: float


@dataclass
class Prepared:
    """A validated trajectory, sectors in store label ids.

    geometry: what is matched and fused (the walk's own nodes, or with ``summary_geometry:
    map`` the nodes of the map it was walked in); walk_nodes: int (K,) each walk node's index
    into ``geometry``. place / place_walk_nodes: the map it was walked in and its walk's nodes
    in it, whatever the geometry (stored with the chunk), or None."""

    trajectory_id: str
    node_xy: np.ndarray
    sectors: np.ndarray
    edges: np.ndarray
    goal: str
    reference_yaw: float
    scene_hint: str
    episode_id: str
    policy: str
    success: bool
    description: str
    geometry: Nodes
    walk_nodes: np.ndarray
    place: Nodes | None = None
    place_walk_nodes: np.ndarray | None = None


def to_store_labels(sectors: np.ndarray, lut: np.ndarray) -> np.ndarray:
    """Sector labels with category ids (>= 0) mapped through ``lut`` to store label ids; the
    special labels (negative) unchanged. int16, the shape of ``sectors``."""
    mapped = np.where(sectors >= 0, lut[np.clip(sectors, 0, None)] if len(lut) else 0, sectors)
    return mapped.astype(np.int16)


def first_attr(obj: Any, names: Iterable[str], default: Any = None) -> Any:
    """The first of ``obj``'s attributes ``names`` that is set (not None, not empty), else ``default``."""
    for name in names:
        value = getattr(obj, name, None)
        if value is not None and value != "":
            return value
    return default


def trajectory_key(traj: Any, policy: str | None = None) -> str:
    """The chunk key: ``traj.trajectory_id`` if it has one, else ``scene_id/episode_id[/policy]``.

    Pass ``policy`` when several collectors run the same episodes, so their trajectories differ.
    """
    explicit = first_attr(traj, ("trajectory_id",))
    if explicit is not None:
        return str(explicit)
    parts = [str(first_attr(traj, ("scene_id", "scene_key"), "")), str(first_attr(traj, ("episode_id",), ""))]
    if not any(parts):
        raise ValueError("trajectory has no trajectory_id, scene_id or episode_id to key it by")
    policy = policy if policy is not None else first_attr(traj, ("policy",))
    return "/".join(parts + ([str(policy)] if policy else []))


def chunk_description(traj: TopoPolarLike) -> str:
    """L(T_tp), the paper's chunk text (~85 bytes a node; the encoder stage may re-derive it).
    The memory writes it unless the trajectory carries it (``traj.description``): collectors
    attach it, since it costs the single writer as much as a quarter of an insert."""
    return describe(TopoPolarTrajectory(
        np.asarray(traj.node_xy, dtype=np.float64), np.asarray(traj.sectors), tuple(traj.categories),
        str(traj.goal), float(traj.reference_yaw), success=bool(first_attr(traj, ("success",), False))))


def search_sectors(traj: Any, vocab: dict[str, int], summary_geometry: str) -> np.ndarray | None:
    """The sectors ``prepare`` gives the prefilter's search (its geometry's, in store label ids),
    without a change to any state: None when a category is not in ``vocab`` yet or the
    trajectory is malformed (``prepare`` then says why). What the writer reads ahead with."""
    try:
        categories = [str(name) for name in traj.categories]
        source = traj
        if summary_geometry == GEOMETRY_MAP and getattr(traj, "place", None) is not None:
            source = traj.place
        sectors = np.asarray(source.sectors)
    except (AttributeError, TypeError, ValueError):
        return None
    if any(name not in vocab for name in categories) or sectors.ndim != 2 \
            or sectors.shape[1] != N_SECTORS or not np.issubdtype(sectors.dtype, np.integer) \
            or ((sectors < UNKNOWN) | (sectors >= len(categories))).any():
        return None
    return to_store_labels(sectors, np.array([vocab[name] for name in categories], dtype=np.int16))


def prepare(traj: Any, tid: str, description: str | None, policy: str | None,
            label_lut: Callable[[Sequence[str]], np.ndarray], summary_geometry: str,
            timed: Callable[[str], ContextManager[None]]) -> Prepared | str:
    """A validated, vocabulary-mapped trajectory, or the reason it is rejected.

    ``label_lut(categories)``: each category's store label id (new names join the store's
    vocabulary; ValueError when it is full). ``summary_geometry``: ``GEOMETRY_WALK`` or
    ``GEOMETRY_MAP`` (what is matched and fused). ``timed("describe")`` times the chunk text
    when the trajectory does not carry it."""
    try:
        xy = np.asarray(traj.node_xy, dtype=np.float64)
        sectors = np.asarray(traj.sectors)
        edges = np.asarray(traj.edges, dtype=np.int64).reshape(-1, 2)
        categories = tuple(traj.categories)
        goal = str(traj.goal)
        ref = float(traj.reference_yaw)
    except (AttributeError, TypeError, ValueError) as exc:
        return f"not a topo-polar trajectory: {exc}"
    if xy.ndim != 2 or xy.shape[1] != 2 or len(xy) < 2:
        return f"needs at least 2 nodes with (x, y), got node_xy shape {xy.shape}"
    if not np.isfinite(xy).all():
        return f"node_xy has non-finite values at nodes {np.where(~np.isfinite(xy).all(1))[0].tolist()}"
    if sectors.shape != (len(xy), N_SECTORS) or not np.issubdtype(sectors.dtype, np.integer):
        return f"sectors must be int ({len(xy)}, {N_SECTORS}), got {sectors.dtype} {sectors.shape}"
    bad = (sectors < UNKNOWN) | (sectors >= len(categories))
    if bad.any():
        return (f"unknown sector labels {sorted(set(sectors[bad].tolist()))[:5]} "
                f"(valid: {FREE}, {OBSTACLE}, {UNKNOWN} and 0..{len(categories) - 1})")
    if len(edges) and (edges.min() < 0 or edges.max() >= len(xy)):
        return f"edges reference nodes outside 0..{len(xy) - 1}"
    if not goal:
        return "empty goal"
    if not math.isfinite(ref):
        return f"reference_yaw is {ref}"
    try:
        lut = label_lut(categories)
    except ValueError as exc:
        return str(exc)
    mapped = to_store_labels(sectors, lut)
    success = bool(first_attr(traj, ("success",), False))
    if description is None:
        description = first_attr(traj, ("description",))
    if description is None:
        with timed("describe"):
            description = chunk_description(traj)
    place = map_geometry(traj, xy, lut, ref)
    if isinstance(place, str):
        return place
    place_nodes, place_walk_nodes = place if place is not None else (None, None)
    geometry, walk_nodes = Nodes(xy, mapped, edges, ref), np.arange(len(xy))
    if summary_geometry == GEOMETRY_MAP and place is not None:
        geometry, walk_nodes = place
    return Prepared(
        trajectory_id=tid, node_xy=xy, sectors=mapped, edges=edges, goal=goal,
        reference_yaw=ref,
        scene_hint=str(first_attr(traj, ("scene_hint", "scene_key", "scene_id", "scene"), "")),
        episode_id=str(first_attr(traj, ("episode_id",), "")),
        policy=str(policy if policy is not None else first_attr(traj, ("policy",), "")),
        success=success, description=str(description), geometry=geometry, walk_nodes=walk_nodes,
        place=place_nodes, place_walk_nodes=place_walk_nodes)


def map_geometry(traj: Any, xy: np.ndarray, lut: np.ndarray,
                 ref: float) -> tuple[Nodes, np.ndarray] | str | None:
    """The map the trajectory was walked in (``traj.place``, a ``topo.candidates.MapPlace``
    whose nodes ``traj.node_ids`` index) as matching geometry, or None when it carries none,
    or the reason it does not fit the trajectory."""
    place = getattr(traj, "place", None)
    if place is None:
        return None
    ids = np.asarray(getattr(traj, "node_ids", ()), dtype=np.int64)
    pxy = np.asarray(place.node_xy, dtype=np.float64).reshape(-1, 2)
    if len(ids) != len(xy) or ids.min(initial=0) < 0 or ids.max(initial=0) >= len(pxy) \
            or not np.allclose(pxy[ids], xy, atol=1e-3):
        return "its map place does not hold its nodes (node_ids do not index place.node_xy)"
    if tuple(place.categories) != tuple(traj.categories) or float(place.reference_yaw) != ref:
        return "its map place has other categories or another reference heading"
    sectors = np.asarray(place.sectors)
    if not np.isfinite(pxy).all() or sectors.shape != (len(pxy), N_SECTORS) \
            or ((sectors < UNKNOWN) | (sectors >= len(lut))).any():
        return "its map place has non-finite positions or invalid sector labels"
    return Nodes(pxy, to_store_labels(sectors, lut), np.asarray(place.edges, dtype=np.int64).reshape(-1, 2), ref), ids


def chunk_row(prep: Prepared, gid: int, T: Transform2D, summary_nodes: np.ndarray) -> dict:
    """The chunks-table row ``prep`` becomes in group ``gid`` (``T``: its frame -> the group's;
    ``summary_nodes``: the summary node of each walked node)."""
    return {
        "trajectory_id": prep.trajectory_id, "group_id": gid, "scene_hint": prep.scene_hint,
        "goal": prep.goal, "n_nodes": len(prep.node_xy),
        "node_xy": prep.node_xy.astype(np.float32).ravel(),
        "sectors": prep.sectors.astype(np.int8).ravel(),
        "edges": prep.edges.astype(np.int32).ravel(),
        "summary_nodes": np.asarray(summary_nodes, dtype=np.int32),
        "group_transform": np.asarray(T.as_list(), dtype=np.float32),
        "reference_yaw": prep.reference_yaw, "description": prep.description,
        "embedding": None, "encoder_version": None, "episode_id": prep.episode_id,
        "policy": prep.policy, "success": prep.success, "created_at": utc_now(),
        **map_columns(prep)}


def map_columns(prep: Prepared) -> dict:
    """The chunk's ``map_*`` columns (``memory.schema``): its map, or nulls."""
    place = prep.place
    if place is None:
        return dict.fromkeys(MAP_COLUMNS)
    return {"map_xy": place.node_xy.astype(np.float32).ravel(),
            "map_sectors": place.sectors.astype(np.int8).ravel(),
            "map_edges": place.edges.astype(np.int32).ravel(),
            "map_walk_nodes": prep.place_walk_nodes.astype(np.int32)}
