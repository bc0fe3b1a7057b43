"""The simulator interface every backend implements (our grid simulator, the habitat adapter).

Kept deliberately small, like VLFM's simulator/robot adapters: the navigation stack sees only
``Observations`` and sends only ``Action``s, so it never depends on which world produced them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Optional, Protocol

import numpy as np

from trajrag.world.frames import Pose2D
from trajrag.world.scene import Scene


class Action(IntEnum):
    """Discrete actions with habitat-lab's ids."""

    STOP = 0
    MOVE_FORWARD = 1
    TURN_LEFT = 2
    TURN_RIGHT = 3


@dataclass(frozen=True)
class CameraIntrinsics:
    """Pinhole camera: ``width``/``height`` in pixels, horizontal FOV in radians, height in metres."""

    width: int
    height: int
    hfov: float
    camera_height: float
    min_depth: float
    max_depth: float

    @property
    def focal(self) -> float:
        """Focal length in pixels (square pixels, as habitat)."""
        return (self.width / 2.0) / np.tan(self.hfov / 2.0)


@dataclass
class Observations:
    """One step's sensor readings, habitat-style.

    depth: float32 (H, W) z-depth in metres, clipped to [min_depth, max_depth] like habitat's
        depth sensor (``max_depth`` also where nothing is hit in range).
    instance: int32 (H, W) object instance id per pixel, 0 for walls, floor and ceiling.
    category: int16 (H, W) category id per pixel (index into ``Scene.categories``), -1 for none.
    rgb: uint8 (H, W, 3) synthetic colour image, or None when the rgb sensor is off.
    pose: the agent pose in the map frame (metres, radians).
    collided: whether the last MOVE_FORWARD was blocked (the agent did not move, or with
        ``sim.allow_sliding`` moved less than the step).
    """

    depth: np.ndarray
    instance: np.ndarray
    category: np.ndarray
    rgb: Optional[np.ndarray]
    pose: Pose2D
    collided: bool = False


class Simulator(Protocol):
    """What the agent and the collectors need from a world."""

    @property
    def scene(self) -> Scene: ...

    @property
    def intrinsics(self) -> CameraIntrinsics: ...

    @property
    def pose(self) -> Pose2D: ...

    def reset(self, scene: Scene, pose: Pose2D) -> Observations:
        """Place the agent at ``pose`` in ``scene`` and render; ``ValueError`` if it is off the
        traversable area."""
        ...

    def step(self, action: Action) -> Observations:
        """Apply one action; STOP only renders (episode bookkeeping is the caller's)."""
        ...
