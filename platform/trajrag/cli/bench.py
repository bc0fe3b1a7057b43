"""``trajrag bench NAME --json``: benchmarks that print one JSON object (never timed tests)."""

from __future__ import annotations

import argparse
import importlib
import json

from trajrag.cli import add_override_arg

# name -> "module:function"; the function takes the parsed args and returns a JSON-able dict.
BENCHES: dict[str, str] = {
    "sim": "trajrag.bench.world:run",
    "topo": "trajrag.bench.topo:run",
    "store": "trajrag.bench.store:run",
    "mapping": "trajrag.bench.mapping:run",
    "encoder": "trajrag.bench.encoder:run",
    # corpus_traj_per_s_1/_2, eval_episodes_per_h_1/_2, serve_ms_p50/_p99 (the Ray jobs, issue 7)
    "pipeline": "trajrag.bench.pipeline:run",
    # LanceDB store of --chunks N chunks: size, fine-stage ANN latency and recall@10 (issue 7)
    "scale": "trajrag.bench.scale:run",
    # the retrieved-experience lookup per decision on --chunks N past candidates, LanceDB vs numpy
    "experience": "trajrag.bench.experience:run",
}


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="run a benchmark and print one JSON object")
    parser.add_argument("name", choices=sorted(BENCHES), help="which benchmark")
    parser.add_argument("--json", action="store_true", help="print JSON only (no progress output)")
    parser.add_argument("--quick", action="store_true", help="a smaller run, for smoke tests")
    parser.add_argument("--chunks", type=int, default=None, metavar="N",
                        help="corpus size for benches that take one (scale); default from its config")
    parser.add_argument("--workdir", default=None, metavar="DIR",
                        help="folder for the temporary stores of store, scale and experience "
                             "(default: the system temp folder; a tmpfs such as /dev/shm leaves "
                             "the disk out of the figures)")
    add_override_arg(parser)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    module_name, func_name = BENCHES[args.name].split(":")
    result = getattr(importlib.import_module(module_name), func_name)(args)
    print(json.dumps(result, indent=None if args.json else 2, sort_keys=True))
    return 0
