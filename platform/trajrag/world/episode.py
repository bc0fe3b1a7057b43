"""ObjectNav episodes in habitat-lab's JSON schema."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from trajrag.world.frames import (
    Pose2D,
    habitat_to_map_xy,
    habitat_yaw_to_map_yaw,
    map_to_habitat_position,
    map_yaw_to_habitat_yaw,
    quaternion_to_yaw,
    yaw_to_quaternion_xyzw,
)


@dataclass
class ObjectNavEpisode:
    """One ObjectNav episode, field names as habitat-lab's ``ObjectGoalNavEpisode``.

    start_position: habitat ``[X, Y, Z]`` metres; start_rotation: quaternion ``[x, y, z, w]``
    (readers also accept the SemExp ``[w, x, y, z]`` order, see ``frames.quaternion_to_yaw``).
    info["geodesic_distance"]: shortest-path length in metres from the start to the goal region.
    scene_key: the ``Scene.name`` this episode runs in (not part of habitat's schema; derived
    from scene_id + floor_id by the dataset loaders).
    """

    episode_id: str
    scene_id: str
    start_position: list[float]
    start_rotation: list[float]
    object_category: str
    info: dict = field(default_factory=dict)
    floor_id: int = 0
    scene_key: str = ""

    def start_pose(self) -> Pose2D:
        """The start as a map-frame pose (raises ``ValueError`` on a malformed rotation)."""
        xy = habitat_to_map_xy(self.start_position)
        yaw = habitat_yaw_to_map_yaw(quaternion_to_yaw(self.start_rotation))
        return Pose2D(float(xy[0]), float(xy[1]), yaw)

    @classmethod
    def from_pose(cls, episode_id: str, scene_id: str, scene_key: str, pose: Pose2D,
                  floor_height: float, category: str, geodesic_distance: float,
                  floor_id: int = 0) -> "ObjectNavEpisode":
        return cls(
            episode_id=episode_id,
            scene_id=scene_id,
            start_position=map_to_habitat_position(np.array([pose.x, pose.y]), floor_height),
            start_rotation=yaw_to_quaternion_xyzw(map_yaw_to_habitat_yaw(pose.yaw)),
            object_category=category,
            info={"geodesic_distance": float(geodesic_distance)},
            floor_id=floor_id,
            scene_key=scene_key,
        )

    def to_json(self) -> dict:
        """The habitat-lab JSON dict (``scene_key`` kept as an extra field)."""
        return asdict(self)
