"""Cross-validated held-out recall: every scene of a store held out once.

One held-out split of a real memory leaves few queries (a chunk is a query only if another
held-out chunk shares its group: 9 to 118 queries on our memories), so recall@5 of the encoder
and of the text baseline differ by a query or two from one split to the next.
``cross_validate(store, out_dir, folds)`` trains one encoder per fold (``encoder.train.fold``
``I/K``: the K folds of one seed partition the scenes), evaluates each on its own held-out
scenes, and pools the per-query hits of all folds: recall over every query of the store, and the
paired difference of the trained encoder against the text baseline and against the untrained
encoder with a bootstrap interval over queries.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from trajrag.encoder import EncoderConfig, EncoderError, torch_device
from trajrag.encoder.evaluate import evaluate_encoder, paired_differences
from trajrag.encoder.node_encoder import NodeEncoder
from trajrag.encoder.train import train_encoder

EMBEDDINGS = ("trained", "text", "untrained")


def cross_validate(store: Any, out_dir: str | Path, folds: int, cfg: EncoderConfig, *, workers: int | None = None,
                   log: Callable[[str], None] | None = None) -> dict:
    """Train and evaluate ``folds`` encoders (``<out_dir>/fold-I``, each ``cfg`` with its
    ``train.fold``); returns one JSON-able dict:
    ``folds``, ``queries``, pooled ``trained`` / ``text`` / ``untrained`` recall@k,
    ``trained_minus_text`` and ``trained_minus_untrained`` (recall@k difference with its 95%
    interval), and ``per_fold`` (held-out scenes, queries and recall@k of each)."""
    if folds < 2:
        raise EncoderError(f"cross-validation needs at least 2 folds, got {folds}")
    say = log or (lambda _msg: None)
    ks = cfg.eval.ks
    # one frozen encoder (and its cache) for every fold
    node_encoder = NodeEncoder(cfg.node, device=torch_device(cfg.node.device))
    pooled: dict[str, dict[int, list[np.ndarray]]] = {name: {k: [] for k in ks} for name in EMBEDDINGS}
    per_fold = []
    for index in range(folds):
        fold_cfg = replace(cfg, train=replace(cfg.train, fold=f"{index}/{folds}"))
        model_dir = Path(out_dir) / f"fold-{index}"
        say(f"fold {index + 1}/{folds}: training")
        trained = train_encoder(store, model_dir, fold_cfg, workers=workers, node_encoder=node_encoder, log=say)
        hits: dict = {}
        result = evaluate_encoder(store, model_dir, fold_cfg, write=False, node_encoder=node_encoder, hits=hits)
        for name in EMBEDDINGS:
            for k in ks:
                pooled[name][k].append(hits[name][k])
        per_fold.append({"fold": index, "held_out_scenes": trained.held_out_scenes,
                         "queries": result["held_out"]["queries"],
                         **{name: result[name] for name in EMBEDDINGS}})
        say(f"fold {index + 1}/{folds}: {result['held_out']['queries']} queries, recall "
            + ", ".join(f"{name} {result[name]}" for name in EMBEDDINGS))
    return summarize_folds(pooled, per_fold, cfg.train.seed)


def summarize_folds(pooled: dict[str, dict[int, list[np.ndarray]]], per_fold: list[dict],
                    seed: int) -> dict:
    """Pooled recall@k and the paired query-level differences (see ``cross_validate``)."""
    hits = {name: {k: np.concatenate(parts).astype(np.float64) for k, parts in by_k.items()}
            for name, by_k in pooled.items()}
    summary: dict = {"folds": len(per_fold), "queries": int(len(next(iter(hits["trained"].values()))))}
    for name in EMBEDDINGS:
        summary[name] = {f"recall@{k}": float(h.mean()) for k, h in hits[name].items()}
    summary.update(paired_differences(hits, seed))
    summary["per_fold"] = per_fold
    return summary
