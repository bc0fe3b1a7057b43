"""Candidate paths to frontiers over the current topo graph (paper Sec. 3.3).

"A breadth-first search (BFS) is performed over the current topo-polar trajectory to compute
paths leading to all valid frontiers." Here:

* the graph is the current map's topological nodes with undirected edges (the skeleton edges of
  ``topo_graph`` plus the transitions the agent actually made), searched from the agent's node;
* a frontier is *valid* when the node nearest to its centroid, among the nodes in the same
  connected free-space region as the frontier, is reachable in that graph; a frontier behind a
  wall is thus never routed through a node on the wall's other side;
* each candidate is the hypothetical trajectory "what has been walked so far + the BFS path +
  a final node at the frontier centroid", loop-pruned (f_PL) like a stored trajectory so the
  retriever encodes both the same way. Its frontier node carries the frontier's own sector
  vector (Eq. 3 at the centroid).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

import numpy as np
from scipy import ndimage, sparse
from scipy.sparse.csgraph import breadth_first_order

from trajrag.topo.sectors import SemanticMapLike, check_map, free_space, sector_vectors
from trajrag.topo.trajectory import (
    TopoConfig,
    TopoGraph,
    TopoPolarTrajectory,
    build_topo_polar,
    prune_loops,
    topo_graph,
)
from trajrag.topo.labels import LABEL_DTYPE
from trajrag.world.frames import xy_to_cell

_EIGHT = np.ones((3, 3), dtype=bool)


class FrontierLike(Protocol):
    """What is read from a frontier (``mapping``).

    centroid_xy: (2,) map-frame metres. cells: int (K, 2) ``[row, col]`` of the frontier.
    """

    centroid_xy: np.ndarray
    cells: np.ndarray


@dataclass
class CandidatePath:
    """One way to a frontier.

    frontier_index: index into the frontier list. node_path: int (L,) graph node ids from the
    agent's node to the node nearest the frontier (both included). length_m: metres along the
    path plus the last leg to the frontier centroid. trajectory: the hypothetical loop-free
    topo-polar trajectory (walked part + path + frontier node, whose ``node_ids`` entry is
    ``-1 - frontier_index``).
    """

    frontier_index: int
    node_path: np.ndarray
    length_m: float
    trajectory: TopoPolarTrajectory


def frontier_node(node_cells: np.ndarray, frontiers: Sequence[FrontierLike], free: np.ndarray,
                  origin: Sequence[float], cell_size: float) -> np.ndarray:
    """For each frontier, the nearest node in its free-space region, or -1: int (F,).

    Regions are 8-connected components of ``free`` (bool (H, W)) with the node cells added (a
    node on a filled speck still belongs to the region around it). A frontier's region is the
    most common one among its cells and their 8 neighbours (frontier cells may be the unknown
    side of the border). Distances are from the frontier centroid to the node cell centres.
    """
    node_cells = np.asarray(node_cells, dtype=np.int64).reshape(-1, 2)
    free = np.asarray(free, dtype=bool)
    frontier_cells = [np.asarray(f.cells, dtype=np.int64).reshape(-1, 2) for f in frontiers]
    lo, hi = _window(free, [node_cells, *frontier_cells])
    mask = free[lo[0] : hi[0], lo[1] : hi[1]].copy()
    shape = mask.shape
    local = node_cells - lo
    inside = _in_bounds(local, shape)
    mask[local[inside, 0], local[inside, 1]] = True
    regions, _ = ndimage.label(mask, structure=_EIGHT)
    node_region = np.zeros(len(node_cells), dtype=np.int64)
    node_region[inside] = regions[local[inside, 0], local[inside, 1]]
    node_xy = np.stack([origin[0] + (node_cells[:, 1] + 0.5) * cell_size,
                        origin[1] + (node_cells[:, 0] + 0.5) * cell_size], axis=1)
    ring = np.array([(dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1)])
    out = np.full(len(frontiers), -1, dtype=np.int64)
    for f, (frontier, cells) in enumerate(zip(frontiers, frontier_cells)):
        around = (cells[:, None, :] + ring[None] - lo).reshape(-1, 2)
        around = around[_in_bounds(around, shape)]
        labels = regions[around[:, 0], around[:, 1]]
        labels = labels[labels > 0]
        if len(labels) == 0:
            continue
        region = np.bincount(labels).argmax()
        members = np.flatnonzero(node_region == region)
        if len(members) == 0:
            continue
        d = np.linalg.norm(node_xy[members] - np.asarray(frontier.centroid_xy, float)[None], axis=1)
        out[f] = members[np.argmin(d)]
    return out


def _window(free: np.ndarray, cell_sets: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Corners ``lo`` (inclusive) and ``hi`` (exclusive) of the grid window holding the free space
    and the given cells, plus one cell, clipped to the grid: labelling it costs what is explored,
    not the whole map."""
    rows, cols = np.flatnonzero(free.any(axis=1)), np.flatnonzero(free.any(axis=0))
    if len(rows):
        cell_sets = cell_sets + [np.array([[rows[0], cols[0]], [rows[-1], cols[-1]]])]
    corners = np.concatenate(cell_sets) if cell_sets else np.zeros((0, 2), dtype=np.int64)
    if len(corners) == 0:
        return np.zeros(2, dtype=np.int64), np.zeros(2, dtype=np.int64)
    lo = np.maximum(corners.min(axis=0) - 1, 0)
    hi = np.minimum(corners.max(axis=0) + 2, free.shape)
    return lo, hi


