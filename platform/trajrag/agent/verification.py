"""Verification before STOP: look at the mapped goal again from where the agent stands.

A detector's false positive (a chair taken for a sofa, a blob on the wall) puts a goal on the map
that is not there. VLFM, SG-Nav and ApexNav each check a detection again before committing; here
the agent, once within STOP distance of the mapped goal, faces it and takes ``verify_views`` more
frames (turning a step left and right, so each frame is a new detection). It STOPs if at least
``verify_min_share`` of them detect the goal within ``verify_radius_m`` of the target cell;
otherwise the goal there is rejected: its cells within ``verify_reject_radius_m`` are remembered
and never taken for the goal again in this episode, and the agent explores on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Optional

import numpy as np

from trajrag.world.frames import Pose2D, wrap_angle
from trajrag.world.interface import Action


class Verdict(Enum):
    LOOKING = "looking"  # act() returned the next action
    CONFIRMED = "confirmed"  # STOP
    REJECTED = "rejected"  # forget this goal and explore on


@dataclass
class Verification:
    """One look at one target: the target (map-frame metres) and the frames counted so far."""

    target_xy: np.ndarray
    frames: int = 0
    confirmed: int = 0
    turn_left_next: bool = True


class GoalVerifier:
    """Counts the frames that see the goal near a target and decides (module doc).

    views: frames to take (0: verification off, every STOP is confirmed at once). min_share: the
    share of them that must detect the goal. radius_m: how near the target a detection counts.
    half_fov_rad: half the camera's horizontal field of view (a frame counts only while the target
    is inside it).
    """

    def __init__(self, views: int, min_share: float, radius_m: float, half_fov_rad: float) -> None:
        self.views = views
        self.min_share = min_share
        self.radius_m = radius_m
        self.half_fov_rad = half_fov_rad
        self.current: Optional[Verification] = None

    def reset(self) -> None:
        self.current = None

    def look(self, pose: Pose2D, target_xy: np.ndarray, detected_xy: Optional[np.ndarray]) -> tuple[Verdict, Optional[Action]]:
        """One step at the goal: ``detected_xy`` (N, 2) metres are the cells where the goal was
        detected in the frame just observed (None: nowhere). Returns the verdict and, while
        looking, the action to take."""
        if self.views <= 0:
            return Verdict.CONFIRMED, None
        v = self.current
        if v is None or np.linalg.norm(v.target_xy - target_xy) > self.radius_m:
            v = self.current = Verification(np.asarray(target_xy, dtype=np.float64))
        bearing = wrap_angle(math.atan2(target_xy[1] - pose.y, target_xy[0] - pose.x) - pose.yaw)
        if abs(bearing) <= self.half_fov_rad:
            v.frames += 1
            if detected_xy is not None and len(detected_xy):
                v.confirmed += bool((np.linalg.norm(detected_xy - v.target_xy, axis=1) <= self.radius_m).any())
            if v.frames >= self.views:
                self.current = None
                return (Verdict.CONFIRMED if v.confirmed >= self.min_share * v.frames else Verdict.REJECTED), None
            action = Action.TURN_LEFT if v.turn_left_next else Action.TURN_RIGHT
            v.turn_left_next = not v.turn_left_next
            return Verdict.LOOKING, action
        return Verdict.LOOKING, Action.TURN_LEFT if bearing > 0 else Action.TURN_RIGHT
