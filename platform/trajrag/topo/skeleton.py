"""Skeleton of the free space and its topological nodes (paper Eq. 1 and the distance NMS).

All functions work on grid arrays (``[row, col]`` cells); lengths given in metres are converted
with ``cell_size_m``. Nothing here loops over pixels in Python: neighbourhoods are read with
shifted views of a padded array, components with ``scipy.ndimage.label``.

Pipeline (``junction_nodes``): thin the free space to a one-pixel skeleton (Zhang's thinning,
``skimage.morphology.skeletonize``), optionally prune short spurs, take the pixels whose
8-ring crosses the skeleton at least three times (the crossing number: Eq. 1's "8-neighbourhood
with >= 3 connected components"), merge the ones within ``d_min`` into one node, optionally add
the skeleton's end points, and guarantee at least one node while any skeleton exists.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage
from scipy.spatial import cKDTree
from skimage.morphology import skeletonize
from skimage.segmentation import watershed

# The 8-ring around a pixel in circular order (N, NE, E, SE, S, SW, W, NW) as (drow, dcol).
RING_OFFSETS: tuple[tuple[int, int], ...] = (
    (-1, 0), (-1, 1), (0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1),
)
_EIGHT = np.ones((3, 3), dtype=bool)
_FOUR = ndimage.generate_binary_structure(2, 1)


# -- free space and skeleton ----------------------------------------------------------------
def clean_free(free: np.ndarray, cell_size_m: float, min_island_m2: float, min_hole_m2: float) -> np.ndarray:
    """Free space without speckle: drop free islands and fill obstacle holes smaller than the areas.

    Area-based rather than an opening/closing: a closing of the free space would also erase thin
    walls between two rooms (it closes any obstacle narrower than its disk), while a small hole
    is only filled when it is enclosed by free space. Each hole inside free space is a loop in the
    skeleton, i.e. two spurious junctions, hence the hole filling. Areas in square metres.
    """
    out = np.asarray(free, dtype=bool)
    cell_area = cell_size_m * cell_size_m
    if min_island_m2 > 0:
        out = out & ~_small_components(out, min_island_m2 / cell_area, _EIGHT)
    if min_hole_m2 > 0:
        # Holes are 4-connected: the complement of 8-connected free space.
        out = out | _small_components(~out, min_hole_m2 / cell_area, _FOUR)
    return out


def _small_components(mask: np.ndarray, max_cells: float, structure: np.ndarray) -> np.ndarray:
    """Cells of ``mask`` in connected components of at most ``max_cells`` cells."""
    labels, n = ndimage.label(mask, structure=structure)
    small = np.bincount(labels.ravel(), minlength=n + 1) <= max_cells
    small[0] = False
    return small[labels]


def free_skeleton(free: np.ndarray, cell_size_m: float, min_branch_m: float = 0.0,
                  clearance_factor: float = 0.0) -> np.ndarray:
    """One-pixel skeleton of ``free`` (bool (H, W)) with its spurs pruned (see ``prune_spurs``).

    An end branch is a spur when it is shorter than ``min_branch_m`` plus ``clearance_factor``
    times the free-space clearance (distance to the nearest non-free cell) where it leaves its
    junction. Both zero: the plain skeleton.
    """
    free = np.asarray(free, dtype=bool)
    skel = skeletonize(free)
    clearance = ndimage.distance_transform_edt(free) if clearance_factor > 0 else None
    return prune_spurs(skel, min_branch_m / cell_size_m, clearance, clearance_factor)


def ring(skel: np.ndarray) -> list[np.ndarray]:
    """The 8 ring neighbours of every pixel as bool (H, W) views, in ``RING_OFFSETS`` order."""
    h, w = skel.shape
    padded = np.pad(np.asarray(skel, dtype=bool), 1)
    return [padded[1 + dr : 1 + dr + h, 1 + dc : 1 + dc + w] for dr, dc in RING_OFFSETS]


def crossing_number(skel: np.ndarray) -> np.ndarray:
    """Number of 0 -> 1 transitions around each skeleton pixel's 8-ring (uint8 (H, W); 0 off the skeleton).

    2 on a simple path, 1 at an end, >= 3 where branches meet (Eq. 1). Consecutive ring pixels
    share an edge, so each transition starts one 4-connected run of skeleton neighbours: a branch.
    """
    nb = ring(skel)
    count = np.zeros(skel.shape, dtype=np.uint8)
    for i in range(8):
        count += nb[(i + 1) % 8] & ~nb[i]
    return np.where(skel, count, 0).astype(np.uint8)


def neighbour_count(skel: np.ndarray) -> np.ndarray:
    """Number of skeleton pixels in each skeleton pixel's 8-ring (uint8 (H, W); 0 off the skeleton)."""
    count = np.zeros(skel.shape, dtype=np.uint8)
    for nb in ring(skel):
        count += nb
    return np.where(skel, count, 0).astype(np.uint8)


