"""Frontiers: the boundary between explored free space and unexplored space (paper Sec. 3.3).

A frontier cell is a free cell (explored, no obstacle) with an unexplored 4-neighbour. Frontier
cells are grouped by 8-connectivity; groups shorter than ``min_size_m`` (narrower than the agent:
it could not pass) are dropped as noise, and, given the agent's position, so are groups the agent
cannot reach through free space. Each frontier is represented by one of its own cells, the one
nearest to the group's geometric centroid, so the waypoint handed to the local policy lies on the
frontier (a curved frontier's mean can fall in unexplored space or inside a wall).

Everything is computed inside the explored bounding box (+1 cell), so the cost scales with the
explored area, not the 960 x 960 map.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from skimage.measure import label

from trajrag.mapping.semantic_map import FrontierConfig, MappingConfig, SemanticMap, dilate_disk


@dataclass
class Frontier:
    """One frontier segment.

    id: index in the list ``find_frontiers`` returned (stable only within one call).
    cells: int64 (K, 2) ``(row, col)`` map cells of the segment.
    centroid_cell: int64 (2,) the segment's cell nearest to its geometric centroid.
    centroid_xy: float (2,) map-frame metres of ``centroid_cell``'s centre.
    size: number of cells.
    """

    id: int
    cells: np.ndarray
    centroid_cell: np.ndarray
    centroid_xy: np.ndarray
    size: int


def frontier_mask(free: np.ndarray, explored: np.ndarray) -> np.ndarray:
    """Bool: free cells with at least one unexplored 4-neighbour (cells outside the array are not)."""
    unexplored = ~explored
    near = np.zeros_like(free)
    near[1:, :] |= unexplored[:-1, :]
    near[:-1, :] |= unexplored[1:, :]
    near[:, 1:] |= unexplored[:, :-1]
    near[:, :-1] |= unexplored[:, 1:]
    return free & near


def find_frontiers(
    sem_map: SemanticMap,
    cfg: FrontierConfig | MappingConfig,
    agent_xy: np.ndarray | None = None,
) -> list[Frontier]:
    """Frontier segments of ``sem_map`` (largest first).

    cfg: the ``frontier`` part of the mapping config (a whole ``MappingConfig`` is accepted too).
    agent_xy: map-frame metres; if given, keep only frontiers reachable from there through free
        space with obstacles inflated by ``reachable_clearance_m``.
    """
    if isinstance(cfg, MappingConfig):
        cfg = cfg.frontier
    bbox = sem_map.explored_bbox(margin=1)
    if bbox is None:
        return []
    r0, r1, c0, c1 = bbox
    explored = sem_map.explored[r0:r1, c0:c1]
    obstacle = sem_map.obstacle[r0:r1, c0:c1]
    free = explored & ~obstacle
    cells_per_m = 1.0 / sem_map.cell_size
    front = frontier_mask(free, explored)
    if cfg.obstacle_clearance_m > 0:
        front &= ~dilate_disk(obstacle, cfg.obstacle_clearance_m * cells_per_m)
    labels, n = label(front, connectivity=2, return_num=True)
    if n == 0:
        return []
    sizes = np.bincount(labels.ravel(), minlength=n + 1)
    keep = sizes >= cfg.min_size_m * cells_per_m
    keep[0] = False
    if agent_xy is not None:
        keep &= _reachable_labels(labels, n, free, obstacle, sem_map, (r0, c0), agent_xy, cfg)
    return _collect(labels, keep, sizes, sem_map, (r0, c0))


def _reachable_labels(
    labels: np.ndarray,
    n: int,
    free: np.ndarray,
    obstacle: np.ndarray,
    sem_map: SemanticMap,
    offset: tuple[int, int],
    agent_xy: np.ndarray,
    cfg: FrontierConfig,
) -> np.ndarray:
    """Bool (n + 1,): which frontier labels touch the agent's free-space component."""
    reachable = np.zeros(n + 1, dtype=bool)
    clearance = cfg.reachable_clearance_m / sem_map.cell_size
    navigable = free & ~dilate_disk(obstacle, clearance) if clearance >= 1 else free.copy()
    agent = sem_map.to_cell(np.asarray(agent_xy, dtype=np.float64)) - np.array(offset)
    seed = _nearest_true(navigable, agent, max_radius=int(np.ceil(clearance)) + 1)
    if seed is None:
        return reachable
    components = label(navigable, connectivity=1)
    component = components[seed[0], seed[1]]
    touched = labels[(components == component) & (labels > 0)]
    reachable[np.unique(touched)] = True
    return reachable


def _nearest_true(mask: np.ndarray, cell: np.ndarray, max_radius: int) -> tuple[int, int] | None:
    """The ``True`` cell of ``mask`` nearest to ``cell`` within ``max_radius`` cells, or None.

    The agent's own cell can sit inside the inflated obstacles (it stands close to a wall), so
    reachability starts from the nearest navigable cell instead.
    """
    h, w = mask.shape
    r, c = int(cell[0]), int(cell[1])
    r0, r1 = max(r - max_radius, 0), min(r + max_radius + 1, h)
    c0, c1 = max(c - max_radius, 0), min(c + max_radius + 1, w)
    if r0 >= r1 or c0 >= c1:
        return None
    rr, cc = np.nonzero(mask[r0:r1, c0:c1])
    if rr.size == 0:
        return None
    d2 = (rr + r0 - r) ** 2 + (cc + c0 - c) ** 2
    i = int(np.argmin(d2))
    if d2[i] > max_radius**2:
        return None
    return int(rr[i] + r0), int(cc[i] + c0)


def _collect(
    labels: np.ndarray, keep: np.ndarray, sizes: np.ndarray, sem_map: SemanticMap, offset: tuple[int, int]
) -> list[Frontier]:
    """Build ``Frontier`` objects for the kept labels, largest first (ties: scan order)."""
    kept = np.flatnonzero(keep)
    if kept.size == 0:
        return []
    idx = np.flatnonzero(labels)  # frontier cells only: far fewer than the crop's cells
    flat_labels = labels.ravel()[idx]
    order = np.argsort(flat_labels, kind="stable")
    idx = idx[order]
    bounds = np.searchsorted(flat_labels[order], [kept, kept + 1])
    w = labels.shape[1]
    frontiers = []
    for lab in sorted(kept, key=lambda k: (-sizes[k], k)):
        i = int(np.searchsorted(kept, lab))
        group = idx[bounds[0][i] : bounds[1][i]]
        cells = np.stack([group // w + offset[0], group % w + offset[1]], axis=1).astype(np.int64)
        mean = cells.mean(axis=0)
        centre = cells[int(np.argmin(((cells - mean) ** 2).sum(axis=1)))]
        frontiers.append(
            Frontier(
                id=len(frontiers),
                cells=cells,
                centroid_cell=centre,
                centroid_xy=sem_map.to_xy(centre),
                size=int(cells.shape[0]),
            )
        )
    return frontiers
