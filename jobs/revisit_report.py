"""What a revisit memory held for the episodes it served (docs/known_homes.md, "Why not").

    python jobs/revisit_report.py OUT --scenes SPEC [--run trajrag] [--baseline frontier] [--json]

For an evaluation folder made with ``trajrag eval --revisit K`` (its ``<out>/revisit/`` memories),
splits the paired episodes of ``--run`` and ``--baseline`` by what the episode's home memory
held about its goal: a successful earlier walk to the same goal category, only sightings of it
(some walk's map saw it), or nothing; and prints the memories' sizes (chunks and groups: how many
of the K walks the memory matched to each other).

Two bounds on what remembering could give (privileged: shortest walks on the true map; not
planners): ``bound_spl_walk_ends`` walks from the start to the nearest place where an earlier
walk found the goal category (its last node), then into the goal region; ``bound_spl_sightings``
to the nearest node of any earlier walk's map that saw the category, then into the goal region.
Where the memory holds neither, the baseline's SPL stands. The collectors' nodes lie in the
scene's frame, so the bounds take the memory's positions as they are: a planner would first have
to find where it is in the remembered home.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from trajrag import config
from trajrag.agent.run_records import PAIRED_METRICS, AgentRun
from trajrag.memory.store import CHUNKS, MemoryStore
from trajrag.queries.inventory import chunk_nodes
from trajrag.revisit.memories import HomeMemories
from trajrag.world.datasets import load_scenes
from trajrag.world.episode_gen import scene_goal_field
from trajrag.world.geodesic import geodesic_field


def memory_of_homes(out: Path, homes: set[str]) -> dict[str, dict]:
    """Per home: chunks, groups, where its successful earlier walks ended and which nodes of its
    walks' maps saw each category (map frame = scene frame for the collectors), by category."""
    memories = HomeMemories(out)
    held = {}
    for home in sorted(homes):
        store = MemoryStore(memories.uri(home), read_only=True)
        try:
            names = {label: name for name, label in store.vocabulary().items()}
            maps = ["map_xy", "map_sectors"] if store.keeps_maps else []
            columns = ["goal", "success", "node_xy", "sectors", *maps]
            rows = store.read(CHUNKS, columns).to_pylist()
            ends, seen_from = defaultdict(list), defaultdict(list)
            for row in rows:
                if row["success"]:
                    ends[row["goal"]].append(np.asarray(row["node_xy"], dtype=float).reshape(-1, 2)[-1])
                xy, sectors = chunk_nodes(row)
                for node, sector in zip(*np.nonzero(sectors >= 0)):
                    seen_from[names[int(sectors[node, sector])]].append(xy[node])
            held[home] = {"chunks": len(rows), "groups": store.count_groups(), "ends": ends, "seen_from": seen_from}
        finally:
            store.close()
    return held


def bound_spl(scene, places: list, start_xy, category: str, shortest_m: float, episode_cfg) -> float:
    """SPL of the shortest walk on the true map from ``start_xy`` via the best of ``places``
    into ``category``'s goal region."""
    start = np.zeros(scene.shape, dtype=bool)
    start[tuple(scene.to_cell(np.asarray(start_xy[:2])))] = True
    from_start = geodesic_field(scene.traversable, start, scene.cell_size, episode_cfg.geodesic_neighbourhood_radius)
    to_goal = scene_goal_field(scene, category, episode_cfg).distance
    cells = np.array([scene.to_cell(np.asarray(p)) for p in places])
    inside = (cells >= 0).all(axis=1) & (cells < scene.shape).all(axis=1)
    cells = cells[inside]
    walked = (from_start[cells[:, 0], cells[:, 1]] + to_goal[cells[:, 0], cells[:, 1]]).min() if len(cells) else np.inf
    return float(shortest_m / max(shortest_m, walked)) if np.isfinite(walked) else 0.0


def report(out: Path, scene_spec: str, run: str, baseline: str) -> dict:
    mine = AgentRun(run, out / run).finished()
    theirs = AgentRun(baseline, out / baseline).finished(PAIRED_METRICS)
    keys = sorted(set(mine) & set(theirs))
    held = memory_of_homes(out, {home for home, _ in keys})
    settings = config.settings()
    scenes = {scene.name: scene for scene in load_scenes(scene_spec, settings)}
    episode_cfg = settings.episodes
    split: dict[str, list[tuple[float, float]]] = defaultdict(list)
    bounds: dict[str, list[float]] = defaultdict(list)
    for key in keys:
        home, record, base_spl = key[0], mine[key], float(theirs[key]["metrics"]["spl"])
        category, memory = record["category"], held[key[0]]
        ends, seen_from = memory["ends"].get(category), memory["seen_from"].get(category)
        kind = "walked to before" if ends else "only sighted" if seen_from else "not in memory"
        split[kind].append((float(record["metrics"]["spl"]), base_spl))
        for name, places in (("walk_ends", ends), ("sightings", seen_from)):
            bounds[name].append(bound_spl(scenes[home], places, record["poses"][0], category,
                                          record["metrics"]["geodesic_distance"], episode_cfg)
                                if places else base_spl)
    groups = [h["groups"] for h in held.values()]
    return {"episodes": len(keys), "homes": len(held),
            **{f"bound_spl_{name}": float(np.mean(values)) for name, values in bounds.items()},
            "chunks_per_home": float(np.mean([h["chunks"] for h in held.values()])),
            "groups_per_home": float(np.mean(groups)),
            "homes_in_one_group": sum(g == 1 for g in groups),
            "by_goal_memory": {kind: {"episodes": len(pairs), f"{run}_spl": float(np.mean([p[0] for p in pairs])),
                                      f"{baseline}_spl": float(np.mean([p[1] for p in pairs]))}
                               for kind, pairs in sorted(split.items())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--scenes", required=True, help="the scene spec the evaluation ran on")
    parser.add_argument("--run", default="trajrag")
    parser.add_argument("--baseline", default="frontier")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    print(json.dumps(report(args.out, args.scenes, args.run, args.baseline), indent=None if args.json else 2))


if __name__ == "__main__":
    main()
