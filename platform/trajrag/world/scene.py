"""The one scene representation shared by every source (procedural, Gibson, habitat adapter)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from trajrag.world.frames import GridGeometry, Pose2D

NO_INSTANCE = 0
NO_CATEGORY = -1


@dataclass
class Scene(GridGeometry):
    """A top-down scene on a regular grid of square cells.

    Attributes:
        name: unique scene name, e.g. ``procedural/train/0007`` or ``gibson/Allensville/0``.
        categories: object category names; a category id is an index into this tuple.
        traversable: bool (H, W): cells where the agent's *centre* may stand. It already keeps
            the agent radius off walls and objects (procedural scenes erode their free space at
            generation; Gibson's navmesh-derived floor needs no erosion).
        floor: bool (H, W): cells with no wall, i.e. where the floor is visible (a superset of
            ``traversable``; objects stand on floor cells). Everything else renders as a wall.
        instance_map: int32 (H, W): object instance id per cell, ``0`` where there is none.
        category_map: int16 (H, W): category id per cell, ``-1`` where there is none.
        instance_category: int16 (n_instances + 1,): category id of each instance id
            (index 0 is ``-1``).
        cell_size: cell edge in metres (0.05 by default, as VLFM, SemExp and the Gibson maps).
        origin: map-frame ``(x, y)`` in metres of the corner of cell ``(0, 0)``.
        floor_height: habitat ``Y`` of this floor, metres (for writing habitat positions).
        meta: free-form provenance (generator seed, room list, source file).
        low_obstacle: bool (H, W) or None: cells with no floor and no labelled object that render
            as a low unlabelled column of ``low_obstacle_height`` metres instead of a wall (the
            stand in front of a tv in a 2.5D conversion: seen over, never walked on). None: none.
        low_obstacle_height: metres, the top of every ``low_obstacle`` cell.
    """

    name: str
    categories: tuple[str, ...]
    traversable: np.ndarray
    floor: np.ndarray
    instance_map: np.ndarray
    category_map: np.ndarray
    instance_category: np.ndarray
    cell_size: float = 0.05
    origin: tuple[float, float] = (0.0, 0.0)
    floor_height: float = 0.0
    meta: dict = field(default_factory=dict)
    low_obstacle: Optional[np.ndarray] = None
    low_obstacle_height: float = 0.0

    def __post_init__(self) -> None:
        shape = self.traversable.shape
        if self.low_obstacle is None:
            self.low_obstacle = np.zeros(shape, dtype=bool)
        for attr in ("floor", "instance_map", "category_map", "low_obstacle"):
            if getattr(self, attr).shape != shape:
                raise ValueError(f"scene {self.name}: {attr} shape {getattr(self, attr).shape} != {shape}")
        self.traversable = self.traversable.astype(bool, copy=False)
        self.floor = self.floor.astype(bool, copy=False)
        self.instance_map = self.instance_map.astype(np.int32, copy=False)
        self.category_map = self.category_map.astype(np.int16, copy=False)
        self.instance_category = np.asarray(self.instance_category, dtype=np.int16)
        self.low_obstacle = self.low_obstacle.astype(bool) & ~self.floor & (self.instance_map == NO_INSTANCE)

    @property
    def shape(self) -> tuple[int, int]:
        return self.traversable.shape

    def freeze(self) -> "Scene":
        """Make the grids read-only (a cached scene is shared: one caller cannot change another's)."""
        for attr in ("traversable", "floor", "instance_map", "category_map", "instance_category", "low_obstacle"):
            getattr(self, attr).setflags(write=False)
        return self

    def category_id(self, name: str) -> int:
        """Category id of ``name``; ``KeyError`` naming the scene if it has no such category."""
        try:
            return self.categories.index(name)
        except ValueError:
            raise KeyError(f"scene {self.name} has no category {name!r}; it has {list(self.categories)}") from None

    def present_categories(self) -> list[str]:
        """Names of the categories with at least one object in this scene."""
        ids = np.unique(self.instance_category[1:])
        return [self.categories[i] for i in ids if i >= 0]

    @property
    def not_wall(self) -> np.ndarray:
        """bool (H, W): cells that are no wall (floor, objects and low obstacles)."""
        return self.floor | self.low_obstacle | (self.instance_map > NO_INSTANCE)

    # -- geometry ---------------------------------------------------------------------------
    def is_traversable(self, xy: np.ndarray) -> bool:
        """Whether the agent's centre may stand at map-frame ``xy`` (metres)."""
        return bool(self.traversable_at(np.asarray(xy, dtype=float).reshape(1, 2))[0])

    def traversable_at(self, points: np.ndarray) -> np.ndarray:
        """bool (N,): whether the agent's centre may stand at each map-frame point (N, 2), metres
        (False off the map)."""
        cells = self.to_cell(points)
        inside = self.in_bounds(cells)
        free = np.zeros(len(cells), dtype=bool)
        free[inside] = self.traversable[cells[inside, 0], cells[inside, 1]]
        return free

    def pose_is_valid(self, pose: Pose2D) -> bool:
        return self.is_traversable(pose.xy)
