"""``trajrag bench scale --chunks N``: the fine stage's ANN search on a LanceDB store of N chunks.

1. **Source chunks** ("real ones"): the chunks of ``scale_bench.source_store``, or, when it is
   empty, a small corpus collected on the fly (``agent.corpus.build_corpus``: procedural homes,
   the collectors' real pipeline). Embeddings: the stored ones when every source chunk has one,
   else computed by a freshly initialised (untrained) trajectory encoder (``encoder.model``:
   ``build_model`` saved with ``save_model_dir``, applied through ``TrajectoryEncoder``); the
   JSON's ``embedding_source`` says which.
2. **Fill**: ``round(N / chunks_per_group)`` groups, each a perturbed copy of a source chunk
   (nodes jittered, labels changed, embedding + noise), and N member chunks spread over them at
   random, each a perturbed copy of its group (jittered, moved by a random SE(2) whose inverse is
   its ``group_transform``, labels changed, embedding + noise, renormalised, float32). Summaries
   and the vocabulary go through ``MemoryStore.commit``; chunks are appended in big Arrow batches
   straight to the chunks table, and ``MemoryStore.compact`` then merges the fragments, indexes
   the keys and journals the result (a crash before it leaves a store that the next writer rolls
   back: this is a benchmark store, in a temporary folder by default).
3. **Indexes** (``retrieval.ann.build_indexes``): IVF_PQ (cosine) on ``embedding``, timed, and
   BTREE on ``group_id``.
4. **Search**: a decision is ``candidates`` queries restricted to the chunks of
   ``groups_per_decision`` random groups. Per decision: ``LanceChunkSearch`` as configured (an
   exact scan of the few allowed rows below ``ann.flat_max_rows``), the same through the IVF_PQ
   index (``index_*`` keys), and ``ExactChunkSearch`` (numpy, all embeddings in memory) over the
   same rows. recall@k = |ANN top-k & exact top-k| / |exact top-k|, averaged over queries.
   Unrestricted queries (no group filter) go through the IVF_PQ index, one query per call.
5. **Retriever** (when ``trajrag.retrieval.retriever.Retriever`` is there): whole decisions,
   coarse stage (node prefilter + RANSAC against the group summaries) and fine stage on
   ``LanceChunkSearch``, for candidate trajectories that are perturbed copies of group summaries.
   Steps 3-5 need ``scale_bench.lancedb`` (the IVF_PQ build takes minutes at 100k chunks).
6. **Navigation** (``measure_navigation``): the decisions of real navigation episodes through
   the retriever in memory (its default): as configured, the path before issue 49 item 6 (the
   reference), without the caches, and in a fresh replica.

Store bytes are the store folder's files on disk (every table, indexes included) after a
compaction that keeps one version; ``bytes_per_chunk`` = store_bytes / chunks.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from trajrag.agent.corpus import build_corpus
from trajrag.agent.episode_runner import run_episode
from trajrag.agent.navigator import make_navigator
from trajrag.bench import blas_kernels, work_dir
from trajrag.config import Settings
from trajrag.encoder.node_encoder import NodeEncoder
from trajrag.errors import UserError
from trajrag.memory.store import CHUNKS, MAP_COLUMNS, Batch, MemoryStore, chunk_schema
from trajrag.planners.scoring import ScoringPlanner
from trajrag.retrieval.ann import AnnConfig, LanceChunkSearch, build_indexes
from trajrag.retrieval.retriever import ExactChunkSearch, Retriever
from trajrag.topo.labels import FREE, OBSTACLE, UNKNOWN
from trajrag.topo.trajectory import TopoPolarTrajectory
from trajrag.world.datasets import load_episodes, load_scenes
from trajrag.world.sim import GridSimulator

N_SECTORS = 12
# recall@k and the results per query: the issue asks for recall@10.
TOP_K = 10


@dataclass
class ScaleBenchConfig:
    """``configs/scale_bench.yaml`` (values and their sources there)."""

    chunks: int
    quick_chunks: int
    source_store: str
    source_scenes: str
    source_episodes_per_scene: int
    source_policy: str
    source_overrides: list[str]
    model_dir: str
    chunks_per_group: int
    jitter_m: float
    frame_offset_m: float
    labels_changed: int
    group_cosine: float
    member_cosine: float
    query_cosine: float
    batch_rows: int
    candidates: int
    groups_per_decision: int
    decisions: int
    unfiltered_queries: int
    warmup: int
    retriever: bool
    retriever_decisions: int
    lancedb: bool
    navigation_scenes: str
    navigation_episodes: str
    navigation_overrides: list[str]
    store_dir: str
    seed: int
    ann: AnnConfig


# -- source chunks --------------------------------------------------------------------------------
@dataclass
class Ragged:
    """Variable-length node lists, concatenated: item i owns nodes ``starts[i]:starts[i]+counts[i]``
    of ``xy`` (float64 metres) and ``sectors`` (int16 store label ids), and edges
    ``edge_starts[i]:...`` of ``edges`` (int32 pairs of local node indices)."""

    counts: np.ndarray
    xy: np.ndarray
    sectors: np.ndarray
    edge_counts: np.ndarray
    edges: np.ndarray

    @property
    def starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)

    @property
    def edge_starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.edge_counts)[:-1]]).astype(np.int64)

    def item(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s, e = self.starts[i], self.edge_starts[i]
        return (self.xy[s:s + self.counts[i]], self.sectors[s:s + self.counts[i]],
                self.edges[e:e + self.edge_counts[i]])


@dataclass
class Source:
    """The real chunks copied from: nodes, per-chunk fields, unit embeddings (S, D) float32."""

    nodes: Ragged
    reference_yaw: np.ndarray
    goal: list[str]
    success: list[bool]
    policy: list[str]
    description: list[str]
    embedding: np.ndarray
    names: dict[int, str]
    embedding_source: str
    encoder_version: str
    encoder: Any  # the TrajectoryEncoder whose version the embeddings carry, or None
    groups: int
    store: str


def _read_source(store_uri: str) -> tuple[Any, dict, dict[int, str]]:
    """Chunks table (Arrow) and vocabulary of a memory store."""
    store = MemoryStore(store_uri, read_only=True)
    table = store.read(CHUNKS, ["trajectory_id", "group_id", "goal", "n_nodes", "node_xy", "sectors",
                                "edges", "reference_yaw", "description", "embedding",
                                "encoder_version", "policy", "success"])
    if table.num_rows == 0:
        raise UserError(f"scale_bench.source_store {store_uri}: the store has no chunks")
    names = {label: name for name, label in store.vocabulary().items()}
    return table, {"groups": store.count_groups()}, names


def _ragged(table: Any) -> Ragged:
    counts = np.asarray(table.column("n_nodes").to_numpy(), dtype=np.int64)
    xy = np.asarray(table.column("node_xy").combine_chunks().flatten().to_numpy(), np.float64)
    sectors = np.asarray(table.column("sectors").combine_chunks().flatten().to_numpy(), np.int16)
    edge_lists = table.column("edges").to_pylist()
    edges = np.asarray([v for e in edge_lists for v in (e or [])], dtype=np.int32).reshape(-1, 2)
    edge_counts = np.asarray([len(e or []) // 2 for e in edge_lists], dtype=np.int64)
    if xy.size != 2 * counts.sum() or sectors.size != N_SECTORS * counts.sum():
        raise ValueError("source chunks: node_xy / sectors lengths do not match n_nodes")
    return Ragged(counts, xy.reshape(-1, 2), sectors.reshape(-1, N_SECTORS), edge_counts, edges)


def _build_source_corpus(cfg: ScaleBenchConfig, folder: str, settings: Settings, progress: bool) -> str:
    """A small real corpus (the `trajrag corpus build` code path) in ``folder``, with
    ``scale_bench.source_overrides`` beneath the settings' own; its URI."""
    uri = os.path.join(folder, "source")
    build_corpus(cfg.source_scenes, cfg.source_episodes_per_scene, cfg.source_policy, uri,
                 settings.with_overrides(cfg.source_overrides, beneath=True), progress=progress)
    return uri


