"""``trajrag episodes check``: the dataset doctor.

Loads scenes and episodes exactly as every job does and reports whether they can run: starts on
the traversable area, goals reachable, geodesic lengths and a per-category breakdown. Exits 1
when any episode is unusable (the JSON still lists what was checked) and 2 when the input cannot
be read at all.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict

from tqdm import tqdm

from trajrag.agent.goal_visibility import MappabilityCheck, unmappable_goals
from trajrag.cli import add_override_arg
from trajrag.config import Settings
from trajrag.world.sim import GridSimulator

SCENES_HELP = ("a Gibson *_info.pbz2 file (or folder of them), a folder of Matterport3D scans "
               "(<scan>/BEV_semantic_map.npy), either with @held_out or @rest (the held-out homes of "
               "configs/gibson.yaml / mp3d.yaml, or the others), or procedural:SPLIT:N (N homes of "
               "train/val/test; SPLIT:A-B for homes A..B-1)")
EPISODES_HELP = "a habitat-layout folder of *_episodes.json.gz files, or generated:K[:SEED] (K episodes per scene)"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("episodes", help="inspect ObjectNav episode sets")
    episodes_sub = parser.add_subparsers(dest="episodes_command", required=True, metavar="ACTION")
    check = episodes_sub.add_parser(
        "check",
        help="load scenes + episodes and report whether they can run",
        description="The dataset doctor: loads SCENES and EPISODES, checks every start is traversable "
        "and every goal reachable, and prints counts, mean geodesic length and a per-category table. "
        "It also maps every goal instance of the goal categories from one frame of exact semantics "
        "(the configured simulator and mapper, from traversable cells around it) and names those "
        "the agent could never put on its map, with the reason; an episode whose goal has no "
        "mappable instance in its scene is a problem.",
    )
    check.add_argument("--scenes", required=True, help=SCENES_HELP)
    check.add_argument("--episodes", required=True, help=EPISODES_HELP)
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.add_argument("--skip-mapping", action="store_true",
                       help="skip the goal-mapping check (seconds per scene at 640x480; 7 s on the largest "
                       "MP3D home)")
    add_override_arg(check)
    check.set_defaults(func=check_command)


def check_command(args: argparse.Namespace) -> int:
    mapping_check = None if args.skip_mapping else mappability_check(args.settings)
    report = check_dataset(args.scenes, args.episodes, args.settings, mapping_check, progress=args.progress)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        _print_table(report)
    if report["problems"]:
        print(f"{len(report['problems'])} episode problem(s), first: {report['problems'][0]}", file=sys.stderr)
        return 1
    return 0


def mappability_check(settings: Settings) -> MappabilityCheck:
    """The goal-mapping check's settings from the sections the agent runs with."""
    episodes_cfg = settings.episodes
    return MappabilityCheck(
        sim=GridSimulator(settings.sim),
        mapping=settings.mapping,
        perception=settings.perception,
        view_radius_m=episodes_cfg.mappable_view_radius_m,
        max_views=episodes_cfg.mappable_views,
        enough_cells=settings.navigator.goal_min_cells,
    )


