"""Held-out retrieval recall of the trajectory encoder, its baselines, and embeddings to the store.

``evaluate_encoder(store, model_dir)``: the chunks of scenes the model was not trained on (every
scene not in ``encoder.json``'s ``train_scenes``) are the queries and the gallery. A query's
positives are the other chunks of its group (the memory's geometric-semantic grouping: the same
place); recall@k is the share of queries (with at least one positive) that find one in their k
nearest neighbours by cosine similarity, the query itself excluded. Three embeddings:

* ``trained``: the trained f_E (Eq. 6);
* ``text``: the paper's text-embedding baseline (TE / TrajTextRAG): the same frozen MiniLM over
  the chunk's description L(T_tp) (``topo.describe``; it starts with the goal, "Goal: bed.");
* ``untrained``: f_E with the training run's initial weights (same architecture and seed).

The trained encoder's paired difference to each baseline (the same queries) comes with a
bootstrap interval over queries: one split holds few queries, and the interval says how far
its recall could move on another.

With ``write`` (the default), every chunk of the store then gets the trained embedding and the
encoder's version, whether recall could be measured or not (a small store may hold no held-out
chunk that shares its group with another: the result says so), in batches of
``eval.write_batch`` (one store commit each). The store takes a single writer: do not run this
while a corpus build is inserting into the same store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from trajrag.bootstrap import paired_interval
from trajrag.encoder import EncoderConfig, EncoderError, RecallNotMeasurable, torch_device
from trajrag.encoder.data import ChunkRecord, encode_records, read_records
from trajrag.memory.store import MemoryStore, StoreError, claim_store
from trajrag.topo.describe import describe
from trajrag.topo.trajectory import TopoPolarTrajectory


def query_hits(z: np.ndarray, group: np.ndarray, ks: Sequence[int]) -> dict[int, np.ndarray]:
    """{k: bool per query, whether a same-group chunk is among its k nearest by cosine similarity
    (rows of ``z`` are unit vectors; the query itself excluded)}: recall@k is its mean. The
    queries are the rows whose group has another member (a group of one has no positive), in
    row order."""
    z = np.asarray(z, dtype=np.float32)
    group = np.asarray(group)
    sizes = {g: int(n) for g, n in zip(*np.unique(group, return_counts=True))}
    queries = np.array([sizes[g] > 1 for g in group.tolist()], dtype=bool)
    if not queries.any():
        raise RecallNotMeasurable("no held-out chunk shares its group with another held-out chunk")
    sim = z[queries] @ z.T
    sim[np.arange(int(queries.sum())), np.flatnonzero(queries)] = -np.inf
    k_max = min(max(ks), len(z) - 1)
    top = np.argpartition(-sim, k_max - 1, axis=1)[:, :k_max] if k_max < sim.shape[1] else \
        np.tile(np.arange(sim.shape[1]), (len(sim), 1))
    # argpartition leaves the top k_max unordered: order them.
    order = np.take_along_axis(top, np.argsort(-np.take_along_axis(sim, top, 1), axis=1), 1)
    hit = group[order] == group[queries][:, None]
    return {k: hit[:, :k].any(axis=1) for k in ks}


def paired_differences(hits: Mapping[str, Mapping[int, np.ndarray]], seed: int) -> dict:
    """``{"trained_minus_text": {"recall@k": {"mean", "ci95"}}, "trained_minus_untrained": ..}``:
    the trained encoder's per-query hits (``query_hits``, one bool per query) minus each
    baseline's on the same queries, with a 95% paired bootstrap interval (recall fractions)."""
    out = {}
    for other in ("text", "untrained"):
        rng = np.random.default_rng([seed, len(other)])
        diffs = {}
        for k, trained in hits["trained"].items():
            d = np.asarray(trained, dtype=np.float64) - np.asarray(hits[other][k], dtype=np.float64)
            low, high = paired_interval(d, rng)
            diffs[f"recall@{k}"] = {"mean": float(d.mean()), "ci95": [low, high]}
        out[f"trained_minus_{other}"] = diffs
    return out


def _description(record: ChunkRecord, names: Mapping[int, str]) -> str:
    """The stored description, or L(T_tp) rebuilt from the chunk when the store has none."""
    if record.description:
        return record.description

    categories = tuple(names[k] for k in range(max(names, default=-1) + 1))
    return describe(TopoPolarTrajectory(record.node_xy, record.sectors, categories, record.goal,
                                        record.reference_yaw))


def write_embeddings(store: Any, ids: Sequence[str], z: np.ndarray, version: str,
                     batch_size: int) -> int:
    """Set ``embedding`` and ``encoder_version`` of the chunks ``ids`` (rows of ``z``),
    ``batch_size`` chunks per LanceDB version; returns the chunks updated.

    ``store``: a ``MemoryStore`` opened for writing, or its URI. Each batch is one
    ``MemoryStore.update_embeddings`` call (ids no longer stored are skipped; the store journals
    the update so a later writer does not roll it back).
    """
    if not isinstance(store, MemoryStore):
        store = MemoryStore(str(store))
    z = np.asarray(z, dtype=np.float32)
    if z.ndim != 2 or z.shape[1] != store.embedding_dim:
        raise EncoderError(f"memory store {store.uri} holds {store.embedding_dim}-wide embeddings "
                           f"(memory.embedding_dim), the encoder makes {z.shape[-1]}-wide ones; "
                           "set encoder.model.out_dim so that out_dim + the node encoder width match")
    if len(ids) != len(z):
        raise EncoderError(f"{len(ids)} chunk ids for {len(z)} embeddings")
    updated = 0
    for start in range(0, len(ids), batch_size):
        part = slice(start, start + batch_size)
        try:
            updated += store.update_embeddings(ids[part], z[part], version)
        except StoreError as exc:
            raise EncoderError(f"memory store {store.uri}: writing embeddings failed: {exc}") from exc
    return updated