def prune_spurs(skel: np.ndarray, max_len_cells: float, clearance: np.ndarray | None = None,
                clearance_factor: float = 0.0) -> np.ndarray:
    """Remove end branches (junction -> end point) shorter than a length limit, in pixels.

    The limit is ``max_len_cells``, plus ``clearance_factor * clearance`` at the branch's junction
    when ``clearance`` (float (H, W), cells to the nearest non-free cell) is given.
    Ragged map boundaries (depth noise, furniture legs, the jagged edge of what has been seen)
    grow side branches on the skeleton, and every one of them makes a junction. A branch that
    barely leaves the free disk around its junction only runs into that boundary; one that goes
    well beyond it leads somewhere (a corridor, a doorway, a dead end).

    Branches are the 8-connected pieces left after removing the junctions (crossing number >= 3)
    *and their 8-neighbours*: a branch's first pixel often touches the pixels flanking the
    junction diagonally, so removing the junction pixel alone would not split the branches. A
    branch is a spur when it holds an end point (crossing number <= 1) and touches a junction's
    neighbourhood; end points inside a neighbourhood are one-pixel spurs. Repeats until nothing
    changes (a removed spur leaves its first pixel, a one-pixel spur, behind). Isolated pieces
    (no junction) are kept: they are whole corridors or rooms.
    """
    skel = np.asarray(skel, dtype=bool).copy()
    use_clearance = clearance is not None and clearance_factor > 0
    if max_len_cells <= 0 and not use_clearance:
        return skel
    while True:
        cn = crossing_number(skel)
        junction = cn >= 3
        if not junction.any():
            return skel
        ends = skel & (cn <= 1)
        zone = _dilate8(junction) & skel  # junctions + their neighbours
        labels, n = ndimage.label(skel & ~zone, structure=_EIGHT)
        size = np.bincount(labels.ravel(), minlength=n + 1)
        has_end = np.zeros(n + 1, dtype=bool)
        has_end[labels[ends]] = True
        touches, attach_clearance = _attachments(labels, n, zone, clearance if use_clearance else None)
        limit = float(max_len_cells) + (clearance_factor * attach_clearance if use_clearance else 0.0)
        spur = has_end & touches & (size < limit)
        spur[0] = False
        remove = spur[labels] | (zone & ends & ~junction)
        if not remove.any():
            return skel
        skel &= ~remove


def _dilate8(mask: np.ndarray) -> np.ndarray:
    """``mask`` grown by its 8 neighbours (a 3x3 binary dilation from shifted views: cheaper)."""
    out = mask.copy()
    for nb in ring(mask):
        out |= nb
    return out