def check_dataset(scene_spec: str, episode_spec: str, settings: Settings,
                  mapping_check: MappabilityCheck | None = None, progress: bool = False) -> dict:
    """The doctor's report as a dict (keys: episodes, starts_traversable, goals_reachable, ...,
    scenes_without_episodes: scene name -> why none was generated or listed there, and with
    ``mapping_check`` unmappable_goals: the goal instances no frame maps, with the reason).

    ``starts_traversable`` and ``goals_reachable`` count episodes; ``*_frac`` give the fractions.
    Raises the dataset errors of ``world.datasets`` on input that cannot be read.
    """
    from trajrag.cli import UserError
    from trajrag.world.datasets import load_episodes, validate_episodes, load_scenes
    from trajrag.world.episode_gen import scene_goal_field, why_no_episodes

    scenes = load_scenes(scene_spec, settings)
    if not scenes:
        raise UserError(f"no scenes in {scene_spec!r}")
    episodes = load_episodes(episode_spec, scenes, settings, strict=False)
    if not episodes:
        raise UserError(f"no episodes in {episode_spec!r}")
    cfg = settings.episodes
    validation = validate_episodes(episodes, scenes, cfg.start_floor_tolerance_m)
    bad = {(p.scene_key, p.episode_id) for p in validation.problems}
    by_name = {scene.name: scene for scene in scenes}

    per_category: dict[str, dict] = defaultdict(lambda: {"episodes": 0, "reachable": 0, "geodesic_sum": 0.0})
    starts_ok = reachable = 0
    geodesics: list[float] = []
    problems = [str(p) for p in validation.problems]
    for episode in episodes:
        row = per_category[episode.object_category]
        row["episodes"] += 1
        if (episode.scene_key, episode.episode_id) in bad:
            continue
        starts_ok += 1
        scene = by_name[episode.scene_key]
        field = scene_goal_field(scene, episode.object_category, cfg)
        distance = field.cell_distance(scene.to_cell(episode.start_pose().xy))
        if not math.isfinite(distance):
            problems.append(f"episode {episode.episode_id} ({episode.scene_key}): goal "
                            f"{episode.object_category!r} unreachable from the start")
            continue
        reachable += 1
        geodesics.append(distance)
        row["reachable"] += 1
        row["geodesic_sum"] += distance

    unmappable: list[dict] = []
    if mapping_check is not None:
        unmappable, mapping_problems = _goal_mapping(scenes, episodes, bad, cfg.goal_categories, mapping_check,
                                                     progress)
        problems += mapping_problems

    n = len(episodes)
    with_episodes = {episode.scene_key for episode in episodes}
    report = {
        "scenes": len(scenes),
        "episodes": n,
        "starts_traversable": starts_ok,
        "starts_traversable_frac": starts_ok / n,
        "goals_reachable": reachable,
        "goals_reachable_frac": reachable / n,
        "mean_geodesic_m": sum(geodesics) / len(geodesics) if geodesics else None,
        "per_category": {
            name: {
                "episodes": row["episodes"],
                "reachable": row["reachable"],
                "mean_geodesic_m": row["geodesic_sum"] / row["reachable"] if row["reachable"] else None,
            }
            for name, row in sorted(per_category.items())
        },
        "problems": problems,
        "scenes_without_episodes": {
            scene.name: why_no_episodes(scene, cfg) for scene in scenes if scene.name not in with_episodes
        },
    }
    if mapping_check is not None:
        report["unmappable_goals"] = unmappable
    return report


def _goal_mapping(scenes: list, episodes: list, bad: set, goal_categories: list[str],
                  check: MappabilityCheck, progress: bool) -> tuple[list[dict], list[str]]:
    """The unmappable goal instances of every scene, and one problem per episode whose goal
    category has no mappable instance in its scene."""
    unmappable = []
    mappable: dict[tuple[str, str], bool] = {}
    for scene in tqdm(scenes, desc="goal mapping", unit="scene", disable=not progress, file=sys.stderr):
        categories = [c for c in goal_categories if c in scene.categories]
        rows = unmappable_goals(scene, categories, check)
        unmappable += rows
        for category in categories:
            total = int((scene.instance_category == scene.category_id(category)).sum())
            mappable[(scene.name, category)] = sum(r["category"] == category for r in rows) < total
    problems = [
        f"episode {e.episode_id} ({e.scene_key}): no instance of goal {e.object_category!r} can be mapped"
        for e in episodes
        if (e.scene_key, e.episode_id) not in bad and not mappable.get((e.scene_key, e.object_category), True)
    ]
    return unmappable, problems


def _print_table(report: dict) -> None:
    print(f"scenes {report['scenes']}  episodes {report['episodes']}  "
          f"starts traversable {report['starts_traversable']}  goals reachable {report['goals_reachable']}  "
          f"mean geodesic {report['mean_geodesic_m'] or float('nan'):.2f} m")
    print(f"{'category':<14}{'episodes':>10}{'reachable':>11}{'geodesic m':>12}")
    for name, row in report["per_category"].items():
        geo = row["mean_geodesic_m"]
        print(f"{name:<14}{row['episodes']:>10}{row['reachable']:>11}{(geo if geo is not None else float('nan')):>12.2f}")
    for line in report["problems"][:20]:
        print(f"  problem: {line}")
    for name, why in report["scenes_without_episodes"].items():
        print(f"  no episodes in {name}: {why}")
    for row in report.get("unmappable_goals", []):
        print(f"  unmappable goal: {row['scene']} {row['category']} #{row['instance']}: {row['reason']}")
