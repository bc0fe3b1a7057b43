"""How many episodes hinge on goal "instances" that are a few projected cells, not objects.

A top-down semantic map makes every connected component of a label an instance, so a stray cell
labelled toilet in a corridor is a toilet the episode generator measures geodesics to and a stop
next to counts as success. For each episode this counts whether, with the instances of at most
``--max-cells`` of the scene's cells left out as goals, the nearest goal is farther by more than
half a metre (a fragment was the nearest), or there is no reachable goal at all (only fragments).
Prints one JSON object, per category too (docs/notes/2026-12-06-mp3d-homes.md).

    PYTHONPATH=platform .venv/bin/python jobs/goal_fragments.py \\
        --scenes ../shared/data/mp3d-bev/scenes@held_out --episodes generated:23:0 --max-cells 4 \\
        [--set mp3d.fragment_max_cells=1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import Counter

import numpy as np

from trajrag import config
from trajrag.world.datasets import load_episodes, load_scenes
from trajrag.world.episode_gen import scene_goal_field
from trajrag.world.scene import NO_CATEGORY, Scene

# A fragment's nearest goal must be this much nearer than the nearest object to count (metres):
# the geodesic field's own 8-neighbour error is a few centimetres.
NEARER_M = 0.5


def without_fragments(scene: Scene, max_cells: int) -> Scene:
    """``scene`` with the instances of at most ``max_cells`` cells left out of the goal categories
    (renamed, so that the goal-field cache keeps the two apart)."""
    sizes = np.bincount(scene.instance_map.ravel(), minlength=len(scene.instance_category))
    fragment = sizes <= max_cells
    fragment[0] = False
    category_map = np.where(fragment[scene.instance_map], NO_CATEGORY, scene.category_map)
    return dataclasses.replace(scene, name=f"{scene.name}#objects", category_map=category_map)


def count(scene_spec: str, episode_specs: list[str], max_cells: int, settings: config.Settings) -> dict:
    scenes = load_scenes(scene_spec, settings)
    by_name = {scene.name: scene for scene in scenes}
    objects_only = {scene.name: without_fragments(scene, max_cells) for scene in scenes}
    cfg = settings.episodes
    out: Counter = Counter()
    for spec in episode_specs:
        for episode in load_episodes(spec, scenes, settings):
            scene = by_name[episode.scene_key]
            cell = tuple(scene.to_cell(episode.start_pose().xy))
            nearest = scene_goal_field(scene, episode.object_category, cfg).distance[cell]
            to_object = scene_goal_field(objects_only[scene.name], episode.object_category, cfg).distance[cell]
            out["episodes"] += 1
            if not np.isfinite(to_object):
                out["only_fragments"] += 1
                out[f"only_fragments.{episode.object_category}"] += 1
            elif to_object > nearest + NEARER_M:
                out["nearest_is_fragment"] += 1
                out[f"nearest_is_fragment.{episode.object_category}"] += 1
    return dict(sorted(out.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenes", required=True, help="a scene spec (trajrag episodes check --help)")
    parser.add_argument("--episodes", required=True, nargs="+", help="one or more episode specs")
    parser.add_argument("--max-cells", type=int, default=4,
                        help="a fragment has at most this many of the scene's cells (MP3D: 4 = one 10 cm cell)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a value of configs/ (e.g. mp3d.fragment_max_cells=1)")
    args = parser.parse_args()
    config.check_overrides(args.overrides)
    print(json.dumps({"max_cells": args.max_cells,
                      **count(args.scenes, args.episodes, args.max_cells, config.settings(args.overrides))}))


if __name__ == "__main__":
    main()