def _in_bounds(cells: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    return (cells[:, 0] >= 0) & (cells[:, 0] < shape[0]) & (cells[:, 1] >= 0) & (cells[:, 1] < shape[1])


def bfs_predecessors(n_nodes: int, edges: np.ndarray, source: int) -> np.ndarray:
    """BFS tree from ``source`` over undirected ``edges`` (int (E, 2)): predecessor per node, -9999 if unreachable."""
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    if not 0 <= source < n_nodes:
        raise ValueError(f"current node {source} is not one of the {n_nodes} graph nodes")
    if len(edges) and (edges.min() < 0 or edges.max() >= n_nodes):
        raise ValueError(f"edges refer to nodes outside [0, {n_nodes}): {edges[(edges < 0) | (edges >= n_nodes)][:5]}")
    adjacency = sparse.coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n_nodes, n_nodes))
    _, pred = breadth_first_order(adjacency.tocsr(), source, directed=False, return_predecessors=True)
    return pred


def _path(pred: np.ndarray, source: int, target: int) -> np.ndarray | None:
    """Node ids from source to target along the BFS tree, or None if target is unreachable."""
    if target != source and pred[target] < 0:
        return None
    path = [target]
    while path[-1] != source:
        path.append(int(pred[path[-1]]))
    return np.asarray(path[::-1], dtype=np.int64)


def candidate_paths(node_xy: np.ndarray, edges: np.ndarray, current_node: int, frontiers: Sequence[FrontierLike],
                    sem_map: SemanticMapLike, cfg: TopoConfig, current: TopoPolarTrajectory) -> list[CandidatePath]:
    """Candidate paths from ``current_node`` to every valid frontier, as hypothetical trajectories.

    node_xy: float (K, 2) graph node positions (metres; cell centres of ``sem_map``).
    edges: int (E, 2) undirected graph edges. current_node: the agent's graph node.
    frontiers: ``FrontierLike`` objects. current: the trajectory walked so far, whose
    ``node_ids`` index the same graph (``build_topo_polar(..., graph=...)``); its goal, reference
    heading and ids carry over to the candidates. Frontiers that are not valid are left out.
    """
    check_map(sem_map, "candidate_paths: semantic map")
    node_xy = np.asarray(node_xy, dtype=np.float64).reshape(-1, 2)
    cell = float(sem_map.cell_size)
    node_cells = xy_to_cell(node_xy, sem_map.origin, cell)
    pred = bfs_predecessors(len(node_xy), edges, int(current_node))
    targets = frontier_node(node_cells, frontiers, free_space(sem_map), sem_map.origin, cell)
    routes = []
    for f, target in enumerate(targets):
        path = None if target < 0 else _path(pred, int(current_node), int(target))
        if path is not None:
            routes.append((f, path))
    if not routes:
        return []
    used = np.unique(np.concatenate([p for _, p in routes]))
    node_sectors = dict(zip(used.tolist(), sector_vectors(sem_map, node_cells[used], current.reference_yaw, cfg)))
    centroids = np.array([np.asarray(frontiers[f].centroid_xy, float) for f, _ in routes])
    frontier_sectors = sector_vectors(sem_map, xy_to_cell(centroids, sem_map.origin, cell), current.reference_yaw, cfg)
    out = []
    for (f, path), centroid, f_sectors in zip(routes, centroids, frontier_sectors):
        legs = np.diff(np.vstack([node_xy[path], centroid[None]]), axis=0)
        traj = _hypothetical(current, path, node_xy, node_sectors, f, centroid, f_sectors)
        out.append(CandidatePath(f, path, float(np.linalg.norm(legs, axis=1).sum()), traj))
    return out


def _hypothetical(current: TopoPolarTrajectory, path: np.ndarray, node_xy: np.ndarray, node_sectors: dict,
                  frontier_index: int, centroid: np.ndarray, frontier_sectors: np.ndarray) -> TopoPolarTrajectory:
    """The walked trajectory + BFS path + the frontier node, loop-pruned (f_PL)."""
    new = path[1:] if len(current) and current.node_ids[-1] == path[0] else path
    ids = np.concatenate([current.node_ids, new, [-1 - frontier_index]])
    xy = np.vstack([current.node_xy, node_xy[new], centroid[None]])
    sectors = np.vstack([current.sectors] + [node_sectors[int(i)][None] for i in new] + [frontier_sectors[None]])
    steps = np.concatenate([current.node_visit_steps, np.full(len(new) + 1, -1)])
    keep = prune_loops(ids, return_index=True)
    return TopoPolarTrajectory(
        node_xy=xy[keep], sectors=sectors[keep], categories=current.categories, goal=current.goal,
        reference_yaw=current.reference_yaw, success=False, episode_id=current.episode_id,
        scene_id=current.scene_id, node_visit_steps=steps[keep], node_ids=ids[keep],
    )