def _attachments(labels: np.ndarray, n: int, zone: np.ndarray,
                 clearance: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Per branch label (0..n): does it touch ``zone``, and the largest clearance of the zone
    pixels it touches (zeros without ``clearance``)."""
    touches = np.zeros(n + 1, dtype=bool)
    out = np.zeros(n + 1)
    zr, zc = np.nonzero(zone)
    padded = np.pad(labels, 1)
    for dr, dc in RING_OFFSETS:
        neighbour = padded[1 + zr + dr, 1 + zc + dc]
        touches[neighbour] = True
        if clearance is not None:
            np.maximum.at(out, neighbour, clearance[zr, zc])
    return touches, out


# -- nodes ------------------------------------------------------------------------------------
def merge_nearby(cells: np.ndarray, d_min_cells: float) -> np.ndarray:
    """Distance non-maximum suppression: greedy clusters of radius ``d_min_cells``, one cell each.

    Seeds are taken densest first (most candidates within ``d_min``), so a blob of junction
    pixels collapses around its middle; each cluster is represented by its member closest to the
    cluster centroid, which is a skeleton pixel (the centroid itself may be off the skeleton).
    Repeated until no two representatives are within ``d_min`` (a representative may sit up to
    ``d_min`` from its seed). Returns int (K, 2) cells in deterministic order (row, then col).
    """
    pts = np.asarray(cells, dtype=np.int64).reshape(-1, 2)
    if len(pts) < 2:
        return pts
    while True:
        tree = cKDTree(pts)
        neighbours = tree.query_ball_point(pts, r=d_min_cells)
        density = np.array([len(nb) for nb in neighbours])
        order = np.lexsort((pts[:, 1], pts[:, 0], -density))
        assigned = np.zeros(len(pts), dtype=bool)
        keep = []
        for i in order:
            if assigned[i]:
                continue
            members = np.array([j for j in neighbours[i] if not assigned[j]])
            assigned[members] = True
            centre = pts[members].mean(axis=0)
            keep.append(members[np.argmin(((pts[members] - centre) ** 2).sum(axis=1))])
        merged = pts[np.sort(np.asarray(keep))]
        if len(merged) == len(pts):
            return _sorted_cells(merged)
        pts = merged


def _sorted_cells(cells: np.ndarray) -> np.ndarray:
    return cells[np.lexsort((cells[:, 1], cells[:, 0]))]


def end_points(skel: np.ndarray) -> np.ndarray:
    """Skeleton tips (dead ends, isolated dots): pixels with crossing number <= 1, int (N, 2).

    A tip may have two neighbours when they touch each other; counting neighbours would miss it.
    """
    skel = np.asarray(skel, dtype=bool)
    return np.argwhere(skel & (crossing_number(skel) <= 1))


def skeleton_nodes(skel: np.ndarray, cell_size_m: float, d_min_m: float, *, include_ends: bool = False,
                   anchor_cell: np.ndarray | None = None) -> np.ndarray:
    """Topological nodes of a skeleton (bool (H, W)) as int (K, 2) cells.

    Junctions (crossing number >= 3) merged within ``d_min_m``; with ``include_ends``, also end
    points farther than ``d_min_m`` from every junction node (merged among themselves the same
    way). If that leaves no node but the skeleton is not empty (a plain corridor or room), the
    single node is the skeleton pixel nearest ``anchor_cell`` (the agent), or without an anchor
    the one nearest the skeleton's centroid, so a trajectory always has a node to be assigned to.
    """
    skel = np.asarray(skel, dtype=bool)
    d_min_cells = d_min_m / cell_size_m
    nodes = merge_nearby(np.argwhere(crossing_number(skel) >= 3), d_min_cells)
    if include_ends:
        ends = merge_nearby(end_points(skel), d_min_cells)
        if len(nodes) and len(ends):
            far, _ = cKDTree(nodes).query(ends, k=1)
            ends = ends[far > d_min_cells]
        nodes = _sorted_cells(np.concatenate([nodes, ends]).astype(np.int64))
    if len(nodes) == 0 and skel.any():
        pixels = np.argwhere(skel)
        target = pixels.mean(axis=0) if anchor_cell is None else np.asarray(anchor_cell, dtype=float)
        nodes = pixels[[np.argmin(((pixels - target) ** 2).sum(axis=1))]]
    return nodes.astype(np.int64).reshape(-1, 2)


def junction_nodes(free: np.ndarray, cell_size_m: float, d_min_m: float, *, include_ends: bool = False,
                   min_branch_m: float = 0.0, clearance_factor: float = 0.0,
                   anchor_cell: np.ndarray | None = None) -> np.ndarray:
    """Topological nodes of a free-space mask (bool (H, W)) as int (K, 2) ``[row, col]`` cells.

    ``cell_size_m`` metres per cell; ``d_min_m`` the NMS radius (paper: 0.5 m); ``min_branch_m``
    and ``clearance_factor`` prune spurs first (``free_skeleton``; 0: the paper's plain skeleton).
    See ``skeleton_nodes``.
    """
    free = np.asarray(free)
    if free.ndim != 2:
        raise ValueError(f"free space must be a 2D bool grid, got shape {free.shape}")
    skel = free_skeleton(free.astype(bool), cell_size_m, min_branch_m, clearance_factor)
    return skeleton_nodes(skel, cell_size_m, d_min_m, include_ends=include_ends, anchor_cell=anchor_cell)


# -- graph --------------------------------------------------------------------------------------
def skeleton_edges(skel: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """Undirected edges between nodes joined along the skeleton: int (E, 2), ``i < j``, sorted.

    Every skeleton pixel goes to the node it is nearest to *along the skeleton* (a breadth-first
    flood from all nodes at once: watershed on a flat image); two nodes are joined when their
    regions touch. Nodes must lie on the skeleton; skeleton parts holding no node are ignored.
    """
    skel = np.asarray(skel, dtype=bool)
    nodes = np.asarray(nodes, dtype=np.int64).reshape(-1, 2)
    if len(nodes) < 2:
        return np.zeros((0, 2), dtype=np.int64)
    off = ~skel[nodes[:, 0], nodes[:, 1]]
    if off.any():
        raise ValueError(f"skeleton_edges: nodes {nodes[off].tolist()} are not on the skeleton")
    markers = np.zeros(skel.shape, dtype=np.int32)
    markers[nodes[:, 0], nodes[:, 1]] = np.arange(1, len(nodes) + 1)
    region = watershed(np.zeros(skel.shape, dtype=np.uint8), markers, mask=skel, connectivity=2)
    pairs = []
    h, w = skel.shape
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):  # each unordered neighbour pair once
        a = region[0 : h - dr, max(0, -dc) : w - max(0, dc)]
        b = region[dr:h, max(0, dc) : w - max(0, -dc)]
        touch = (a > 0) & (b > 0) & (a != b)
        if touch.any():
            pairs.append(np.stack([a[touch], b[touch]], axis=1))
    if not pairs:
        return np.zeros((0, 2), dtype=np.int64)
    e = np.concatenate(pairs).astype(np.int64) - 1
    e = np.unique(np.sort(e, axis=1), axis=0)
    return e
