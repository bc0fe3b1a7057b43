"""``trajrag bench scale`` and the LanceDB fine-stage backend (``retrieval.ann.LanceChunkSearch``)."""

from __future__ import annotations

import contextlib
import io
import json
import math
from dataclasses import replace

import numpy as np
import pytest

from trajrag import config
from trajrag.bench.scale import Ragged, Source, fill_store, noise_sigma, noisy_unit
from trajrag.memory.store import CHUNKS, MemoryStore
from trajrag.retrieval.ann import LanceChunkSearch, build_indexes
from trajrag.retrieval.retriever import ExactChunkSearch

DIM = 16


def _synthetic_source(n: int, rng: np.random.Generator) -> Source:
    """Source chunks without a corpus: 3-6 node chains, random labels, random unit embeddings."""
    counts = rng.integers(3, 7, size=n)
    total = int(counts.sum())
    edges = np.concatenate([np.stack([np.arange(c - 1), np.arange(1, c)], 1) for c in counts])
    nodes = Ragged(counts, rng.uniform(0, 10, size=(total, 2)),
                   rng.integers(-3, 4, size=(total, 12)).astype(np.int16),
                   counts - 1, edges.astype(np.int32))
    z = rng.normal(size=(n, DIM)).astype(np.float32)
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    return Source(nodes=nodes, reference_yaw=rng.uniform(-math.pi, math.pi, n),
                  goal=["bed"] * n, success=[True] * n, policy=["oracle"] * n,
                  description=["d"] * n, embedding=z, names={0: "chair", 1: "bed", 2: "sofa", 3: "tv"},
                  embedding_source="random", encoder_version="test", encoder=None, groups=n,
                  store="synthetic")


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    """600 chunks in 15 groups of 16-dim embeddings, indexed (IVF_PQ + BTREE)."""
    cfg = config.load("scale_bench", ["scale_bench.batch_rows=250"])
    rng = np.random.default_rng(0)
    src = _synthetic_source(8, rng)
    store = MemoryStore(str(tmp_path_factory.mktemp("scale") / "memory"), embedding_dim=DIM)
    groups, group_of = fill_store(store, src, 600, cfg, rng, progress=False)
    store.compact(keep_versions=1)
    ann = replace(cfg.ann, num_partitions=8, num_sub_vectors=4, nprobes=8)
    built = build_indexes(store.table(CHUNKS), ann)
    return store, groups, group_of, ann, built


def _rows(store):
    table = store.read(CHUNKS, ["trajectory_id", "group_id", "embedding", "node_xy",
                                "group_transform", "summary_nodes"])
    z = np.asarray(table.column("embedding").combine_chunks().flatten().to_numpy(), np.float32)
    return table, z.reshape(table.num_rows, DIM)


def test_fill_writes_exact_count_and_valid_group_transforms(small_store):
    store, groups, group_of, _, built = small_store
    assert store.count(CHUNKS) == 600
    assert store.count_groups() == 15  # 600 / chunks_per_group (40)
    assert built["num_partitions"] == 8 and built["num_sub_vectors"] == 4
    table, z = _rows(store)
    assert np.allclose(np.linalg.norm(z, axis=1), 1.0, atol=1e-5)
    # A copy's group_transform takes its nodes back onto its group's summary nodes (up to jitter).
    for row in table.slice(0, 20).to_pylist():
        theta, tx, ty = row["group_transform"]
        xy = np.asarray(row["node_xy"], dtype=np.float64).reshape(-1, 2)
        back = xy @ np.array([[math.cos(theta), math.sin(theta)],
                              [-math.sin(theta), math.cos(theta)]]) + [tx, ty]
        summary_xy, _, _ = groups.nodes.item(int(row["group_id"]))
        assert np.abs(back - summary_xy[row["summary_nodes"]]).max() < 0.5