def _untrained_encoder(nodes: Ragged, names: dict[int, str], folder: str, seed: int, enc_cfg: Any) -> Any:
    """A freshly initialised trajectory encoder (``enc_cfg``: the ``encoder`` section) saved to
    ``folder`` and loaded as a ``TrajectoryEncoder`` (so retrieval can use it); input
    standardisation from the source nodes."""
    from trajrag.encoder.model import TrajectoryEncoder, build_model, input_norm, save_model_dir

    node_encoder = NodeEncoder(enc_cfg.node)
    norm = input_norm(node_encoder.encode_nodes(nodes.sectors, names))
    model = build_model(enc_cfg.model, node_encoder.dim, seed, norm)
    save_model_dir(folder, model, enc_cfg.model, node_encoder.info(),
                   extra={"seed": seed, "train_scenes": [], "untrained": True})
    return TrajectoryEncoder(folder, enc_cfg, node_encoder=node_encoder)


def load_source(cfg: ScaleBenchConfig, work: str, settings: Settings, progress: bool) -> Source:
    """The source chunks with unit float32 embeddings (stored ones, or the untrained encoder's)."""
    uri = cfg.source_store or _build_source_corpus(cfg, work, settings, progress)
    table, info, names = _read_source(uri)
    nodes = _ragged(table)
    versions = table.column("encoder_version").to_pylist()
    encoder, model_dir = None, cfg.model_dir
    if table.column("embedding").null_count == 0:
        z = np.asarray(table.column("embedding").combine_chunks().flatten().to_numpy(), np.float32)
        z = z.reshape(table.num_rows, -1)
        version = str(versions[0]) if len(set(versions)) == 1 else "mixed"
        embedding_source = f"store (encoder_version {version})"
        if model_dir:
            from trajrag.encoder.model import TrajectoryEncoder

            encoder = TrajectoryEncoder(model_dir, settings.encoder)
    else:
        if model_dir:
            from trajrag.encoder.model import TrajectoryEncoder

            encoder, embedding_source = TrajectoryEncoder(model_dir, settings.encoder), f"trained encoder {model_dir}"
        else:
            encoder = _untrained_encoder(nodes, names, os.path.join(work, "encoder"), cfg.seed, settings.encoder)
            embedding_source = f"untrained encoder (freshly initialised, seed {cfg.seed})"
        version = encoder.version
        sequences = [nodes.item(i)[1] for i in range(len(nodes.counts))]
        z = encoder.encode_sectors(sequences, table.column("goal").to_pylist(), names)
    z = z.astype(np.float32)
    z /= np.linalg.norm(z, axis=1, keepdims=True).astype(np.float32)
    return Source(nodes=nodes, reference_yaw=table.column("reference_yaw").to_numpy().astype(np.float64),
                  goal=[str(g) for g in table.column("goal").to_pylist()],
                  success=[bool(s) for s in table.column("success").to_pylist()],
                  policy=[str(p or "") for p in table.column("policy").to_pylist()],
                  description=[str(d or "") for d in table.column("description").to_pylist()],
                  embedding=z, names=names, embedding_source=embedding_source,
                  encoder_version=version, encoder=encoder, groups=info["groups"],
                  store=uri if cfg.source_store else "built on the fly")


