"""Ray job: the encoder's training on a GPU against a CPU worker, in one Ray and one run.

    python jobs/encoder_gpu_bench.py            # on a node with a GPU; prints one JSON line

`trajrag bench encoder` (synthetic set, InfoNCE, AdamW; see trajrag/bench/encoder.py) with one
Ray Train worker, run five times: the configured model (configs/encoder.yaml, 2 x 128) and the
paper's size (DistilGPT2: 6 layers, 12 heads, 768 wide), each on a GPU worker
(`encoder.train.use_gpu=true`) and a 1-CPU worker, and the paper's size once more on the GPU at
batch 512. Each row says the device rank 0 trained on and its last epoch's loss; the CPU run of
the paper's size walks 256 trajectories (2 epochs), since one CPU thread trains it at a few
pairs a second.

`--node-texts N` also times what `encoder.node.device` moves to the GPU in the jobs that encode a
whole memory: the frozen node encoder over N distinct node texts (random sector labels) and the
trajectory model's embeddings, on the GPU and on the CPU (all its threads), with the largest
difference between the two. `--node-dir` names another node encoder folder (default: the
configured one). Figures: docs/results.md, "Latency and scale".
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
    parser.add_argument("--node-texts", type=int, default=0,
                        help="also time the node encoder and trajectory embeddings on N node texts")
    parser.add_argument("--node-dir", default="", help="node encoder folder (default: configured)")
    args = parser.parse_args(argv)
    from trajrag import config
    from trajrag.bench.encoder import run

    unknown = [c for c in filter(None, args.cases.split(",")) if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {list(CASES)}")
    out: dict = {}
    if args.node_texts:
        out["node_encoding"] = node_encoding(args.node_texts, args.node_dir, config.load("encoder"))
        print("node_encoding", json.dumps(out["node_encoding"]), file=sys.stderr, flush=True)
    for case in filter(None, args.cases.split(",")):
        start = time.perf_counter()
        overrides = [*ONE_WORKER, *CASES[case]]
        row = run(argparse.Namespace(quick=False, overrides=overrides), config.settings(overrides))
        out[case] = {**row, "wall_s": round(time.perf_counter() - start, 1)}
        print(case, json.dumps(out[case]), file=sys.stderr, flush=True)
    for size in ("configured", "paper"):
        gpu, cpu = out.get(f"{size}_gpu"), out.get(f"{size}_cpu")
        if gpu and cpu:
            out[f"{size}_gpu_over_cpu"] = round(gpu["samples_per_s_1w"] / cpu["samples_per_s_1w"], 1)
    print(json.dumps(out))
    return 0


def node_encoding(n: int, node_dir: str, cfg) -> dict:
    """Node texts/s and trajectory embeddings/s on the GPU and the CPU (``cfg``: the ``encoder``
    section), and how far apart the two devices' outputs are (max absolute difference of
    unit-length embeddings)."""
    from dataclasses import replace

    import numpy as np
    import torch

    from trajrag.bench.encoder import synthetic_set
    from trajrag.encoder import torch_device
    from trajrag.encoder.model import build_model, embed
    from trajrag.encoder.node_encoder import NodeEncoder

    node_cfg = replace(cfg.node, model_dir=node_dir) if node_dir else cfg.node
    rng = np.random.default_rng(0)
    names = {k: f"object {k}" for k in range(15)}
    labels = rng.integers(-3, 15, size=(n, 12))  # the three special labels are negative ids
    gpu = torch_device("auto")
    result: dict = {"texts": n, "gpu": gpu}
    outputs = {}
    for device in dict.fromkeys([gpu, "cpu"]):
        encoder = NodeEncoder(node_cfg, device=device)
        texts = list(dict.fromkeys(encoder.node_text(row, names) for row in labels))
        encoder.encode_texts(texts[:256])  # warm-up
        start = time.perf_counter()
        outputs[device] = encoder.encode_texts(texts)
        result[f"texts_per_s_{device}"] = round(len(texts) / (time.perf_counter() - start), 1)
        data = synthetic_set(min(n, 4096), 64, 5, 30, encoder.dim, 0)
        model = build_model(cfg.model, data.dim, cfg.train.seed).to(device)
        every = np.arange(len(data))
        start = time.perf_counter()
        outputs[f"z_{device}"] = embed(model, data.sequences(every), data.goal_vectors(every), cfg.eval.encode_batch)
        result[f"trajectories_per_s_{device}"] = round(len(data) / (time.perf_counter() - start), 1)
    result["distinct_texts"] = len(outputs["cpu"])
    if gpu != "cpu":
        result["node_max_abs_diff"] = float(np.abs(outputs[gpu] - outputs["cpu"]).max())
        result["z_max_abs_diff"] = float(np.abs(outputs[f"z_{gpu}"] - outputs["z_cpu"]).max())
        result["node_gpu_over_cpu"] = round(result[f"texts_per_s_{gpu}"] / result["texts_per_s_cpu"], 1)
    result["cpu_threads"] = torch.get_num_threads()
    return result


if __name__ == "__main__":
    sys.exit(main())
