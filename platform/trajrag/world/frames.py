"""Coordinate frames, in one place.

**Map frame** (used everywhere inside this package): a right-handed 2D frame on the floor, in
metres, seen from above. ``x`` grows with the map column, ``y`` with the map row, and a positive
yaw (radians) is a counter-clockwise turn seen from above, which is habitat's TURN_LEFT. A scene
grid cell ``(row, col)`` covers ``[origin + (col, row) * cell, origin + (col + 1, row + 1) * cell)``.

**Habitat frame**: ``(X, Y, Z)`` with ``Y`` up; an agent with the identity rotation looks along
``-Z``. The Gibson semantic-map release maps a habitat position to a cell with
``row = (X - origin[1]/100) * 20`` and ``col = (Z - origin[0]/100) * 20``, so map ``x = Z`` and
map ``y = X``. Because ``Z x X = +Y``, this 2D frame is counter-clockwise seen from above, as
required. A yaw-only habitat rotation by ``theta`` about ``+Y`` turns the forward vector
``(0, 0, -1)`` into ``(-sin theta, 0, -cos theta)``, i.e. map heading ``theta + pi``.

Images of a map (``row`` down) are mirrored with respect to "seen from above": plot them with
``origin="lower"`` to see turns in their true sense.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Pose2D:
    """Agent pose in the map frame: position in metres, heading in radians (wrapped to [-pi, pi))."""

    x: float
    y: float
    yaw: float

    def __post_init__(self) -> None:
        if not all(math.isfinite(v) for v in (self.x, self.y, self.yaw)):
            raise ValueError(f"pose has a non-finite value: {self}")
        object.__setattr__(self, "yaw", wrap_angle(self.yaw))

    @property
    def xy(self) -> np.ndarray:
        return np.array([self.x, self.y])


def xy_to_cell(xy: np.ndarray, origin: tuple[float, float], cell_size: float) -> np.ndarray:
    """Map-frame ``(..., 2)`` metres -> integer ``(..., 2)`` grid cells ``(row, col)`` containing
    them, for a grid whose cell ``(0, 0)`` has its corner at ``origin`` (metres)."""
    xy = np.asarray(xy, dtype=np.float64)
    col = np.floor((xy[..., 0] - origin[0]) / cell_size)
    row = np.floor((xy[..., 1] - origin[1]) / cell_size)
    return np.stack([row, col], axis=-1).astype(np.int64)


def cell_to_xy(cell: np.ndarray, origin: tuple[float, float], cell_size: float) -> np.ndarray:
    """Integer ``(..., 2)`` cells ``(row, col)`` -> map-frame ``(..., 2)`` metres of cell centres."""
    cell = np.asarray(cell, dtype=np.float64)
    x = origin[0] + (cell[..., 1] + 0.5) * cell_size
    y = origin[1] + (cell[..., 0] + 0.5) * cell_size
    return np.stack([x, y], axis=-1)


class GridGeometry:
    """Cell <-> metre conversions for a grid with ``origin`` (map-frame metres of the corner of
    cell (0, 0)), ``cell_size`` (metres) and ``shape`` (rows, cols): shared by scenes and maps."""

    def to_cell(self, xy: np.ndarray) -> np.ndarray:
        """Map-frame ``(..., 2)`` metres -> integer ``(..., 2)`` cells ``(row, col)``."""
        return xy_to_cell(xy, self.origin, self.cell_size)

    def to_xy(self, cell: np.ndarray) -> np.ndarray:
        """Integer ``(..., 2)`` cells ``(row, col)`` -> map-frame ``(..., 2)`` metres of cell centres."""
        return cell_to_xy(cell, self.origin, self.cell_size)

    def in_bounds(self, cell: np.ndarray) -> np.ndarray:
        """Bool (...): whether each ``(row, col)`` cell lies on the grid."""
        cell = np.asarray(cell)
        h, w = self.shape
        return (cell[..., 0] >= 0) & (cell[..., 0] < h) & (cell[..., 1] >= 0) & (cell[..., 1] < w)


def wrap_angle(angle: float) -> float:
    """Wrap an angle in radians to [-pi, pi)."""
    return (angle + math.pi) % (2.0 * math.pi) - math.pi


def habitat_to_map_xy(position: tuple[float, float, float] | np.ndarray) -> np.ndarray:
    """Habitat position ``(X, Y, Z)`` -> map-frame ``(x, y)`` in metres."""
    return np.array([float(position[2]), float(position[0])])


def map_to_habitat_position(xy: np.ndarray, floor_height: float) -> list[float]:
    """Map-frame ``(x, y)`` and the floor height (m) -> habitat ``[X, Y, Z]``."""
    return [float(xy[1]), float(floor_height), float(xy[0])]


def habitat_yaw_to_map_yaw(theta: float) -> float:
    """Yaw about habitat's +Y axis -> map-frame heading (radians)."""
    return wrap_angle(theta + math.pi)


def map_yaw_to_habitat_yaw(yaw: float) -> float:
    """Map-frame heading -> yaw about habitat's +Y axis (radians)."""
    return wrap_angle(yaw - math.pi)


def yaw_to_quaternion_xyzw(theta: float) -> list[float]:
    """Yaw about +Y -> quaternion ``[x, y, z, w]``, habitat-lab's episode order."""
    return [0.0, math.sin(theta / 2.0), 0.0, math.cos(theta / 2.0)]


def quaternion_to_yaw(q: list[float] | tuple[float, ...]) -> float:
    """A yaw-only quaternion -> its angle about +Y (radians).

    Episode files disagree on the component order: habitat-lab writes ``[x, y, z, w]`` while the
    SemExp Gibson release writes ``[w, x, y, z]`` (numpy-quaternion's ``as_float_array``). For a
    rotation about +Y only, one order has zeros at indices 0 and 2, the other at 1 and 3, so the
    order is read off the zeros. Raises ``ValueError`` for a rotation that is not about +Y.
    """
    if len(q) != 4 or not all(math.isfinite(v) for v in q):
        raise ValueError(f"rotation must be 4 finite numbers, got {q!r}")
    tol = 1e-4
    if abs(q[0]) < tol and abs(q[2]) < tol:  # [x, y, z, w]
        sin_half, cos_half = q[1], q[3]
    elif abs(q[1]) < tol and abs(q[3]) < tol:  # [w, x, y, z]
        sin_half, cos_half = q[2], q[0]
    else:
        raise ValueError(f"rotation {q!r} is not a rotation about the up axis")
    return wrap_angle(2.0 * math.atan2(sin_half, cos_half))
