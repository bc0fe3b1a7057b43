"""``trajrag corpus build | stats | regroup | show``: build the TrajRAG memory from collected episodes.

``build`` generates ObjectNav episodes on the given scenes, collects them with the chosen policy
(``agent/collect.py``), converts each to a topo-polar trajectory and inserts it into the LanceDB
memory (``memory/grouping.py``) in batches. Trajectory ids are deterministic, so re-running the
same command after a crash skips what the store already holds and never duplicates.
``regroup`` replays a built memory under other ``memory.*`` settings (``memory/regroup.py``);
``show`` draws one group (``memory/viz.py``).
"""

from __future__ import annotations

import argparse
import json
import time

from trajrag.cli import UserError, add_override_arg, output_file, output_folder
from trajrag.cli.episodes import SCENES_HELP


_WRITERS_HELP = ("grouping writers, each holding the groups of a share of the scenes (memory/shards.py; "
                 "1: the single writer); default: %(default)s")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("corpus", help="build and inspect the trajectory memory")
    corpus_sub = parser.add_subparsers(dest="corpus_command", required=True, metavar="ACTION")
    build = corpus_sub.add_parser(
        "build", help="collect episodes and insert them into the memory",
        description="Collect ObjectNav episodes (oracle, exploration or a mix), convert them to "
        "topo-polar trajectories and insert them into the LanceDB memory. The exploration walks' "
        "decisions are kept beside the chunks for `trajrag value fit --store` "
        "(corpus.keep_value_decisions). Resumable.")
    build.add_argument("--scenes", required=True, help=SCENES_HELP)
    build.add_argument("--episodes-per-scene", type=int, required=True, help="episodes generated per scene")
    build.add_argument("--policy", choices=("oracle", "explore", "mix"), default="mix",
                       help="collector: oracle (shortest walks), explore (nearest frontier) or mix "
                            "(corpus.oracle_fraction oracle walks); default: %(default)s")
    build.add_argument("--store", required=True, help="LanceDB URI (a folder, or an object-store URI)")
    build.add_argument("--seed", type=int, default=None,
                       help="episode generation seed (default: episodes.seed). Episode ids are scene:index "
                            "whatever the seed, so a store keeps the walk it holds at each index: another "
                            "seed adds walks only at indices not yet stored (skipped_already_stored says how "
                            "many it skipped); use a new --store for another plan")
    build.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    build.add_argument("--mixed-settings", action="store_true",
                       help="add walks to a store whose walks were collected with other world or sensor "
                            "settings (sim, perception, episodes, dataset); without it such a build is "
                            "refused, naming the keys that differ. The store records every set "
                            "(corpus stats shows them)")
    build.add_argument("--workers", type=int, default=0,
                       help="collector actors on Ray (0: one process, no Ray; see distributed/corpus.py); "
                            "default: %(default)s")
    build.add_argument("--writers", type=int, default=1, help=_WRITERS_HELP)
    build.add_argument("--ray-address", default=None,
                       help="Ray cluster to join with --workers (default: $RAY_ADDRESS, else a local Ray)")
    add_override_arg(build)
    build.set_defaults(func=build_command)

    stats = corpus_sub.add_parser(
        "stats", help="counts, grouping quality and size of a memory",
        description="Reads a memory (never writes it) and prints its chunk and group counts, the "
                    "grouping decisions by kind, the grouping's quality against the scenes the chunks "
                    "came from (purity: 1.0 when no group mixes homes; completeness: 1.0 when every "
                    "home lies in one group; memory/stats.py), and bytes per chunk on disk. --ceiling "
                    "adds the completeness a perfect matcher could reach.")
    stats.add_argument("--store", required=True, help="LanceDB URI")
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    stats.add_argument("--ceiling", action="store_true",
                       help="also completeness_ceiling: the completeness a perfect matcher would reach "
                            "with memory.min_inliers shared places, over the walks and (completeness_"
                            "ceiling_maps) over the maps they were walked in (slow on big stores)")
    add_override_arg(stats)
    stats.set_defaults(func=stats_command)

    regroup = corpus_sub.add_parser(
        "regroup", help="re-group a memory's chunks under other memory.* settings (no re-collection)",
        description="Replays every chunk of --store, in its original insertion order, through the "
                    "grouping with the current configuration (--set memory.KEY=VALUE) into a new "
                    "store at --out, and prints the decision counts and the corpus stats of the "
                    "result. The source is only read. Chunks dropped as redundant by the source "
                    "cannot be replayed; embeddings are not copied (run trajrag encoder eval on "
                    "the new store).")
    regroup.add_argument("--store", required=True, help="source LanceDB URI (read only)")
    regroup.add_argument("--out", required=True, help="new LanceDB URI (must hold no chunks)")
    regroup.add_argument("--json", action="store_true", help="print one JSON object")
    regroup.add_argument("--writers", type=int, default=1, help=_WRITERS_HELP)
    add_override_arg(regroup)
    regroup.set_defaults(func=regroup_command)

    fit = corpus_sub.add_parser(
        "fit-verifier", help="learn the match verifier (memory.verifier) from a memory of known homes",
        description="Replays every chunk of --store (with the maps it was walked in) through the "
                    "grouping under the current configuration, records the evidence of every "
                    "candidate match with a pose (memory.matching.pose_evidence) and whether the "
                    "candidate group is the trajectory's home (scene_hint), and fits a logistic "
                    "verifier. Prints the weights as --set overrides, the cross-validated AUC, and "
                    "true and false accepts next to the replay's own (the thresholds', or a "
                    "verifier already switched on). Fit on homes the memory you will build does "
                    "not hold.")
    fit.add_argument("--store", required=True, help="source LanceDB URI with scene hints (read only)")
    fit.add_argument("--json", action="store_true", help="print one JSON object")
    add_override_arg(fit)
    fit.set_defaults(func=fit_verifier_command)

    show = corpus_sub.add_parser(
        "show", help="picture of one group: its summary graph and member trajectories by scene",
        description="Draws a group's summary graph in the group frame with every member "
                    "trajectory moved into it, coloured by the scene it came from: a false merge "
                    "shows as two colours on one summary.")
    show.add_argument("--store", required=True, help="LanceDB URI")
    show.add_argument("--group", default="largest",
                      help="a group id, 'largest' (most members, the default) or 'mixed' (the "
                           "largest group whose members come from more than one scene)")
    show.add_argument("--out", required=True, help="PNG file to write")
    show.set_defaults(func=show_command)