def test_lance_search_matches_exact_search_on_restrictions(small_store):
    store, _, _, ann, _ = small_store
    table, z = _rows(store)
    ids = table.column("trajectory_id").to_pylist()
    stored_group = np.asarray(table.column("group_id").to_numpy())
    # The caller's numbering need not be the table's: rows are a permutation of it.
    perm = np.random.default_rng(1).permutation(len(ids))
    search = LanceChunkSearch(store, [ids[i] for i in perm], ann)
    exact = ExactChunkSearch(z[perm])
    row_group = stored_group[perm]
    whole = np.flatnonzero(np.isin(row_group, [2, 7]))
    part = np.flatnonzero(row_group == 4)[::2]  # half a group: the filter selects more rows
    queries = noisy_unit(z[perm][[whole[0], whole[5], part[0]]], noise_sigma(0.95, DIM),
                         np.random.default_rng(2))
    allowed = [whole, whole, part]
    got = search.search(queries, allowed, 10)
    want = exact.search(queries, allowed, 10)
    for g, w, rows in zip(got, want, allowed):
        assert [r for r, _ in g] == [r for r, _ in w]
        assert np.allclose([s for _, s in g], [s for _, s in w], atol=1e-4)
        assert set(r for r, _ in g) <= set(rows.tolist())
    assert search.search(queries[:1], [np.zeros(0, dtype=np.int64)], 10) == [[]]


def test_lance_search_through_the_index(small_store):
    store, _, _, ann, _ = small_store
    table, z = _rows(store)
    ids = table.column("trajectory_id").to_pylist()
    search = LanceChunkSearch(store, ids, replace(ann, flat_max_rows=0))  # always the IVF_PQ index
    exact = ExactChunkSearch(z)
    queries = noisy_unit(z[:20], noise_sigma(0.95, DIM), np.random.default_rng(3))
    found = search.search(queries, [None] * 20, 10)
    truth = exact.search(queries, [None] * 20, 10)
    recall = np.mean([len({r for r, _ in f} & {r for r, _ in t}) / 10 for f, t in zip(found, truth)])
    assert recall > 0.8
    assert all(len(f) == 10 for f in found)


def test_lance_search_rejects_rows_the_table_does_not_have(small_store):
    store, _, _, ann, _ = small_store
    from trajrag.retrieval.ann import AnnError

    with pytest.raises(AnnError, match="lacks 1"):
        LanceChunkSearch(store, ["no/such/chunk"], ann)


@pytest.mark.slow
def test_bench_scale_cli_small_store():
    """The whole bench on 3000 chunks copied from a tiny real corpus (untrained encoder)."""
    from trajrag.cli import main

    sets = ["scale_bench.source_scenes=procedural:train:2", "scale_bench.source_episodes_per_scene=3",
            "scale_bench.source_policy=oracle",
            "scale_bench.source_overrides=[sim.width=64,sim.height=48,mapping.pixel_stride=1]",
            "scale_bench.decisions=30", "scale_bench.unfiltered_queries=20", "scale_bench.warmup=2",
            "scale_bench.retriever_decisions=3", "scale_bench.ann.num_partitions=16",
            "scale_bench.navigation_scenes=procedural:val:1", "episodes.max_steps=150"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["bench", "scale", "--chunks", "3000", "--json",
                     *[a for s in sets for a in ("--set", s)]])
    assert code == 0
    result = json.loads(out.getvalue())
    for key in ("chunks", "groups", "store_bytes", "bytes_per_chunk", "fill_s", "index_build_s",
                "decision_ms_p50", "decision_ms_p99", "exact_decision_ms_p50", "recall_at_10",
                "unfiltered_recall_at_10", "unfiltered_ms_p50", "embedding_source",
                "retriever_decision_ms_p50", "retriever_decision_ms_p99", "navigation_decision_ms_p50"):
        assert key in result, key
    assert result["chunks"] == 3000
    assert result["groups"] == 75
    assert result["num_partitions"] == 16
    assert "untrained" in result["embedding_source"]
    for key in ("recall_at_10", "unfiltered_recall_at_10", "index_recall_at_10"):
        assert 0.5 < result[key] <= 1.0, (key, result[key])
    # The store holds at least the float32 vectors.
    assert result["bytes_per_chunk"] > 4 * result["embedding_dim"]
    assert result["decision_ms_p50"] > 0 and result["retriever_decision_ms_p50"] > 0
    assert result["navigation_decisions"] > 0 and result["navigation_decision_ms_p50"] > 0
    # the same decisions on the path before the fast path and the caches, without the caches, in a
    # fresh replica and on the process's BLAS threads: the same chunks, and where time went
    assert result["navigation_same_chunks"] and result["navigation_max_similarity_diff"] < 1e-5
    for variant in ("reference_", "uncached_", "fresh_", "threaded_"):
        assert result[f"navigation_{variant}decision_ms_p50"] > 0, variant
    assert result["navigation_encode_ms_p50"] >= 0 and result["navigation_fresh_minilm_texts"] > 0