def step_candidates(sem_map: SemanticMapLike, poses: np.ndarray, frontiers: Sequence[FrontierLike], goal: str,
                    cfg: TopoConfig, reference_yaw: float | None = None, episode_id: str = "",
                    scene_id: str = "") -> tuple[TopoPolarTrajectory, list[CandidatePath], TopoGraph]:
    """One online step: the map's graph, the trajectory so far and the candidate paths.

    poses: float (T, 3) map-frame x, y (metres), yaw (radians) up to now; the agent's node is
    the one its latest pose is nearest to. The BFS graph is the skeleton edges plus the
    transitions of the walked trajectory.
    """
    poses = np.asarray(poses, dtype=np.float64)
    graph = topo_graph(sem_map, cfg, anchor_xy=poses[-1, :2] if poses.ndim == 2 and len(poses) else None)
    traj = build_topo_polar(sem_map, poses, goal, cfg, reference_yaw=reference_yaw,
                            episode_id=episode_id, scene_id=scene_id, graph=graph)
    walked = np.stack([traj.node_ids[:-1], traj.node_ids[1:]], axis=1)
    edges = np.concatenate([graph.edges.reshape(-1, 2), walked]).astype(np.int64)
    current_node = int(traj.node_ids[-1])
    return traj, candidate_paths(graph.xy, edges, current_node, frontiers, sem_map, cfg, traj), graph


@dataclass
class MapPlace:
    """Every node of the current map's topo graph with its sector vector: the query that
    recognises a place the memory has seen (``retrieval.project_goal``). Unlike a candidate
    path it does not depend on which nodes were walked, so the part of a home that was only
    seen from afar counts too.

    node_xy: float (K, 2) map-frame metres. sectors: int16 (K, n_sectors), label codes indexing
    ``categories`` as in ``TopoPolarTrajectory``. edges: int (E, 2) undirected node pairs (the
    skeleton's and the walked transitions). reference_yaw: radians, the heading of sector 0's left.
    """

    node_xy: np.ndarray
    sectors: np.ndarray
    edges: np.ndarray
    categories: tuple[str, ...]
    reference_yaw: float

    def __post_init__(self) -> None:
        self.node_xy = np.asarray(self.node_xy, dtype=np.float64).reshape(-1, 2)
        self.sectors = np.asarray(self.sectors, dtype=LABEL_DTYPE).reshape(len(self.node_xy), -1)
        self.edges = np.asarray(self.edges, dtype=np.int64).reshape(-1, 2)
        if len(self.edges) and (self.edges.min() < 0 or self.edges.max() >= len(self.node_xy)):
            raise ValueError(f"map place: edges name nodes outside 0..{len(self.node_xy) - 1}")
        self.categories = tuple(str(c) for c in self.categories)
        self.reference_yaw = float(self.reference_yaw)

    def __len__(self) -> int:
        return len(self.node_xy)

    def to_dict(self) -> dict:
        """JSON-able dict (lists and scalars only)."""
        return {"node_xy": self.node_xy.tolist(), "sectors": self.sectors.tolist(), "edges": self.edges.tolist(),
                "categories": list(self.categories), "reference_yaw": self.reference_yaw}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "MapPlace":
        """Inverse of ``to_dict``; a missing key raises ``ValueError`` naming it."""
        missing = [k for k in ("node_xy", "sectors", "edges", "categories", "reference_yaw") if k not in data]
        if missing:
            raise ValueError(f"map place dict lacks {missing}")
        return cls(data["node_xy"], data["sectors"], data["edges"], tuple(data["categories"]), data["reference_yaw"])


def map_place(sem_map: SemanticMapLike, graph: TopoGraph, walked: TopoPolarTrajectory, cfg: TopoConfig) -> MapPlace:
    """The whole current map as one ``MapPlace``: ``graph``'s nodes with their sector vectors
    (Eq. 3, in ``walked``'s reference heading) and its skeleton edges plus ``walked``'s
    transitions (``walked.node_ids`` index ``graph``)."""
    ids = walked.node_ids
    steps = np.stack([ids[:-1], ids[1:]], axis=1) if len(ids) > 1 else np.zeros((0, 2), dtype=np.int64)
    steps = steps[(steps >= 0).all(axis=1) & (steps < len(graph)).all(axis=1) & (steps[:, 0] != steps[:, 1])]
    edges = np.unique(np.sort(np.concatenate([graph.edges.reshape(-1, 2), steps]), axis=1), axis=0)
    sectors = sector_vectors(sem_map, graph.cells, walked.reference_yaw, cfg)
    return MapPlace(graph.xy, sectors, edges, walked.categories, walked.reference_yaw)
