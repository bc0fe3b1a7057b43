"""The embedded simulator: discrete habitat-style actions on a grid ``Scene``, 2.5D sensors.

``GridSimulator`` implements ``trajrag.world.interface.Simulator``. Poses are in the map frame
(``world/frames.py``): TURN_LEFT adds ``turn_angle_deg`` to the yaw (counter-clockwise seen from
above), TURN_RIGHT subtracts it, MOVE_FORWARD moves ``forward_step`` metres along the heading if
the whole segment stays on ``Scene.traversable``. A blocked move (``Observations.collided`` is
True) leaves the agent where it was, or with ``allow_sliding`` (habitat-sim's default) moves it up
to the obstacle and slides the rest of the step along it: of the two moves along the map axes that
carry the remaining displacement's components, the free part that ends nearest the target (the
traversable area's edges are cell edges, so an axis move is a move along the wall). STOP only
renders. Sensors come from ``world/render.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from trajrag import config as config_mod
from trajrag.world.frames import Pose2D
from trajrag.world.interface import Action, CameraIntrinsics, Observations
from trajrag.world.render import Renderer, RgbConfig, SceneRaster
from trajrag.world.scene import Scene

SENSORS = ("depth", "semantic", "rgb")
REQUIRED_SENSORS = ("depth", "semantic")  # Observations always carries depth and semantics


@dataclass
class SimConfig:
    """Simulator settings (values and their sources: ``configs/sim.yaml``).

    width, height: image size in pixels. hfov_deg: horizontal field of view, degrees.
    camera_height: metres above the floor. min_depth, max_depth: depth clipping range, metres.
    agent_radius, agent_height: metres (the scene's traversable area already keeps the radius).
    forward_step: MOVE_FORWARD distance, metres. turn_angle_deg: TURN_LEFT/RIGHT angle, degrees.
    wall_height: height of walls and of the flat ceiling, metres.
    object_heights: category name -> height of its 2.5D column, metres.
    default_object_height: height of categories missing from ``object_heights``, metres.
    sensors: subset of ``SENSORS``; depth and semantic are always on, rgb is optional.
    ray_step_cells: largest ground step between ray samples, in cells.
    collision_step_cells: largest spacing of the collision samples along a move, in cells.
    allow_sliding: whether a blocked MOVE_FORWARD slides along the obstacle (module doc).
    rgb: synthetic RGB shading (``render.RgbConfig``).
    """

    width: int
    height: int
    hfov_deg: float
    camera_height: float
    min_depth: float
    max_depth: float
    agent_radius: float
    agent_height: float
    forward_step: float
    turn_angle_deg: float
    wall_height: float
    object_heights: dict[str, float]
    default_object_height: float
    sensors: list[str]
    ray_step_cells: float
    collision_step_cells: float
    allow_sliding: bool
    rgb: RgbConfig


def validate(cfg: SimConfig) -> None:
    """Raise ``ConfigError`` naming the first bad ``sim.*`` value."""
    bad = None
    if cfg.width < 1 or cfg.height < 1:
        bad = f"width/height must be >= 1 pixel, got {cfg.width}x{cfg.height}"
    elif not 0 < cfg.hfov_deg < 180:
        bad = f"hfov_deg must be in (0, 180), got {cfg.hfov_deg}"
    elif not 0 < cfg.camera_height < cfg.wall_height:
        bad = f"need 0 < camera_height < wall_height, got {cfg.camera_height}, {cfg.wall_height}"
    elif not 0 < cfg.min_depth < cfg.max_depth:
        bad = f"need 0 < min_depth < max_depth, got {cfg.min_depth}, {cfg.max_depth}"
    elif cfg.forward_step <= 0 or not math.isfinite(cfg.turn_angle_deg):
        bad = f"forward_step must be > 0 and turn_angle_deg finite, got {cfg.forward_step}, {cfg.turn_angle_deg}"
    elif not 0 < cfg.ray_step_cells <= 1 or not 0 < cfg.collision_step_cells <= 1:
        bad = (f"ray_step_cells and collision_step_cells must be in (0, 1], got "
               f"{cfg.ray_step_cells}, {cfg.collision_step_cells}")
    elif set(cfg.sensors) - set(SENSORS):
        bad = f"unknown sensors {sorted(set(cfg.sensors) - set(SENSORS))}; known: {list(SENSORS)}"
    elif set(REQUIRED_SENSORS) - set(cfg.sensors):
        bad = f"sensors must include {list(REQUIRED_SENSORS)} (Observations always carries them), got {cfg.sensors}"
    else:
        heights = {**cfg.object_heights, "<default_object_height>": cfg.default_object_height}
        wrong = {k: v for k, v in heights.items() if not (math.isfinite(v) and v >= 0)}
        if wrong:
            bad = f"object heights must be finite and >= 0 metres, got {wrong}"
    if bad:
        raise config_mod.ConfigError(f"sim: {bad}")


def intrinsics_of(cfg: SimConfig) -> CameraIntrinsics:
    """The pinhole camera described by ``cfg``."""
    return CameraIntrinsics(width=cfg.width, height=cfg.height, hfov=math.radians(cfg.hfov_deg),
                            camera_height=cfg.camera_height, min_depth=cfg.min_depth,
                            max_depth=cfg.max_depth)


class GridSimulator:
    """Discrete-action simulator over grid scenes with 2.5D depth / semantic / RGB sensors."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        validate(self.cfg)
        self._intrinsics = intrinsics_of(self.cfg)
        self._renderer = Renderer(self._intrinsics, self.cfg.wall_height, self.cfg.ray_step_cells, self.cfg.rgb)
        self._with_rgb = "rgb" in self.cfg.sensors
        self._scene: Optional[Scene] = None
        self._raster: Optional[SceneRaster] = None
        self._pose: Optional[Pose2D] = None

    # -- Simulator protocol -----------------------------------------------------------------
    @property
    def scene(self) -> Scene:
        if self._scene is None:
            raise RuntimeError("GridSimulator: no scene yet; call reset(scene, pose) first")
        return self._scene

    @property
    def intrinsics(self) -> CameraIntrinsics:
        return self._intrinsics

    @property
    def pose(self) -> Pose2D:
        if self._pose is None:
            raise RuntimeError("GridSimulator: no pose yet; call reset(scene, pose) first")
        return self._pose

    def reset(self, scene: Scene, pose: Pose2D) -> Observations:
        """Place the agent at ``pose`` (map frame) in ``scene`` and render.

        Raises ``ValueError`` naming the scene and the pose if the pose is non-finite or its
        position is not on ``scene.traversable``.
        """
        pose = _as_pose(pose, scene)
        if not scene.pose_is_valid(pose):
            raise ValueError(f"scene {scene.name}: start pose (x={pose.x:.3f} m, y={pose.y:.3f} m, "
                             f"yaw={pose.yaw:.3f} rad) is not on the traversable area")
        if scene is not self._scene:
            self._raster = self._renderer.prepare(scene, self.cfg.object_heights,
                                                  self.cfg.default_object_height, self._with_rgb)
            self._scene = scene
        self._pose = pose
        return self.render()

    def step(self, action: Action) -> Observations:
        """Apply one action and render; see the module doc for the motion model."""
        pose = self.pose
        try:
            action = Action(action)
        except ValueError:
            raise ValueError(f"unknown action {action!r}; expected one of {[a.name for a in Action]}") from None
        collided = False
        turn = math.radians(self.cfg.turn_angle_deg)
        if action == Action.TURN_LEFT:
            self._pose = Pose2D(pose.x, pose.y, pose.yaw + turn)
        elif action == Action.TURN_RIGHT:
            self._pose = Pose2D(pose.x, pose.y, pose.yaw - turn)
        elif action == Action.MOVE_FORWARD:
            target = pose.xy + self.cfg.forward_step * np.array([math.cos(pose.yaw), math.sin(pose.yaw)])
            collided = not self.segment_is_free(pose.xy, target)
            end = self._blocked_move_end(pose.xy, target) if collided else target
            self._pose = Pose2D(float(end[0]), float(end[1]), pose.yaw)
        return self.render(collided)

    def _blocked_move_end(self, start: np.ndarray, target: np.ndarray) -> np.ndarray:
        """Where a MOVE_FORWARD from ``start`` towards ``target`` (metres) ends when the segment
        is blocked: ``start`` without sliding, else the free part up to the obstacle and then
        the better of the two axis slides (module doc)."""
        if not self.cfg.allow_sliding:
            return start
        contact = self.free_prefix_end(start, target)
        rest = target - contact
        slides = [self.free_prefix_end(contact, contact + step)
                  for step in (np.array([rest[0], 0.0]), np.array([0.0, rest[1]])) if step.any()]
        return min(slides, key=lambda end: float(np.linalg.norm(target - end)), default=contact)

    # -- extras -----------------------------------------------------------------------------
    def segment_is_free(self, start: np.ndarray, end: np.ndarray) -> bool:
        """Whether every point of the segment ``start -> end`` (map frame, metres) is traversable.

        Checked at points no more than ``collision_step_cells`` cells apart, both ends included.
        """
        return bool(self.scene.traversable_at(self._collision_samples(start, end)).all())

    def _collision_samples(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Points (N, 2) of ``start -> end``, metres, at most ``collision_step_cells`` cells apart."""
        spacing = self.cfg.collision_step_cells * self.scene.cell_size
        length = float(np.linalg.norm(np.asarray(end) - np.asarray(start)))
        return np.linspace(start, end, int(math.ceil(length / spacing)) + 1)

    def free_prefix_end(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """The last collision sample of ``start -> end`` (metres) before the first one off the
        traversable area (``end`` itself when the whole segment is free; ``start`` is on it)."""
        points = self._collision_samples(start, end)
        free = self.scene.traversable_at(points)
        blocked = np.flatnonzero(~free)
        return np.asarray(end, dtype=float) if not len(blocked) else points[max(int(blocked[0]) - 1, 0)]

    def render(self, collided: bool = False) -> Observations:
        """Observations at the current pose (no motion)."""
        pose = self.pose
        depth, instance, category, rgb = self._renderer.render(
            self._raster, pose.x, pose.y, pose.yaw, self._with_rgb)
        return Observations(depth=depth, instance=instance, category=category, rgb=rgb,
                            pose=pose, collided=collided)


def _as_pose(pose, scene: Scene) -> Pose2D:
    """``pose`` as a ``Pose2D``; ``ValueError`` naming the scene if it is malformed or non-finite."""
    if isinstance(pose, Pose2D):
        return pose
    try:
        x, y, yaw = (float(v) for v in pose)
        return Pose2D(x, y, yaw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"scene {scene.name}: bad start pose {pose!r}: {exc}") from None
