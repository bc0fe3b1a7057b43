"""Ray job: evaluate planners on ObjectNav episodes with N evaluator actors (planner on Ray Serve).

    python jobs/evaluate.py --scenes procedural:val:10 --episodes generated:5 --planner trajrag,frontier \
        --store s3://bucket/trajrag/memory --model s3://bucket/trajrag/model --out results/ --workers 32

On a cluster: ``ray job submit --working-dir . -- python jobs/evaluate.py ...`` (or the RayJob in
cluster/). The options are ``trajrag eval``'s (``trajrag eval --help``), always on Ray: ``--workers N``
evaluator actors (default ``eval_job.evaluators``), ``--shard I/N`` for one episode range of N (run
N jobs, on as many clusters, into the same --out), ``--ray-address``. The work is done by
``trajrag.distributed.evaluate.evaluate_ray``. Rerunning the same command resumes: episodes with a
record under ``<out>/<label>/`` are skipped.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from trajrag.cli import main as cli_main

    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
    return cli_main(["eval", "--distributed", *args])


if __name__ == "__main__":
    sys.exit(main())
