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

from trajrag.cli import UserError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "compare",
        help="paired SR/SPL differences between eval runs, pooled over several --out folders",
        description="Pairs each run's episodes with the baseline's inside every folder (episode ids "
        "repeat across generated seeds, so never across folders), pools the pairs and prints, per run: "
        "episodes, sr, spl, the baseline's sr and spl, d_sr and d_spl (run - baseline, fractions) with "
        "95%% paired bootstrap intervals, and each folder's own d_sr and d_spl. It warns where a run and the "
        "baseline were walked with other world settings (sim, episodes, perception, procedural, gibson; "
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
    parser.set_defaults(func=compare_command)


def compare_command(args: argparse.Namespace) -> int:
    from trajrag.agent.evaluate import compare_runs

    runs = [r for r in args.runs.split(",") if r] or None
    try:
        comparisons = compare_runs([Path(f) for f in args.folders], args.baseline, runs, args.resamples)
    except ValueError as error:
        raise UserError(str(error)) from error
    if args.json:
        print(json.dumps({"baseline": args.baseline, "runs": [asdict(c) for c in comparisons]}, indent=2))
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


def _points(d: float, interval: tuple[float, float]) -> str:
    """A difference of fractions in percentage points with its interval: +3.7 [+1.9, +5.5]."""
    return f"{100 * d:+.1f} [{100 * interval[0]:+.1f}, {100 * interval[1]:+.1f}]"