# -- perturbed copies -----------------------------------------------------------------------------
def noise_sigma(cosine: float, dim: int) -> float:
    """Per-dimension std of gaussian noise that, added to a unit vector and renormalised, leaves
    an expected cosine ``cosine`` to it: cos = 1 / sqrt(1 + sigma^2 dim)."""
    if not 0.0 < cosine <= 1.0:
        raise ValueError(f"a target cosine must be in (0, 1], got {cosine}")
    return math.sqrt((1.0 / cosine**2 - 1.0) / dim)


def noisy_unit(base: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Rows of ``base`` plus N(0, sigma^2) noise, renormalised, float32 throughout."""
    z = base.astype(np.float32, copy=True)
    z += rng.standard_normal(z.shape, dtype=np.float32) * np.float32(sigma)
    z /= np.linalg.norm(z, axis=1, keepdims=True).astype(np.float32)
    return z


def perturb_nodes(base: Ragged, pick: np.ndarray, rng: np.random.Generator, *, jitter_m: float,
                  labels_changed: int, label_choices: np.ndarray, move: bool,
                  frame_offset_m: float) -> tuple[Ragged, np.ndarray, np.ndarray]:
    """Copies of items ``pick`` of ``base``: nodes jittered, ``labels_changed`` sector labels
    replaced per copy, and (``move``) each copy moved by a random SE(2) x' = R(theta) x + t.
    Returns the copies, theta (B,) and t (B, 2) (zeros without ``move``)."""
    counts, starts = base.counts[pick], base.starts[pick]
    out_starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    node = np.repeat(starts - out_starts, counts) + np.arange(counts.sum())
    xy = base.xy[node] + rng.normal(0.0, jitter_m, size=(len(node), 2))
    theta, shift = np.zeros(len(pick)), np.zeros((len(pick), 2))
    if move:
        theta = rng.uniform(-math.pi, math.pi, size=len(pick))
        shift = rng.uniform(-frame_offset_m, frame_offset_m, size=(len(pick), 2))
        c, s = np.repeat(np.cos(theta), counts), np.repeat(np.sin(theta), counts)
        xy = np.stack([c * xy[:, 0] - s * xy[:, 1], s * xy[:, 0] + c * xy[:, 1]], 1)
        xy += np.repeat(shift, counts, axis=0)
    sectors = base.sectors[node].copy()
    flat = sectors.reshape(-1)
    for _ in range(labels_changed):
        where = out_starts * N_SECTORS + (rng.random(len(pick)) * counts * N_SECTORS).astype(np.int64)
        flat[where] = rng.choice(label_choices, size=len(pick))
    edge_counts, edge_starts = base.edge_counts[pick], base.edge_starts[pick]
    out_edge_starts = np.concatenate([[0], np.cumsum(edge_counts)[:-1]]).astype(np.int64)
    edge = np.repeat(edge_starts - out_edge_starts, edge_counts) + np.arange(edge_counts.sum())
    return Ragged(counts, xy, sectors, edge_counts, base.edges[edge]), theta, shift


def _list_array(values: np.ndarray, counts: np.ndarray, arrow_type: Any) -> Any:
    import pyarrow as pa

    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()),
                                    pa.array(np.ascontiguousarray(values).reshape(-1), arrow_type))


def _wrap(angle: np.ndarray) -> np.ndarray:
    return (angle + math.pi) % (2 * math.pi) - math.pi


@dataclass
class Groups:
    """The bench's groups: summary nodes (group frame), source chunk, unit embedding, members."""

    nodes: Ragged
    source: np.ndarray
    embedding: np.ndarray
    members: np.ndarray  # (G,) chunk count


def make_groups(src: Source, n_groups: int, cfg: ScaleBenchConfig, rng: np.random.Generator,
                label_choices: np.ndarray) -> Groups:
    """Each group a perturbed copy of a source chunk (sources used round-robin, shuffled)."""
    source = rng.permutation(np.resize(np.arange(len(src.nodes.counts)), n_groups))
    nodes, _, _ = perturb_nodes(src.nodes, source, rng, jitter_m=cfg.jitter_m,
                                labels_changed=cfg.labels_changed, label_choices=label_choices,
                                move=False, frame_offset_m=0.0)
    dim = src.embedding.shape[1]
    z = noisy_unit(src.embedding[source], noise_sigma(cfg.group_cosine, dim), rng)
    return Groups(nodes, source, z, np.zeros(n_groups, dtype=np.int64))


def chunk_batch(src: Source, groups: Groups, group_of: np.ndarray, first_id: int,
                cfg: ScaleBenchConfig, rng: np.random.Generator, label_choices: np.ndarray,
                schema: Any, version: str) -> Any:
    """An Arrow table of member chunks (one per entry of ``group_of``) in the chunks schema."""
    import pyarrow as pa

    n = len(group_of)
    nodes, theta, shift = perturb_nodes(groups.nodes, group_of, rng, jitter_m=cfg.jitter_m,
                                        labels_changed=cfg.labels_changed,
                                        label_choices=label_choices, move=True,
                                        frame_offset_m=cfg.frame_offset_m)
    # group_transform maps the chunk's frame back into the group frame: the inverse move.
    c, s = np.cos(-theta), np.sin(-theta)
    inverse_t = -np.stack([c * shift[:, 0] - s * shift[:, 1], s * shift[:, 0] + c * shift[:, 1]], 1)
    transform = np.stack([-theta, inverse_t[:, 0], inverse_t[:, 1]], 1).astype(np.float32)
    source = groups.source[group_of]
    local = np.arange(nodes.counts.sum()) - np.repeat(
        np.concatenate([[0], np.cumsum(nodes.counts)[:-1]]), nodes.counts)
    z = noisy_unit(groups.embedding[group_of], noise_sigma(cfg.member_cosine, src.embedding.shape[1]), rng)
    ids = [f"scale/{first_id + i:08d}" for i in range(n)]
    now = datetime.now(timezone.utc)
    columns = {
        "trajectory_id": pa.array(ids, pa.string()),
        "group_id": pa.array(group_of.astype(np.int64), pa.int64()),
        "scene_hint": pa.array([f"scale/{g:06d}" for g in group_of.tolist()], pa.string()),
        "goal": pa.array([src.goal[i] for i in source.tolist()], pa.string()),
        "n_nodes": pa.array(nodes.counts.astype(np.int32), pa.int32()),
        "node_xy": _list_array(nodes.xy.astype(np.float32), nodes.counts * 2, pa.float32()),
        "sectors": _list_array(nodes.sectors.astype(np.int8), nodes.counts * N_SECTORS, pa.int8()),
        "edges": _list_array(nodes.edges.astype(np.int32), nodes.edge_counts * 2, pa.int32()),
        "summary_nodes": _list_array(local.astype(np.int32), nodes.counts, pa.int32()),
        "group_transform": pa.FixedSizeListArray.from_arrays(pa.array(transform.reshape(-1), pa.float32()), 3),
        "reference_yaw": pa.array(_wrap(src.reference_yaw[source] + theta).astype(np.float32), pa.float32()),
        "description": pa.array([src.description[i] for i in source.tolist()], pa.string()),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(z.reshape(-1), pa.float32()), z.shape[1]),
        "encoder_version": pa.array([version] * n, pa.string()),
        "episode_id": pa.array(ids, pa.string()),
        "policy": pa.array([src.policy[i] for i in source.tolist()], pa.string()),
        "success": pa.array([src.success[i] for i in source.tolist()], pa.bool_()),
        "created_at": pa.array([now] * n, pa.timestamp("ms", tz="UTC")),
        # Perturbed copies carry no map.
        **{name: pa.nulls(n, schema.field(name).type) for name in MAP_COLUMNS if name in schema.names},
    }
    return pa.Table.from_arrays([columns[f.name].cast(f.type) for f in schema], schema=schema)


