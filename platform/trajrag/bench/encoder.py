"""``trajrag bench encoder``: contrastive training throughput on Ray Train with 1 and 2 workers.

The workload is a synthetic ``EncodedSet`` shaped like the real one (``encoder.bench``: node
embeddings of the node encoder's width as random unit vectors, trajectories of 5-30 nodes,
groups and goals), trained with the configured model and batch size. The frozen node encoder
is not part of the timing: training only reads its cached outputs.

* ``samples_per_s_1w`` / ``samples_per_s_2w``: anchor-positive pairs per second over all
  workers, measured inside the training loop (forward, InfoNCE with the gathered negatives,
  backward, AdamW step) over ``encoder.bench.epochs`` epochs after one warm-up epoch; each worker
  has one CPU thread (Ray's default for a 1-CPU worker).
* ``startup_s_1w`` / ``startup_s_2w``: the rest of the ``TorchTrainer.fit`` wall time (worker
  group start, process group, checkpoints, reports).
* ``device_1w`` / ``loss_1w`` (and 2w): the device rank 0 trained on (``cpu``, ``cuda:0``: GPU
  workers with ``--set encoder.train.use_gpu=true``) and the last epoch's mean InfoNCE loss, so
  a GPU run can be checked against a CPU run of the same set.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from dataclasses import replace

import numpy as np

from trajrag.config import Settings
from trajrag.encoder.data import EncodedSet
from trajrag.encoder.train import run_trainer
from trajrag.ray_cluster import ensure_ray

# MiniLM's width: the default node encoder (configs/encoder.yaml node.model_dir).
NODE_DIM = 384
GOALS = 6
_QUICK_TRAJECTORIES = 256


def synthetic_set(n: int, groups: int, min_nodes: int, max_nodes: int, dim: int,
                  seed: int) -> EncodedSet:
    """``n`` trajectories of random unit node embeddings (``dim`` wide) in ``groups`` groups."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_nodes, max_nodes + 1, size=n)
    distinct = int(lengths.sum())
    node_emb = rng.normal(size=(distinct, dim)).astype(np.float32)
    node_emb /= np.linalg.norm(node_emb, axis=1, keepdims=True)
    goal_emb = rng.normal(size=(GOALS, dim)).astype(np.float32)
    goal_emb /= np.linalg.norm(goal_emb, axis=1, keepdims=True)
    return EncodedSet(
        ids=[f"bench-{i}" for i in range(n)], group=rng.integers(0, groups, size=n),
        goal_code=rng.integers(0, GOALS, size=n), node_emb=node_emb,
        node_idx=np.arange(distinct, dtype=np.int64),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        goal_emb=goal_emb, goals=[f"goal{g}" for g in range(GOALS)])


def run(args: argparse.Namespace, settings: Settings) -> dict:
    cfg = settings.encoder
    bench = cfg.bench
    n = _QUICK_TRAJECTORIES if args.quick else bench.trajectories
    epochs = 1 + (1 if args.quick else bench.epochs)
    cfg = replace(cfg, train=replace(cfg.train, epochs=epochs, wandb_mode="disabled"))
    data = synthetic_set(n, bench.groups, bench.min_nodes, bench.max_nodes, NODE_DIM,
                         cfg.train.seed)
    ensure_ray(cfg.train.ray_address, quiet=True)
    out: dict = {"trajectories": n, "timed_epochs": epochs - 1, "batch_size": cfg.train.batch_size}
    with tempfile.TemporaryDirectory(prefix="trajrag-bench-encoder-") as storage:
        for workers in bench.workers:
            start = time.perf_counter()
            result = run_trainer(data, cfg, storage, f"bench-{workers}w-{uuid.uuid4().hex[:6]}",
                                 workers=workers, wandb_dir=storage)
            wall = time.perf_counter() - start
            history = result.return_value["history"]
            timed = history[1:]
            pairs = sum(h["pairs"] for h in timed)
            seconds = sum(h["seconds"] for h in timed)
            out[f"samples_per_s_{workers}w"] = round(pairs / max(seconds, 1e-9), 1)
            out[f"startup_s_{workers}w"] = round(wall - sum(h["seconds"] for h in history), 1)
            out[f"device_{workers}w"] = result.return_value["device"]
            out[f"loss_{workers}w"] = round(history[-1]["loss"], 4)
    return out
