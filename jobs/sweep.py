"""Ray job: Ray Tune sweep of the TrajRAG planner's retrieval and scoring hyperparameters.

    python jobs/sweep.py --store runs/memory --model runs/model --out runs/sweep \
        [--samples 32] [--set sweep.objective=sr] [--set sweep.scenes=procedural:train:40-60]

On a cluster: ``ray job submit --working-dir . -- python jobs/sweep.py ...``. Searches
``configs/sweep.yaml`` ``params`` with Optuna (TPE) and the ASHA scheduler on procedural *train*
homes the corpus never saw (never the val scenes of the tables); every trial is logged to W&B
(offline unless WANDB_MODE says otherwise). Writes ``<out>/best_config.json`` (with the best
setting as ``--set`` overrides for ``trajrag eval``) and ``<out>/results.csv``. The work is done
by ``trajrag.distributed.sweep.sweep``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

from trajrag.cli import UserError, add_override_arg, apply_presets, wants_progress
from trajrag.config import ConfigError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True, help="memory store URI (trajrag corpus build --store)")
    parser.add_argument("--model", required=True, help="trained encoder folder or URI (trajrag encoder train --out)")
    parser.add_argument("--out", required=True, help="output folder or URI (best_config.json, results.csv, tune/)")
    parser.add_argument("--samples", type=int, default=None, help="trials (default: sweep.num_samples)")
    parser.add_argument("--ray-address", default=None, help="Ray cluster (default: $RAY_ADDRESS or local)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON line (progress only on a terminal's stderr)")
    add_override_arg(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from trajrag.distributed.sweep import sweep
    from trajrag.world.datasets import DATA_ERRORS

    try:
        apply_presets(args)
        # Tune prints its tables to stdout: keep stdout for the summary JSON alone.
        with contextlib.redirect_stdout(sys.stderr):
            summary = sweep(args.store, args.model, args.out, args.settings, num_samples=args.samples,
                            progress=wants_progress(args), ray_address=args.ray_address)
    except (UserError, ConfigError, FileNotFoundError, *DATA_ERRORS) as exc:
        print(f"sweep: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
