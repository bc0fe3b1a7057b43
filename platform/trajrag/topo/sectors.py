"""Polar sector vectors around topo nodes (paper Eqs. 2-3).

Around each node, ``n_sectors`` rays are cast ``2 pi / n_sectors`` apart; ray ``i`` points at
``reference_yaw + pi/2 + i * 2 pi / n_sectors`` in the map frame, i.e. sector 0 is the left of
the reference heading and indices grow counter-clockwise seen from above (positive yaw).
Each ray returns the label (``topo.labels``) of the first non-free cell within the sector radius.

Grid convention (docs/architecture.md): ``col`` grows with map ``x``, ``row`` with map ``y``, so
a ray at angle ``a`` advances ``(dcol, drow) = (cos a, sin a)`` per unit length.

Rotating a map with ``np.rot90`` (every channel) maps cell ``(r, c)`` to ``(W - 1 - c, r)``, i.e.
map ``(x, y) -> (y, -x)``: the world turns by -90 deg (clockwise seen from above). With the same
reference yaw, what was in sector ``i + 3`` is then in sector ``i``:
``sectors(rot90 map) == np.roll(sectors(map), -3, axis=1)`` (for 12 sectors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np
from scipy import ndimage
from skimage.morphology import disk

from trajrag.topo.labels import FREE, LABEL_DTYPE, OBSTACLE, UNKNOWN

if TYPE_CHECKING:
    from trajrag.topo.trajectory import TopoConfig


class SemanticMapLike(Protocol):
    """What the topo stage reads from a semantic map (``mapping.semantic_map.SemanticMap``).

    obstacle, explored: bool (H, W). objects: bool (N_o, H, W), channel ``k`` = ``categories[k]``.
    cell_size: metres per cell. origin: map-frame ``(x, y)`` metres of the corner of cell (0, 0).
    Free space is ``explored & ~obstacle``.
    """

    obstacle: np.ndarray
    explored: np.ndarray
    objects: np.ndarray
    categories: Sequence[str]
    cell_size: float
    origin: Sequence[float]


def check_map(sem_map: SemanticMapLike, where: str = "semantic map") -> None:
    """Raise ``ValueError`` naming the bad attribute if ``sem_map`` breaks the contract."""
    for attr in ("obstacle", "explored", "objects", "categories", "cell_size", "origin"):
        if not hasattr(sem_map, attr):
            raise ValueError(f"{where}: missing attribute {attr!r} (see topo.sectors.SemanticMapLike)")
    shape = np.shape(sem_map.explored)
    if len(shape) != 2:
        raise ValueError(f"{where}: explored must be (H, W), got shape {shape}")
    if np.shape(sem_map.obstacle) != shape:
        raise ValueError(f"{where}: obstacle shape {np.shape(sem_map.obstacle)} != explored shape {shape}")
    objects_shape = np.shape(sem_map.objects)
    if len(objects_shape) != 3 or objects_shape[1:] != shape:
        raise ValueError(f"{where}: objects must be (N_o, {shape[0]}, {shape[1]}), got {objects_shape}")
    if objects_shape[0] != len(sem_map.categories):
        raise ValueError(
            f"{where}: {objects_shape[0]} object channels but {len(sem_map.categories)} categories"
        )
    if not (np.isfinite(sem_map.cell_size) and sem_map.cell_size > 0):
        raise ValueError(f"{where}: cell_size must be a positive number of metres, got {sem_map.cell_size!r}")


def free_space(sem_map: SemanticMapLike) -> np.ndarray:
    """bool (H, W): explored and not an obstacle."""
    return np.asarray(sem_map.explored, dtype=bool) & ~np.asarray(sem_map.obstacle, dtype=bool)


def dilation_cells(cfg: "TopoConfig", cell_size: float) -> int:
    """Object dilation radius in whole cells (rounded to nearest)."""
    return int(round(cfg.object_dilation_m / cell_size))


def label_grid(sem_map: SemanticMapLike, window: tuple[int, int, int, int], dilation: int) -> np.ndarray:
    """Label codes of the cells in ``window = (row0, row1, col0, col1)``: int16 (row1-row0, col1-col0).

    Priority, lowest first: UNKNOWN (not explored), FREE (explored), OBSTACLE (obstacle even if not
    marked explored: it is positive evidence), then each object channel dilated by a disk of
    ``dilation`` cells, then the undilated objects again so that an object's own cells keep their
    category where two dilated halos overlap (later channels win within a tie).
    The dilation is the paper's: an object seen just behind a thin wall wins over the wall.
    """
    r0, r1, c0, c1 = window
    grid = np.full((r1 - r0, c1 - c0), UNKNOWN, dtype=LABEL_DTYPE)
    grid[np.asarray(sem_map.explored[r0:r1, c0:c1], dtype=bool)] = FREE
    grid[np.asarray(sem_map.obstacle[r0:r1, c0:c1], dtype=bool)] = OBSTACLE
    objects = np.asarray(sem_map.objects[:, r0:r1, c0:c1], dtype=bool)
    present = np.flatnonzero(objects.any(axis=(1, 2)))
    if dilation > 0:
        footprint = disk(dilation).astype(bool)
        for k in present:
            # Dilate only around the channel's bounding box: objects are small next to the window.
            rows = np.flatnonzero(objects[k].any(axis=1))
            cols = np.flatnonzero(objects[k].any(axis=0))
            a0, a1 = max(rows[0] - dilation, 0), rows[-1] + dilation + 1
            b0, b1 = max(cols[0] - dilation, 0), cols[-1] + dilation + 1
            halo = ndimage.binary_dilation(objects[k, a0:a1, b0:b1], structure=footprint)
            grid[a0:a1, b0:b1][halo] = k
    for k in present:
        grid[objects[k]] = k
    return grid


def sector_angles(reference_yaw: float, n_sectors: int) -> np.ndarray:
    """Map-frame heading of each sector's ray, radians (n_sectors,): sector 0 points left of
    ``reference_yaw``, the others follow counter-clockwise (module doc)."""
    return reference_yaw + np.pi / 2 + np.arange(n_sectors) * (2 * np.pi / n_sectors)


def ray_offsets(reference_yaw: float, n_sectors: int, radius_cells: float, step_cells: float) -> np.ndarray:
    """Integer cell offsets of the samples along each ray: int (n_sectors, S, 2) as ``(drow, dcol)``.

    Samples sit at radii ``(k + 0.5) * step`` for ``k >= 1`` up to the radius, measured from the
    node cell's centre. The half-step shift keeps samples off cell borders on the axis-aligned
    and 30-degree rays (a sample exactly on a border would round one way and break the rotation
    symmetry of the vector); the first sample is always outside the node's own cell.
    """
    n_steps = int(np.floor(radius_cells / step_cells - 0.5))
    if n_steps < 1:
        raise ValueError(f"sector radius {radius_cells} cells is shorter than two ray steps of {step_cells}")
    radii = (np.arange(1, n_steps + 1) + 0.5) * step_cells
    angles = sector_angles(reference_yaw, n_sectors)
    dcol = np.floor(0.5 + np.cos(angles)[:, None] * radii[None, :])
    drow = np.floor(0.5 + np.sin(angles)[:, None] * radii[None, :])
    return np.stack([drow, dcol], axis=-1).astype(np.int64)


def sector_vectors(sem_map: SemanticMapLike, node_cells: np.ndarray, reference_yaw: float,
                   cfg: "TopoConfig") -> np.ndarray:
    """Sector vectors of the nodes at ``node_cells`` (int (K, 2) ``[row, col]``): int16 (K, n_sectors).

    ``reference_yaw`` (radians, map frame) is the heading whose left is sector 0. Rays leaving
    the map read UNKNOWN. Only the window around the nodes is labelled, so the cost does not
    grow with the map size.
    """
    cells = np.asarray(node_cells, dtype=np.int64).reshape(-1, 2)
    if len(cells) == 0:
        return np.zeros((0, cfg.n_sectors), dtype=LABEL_DTYPE)
    h, w = np.shape(sem_map.explored)
    cell = float(sem_map.cell_size)
    offsets = ray_offsets(reference_yaw, cfg.n_sectors, cfg.sector_radius_m / cell, cfg.ray_step_cells)
    dilation = dilation_cells(cfg, cell)
    # The window holds every sample plus the dilation: an object just past the last sample
    # still spreads its halo onto it.
    reach = int(np.abs(offsets).max()) + 1 + dilation
    r0, c0 = np.maximum(cells.min(axis=0) - reach, 0)
    r1, c1 = np.minimum(cells.max(axis=0) + reach + 1, (h, w))
    if r0 >= r1 or c0 >= c1:  # every node is far off the map
        return np.full((len(cells), cfg.n_sectors), UNKNOWN, dtype=LABEL_DTYPE)
    grid = label_grid(sem_map, (int(r0), int(r1), int(c0), int(c1)), dilation)
    # Pad by one UNKNOWN cell and clip into it: samples off the window read UNKNOWN.
    grid = np.pad(grid, 1, constant_values=UNKNOWN)
    rows = np.clip(cells[:, 0, None, None] + offsets[None, :, :, 0] - r0 + 1, 0, grid.shape[0] - 1)
    cols = np.clip(cells[:, 1, None, None] + offsets[None, :, :, 1] - c0 + 1, 0, grid.shape[1] - 1)
    samples = grid[rows, cols]  # (K, n_sectors, S)
    hit = samples != FREE
    first = np.argmax(hit, axis=2)
    label = np.take_along_axis(samples, first[..., None], axis=2)[..., 0]
    return np.where(hit.any(axis=2), label, FREE).astype(LABEL_DTYPE)
