"""``trajrag bench NAME --json``: benchmarks that print one JSON object (never timed tests)."""

from __future__ import annotations

import argparse
import importlib
import json

from trajrag.cli import add_override_arg, output_folder
from trajrag.perception.config import SEGMENTERS

# name -> "module:function"; the function takes the parsed args and the command's settings
# (``args.settings``) and returns a JSON-able dict.
BENCHES: dict[str, str] = {
    "sim": "trajrag.bench.world:run",
    "topo": "trajrag.bench.topo:run",
    "store": "trajrag.bench.store:run",
    "mapping": "trajrag.bench.mapping:run",
    "encoder": "trajrag.bench.encoder:run",
    # corpus_traj_per_s_1/_2, eval_episodes_per_h_1/_2, serve_ms_p50/_p99 (the Ray jobs, issue 7)
    "pipeline": "trajrag.bench.pipeline:run",
    # trajectories/s into the memory with 1 and N grouping writers (issue 51)
    "build": "trajrag.bench.build:run",
    # LanceDB store of --chunks N chunks: size, fine-stage ANN latency and recall@10 (issue 7)
    "scale": "trajrag.bench.scale:run",
    # the retrieved-experience lookup per decision on --chunks N past candidates, LanceDB vs numpy
    "experience": "trajrag.bench.experience:run",
    # the object detector's ms per frame: --detector oracle (default) or grounded-sam
    "perception": "trajrag.bench.perception:run",
}


# The ``bench --help`` description: what each bench measures, and its full and --quick sizes
# (the constants of its module, or the config keys named).
DESCRIPTION = """\
Run one benchmark and print its figures as one JSON object (never part of the timed
tests).

  sim         simulator steps/s at 640x480 and 160x120 on one core (1000 steps),
              on a procedural home and on the largest MP3D home; oracle SR/SPL
              on procedural, Gibson and MP3D homes
              (bench.oracle_*episodes_per_scene); --quick: 100 steps,
              bench.quick_episodes_per_scene episodes per home
  topo        navigator ms per step and topo-polar conversion (4 val homes x 2
              episodes); --quick: 1 home x 1 episode
  store       memory insert latency at 1k, 10k and 100k chunks (200 timed
              inserts, each committed and batched, on memory.fast_path and on
              the path before, in turn) and where it goes; --chunks N: up to
              N (e.g. 350000); --quick: 1k and 2k chunks, 50 inserts
  mapping     per-step ms of the map stack on one core (500 steps);
              --quick: 60 steps
  encoder     Ray Train pairs/s with 1 and 2 workers (encoder.bench: trajectories,
              epochs); --quick: 256 trajectories, 1 timed epoch
  pipeline    corpus trajectories/s, evaluation episodes/h and Serve decision
              latency (configs/pipeline_bench.yaml); --quick: its quick_* keys
  build       trajectories/s the grouping writer(s) take, 1 and 2 writers, fed
              pre-collected trajectories up to build_bench.chunks (--chunks N:
              also N); --quick: build_bench.quick_chunks
  scale       fine-stage ANN latency and recall@10 on a store of --chunks N chunks
              (scale_bench.chunks); --quick: scale_bench.quick_chunks
  experience  retrieved-experience lookup per decision on --chunks N past
              candidates, in memory vs LanceDB (experience_bench.rows);
              --quick: experience_bench.quick_rows
  perception  ms per frame of the object detector (--detector oracle or
              grounded-sam, on perception.device, weights from
              perception.grounded_sam.*_path) at sim.width x sim.height, 30
              frames; --quick: 5 frames. --curves DIR: SR/SPL against the
              detector's error level from jobs/perception_curves.sh DIR
"""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="run a benchmark and print one JSON object", description=DESCRIPTION,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(BENCHES), help="which benchmark (see above)")
    parser.add_argument("--json", action="store_true",
                        help="print JSON only (progress only on a terminal's stderr)")
    parser.add_argument("--quick", action="store_true", help="a smaller run, for smoke tests (sizes above)")
    parser.add_argument("--chunks", type=int, default=None, metavar="N",
                        help="corpus size, read by the scale, experience, store and build benches only (default: "
                             "scale_bench.chunks / experience_bench.rows, or their quick_* with --quick; "
                             "store: the largest size, 100k)")
    parser.add_argument("--workdir", default=None, metavar="DIR",
                        help="folder for the temporary stores of store, scale and experience "
                             "(default: the system temp folder; a tmpfs such as /dev/shm leaves "
                             "the disk out of the figures)")
    parser.add_argument("--detector", choices=SEGMENTERS, default="oracle",
                        help="the segmenter the perception bench times (read by that bench only; "
                             "grounded-sam needs perception.grounded_sam.grounding_dino_path and sam_path)")
    parser.add_argument("--curves", default=None, metavar="DIR",
                        help="perception bench: instead of timing, SR/SPL against the error level from the "
                             "evaluations jobs/perception_curves.sh DIR wrote, with DIR/curves.png")
    add_override_arg(parser)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    for option, folder in (("--curves", args.curves), ("--workdir", args.workdir)):
        if folder is not None:
            output_folder(folder, option)
    module_name, func_name = BENCHES[args.name].split(":")
    result = getattr(importlib.import_module(module_name), func_name)(args, args.settings)
    print(json.dumps(result, indent=None if args.json else 2, sort_keys=True))
    return 0