def summary_rows(groups: Groups, src: Source) -> list[dict]:
    """The summaries table rows of the groups (group frame = the group's own nodes)."""
    rows, now = [], datetime.now(timezone.utc)
    for g in range(len(groups.source)):
        xy, sectors, edges = groups.nodes.item(g)
        source = int(groups.source[g])
        rows.append({"group_id": g, "n_nodes": len(xy),
                     "node_xy": xy.astype(np.float32).reshape(-1).tolist(),
                     "sectors": sectors.astype(np.int8).reshape(-1).tolist(),
                     "node_count": [int(max(groups.members[g], 1))] * len(xy),
                     "edges": edges.reshape(-1).tolist(),
                     "reference_yaw": float(src.reference_yaw[source]),
                     "n_members": int(groups.members[g]), "scene_hints": [f"scale/{g:06d}"],
                     "goals": [src.goal[source]], "node_embeddings": None, "fused_into": None,
                     "fuse_transform": None, "node_map": None, "updated_at": now})
    return rows


def fill_store(store: Any, src: Source, n_chunks: int, cfg: ScaleBenchConfig,
               rng: np.random.Generator, progress: bool) -> tuple[Groups, np.ndarray]:
    """Write summaries, vocabulary and ``n_chunks`` member chunks; returns the groups and each
    chunk's group (in id order)."""
    from tqdm import tqdm

    n_groups = max(1, round(n_chunks / cfg.chunks_per_group))
    label_choices = np.array([FREE, OBSTACLE, UNKNOWN, *sorted(src.names)], dtype=np.int16)
    groups = make_groups(src, n_groups, cfg, rng, label_choices)
    group_of = rng.integers(0, n_groups, size=n_chunks)
    groups.members[:] = np.bincount(group_of, minlength=n_groups)
    store.commit(Batch(vocab=[{"label": k, "name": v} for k, v in sorted(src.names.items())],
                       summaries=summary_rows(groups, src)))
    schema, table = chunk_schema(store.embedding_dim), store.table(CHUNKS)
    with tqdm(total=n_chunks, desc="fill", unit="chunk", disable=not progress, file=sys.stderr) as bar:
        for start in range(0, n_chunks, cfg.batch_rows):
            part = group_of[start:start + cfg.batch_rows]
            table.add(chunk_batch(src, groups, part, start, cfg, rng, label_choices, schema,
                                  src.encoder_version))
            bar.update(len(part))
    return groups, group_of


