"""Ray job: the encoder's training on a GPU against a CPU worker, in one Ray and one run.

    python jobs/encoder_gpu_bench.py            # on a node with a GPU; prints one JSON line

`trajrag bench encoder` (synthetic set, InfoNCE, AdamW; see trajrag/bench/encoder.py) with one
Ray Train worker, run five times: the configured model (configs/encoder.yaml, 2 x 128) and the
paper's size (DistilGPT2: 6 layers, 12 heads, 768 wide), each on a GPU worker
(`encoder.train.use_gpu=true`) and a 1-CPU worker, and the paper's size once more on the GPU at
batch 512. Each row says the device rank 0 trained on and its last epoch's loss; the CPU run of
the paper's size walks 256 trajectories (2 epochs), since one CPU thread trains it at a few
pairs a second. Figures: docs/results.md, "Latency and scale".
"""

from __future__ import annotations

import argparse
import json
import sys
import time

PAPER_SIZE = ("encoder.model.n_layer=6", "encoder.model.n_head=12", "encoder.model.n_embd=768")
ONE_WORKER = ("encoder.bench.workers=[1]",)
SMALL_SET = ("encoder.bench.trajectories=256", "encoder.bench.epochs=1")
CASES = {
    "configured_gpu": ("encoder.train.use_gpu=true",),
    "configured_cpu": ("encoder.train.use_gpu=false",),
    "paper_gpu": ("encoder.train.use_gpu=true", *PAPER_SIZE),
    "paper_gpu_batch512": ("encoder.train.use_gpu=true", *PAPER_SIZE, "encoder.train.batch_size=512",
                           "encoder.bench.trajectories=8192"),
    "paper_cpu": ("encoder.train.use_gpu=false", *PAPER_SIZE, *SMALL_SET),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated subset of {', '.join(CASES)} (default: all)")
    args = parser.parse_args(argv)
    from trajrag.bench.encoder import run

    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {list(CASES)}")
    out: dict = {}
    for case in args.cases.split(","):
        start = time.perf_counter()
        row = run(argparse.Namespace(quick=False, overrides=[*ONE_WORKER, *CASES[case]]))
        out[case] = {**row, "wall_s": round(time.perf_counter() - start, 1)}
        print(case, json.dumps(out[case]), file=sys.stderr, flush=True)
    for size in ("configured", "paper"):
        gpu, cpu = out.get(f"{size}_gpu"), out.get(f"{size}_cpu")
        if gpu and cpu:
            out[f"{size}_gpu_over_cpu"] = round(gpu["samples_per_s_1w"] / cpu["samples_per_s_1w"], 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
