"""Ray job: train the trajectory encoder on a memory store with Ray Train, then evaluate it.

    python jobs/train_encoder.py --store s3://bucket/trajrag/memory --out s3://bucket/trajrag/model \
        --workers 8 --set encoder.train.use_gpu=true --eval

On a cluster: ``ray job submit --working-dir . -- python jobs/train_encoder.py ...``. Same options
as ``trajrag encoder train`` (and ``--eval`` runs ``trajrag encoder eval`` afterwards, writing the
embeddings into the store); the work is done by ``trajrag.encoder.train.train_encoder``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from trajrag.cli import add_override_arg, apply_presets, wants_progress
from trajrag.config import ConfigError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True, help="memory store URI (a folder or s3://...)")
    parser.add_argument("--out", required=True, help="model folder or URI (s3://...) to write")
    parser.add_argument("--workers", type=int, default=None,
                        help="Ray Train workers (default: encoder.train.workers)")
    parser.add_argument("--ray-address", default=None,
                        help="Ray cluster (default: encoder.train.ray_address, $RAY_ADDRESS or local)")
    parser.add_argument("--eval", action="store_true",
                        help="then evaluate on the held-out scenes and write embeddings to the store")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON line (progress only on a terminal's stderr)")
    add_override_arg(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from trajrag.encoder import EncoderError
    from trajrag.encoder.evaluate import evaluate_encoder
    from trajrag.encoder.train import train_encoder
    from trajrag.memory.store import StoreError

    log = (lambda msg: print(msg, file=sys.stderr)) if wants_progress(args) else None
    try:
        apply_presets(args)
        settings = args.settings
        if args.ray_address:
            settings = settings.with_values({"encoder.train.ray_address": args.ray_address})
        result = train_encoder(args.store, args.out, settings.encoder, workers=args.workers, log=log)
        summary: dict = {"train": asdict(result)}
        if args.eval:
            summary["eval"] = evaluate_encoder(args.store, args.out, settings.encoder)
    except (EncoderError, StoreError, ConfigError, FileNotFoundError) as exc:
        print(f"train_encoder: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