# -- measuring ------------------------------------------------------------------------------------
def _percentiles(ms: list[float], prefix: str) -> dict:
    return {f"{prefix}_p50": round(float(np.percentile(ms, 50)), 3),
            f"{prefix}_p99": round(float(np.percentile(ms, 99)), 3)}


def _recall(found: list[tuple[int, float]], truth: list[tuple[int, float]]) -> float:
    want = {r for r, _ in truth}
    return len(want & {r for r, _ in found}) / len(want) if want else 1.0


def _timed(fn: Any, *args: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - start) * 1e3


def measure_decisions(backends: dict[str, Any], exact: Any, embeddings: np.ndarray,
                      rows_of_group: list[np.ndarray], cfg: ScaleBenchConfig,
                      rng: np.random.Generator) -> dict:
    """Per decision: each backend and exact search over the chunks of a few random groups."""
    sigma = noise_sigma(cfg.query_cosine, embeddings.shape[1])
    nonempty = [g for g, rows in enumerate(rows_of_group) if len(rows)]
    times: dict[str, list[float]] = {name: [] for name in [*backends, "exact"]}
    recalls: dict[str, list[float]] = {name: [] for name in backends}
    allowed_rows = []
    for d in range(cfg.warmup + cfg.decisions):
        chosen = rng.choice(nonempty, size=min(cfg.groups_per_decision, len(nonempty)), replace=False)
        allowed = np.concatenate([rows_of_group[g] for g in chosen])
        queries = noisy_unit(embeddings[rng.choice(allowed, size=cfg.candidates)], sigma, rng)
        sets = [allowed] * cfg.candidates
        truth, exact_ms = _timed(exact.search, queries, sets, TOP_K)
        results = {name: _timed(b.search, queries, sets, TOP_K) for name, b in backends.items()}
        if d < cfg.warmup:
            continue
        allowed_rows.append(len(allowed))
        times["exact"].append(exact_ms)
        for name, (found, ms) in results.items():
            times[name].append(ms)
            recalls[name].extend(_recall(f, t) for f, t in zip(found, truth))
    out = {"allowed_rows_mean": round(float(np.mean(allowed_rows)), 1)}
    for name, ms in times.items():
        out.update(_percentiles(ms, f"{name}_decision_ms"))
    for name, values in recalls.items():
        out[f"{name}_recall_at_{TOP_K}"] = round(float(np.mean(values)), 4)
    return out


def measure_unfiltered(ann: Any, exact: Any, embeddings: np.ndarray, cfg: ScaleBenchConfig,
                       rng: np.random.Generator) -> dict:
    """One query per call over every chunk (no group filter): IVF_PQ vs exact numpy."""
    sigma = noise_sigma(cfg.query_cosine, embeddings.shape[1])
    ann_ms, exact_ms, recalls = [], [], []
    for i in range(cfg.warmup + cfg.unfiltered_queries):
        q = noisy_unit(embeddings[rng.integers(len(embeddings))][None], sigma, rng)
        truth, t_exact = _timed(exact.search, q, [None], TOP_K)
        found, t_ann = _timed(ann.search, q, [None], TOP_K)
        if i >= cfg.warmup:
            ann_ms.append(t_ann)
            exact_ms.append(t_exact)
            recalls.append(_recall(found[0], truth[0]))
    return {**_percentiles(ann_ms, "unfiltered_ms"), **_percentiles(exact_ms, "unfiltered_exact_ms"),
            f"unfiltered_recall_at_{TOP_K}": round(float(np.mean(recalls)), 4)}


