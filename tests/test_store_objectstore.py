"""The memory store on an object-store URI (``s3://bucket/prefix``), as README's "Shared storage"
promises: a local S3 endpoint (moto's server, loopback only) configured through the environment
only, the way a cluster node gets its endpoint and credentials."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from trajrag.config import load
from trajrag.memory.grouping import TrajectoryMemory
from trajrag.memory.prepare import trajectory_key
from trajrag.memory.store import CHUNKS, DECISIONS, SUMMARIES, MemoryStore
from trajrag.memory.synthetic import synthetic_scene, synthetic_trajectory

from conftest import S3_BUCKET as BUCKET


def _chunks(store: MemoryStore) -> dict[str, int]:
    """trajectory_id -> current group_id of every stored chunk."""
    rows = store.read(CHUNKS, ["trajectory_id", "group_id"])
    ids = rows.column("trajectory_id").to_pylist()
    return dict(zip(ids, store.resolve_groups(rows.column("group_id").to_pylist())))


def _counts(store: MemoryStore) -> tuple[int, int, int]:
    return store.count(CHUNKS), store.count(SUMMARIES), store.count(DECISIONS)


@pytest.mark.slow
def test_the_memory_store_works_on_an_s3_uri(s3_env):
    uri = f"s3://{BUCKET}/mem"
    cfg = replace(load("memory"), batch_size=8)
    rng = np.random.default_rng(3)
    homes = [synthetic_scene(rng, f"home{i}") for i in range(3)]
    trajs = [synthetic_trajectory(homes[k % 3], rng, f"s3-{k}") for k in range(24)]
    good, bad = trajs[:12], trajs[12:]

    memory = TrajectoryMemory(uri, cfg)  # creates the store in the bucket
    memory.insert_many(good)
    chunks, groups, counts = _chunks(memory.store), memory.store.list_groups(), _counts(memory.store)
    versions = memory.versions()
    assert set(chunks) == {trajectory_key(t) for t in good}
    assert 1 <= len(groups) <= len(good)
    # The tables are objects under the prefix, not a local folder named "s3:".
    keys = [o["Key"] for o in s3_env.list_objects_v2(Bucket=BUCKET, Prefix="mem/")["Contents"]]
    assert {f"mem/{name}.lance" for name in (CHUNKS, SUMMARIES, DECISIONS)} <= {
        k.split("/_versions/")[0] for k in keys if "/_versions/" in k}

    # Another instance on the same URI (a reader on another node) sees the same memory.
    reader = MemoryStore(uri, read_only=True)
    assert _chunks(reader) == chunks
    assert reader.list_groups() == groups
    traj = good[5]
    row = reader.get_chunk(trajectory_key(traj))
    assert row["group_id"] == chunks[trajectory_key(traj)]
    np.testing.assert_allclose(np.reshape(row["node_xy"], (-1, 2)), traj.node_xy, atol=1e-5)

    # A bad batch, rolled back through LanceDB versions: the reader sees the earlier state.
    memory.insert_many(bad)
    assert reader.count(CHUNKS) > len(chunks)
    memory.rollback(versions)
    assert _counts(reader) == counts and _chunks(reader) == chunks
    assert reader.list_groups() == groups

    # A writer reopening the URI starts from the restored state; the batch is really gone.
    reopened = TrajectoryMemory(uri, cfg)
    assert reopened.n_chunks == len(chunks) and reopened.n_groups == len(groups)
    assert reopened.insert(bad[0]).action != "duplicate"
    # Compaction (rewrites the summaries and small fragments, indexes the keys) works there too.
    stored = _chunks(reopened.store)
    reopened.store.compact(keep_versions=cfg.keep_versions)
    assert _chunks(reader) == stored and reader.list_groups() == reopened.store.list_groups()
    for store in (memory.store, reader, reopened.store):
        store.close()