def build_command(args: argparse.Namespace) -> int:
    output_folder(args.store, "--store")
    if args.workers < 0:
        raise UserError(f"--workers must be >= 0, got {args.workers}")
    if args.writers < 1:
        raise UserError(f"--writers must be >= 1, got {args.writers}")
    if args.workers >= 1:
        from trajrag.distributed.corpus import build_corpus_ray

        summary = build_corpus_ray(args.scenes, args.episodes_per_scene, args.policy, args.store,
                                   args.settings, seed=args.seed, workers=args.workers, writers=args.writers,
                                   progress=args.progress, ray_address=args.ray_address,
                                   mixed_settings=args.mixed_settings)
        print(json.dumps(summary, indent=None if args.json else 2))
        return 0
    from trajrag.agent.corpus import build_corpus

    summary = build_corpus(args.scenes, args.episodes_per_scene, args.policy, args.store, args.settings,
                           seed=args.seed, progress=args.progress, writers=args.writers,
                           mixed_settings=args.mixed_settings)
    print(json.dumps(summary, indent=None if args.json else 2))
    return 0


def regroup_command(args: argparse.Namespace) -> int:
    from trajrag.memory.regroup import regroup
    from trajrag.memory.stats import corpus_stats

    output_folder(args.out, "--out")
    start = time.perf_counter()
    if args.writers < 1:
        raise UserError(f"--writers must be >= 1, got {args.writers}")
    replayed = regroup(args.store, args.out, args.settings.memory, progress=args.progress,
                       writers=args.writers)
    seconds = time.perf_counter() - start
    summary = {"source": args.store, "replayed": replayed, **corpus_stats(args.out),
               "seconds": round(seconds, 2)}
    print(json.dumps(summary, indent=None if args.json else 2, default=str))
    return 0


def fit_verifier_command(args: argparse.Namespace) -> int:
    from trajrag.memory.verifier import collect, fit

    cfg = args.settings.memory
    start = time.perf_counter()
    try:
        report = fit(collect(args.store, cfg, progress=args.progress), cfg)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    report = {"source": args.store, **report, "seconds": round(time.perf_counter() - start, 2)}
    print(json.dumps(report, indent=None if args.json else 2))
    return 0


def show_command(args: argparse.Namespace) -> int:
    from trajrag.memory.store import MemoryStore
    from trajrag.memory.viz import pick_group, render_group_png

    output_file(args.out, "--out")
    store = MemoryStore(args.store, read_only=True)
    try:
        group_id = pick_group(store, args.group)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    print(render_group_png(store, group_id, args.out))
    return 0


def stats_command(args: argparse.Namespace) -> int:
    from trajrag.memory.build_settings import BuildSettings
    from trajrag.memory.stats import corpus_stats

    memory_cfg = args.settings.memory
    ceiling = (memory_cfg.min_inliers, memory_cfg.merge_radius_m) if args.ceiling else None
    stats = corpus_stats(args.store, ceiling)
    stats["build_settings"] = BuildSettings(args.store).recorded()
    print(json.dumps(stats, indent=None if args.json else 2, default=str))
    return 0