def _candidate(groups: Groups, group: int, src: Source, categories: tuple[str, ...], goal: str,
               cfg: ScaleBenchConfig, rng: np.random.Generator, label_choices: np.ndarray) -> Any:
    """A hypothetical candidate trajectory: a moved, jittered, relabelled copy of a group summary."""
    nodes, theta, _ = perturb_nodes(groups.nodes, np.array([group]), rng, jitter_m=cfg.jitter_m,
                                    labels_changed=cfg.labels_changed, label_choices=label_choices,
                                    move=True, frame_offset_m=cfg.frame_offset_m)
    source = int(groups.source[group])
    return TopoPolarTrajectory(node_xy=nodes.xy, sectors=nodes.sectors, categories=categories,
                               goal=goal, reference_yaw=float(_wrap(src.reference_yaw[source] + theta[0])))


def measure_retriever(store: Any, src: Source, groups: Groups, ann_cfg: AnnConfig,
                      cfg: ScaleBenchConfig, settings: Settings, rng: np.random.Generator) -> dict:
    """Whole decisions through ``Retriever`` (coarse + fine on ``LanceChunkSearch``)."""
    if src.encoder is None:
        return {"retriever_skipped": "the source store's embeddings need their encoder: set "
                                     "scale_bench.model_dir"}
    # The retriever numbers rows in the order it reads the chunks table: the same read here.
    ids = store.read(CHUNKS, ["trajectory_id"]).column("trajectory_id").to_pylist()
    search = LanceChunkSearch(store, ids, ann_cfg)
    retrieval_cfg = settings.retrieval
    start = time.perf_counter()
    retriever = Retriever(store, replace(retrieval_cfg, store=store.uri, coarse=True),
                          settings.memory, encoder=src.encoder, search=search)
    load_s = time.perf_counter() - start
    if list(retriever.ids) != ids:
        raise RuntimeError("the retriever numbered the chunks differently from the bench's read")
    categories = tuple(src.names.get(k, f"label{k}") for k in range(max(src.names, default=-1) + 1))
    label_choices = np.array([FREE, OBSTACLE, UNKNOWN, *sorted(src.names)], dtype=np.int16)
    wall, coarse, fine = [], [], []
    for d in range(cfg.warmup + cfg.retriever_decisions):
        chosen = rng.choice(len(groups.source), size=cfg.candidates)
        goal = src.goal[int(groups.source[chosen[0]])]
        candidates = [_candidate(groups, int(g), src, categories, goal, cfg, rng, label_choices)
                      for g in chosen]
        result, ms = _timed(retriever.retrieve, candidates, goal)
        if d >= cfg.warmup:
            wall.append(ms)
            coarse.append(result.coarse_ms)
            fine.append(result.fine_ms)
    return {**_percentiles(wall, "retriever_decision_ms"),
            "retriever_coarse_ms_p50": round(float(np.median(coarse)), 3),
            "retriever_fine_ms_p50": round(float(np.median(fine)), 3),
            "retriever_load_s": round(load_s, 2), "retriever_top_k": retrieval_cfg.top_k,
            "retriever_coarse_groups": retrieval_cfg.coarse_groups}


