"""Topo-polar trajectories (paper Eqs. 4-5): poses -> nearest nodes -> merged runs -> loop-free path.

``build_topo_polar`` turns a semantic map and the agent's poses into a ``TopoPolarTrajectory``:

1. the map's topological nodes (``topo_graph``: free space cropped to its bounding box,
   cleaned, skeletonised, junctions merged within ``d_min``; ``topo.skeleton``);
2. every pose goes to its nearest node (Eq. 4, ``assign_nodes``);
3. consecutive repeats merge (``merge_consecutive``) and loops are pruned (``prune_loops``:
   f_PL keeps the last occurrence of a node and drops everything since its previous one);
4. each kept node gets its sector vector relative to the reference heading (``topo.sectors``).

Positions are map-frame metres; node cells are ``[row, col]`` of the map grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from scipy.spatial import cKDTree

from trajrag.topo.labels import LABEL_DTYPE, SPECIAL_NAMES
from trajrag.topo.sectors import SemanticMapLike, check_map, sector_vectors
from trajrag.topo.skeleton import clean_free, free_skeleton, skeleton_edges, skeleton_nodes
from trajrag.world.frames import cell_to_xy, xy_to_cell


@dataclass
class TopoConfig:
    """Topo-polar representation settings (values and their sources: ``configs/topo.yaml``).

    d_min_m: NMS radius merging junction candidates, metres.
    sector_radius_m: ray length R, metres. n_sectors: rays per node (30 deg apart for 12).
    ray_step_cells: spacing of the samples along a ray, cells.
    object_dilation_m: radius of the disk dilating object channels before ray sampling, metres.
    include_end_nodes: also use skeleton end points (dead ends) as nodes.
    min_branch_m, spur_clearance_factor: an end branch of the skeleton shorter than
        ``min_branch_m`` (metres) + factor x the free-space clearance at its junction is pruned.
    min_free_island_m2: free components up to this area are dropped before thinning, m^2.
    min_obstacle_hole_m2: obstacle specks up to this area inside free space are filled, m^2.
    """

    d_min_m: float
    sector_radius_m: float
    n_sectors: int
    ray_step_cells: float
    object_dilation_m: float
    include_end_nodes: bool
    min_branch_m: float
    spur_clearance_factor: float
    min_free_island_m2: float
    min_obstacle_hole_m2: float


# -- grid <-> metres ----------------------------------------------------------------------------
# -- the node set of a map ------------------------------------------------------------------------
@dataclass
class TopoGraph:
    """The topological nodes of one semantic map and the skeleton edges between them.

    cells: int (K, 2) ``[row, col]``; xy: float (K, 2) cell centres, metres;
    edges: int (E, 2) undirected ``i < j`` (nodes joined along the skeleton; empty when not computed).
    """

    cells: np.ndarray
    xy: np.ndarray
    edges: np.ndarray

    def __len__(self) -> int:
        return len(self.cells)


def topo_graph(sem_map: SemanticMapLike, cfg: TopoConfig, anchor_xy: np.ndarray | None = None,
               with_edges: bool = True) -> TopoGraph:
    """Nodes (and optionally skeleton edges) of ``sem_map``'s free space.

    The map is cropped to the explored bounding box plus one cell first, so the cost follows
    the explored area, not the map size. ``anchor_xy`` (metres; the agent) picks the
    fallback node when the skeleton has no junction, and is itself the node when there is no
    free space at all.
    """
    check_map(sem_map)
    cell = float(sem_map.cell_size)
    anchor = None if anchor_xy is None else xy_to_cell(anchor_xy, sem_map.origin, cell)
    explored = np.asarray(sem_map.explored, dtype=bool)
    rows, cols = np.flatnonzero(explored.any(axis=1)), np.flatnonzero(explored.any(axis=0))
    if len(rows) == 0:
        cells = np.zeros((0, 2), dtype=np.int64) if anchor is None else anchor.reshape(1, 2)
        return TopoGraph(cells, cell_to_xy(cells, sem_map.origin, cell), np.zeros((0, 2), dtype=np.int64))
    # Free space lies inside the explored box: crop to it (+1 cell) before anything else.
    r0, c0 = max(rows[0] - 1, 0), max(cols[0] - 1, 0)
    window = (slice(r0, rows[-1] + 2), slice(c0, cols[-1] + 2))
    crop = explored[window] & ~np.asarray(sem_map.obstacle[window], dtype=bool)
    crop = clean_free(crop, cell, cfg.min_free_island_m2, cfg.min_obstacle_hole_m2)
    skel = free_skeleton(crop, cell, cfg.min_branch_m, cfg.spur_clearance_factor)
    local_anchor = None if anchor is None else anchor - (r0, c0)
    nodes = skeleton_nodes(skel, cell, cfg.d_min_m, include_ends=cfg.include_end_nodes, anchor_cell=local_anchor)
    edges = skeleton_edges(skel, nodes) if with_edges else np.zeros((0, 2), dtype=np.int64)
    if len(nodes) == 0:  # everything free was speckle
        nodes = np.zeros((0, 2), dtype=np.int64) if anchor is None else local_anchor.reshape(1, 2)
    cells = nodes + np.array([r0, c0])
    return TopoGraph(cells, cell_to_xy(cells, sem_map.origin, cell), edges)


# -- Eq. 4 and f_PL -------------------------------------------------------------------------------
def assign_nodes(poses_xy: np.ndarray, node_xy: np.ndarray) -> np.ndarray:
    """Index of the nearest node (Euclidean, Eq. 4) for each position: int (T,)."""
    node_xy = np.asarray(node_xy, dtype=np.float64).reshape(-1, 2)
    if len(node_xy) == 0:
        raise ValueError("assign_nodes: no nodes to assign poses to")
    _, idx = cKDTree(node_xy).query(np.asarray(poses_xy, dtype=np.float64).reshape(-1, 2), k=1)
    return np.asarray(idx, dtype=np.int64)


def merge_consecutive(seq: Sequence[int] | np.ndarray, return_starts: bool = False):
    """Collapse runs of equal consecutive values: ``[a, a, b, a] -> [a, b, a]``.

    With ``return_starts``, also the index in ``seq`` where each run starts.
    """
    seq = np.asarray(seq).ravel()
    if len(seq) == 0:
        return (seq, np.zeros(0, dtype=np.int64)) if return_starts else seq
    starts = np.flatnonzero(np.concatenate([[True], seq[1:] != seq[:-1]]))
    return (seq[starts], starts) if return_starts else seq[starts]


def prune_loops(seq: Sequence[int] | np.ndarray, return_index: bool = False):
    """f_PL: when a node reappears, drop everything since its previous occurrence.

    ``[A, B, C, B, D, A, E] -> [A, E]``: only the last occurrence of each node survives and the
    result has no repeats. With ``return_index``, returns the positions in ``seq`` that are kept
    (each node's latest occurrence) instead of the values.
    """
    seq = np.asarray(seq).ravel()
    kept: list[int] = []  # positions in seq
    where: dict[Any, int] = {}  # node -> its index in kept
    for pos, node in enumerate(seq.tolist()):
        if node in where:
            cut = where[node]
            for dropped in kept[cut:]:
                del where[seq[dropped].item()]
            del kept[cut:]
        where[node] = len(kept)
        kept.append(pos)
    index = np.asarray(kept, dtype=np.int64)
    return index if return_index else seq[index]


# -- the trajectory -------------------------------------------------------------------------------
@dataclass
class TopoPolarTrajectory:
    """A loop-free topo-polar trajectory T_tp = (V, E) (Eq. 5).

    node_xy: float (K, 2) map-frame node positions, metres (episode-specific frame).
    sectors: int16 (K, n_sectors) label codes (``topo.labels``), sector 0 = left of ``reference_yaw``.
    categories: the category names that the label codes index.
    goal: the goal category name. reference_yaw: radians, map frame (the start heading).
    success: whether the episode reached the goal. episode_id, scene_id: provenance.
    node_visit_steps: int (K,) step at which the agent arrived at each node on its kept visit
        (-1 for nodes not visited, e.g. the hypothetical part of a candidate path).
    node_ids: int (K,) index of each node in the node set of the map it was built from (the
        ``TopoGraph``); negative for nodes outside it (a frontier). Only meaningful online.
    The edges are the directed consecutive pairs ``(k, k + 1)`` (``edges``).
    """

    node_xy: np.ndarray
    sectors: np.ndarray
    categories: tuple[str, ...]
    goal: str
    reference_yaw: float
    success: bool = False
    episode_id: str = ""
    scene_id: str = ""
    node_visit_steps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    node_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __post_init__(self) -> None:
        where = f"trajectory {self.scene_id or '?'}/{self.episode_id or '?'}"
        self.node_xy = np.asarray(self.node_xy, dtype=np.float64).reshape(-1, 2)
        k = len(self.node_xy)
        if k == 0:
            raise ValueError(f"{where}: a topo-polar trajectory needs at least one node")
        self.sectors = np.asarray(self.sectors, dtype=LABEL_DTYPE)
        if self.sectors.ndim != 2 or len(self.sectors) != k:
            raise ValueError(f"{where}: sectors shape {self.sectors.shape} does not match {k} nodes")
        self.categories = tuple(str(c) for c in self.categories)
        bad = (self.sectors >= len(self.categories)) | (self.sectors < min(SPECIAL_NAMES))
        if bad.any():
            raise ValueError(f"{where}: sector labels {np.unique(self.sectors[bad]).tolist()} are not valid "
                             f"for {len(self.categories)} categories")
        for name in ("node_visit_steps", "node_ids"):
            value = np.asarray(getattr(self, name), dtype=np.int64).ravel()
            if len(value) == 0:
                value = np.full(k, -1, dtype=np.int64)
            if len(value) != k:
                raise ValueError(f"{where}: {name} has {len(value)} entries for {k} nodes")
            setattr(self, name, value)
        self.reference_yaw = float(self.reference_yaw)
        self.success = bool(self.success)
        self.goal, self.episode_id, self.scene_id = str(self.goal), str(self.episode_id), str(self.scene_id)

    def __len__(self) -> int:
        return len(self.node_xy)

    @property
    def n_sectors(self) -> int:
        return self.sectors.shape[1]

    @property
    def edges(self) -> np.ndarray:
        """Directed edges between consecutive nodes: int (K - 1, 2)."""
        k = np.arange(max(len(self) - 1, 0), dtype=np.int64)
        return np.stack([k, k + 1], axis=1)

    def length_m(self) -> float:
        """Path length along the nodes, metres."""
        return float(np.linalg.norm(np.diff(self.node_xy, axis=0), axis=1).sum())

    # -- serialisation ---------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """JSON-able dict (lists and scalars only); ``edges`` is included for readers, ignored on load."""
        return {
            "episode_id": self.episode_id,
            "scene_id": self.scene_id,
            "goal": self.goal,
            "success": self.success,
            "reference_yaw": self.reference_yaw,
            "categories": list(self.categories),
            "node_xy": self.node_xy.tolist(),
            "sectors": self.sectors.tolist(),
            "edges": self.edges.tolist(),
            "node_visit_steps": self.node_visit_steps.tolist(),
            "node_ids": self.node_ids.tolist(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TopoPolarTrajectory":
        """Inverse of ``to_dict``; a missing key raises ``ValueError`` naming it."""
        required = ("goal", "reference_yaw", "categories", "node_xy", "sectors")
        missing = [key for key in required if key not in data]
        if missing:
            raise ValueError(f"topo-polar trajectory dict lacks {missing} (episode {data.get('episode_id', '?')})")
        return cls(
            node_xy=np.asarray(data["node_xy"], dtype=np.float64).reshape(-1, 2),
            sectors=np.asarray(data["sectors"], dtype=LABEL_DTYPE),
            categories=tuple(data["categories"]),
            goal=data["goal"],
            reference_yaw=data["reference_yaw"],
            success=data.get("success", False),
            episode_id=data.get("episode_id", ""),
            scene_id=data.get("scene_id", ""),
            node_visit_steps=data.get("node_visit_steps", []),
            node_ids=data.get("node_ids", []),
        )

    def to_columns(self) -> dict:
        """One flat row for Arrow / LanceDB: scalars and 1-D lists (sectors flattened row-major).

        ``node_ids`` is left out: it only means something next to the map it was built from.
        """
        return {
            "episode_id": self.episode_id,
            "scene_id": self.scene_id,
            "goal": self.goal,
            "success": self.success,
            "reference_yaw": self.reference_yaw,
            "categories": list(self.categories),
            "n_nodes": len(self),
            "n_sectors": self.n_sectors,
            "node_x": self.node_xy[:, 0].tolist(),
            "node_y": self.node_xy[:, 1].tolist(),
            "sectors": self.sectors.ravel().tolist(),
            "node_visit_steps": self.node_visit_steps.tolist(),
        }

    @classmethod
    def from_columns(cls, row: Mapping[str, Any]) -> "TopoPolarTrajectory":
        """Inverse of ``to_columns``."""
        n_sectors = int(row["n_sectors"])
        return cls(
            node_xy=np.stack([np.asarray(row["node_x"], float), np.asarray(row["node_y"], float)], axis=1),
            sectors=np.asarray(row["sectors"], dtype=LABEL_DTYPE).reshape(-1, n_sectors),
            categories=tuple(row["categories"]),
            goal=row["goal"],
            reference_yaw=row["reference_yaw"],
            success=row["success"],
            episode_id=row["episode_id"],
            scene_id=row["scene_id"],
            node_visit_steps=row["node_visit_steps"],
        )


def _check_poses(poses: np.ndarray, where: str) -> np.ndarray:
    poses = np.asarray(poses, dtype=np.float64)
    if poses.ndim != 2 or poses.shape[1] != 3 or len(poses) == 0:
        raise ValueError(f"{where}: poses must be a non-empty (T, 3) array of x, y, yaw; got shape {poses.shape}")
    if not np.isfinite(poses).all():
        bad = int(np.flatnonzero(~np.isfinite(poses).all(axis=1))[0])
        raise ValueError(f"{where}: pose {bad} is not finite: {poses[bad].tolist()}")
    return poses


def build_topo_polar(sem_map: SemanticMapLike, poses: np.ndarray, goal: str, cfg: TopoConfig,
                     reference_yaw: float | None = None, success: bool = False, episode_id: str = "",
                     scene_id: str = "", graph: TopoGraph | None = None) -> TopoPolarTrajectory:
    """The topo-polar trajectory of an episode (Eq. 5).

    sem_map: the episode's semantic map (``SemanticMapLike``). poses: float (T, 3) map-frame
    ``x, y`` (metres) and yaw (radians), one per step. reference_yaw: radians, the heading whose
    left is sector 0 (the same for every node, so sectors are comparable along the trajectory);
    defaults to the first pose's yaw (the episode's start heading).
    graph: the map's ``TopoGraph`` if already computed (online, to share node ids with
    candidate paths); otherwise computed here without edges.
    """
    where = f"episode {scene_id or '?'}/{episode_id or '?'}"
    poses = _check_poses(poses, where)
    check_map(sem_map, f"{where}: semantic map")
    if graph is None:
        graph = topo_graph(sem_map, cfg, anchor_xy=poses[-1, :2], with_edges=False)
    if len(graph) == 0:  # no free space and no anchor: the agent's cell is the only node
        cells = xy_to_cell(poses[-1, :2], sem_map.origin, sem_map.cell_size).reshape(1, 2)
        graph = TopoGraph(cells, cell_to_xy(cells, sem_map.origin, sem_map.cell_size), np.zeros((0, 2), np.int64))
    ref = float(poses[0, 2]) if reference_yaw is None else float(reference_yaw)
    runs, starts = merge_consecutive(assign_nodes(poses[:, :2], graph.xy), return_starts=True)
    keep = prune_loops(runs, return_index=True)
    ids = runs[keep]
    return TopoPolarTrajectory(
        node_xy=graph.xy[ids],
        sectors=sector_vectors(sem_map, graph.cells[ids], ref, cfg),
        categories=tuple(sem_map.categories),
        goal=goal,
        reference_yaw=ref,
        success=success,
        episode_id=episode_id,
        scene_id=scene_id,
        node_visit_steps=starts[keep],
        node_ids=ids,
    )
