"""``trajrag compare``: paired SR / SPL differences between evaluation runs, pooled over folders.

One ``trajrag eval --out`` folder already tabulates its runs against nearest frontier
(``results.md``). A cross-validation writes one folder per fold and episode seed; this command
pairs the runs episode by episode inside each folder, pools the pairs and prints the pooled
differences with a 95% paired bootstrap interval, and the difference in each folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from trajrag import config
from trajrag.cli import UserError, output_folder


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "compare",
        help="paired SR/SPL differences between eval runs, pooled over several --out folders",
        description="Pairs each run's episodes with the baseline's inside every folder (episode ids "
        "repeat across generated seeds, so never across folders), pools the pairs and prints, per run: "
        "episodes, sr, spl, the baseline's sr and spl, d_sr and d_spl (run - baseline, fractions) with "
        "95% paired bootstrap intervals, and each folder's own d_sr and d_spl. It warns where a run and the "
        "baseline were walked with other world settings (sim, episodes, perception, procedural, gibson, mp3d; "
        "from their run.json).",
        epilog="example, a 5-fold x 3-seed Gibson cross-validation: trajrag compare runs/gibson/F*/O* "
        "--baseline frontier --runs trajrag",
    )
    parser.add_argument("folders", nargs="+", metavar="OUT", help="trajrag eval --out folders")
    parser.add_argument("--baseline", default="frontier", help="the run compared against (default: frontier)")
    parser.add_argument("--runs", default="", help="run labels to compare, comma-separated (default: every "
                        "run found beside the baseline)")
    parser.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default: 10000)")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("--pictures", type=Path, default=None, metavar="DIR",
                        help="also draw, per run, the episodes it lost against the baseline (the baseline "
                        "succeeded, the run failed) and those it won, both walks over the scene with the goal "
                        "outlined: DIR/<run>-vs-<baseline>/lost-NN.png, won-NN.png and index.md (needs --scenes)")
    parser.add_argument("--scenes", default="", metavar="SCENES",
                        help="the scenes the episodes ran in, as for trajrag eval (for --pictures; with folds "
                        "of one Gibson file, the whole file: GIBSON/train_info.pbz2); each run's are built with the "
                        "world settings of its run.json, as it walked them")
    parser.add_argument("--pictures-per-kind", type=int, default=6, metavar="N",
                        help="lost and won episodes drawn per run, the largest SPL differences first (default: 6)")
    parser.set_defaults(func=compare_command)


def compare_command(args: argparse.Namespace) -> int:
    from trajrag.agent.paired import compare_runs
    from trajrag.agent.run_records import json_safe

    runs = [r for r in args.runs.split(",") if r] or None
    if args.pictures is not None and not args.scenes:
        raise UserError("--pictures needs --scenes: the scenes the episodes ran in (as for trajrag eval)")
    if args.pictures_per_kind < 1:
        raise UserError(f"--pictures-per-kind must be at least 1, got {args.pictures_per_kind}")
    if args.pictures is not None:
        output_folder(args.pictures, "--pictures")
    try:
        comparisons = compare_runs([Path(f) for f in args.folders], args.baseline, runs, args.resamples)
    except ValueError as error:
        raise UserError(str(error)) from error
    pictures = _draw_pictures(args, [c.run for c in comparisons]) if args.pictures is not None else {}
    if args.json:
        print(json.dumps(json_safe({"baseline": args.baseline, "runs": [asdict(c) for c in comparisons],
                                    **({"pictures": pictures} if pictures else {})}), indent=2, allow_nan=False))
        return 0
    print(f"Paired differences vs {args.baseline}, pooled over {len(args.folders)} folder(s) "
          f"(95% bootstrap interval, {args.resamples} resamples):\n")
    print("| run | episodes | sr | spl | baseline sr | baseline spl | d_sr | d_spl |")
    print("|---|---|---|---|---|---|---|---|")
    for c in comparisons:
        print(f"| {c.run} | {c.episodes} | {c.sr:.3f} | {c.spl:.3f} | {c.baseline_sr:.3f} | {c.baseline_spl:.3f} "
              f"| {_points(c.d_sr, c.d_sr_interval)} | {_points(c.d_spl, c.d_spl_interval)} |")
    for warning in (w for c in comparisons for w in c.warnings):
        print(f"warning: not walked in the same world, {warning}", file=sys.stderr)
    for c in comparisons if len(args.folders) > 1 else ():
        print(f"\n{c.run}, per folder (d_sr / d_spl, points):")
        for f in c.folders:
            print(f"  {f['folder']}: {f['episodes']} episodes, {100 * f['d_sr']:+.1f} / {100 * f['d_spl']:+.1f}")
    return 0


def _draw_pictures(args: argparse.Namespace, runs: list[str]) -> dict[str, str]:
    """Each run's lost and won episodes as pictures (``--pictures``); run -> its index.md."""
    from trajrag.agent.paired import discordant_pairs
    from trajrag.agent.results_table import render_pair_png

    folders = [Path(f) for f in args.folders]
    index_paths = {}
    worlds: dict[tuple[str, ...], dict] = {}
    for run in runs:
        out = args.pictures / f"{run}-vs-{args.baseline}"
        out.mkdir(parents=True, exist_ok=True)
        lost, won = discordant_pairs(folders, args.baseline, run)
        lines = [f"# {run} against {args.baseline}: episodes one succeeded in and the other failed", "",
                 f"{len(lost)} lost (only {args.baseline} succeeded), {len(won)} won (only {run} succeeded); "
                 f"the {args.pictures_per_kind} of each with the largest SPL difference are drawn.", "",
                 "| picture | folder | episode | goal | d_spl | run steps | baseline steps |",
                 "|---|---|---|---|---|---|---|"]
        for kind, pairs in (("lost", lost), ("won", won)):
            for n, pair in enumerate(pairs[: args.pictures_per_kind], start=1):
                scenes = _scenes_walked(args.scenes, pair.folder, run, worlds)
                scene_key = pair.run["scene_key"]
                if scene_key not in scenes:
                    raise UserError(f"{pair.folder}: episode {pair.run['episode_id']} ran in {scene_key}, "
                                    f"which --scenes {args.scenes} does not hold")
                name = f"{kind}-{n:02d}.png"
                render_pair_png(scenes[scene_key], pair, run, args.baseline, out / name)
                steps = pair.run["metrics"]["steps"], pair.baseline["metrics"]["steps"]
                lines.append(f"| [{name}]({name}) | {pair.folder} | {pair.run['episode_id']} | {pair.run['category']} "
                             f"| {pair.d_spl:+.2f} | {steps[0]} | {steps[1]} |")
        (out / "index.md").write_text("\n".join(lines) + "\n")
        index_paths[run] = str(out / "index.md")
        print(f"pictures: {out / 'index.md'} ({len(lost)} lost, {len(won)} won)", file=sys.stderr)
    return index_paths


def _scenes_walked(spec: str, folder: Path, run: str, worlds: dict[tuple[str, ...], dict]) -> dict:
    """The scenes of ``spec`` by name as ``run`` in ``folder`` walked them: built with the world
    settings of its run.json (``mp3d.fragment_max_cells``, a Gibson goal-region rule...), so a
    picture shows the goals that episode had; ``worlds`` caches them per world."""
    from trajrag.agent.paired import world_overrides
    from trajrag.world.datasets import DatasetError, load_scenes

    world = tuple(world_overrides(folder, run))
    if world not in worlds:
        try:
            worlds[world] = {s.name: s for s in load_scenes(spec, config.settings(list(world)))}
        except (DatasetError, OSError, ValueError) as error:
            raise UserError(f"--scenes {spec}: {error}") from error
    return worlds[world]


def _points(d: float, interval: tuple[float, float]) -> str:
    """A difference of fractions in percentage points with its interval: +3.7 [+1.9, +5.5]."""
    return f"{100 * d:+.1f} [{100 * interval[0]:+.1f}, {100 * interval[1]:+.1f}]"