def _folder_bytes(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def _read_embeddings(store: Any) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Row order, unit embeddings (N, D) float32 and stored group of every chunk."""
    table = store.read(CHUNKS, ["trajectory_id", "group_id", "embedding"])
    z = np.asarray(table.column("embedding").combine_chunks().flatten().to_numpy(), np.float32)
    return (table.column("trajectory_id").to_pylist(), z.reshape(table.num_rows, -1),
            np.asarray(table.column("group_id").to_numpy(), np.int64))


def run(args: argparse.Namespace, settings: Settings) -> dict:
    """Build the store, index it, measure; returns the JSON-able results."""
    cfg = settings.scale_bench
    quick = bool(getattr(args, "quick", False))
    n_chunks = int(getattr(args, "chunks", None) or (cfg.quick_chunks if quick else cfg.chunks))
    if n_chunks < 1:
        raise UserError(f"--chunks must be >= 1, got {n_chunks}")
    progress = not getattr(args, "json", False)
    rng = np.random.default_rng(cfg.seed)
    work = work_dir(args, "trajrag-bench-scale-")
    store_uri = cfg.store_dir or os.path.join(work, "memory")
    out: dict = {"chunks_requested": n_chunks, "blas_kernels": blas_kernels()}
    try:
        start = time.perf_counter()
        src = load_source(cfg, work, settings, progress)
        out.update(source_chunks=len(src.goal), source_groups=src.groups, source_store=src.store,
                   embedding_source=src.embedding_source, embedding_dim=int(src.embedding.shape[1]),
                   source_s=round(time.perf_counter() - start, 2))
        store = MemoryStore(store_uri, embedding_dim=int(src.embedding.shape[1]))
        start = time.perf_counter()
        groups, _ = fill_store(store, src, n_chunks, cfg, rng, progress)
        out["fill_s"] = round(time.perf_counter() - start, 2)
        start = time.perf_counter()
        store.compact(keep_versions=1)
        out["compact_s"] = round(time.perf_counter() - start, 2)
        if cfg.lancedb:
            out.update(measure_lancedb(store, store_uri, src, groups, cfg, settings, rng, progress))
        else:
            out.update(chunks=store.count(CHUNKS), groups=store.count_groups())
        if cfg.retriever and src.encoder is not None and cfg.navigation_episodes:
            out.update(measure_navigation(store, src, cfg, settings))
    finally:
        shutil.rmtree(work, ignore_errors=True)  # a store_dir outside it stays
    return out


def measure_lancedb(store: Any, store_uri: str, src: Source, groups: Groups, cfg: ScaleBenchConfig,
                    settings: Settings, rng: np.random.Generator, progress: bool) -> dict:
    """Steps 3-5 of the module docstring: the indexes, the fine stage's searches and whole
    decisions through the retriever on LanceDB."""
    out: dict = {}
    if progress:
        print(f"[bench scale] {store.count(CHUNKS)} chunks written; building the IVF_PQ index", file=sys.stderr)
    built = build_indexes(store.table(CHUNKS), cfg.ann)
    store.compact(keep_versions=1)  # drops the pre-index versions' files
    out.update(index_build_s=round(built["ivf_pq_s"], 2), btree_build_s=round(built["btree_s"], 3),
               num_partitions=built["num_partitions"], num_sub_vectors=built["num_sub_vectors"],
               nprobes=cfg.ann.nprobes, refine_factor=cfg.ann.refine_factor,
               flat_max_rows=cfg.ann.flat_max_rows)
    out["chunks"] = store.count(CHUNKS)
    out["groups"] = store.count_groups()
    out["store_bytes"] = _folder_bytes(store_uri)
    out["chunks_table_bytes"] = store.table_bytes()[CHUNKS]
    out["bytes_per_chunk"] = round(out["store_bytes"] / max(out["chunks"], 1), 1)

    ids, embeddings, stored_group = _read_embeddings(store)
    order = np.argsort(stored_group, kind="stable")
    bounds = np.searchsorted(stored_group[order], np.arange(len(groups.source) + 1))
    rows_of_group = [order[bounds[g]:bounds[g + 1]] for g in range(len(groups.source))]
    exact = ExactChunkSearch(embeddings)
    ann = LanceChunkSearch(store, ids, cfg.ann)
    index_only = LanceChunkSearch(store, ids, replace(cfg.ann, flat_max_rows=0))
    decisions = measure_decisions({"ann": ann, "index": index_only}, exact, embeddings,
                                  rows_of_group, cfg, rng)
    k = TOP_K
    out.update(candidates=cfg.candidates, groups_per_decision=cfg.groups_per_decision,
               decisions=cfg.decisions, allowed_rows_mean=decisions["allowed_rows_mean"],
               decision_ms_p50=decisions["ann_decision_ms_p50"],
               decision_ms_p99=decisions["ann_decision_ms_p99"],
               exact_decision_ms_p50=decisions["exact_decision_ms_p50"],
               exact_decision_ms_p99=decisions["exact_decision_ms_p99"],
               recall_at_10=decisions[f"ann_recall_at_{k}"],
               index_decision_ms_p50=decisions["index_decision_ms_p50"],
               index_decision_ms_p99=decisions["index_decision_ms_p99"],
               index_recall_at_10=decisions[f"index_recall_at_{k}"])
    unfiltered = measure_unfiltered(ann, exact, embeddings, cfg, rng)
    out.update(unfiltered_recall_at_10=unfiltered[f"unfiltered_recall_at_{k}"],
               unfiltered_ms_p50=unfiltered["unfiltered_ms_p50"],
               unfiltered_ms_p99=unfiltered["unfiltered_ms_p99"],
               unfiltered_exact_ms_p50=unfiltered["unfiltered_exact_ms_p50"])
    del exact, embeddings
    if cfg.retriever:
        out.update(measure_retriever(store, src, groups, cfg.ann, cfg, settings, rng))
    return out


def _compare(want: list, got: list, same: bool, max_diff: float) -> tuple[bool, float]:
    """(``same`` and every candidate's chunks in the same order, the largest cosine difference
    so far) of two retrievals of one decision."""
    for wanted, found in zip(want, got, strict=True):
        same &= [e.trajectory_id for e in wanted] == [e.trajectory_id for e in found]
        max_diff = max([max_diff, *(abs(a.similarity - b.similarity) for a, b in zip(wanted, found))])
    return same, max_diff


def measure_navigation(store: Any, src: Source, cfg: ScaleBenchConfig, settings: Settings) -> dict:
    """Every decision of real navigation episodes (procedural val homes, the TrajRAG planner)
    retrieving from the scaled store with the retriever's default backend (exact, in memory):
    candidates as a navigator makes them, whose walked part repeats from one decision to the
    next, the issue's "per decision" figure.

    The episodes are walked once, their decisions recorded; then replayed in order, decision by
    decision in turn (which goes first rotates, so all see the same load), through four
    retrievers, their caches emptied first: as configured (``navigation_*``);
    ``navigation_reference_*``, the path before issue 49 item 6 (``retrieval.query_cache=0``,
    ``fast_path=false``: every decision computed afresh); ``navigation_uncached_*``, the
    configured path without the caches (every decision afresh too: what the fast path alone
    saves); and ``navigation_fresh_*``, as configured over an encoder loaded anew (a fresh
    replica: its node encoder knows only the model folder's cache, so MiniLM embeds the node rows
    never seen before, ``navigation_fresh_minilm_texts`` of them in all, goal names included; the
    others share the encoder the recording walks warmed). Last and alone,
    ``navigation_threaded_*``: the reference path with numpy's BLAS on the process's threads
    (``blas_threads=0``, as the retriever ran before in a process of its own such as this one;
    not in turn with the others, since OpenBLAS's threads spin a while after each product and
    slow whatever runs next). ``navigation_same_chunks``: every one retrieved the reference's
    chunks in the same order for every candidate; ``navigation_max_similarity_diff``: the largest
    cosine difference (float32 rounding)."""
    from trajrag.encoder.model import TrajectoryEncoder

    nav = settings.with_overrides(cfg.navigation_overrides, beneath=True)
    retrieval_cfg = replace(nav.retrieval, store=store.uri)
    memory_cfg = nav.memory
    start = time.perf_counter()
    retriever = Retriever(store, retrieval_cfg, memory_cfg, encoder=src.encoder)
    load_s = time.perf_counter() - start
    before = replace(retrieval_cfg, query_cache=0, fast_path=False)
    variants = {
        "reference_": Retriever(store, before, memory_cfg, encoder=src.encoder),
        "uncached_": Retriever(store, replace(retrieval_cfg, query_cache=0), memory_cfg, encoder=src.encoder),
        "": retriever,
        "fresh_": Retriever(store, retrieval_cfg, memory_cfg,
                            encoder=TrajectoryEncoder(src.encoder.folder, nav.encoder))}
    sim = GridSimulator(nav.sim)
    scenes = load_scenes(cfg.navigation_scenes, nav)
    episodes = load_episodes(cfg.navigation_episodes, scenes, nav)
    by_name = {scene.name: scene for scene in scenes}
    recorded: list[tuple] = []
    planner = ScoringPlanner(retriever, nav.scoring)
    agent = make_navigator(planner, nav)
    retrieve = retriever.retrieve

    def recording(trajectories, goal, place=None):
        recorded.append((trajectories, goal, place))
        return retrieve(trajectories, goal, place)

    retriever.retrieve = recording
    for episode in episodes:
        run_episode(sim, agent, episode, by_name[episode.scene_key], cfg=nav.episodes)
    retriever.retrieve = retrieve
    retriever.clear_caches()
    times: dict[str, dict[str, list[float]]] = {prefix: {} for prefix in [*variants, "threaded_"]}
    same, max_diff = True, 0.0

    def timed(prefix: str, decision: tuple) -> Any:
        result = variants[prefix].retrieve(*decision)
        for part, ms in (("decision", result.total_ms), ("coarse", result.coarse_ms),
                         ("encode", result.encode_ms), ("fine", result.fine_ms)):
            times[prefix].setdefault(part, []).append(ms)
        return result

    order = list(variants)
    answers = []  # the reference's experiences of each decision
    for i, decision in enumerate(recorded):
        results = {prefix: timed(prefix, decision) for prefix in order[i % len(order):] + order[:i % len(order)]}
        answers.append(results["reference_"].experiences)
        for result in results.values():
            same, max_diff = _compare(answers[-1], result.experiences, same, max_diff)
    out = {"navigation_decisions": len(recorded),
           "navigation_candidates_mean": round(float(np.mean([len(d[0]) for d in recorded])), 2) if recorded else 0.0,
           "navigation_retriever_load_s": round(load_s, 2),
           "navigation_fresh_minilm_texts": variants["fresh_"].encoder.node_encoder.misses,
           "navigation_cache_hit_rate": round(retriever.cache_hits / max(retriever.cache_hits + retriever.cache_misses, 1), 3)}
    # Each retriever holds every chunk's embedding (~1.1 GB at 350k): only one from here.
    variants.clear()
    del retriever, retrieve, planner, agent
    variants["threaded_"] = Retriever(store, replace(before, blas_threads=0), memory_cfg, encoder=src.encoder)
    for decision, want in zip(recorded, answers):
        same, max_diff = _compare(want, timed("threaded_", decision).experiences, same, max_diff)
    out.update(navigation_same_chunks=bool(same), navigation_max_similarity_diff=float(max_diff))
    for prefix, parts in times.items():
        if not parts:
            continue
        out.update(_percentiles(parts["decision"], f"navigation_{prefix}decision_ms"))
        for part in ("coarse", "encode", "fine"):
            out[f"navigation_{prefix}{part}_ms_p50"] = round(float(np.median(parts[part])), 3)
    if recorded:
        out["navigation_speedup_p50"] = round(out["navigation_reference_decision_ms_p50"]
                                              / max(out["navigation_decision_ms_p50"], 1e-9), 2)
    return out
