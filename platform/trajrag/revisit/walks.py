"""The earlier walks of each home: generated episodes that are never the evaluated ones.

A walk is an ObjectNav episode of the home drawn with ``revisit.seed`` (``world/episode_gen.py``),
its id ``<scene>:revisit:<i>`` (the evaluated episodes' ids are ``<scene>:<i>`` or a dataset's
own), so no trajectory id of the memory is an evaluated episode's. A walk *coincides* with an
evaluated episode when both seek the same category from a start in the same map cell; it is
dropped and the next draw taken (up to ``spare_walks`` past ``walks``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from trajrag.revisit import RevisitError
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.episode_gen import EpisodeConfig, generate_scene_episodes
from trajrag.world.geodesic import Motion
from trajrag.world.scene import Scene

WALK_TAG = "revisit"


def start_key(episode: ObjectNavEpisode, scene: Scene) -> tuple[str, int, int]:
    """What makes two episodes of one scene the same task: goal category and start cell."""
    row, col = scene.to_cell(episode.start_pose().xy)
    return episode.object_category, int(row), int(col)


def coincides(walk: ObjectNavEpisode, evaluated: ObjectNavEpisode, scene: Scene) -> bool:
    return walk.scene_key == evaluated.scene_key and start_key(walk, scene) == start_key(evaluated, scene)


def plan_walks(scenes: Sequence[Scene], evaluated: Sequence[ObjectNavEpisode], walks: int, seed: int,
               spare_walks: int, episode_cfg: EpisodeConfig, motion: Motion) -> dict[str, list[ObjectNavEpisode]]:
    """``walks`` earlier walks of each scene with an evaluated episode (scene name -> walks,
    reachable with ``motion``; a home nothing is evaluated in needs no memory), none coinciding
    with an episode of ``evaluated``; ``RevisitError`` names a home where fewer could be drawn."""
    if walks < 1:
        raise RevisitError(f"revisit walks per home must be >= 1, got {walks}")
    plan = {}
    evaluated_homes = {e.scene_key for e in evaluated}
    for scene in (s for s in scenes if s.name in evaluated_homes):
        taken = {start_key(e, scene) for e in evaluated if e.scene_key == scene.name}
        drawn = generate_scene_episodes(scene, walks + spare_walks, episode_cfg, seed, motion)
        kept = [w for w in drawn if start_key(w, scene) not in taken][:walks]
        if len(kept) < walks:
            raise RevisitError(f"{scene.name}: only {len(kept)} of {walks} earlier walks could be drawn apart from "
                               f"the evaluated episodes ({len(drawn)} drawn with seed {seed}); set another "
                               f"revisit.seed or more revisit.spare_walks")
        plan[scene.name] = [replace(w, episode_id=f"{scene.name}:{WALK_TAG}:{i}") for i, w in enumerate(kept)]
    return plan


def plan_digest(plan: dict[str, list[ObjectNavEpisode]]) -> list[list]:
    """The plan as plain data for ``revisit.json``: ``[episode_id, category, start x, start z]`` per walk."""
    return [[w.episode_id, w.object_category, round(w.start_position[0], 3), round(w.start_position[2], 3)]
            for home in sorted(plan) for w in plan[home]]
