"""Ray job: build the TrajRAG corpus with N collector actors and one grouping writer.

    python jobs/build_corpus.py --scenes procedural:train:40 --episodes-per-scene 50 \
        --policy mix --store s3://bucket/trajrag/memory --workers 32 --summary summary.json

On a cluster: ``ray job submit --working-dir . -- python jobs/build_corpus.py ...`` (or the
RayJob in cluster/). Same options as ``trajrag corpus build --workers N``; the work is done by
``trajrag.distributed.corpus.build_corpus_ray``. Rerunning the same command resumes: only the
trajectories missing from the store are collected.
"""

from __future__ import annotations

import argparse
import json
import sys

from trajrag import artefacts
from trajrag.cli import UserError, add_override_arg, apply_presets, output_folder, wants_progress
from trajrag.cli.episodes import SCENES_HELP
from trajrag.config import ConfigError
from trajrag.memory.store import StoreError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenes", required=True, help=SCENES_HELP)
    parser.add_argument("--episodes-per-scene", type=int, required=True, help="episodes generated per scene")
    parser.add_argument("--policy", choices=("oracle", "explore", "mix"), default="mix",
                        help="collector policy (mix: corpus.oracle_fraction oracle walks)")
    parser.add_argument("--store", required=True, help="LanceDB URI: a folder or s3://bucket/prefix")
    parser.add_argument("--workers", type=int, default=None,
                        help="collector actors (default: corpus_job.collectors)")
    parser.add_argument("--writers", type=int, default=None,
                        help="grouping writers, by scene (default: corpus_job.writers; memory/shards.py)")
    parser.add_argument("--seed", type=int, default=None, help="episode seed (default: episodes.seed)")
    parser.add_argument("--ray-address", default=None, help="Ray cluster (default: $RAY_ADDRESS or local)")
    parser.add_argument("--summary", default=None, help="also write the summary JSON here (a path or s3://... URI)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON line (progress only on a terminal's stderr)")
    parser.add_argument("--mixed-settings", action="store_true",
                        help="add walks to a store collected with other world or sensor settings "
                             "(refused otherwise, naming the keys that differ)")
    add_override_arg(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from trajrag.distributed.corpus import build_corpus_ray

    try:
        apply_presets(args)
        output_folder(args.store, "--store")
        summary = build_corpus_ray(args.scenes, args.episodes_per_scene, args.policy, args.store,
                                   args.settings, seed=args.seed, workers=args.workers,
                                   progress=wants_progress(args), ray_address=args.ray_address,
                                   mixed_settings=args.mixed_settings, writers=args.writers)
    except (UserError, ConfigError, FileNotFoundError, StoreError) as exc:
        print(f"build_corpus: error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(summary, indent=None if args.json else 2)
    if args.summary:
        with artefacts.output_file(args.summary) as path:
            path.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