def embed_chunks(store: Any, encoder: Any, records: Sequence[ChunkRecord], names: Mapping[int, str],
                 cfg: EncoderConfig) -> int:
    """Write ``encoder``'s (a ``TrajectoryEncoder``) embedding of every record into ``store``,
    claimed for the write (``claim_store``: not while a corpus build adds chunks)."""
    from trajrag.encoder.model import embed

    with claim_store(store.uri, f"embeddings of encoder {encoder.version}"):
        data = encode_records(records, names, encoder.node_encoder)
        every = np.arange(len(data))
        z = embed(encoder.model, data.sequences(every), data.goal_vectors(every), cfg.eval.encode_batch)
        return write_embeddings(store, data.ids, z, encoder.version, cfg.eval.write_batch)


def embed_store(store: Any, model_dir: str | Path, cfg: EncoderConfig, *, node_encoder: Any = None) -> int:
    """Embed every chunk of ``store`` (a writable ``MemoryStore`` or URI) with the model in
    ``model_dir`` (``cfg``: the ``encoder`` section; ``node_encoder``: an already loaded one to
    share); returns the chunks written."""
    from trajrag.encoder.model import TrajectoryEncoder

    if not isinstance(store, MemoryStore):
        store = MemoryStore(str(store))
    encoder = TrajectoryEncoder(model_dir, cfg, device=torch_device(cfg.node.device), node_encoder=node_encoder)
    records, names = read_records(store)
    written = embed_chunks(store, encoder, records, names, cfg)
    encoder.node_encoder.save_cache(encoder.folder / "node_cache.safetensors")
    return written


def evaluate_encoder(store: Any, model_dir: str | Path, cfg: EncoderConfig, *, write: bool = True,
                     node_encoder: Any = None, hits: dict | None = None) -> dict:
    """Held-out recall of the trained encoder, the text baseline and the untrained encoder, then
    (``write``) every chunk's embedding written, whether recall could be measured or not.

    Returns ``{"recall_measured": true, "trained": {"recall@1": ..}, "text": {..}, "untrained":
    {..}, "trained_minus_text": .., "trained_minus_untrained": .. (``paired_differences``),
    "held_out": {scenes, chunks, queries, written, encoder_version}}``; when the held-out chunks
    hold no query (``RecallNotMeasurable``), ``{"recall_measured": false,
    "recall_not_measured_because": reason, "held_out": ..}``. ``hits``, when given, is filled
    with ``{embedding name: {k: bool per query}}`` (``query_hits``) for pooling across folds,
    and a fold without queries raises ``RecallNotMeasurable``.
    """
    from trajrag.encoder.model import TrajectoryEncoder

    if not isinstance(store, MemoryStore):
        store = MemoryStore(str(store), read_only=not write)
    encoder = TrajectoryEncoder(model_dir, cfg, device=torch_device(cfg.node.device), node_encoder=node_encoder)
    records, names = read_records(store)
    trained_on = set(encoder.meta.get("train_scenes", []))
    held = [r for r in records if r.scene not in trained_on]
    try:
        result, queries = _held_out_recall(store, model_dir, encoder, held, names, cfg, hits)
    except RecallNotMeasurable as exc:
        if hits is not None:
            raise
        result, queries = {"recall_measured": False, "recall_not_measured_because": str(exc)}, 0
    written = embed_chunks(store, encoder, records, names, cfg) if write else 0
    encoder.node_encoder.save_cache(encoder.folder / "node_cache.safetensors")
    result["held_out"] = {"scenes": len({r.scene for r in held}), "chunks": len(held),
                          "queries": queries, "written": written, "encoder_version": encoder.version}
    return result


def _held_out_recall(store: Any, model_dir: str | Path, encoder: Any, held: Sequence[ChunkRecord],
                     names: Mapping[int, str], cfg: EncoderConfig, hits: dict | None) -> tuple[dict, int]:
    """``evaluate_encoder``'s recall part on the ``held`` chunks: the three embeddings' recall@k
    with the paired differences, and the query count; ``RecallNotMeasurable`` when there is no
    held-out chunk or no query among them."""
    from trajrag.encoder.model import embed, untrained_model

    if not held:
        raise RecallNotMeasurable(f"memory store {store.uri} has no chunks outside the scenes "
                                  f"{model_dir} was trained on")
    data = encode_records(held, names, encoder.node_encoder)
    index = np.arange(len(data))
    seqs, goals = data.sequences(index), data.goal_vectors(index)
    batch = cfg.eval.encode_batch
    embeddings = {
        "trained": embed(encoder.model, seqs, goals, batch),
        "text": encoder.node_encoder.encode_texts([_description(r, names) for r in held],
                                                  max_length=cfg.node.text_max_length),
        "untrained": embed(untrained_model(encoder.meta, encoder.model), seqs, goals, batch),
    }
    per_query = {name: query_hits(z, data.group, cfg.eval.ks) for name, z in embeddings.items()}
    result: dict = {"recall_measured": True}
    result.update({name: {f"recall@{k}": float(h.mean()) for k, h in by_k.items()}
                   for name, by_k in per_query.items()})
    result.update(paired_differences(per_query, cfg.train.seed))
    if hits is not None:
        hits.update(per_query)
    return result, len(per_query["trained"][cfg.eval.ks[0]])
