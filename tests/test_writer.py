"""The grouping writer's speed work: the fast insert path groups exactly as the per-candidate one
and as the path before it (``memory.fast_path``)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import zlib
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import trajrag
from trajrag.config import load
from trajrag.memory.grouping import TrajectoryMemory
from trajrag.memory.matching import match
from trajrag.memory.shards import ShardedMemory, shard_of
from trajrag.memory.stats import corpus_stats
from trajrag.memory.store import CHUNKS, DECISIONS, MemoryStore, StoreError
from trajrag.memory.synthetic import synthetic_scene, synthetic_trajectory


class _PerCandidateMemory(TrajectoryMemory):
    """The insert path before batching: every candidate matched on its own (Eq. 8 included), a
    freshly seeded generator per match."""

    def _accepted_matches(self, prep):
        seed = [self.cfg.seed, zlib.crc32(prep.trajectory_id.encode())]
        found = [(gid, match(prep.geometry, self.summaries[gid], self.params, np.random.default_rng(seed)))
                 for gid in self.candidates(prep.geometry.sectors)]
        found = [(gid, r) for gid, r in found if r.accepted]
        return sorted(found, key=lambda gr: (-gr[1].score, -gr[1].n_inliers, gr[0]))


def _corpus(n_homes: int, n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    homes = [synthetic_scene(rng, f"home{i:02d}") for i in range(n_homes)]
    return [synthetic_trajectory(homes[int(rng.integers(n_homes))], rng, f"t{k:04d}") for k in range(n)]


def _grouping(memory: TrajectoryMemory) -> dict:
    """Everything the grouping decided, without the wall-clock columns."""
    store = memory.store
    decisions = store.read(DECISIONS).drop_columns(["created_at"]).sort_by("seq").to_pylist()
    chunks = store.read(CHUNKS, ["trajectory_id", "group_id", "summary_nodes", "group_transform"])
    summaries = store.read_summaries().drop_columns(["updated_at"]).sort_by("group_id").to_pylist()
    return {"decisions": decisions, "chunks": chunks.sort_by("trajectory_id").to_pylist(),
            "summaries": summaries, "tombstones": store.group_aliases().keys()}


@pytest.mark.slow  # ~6 s on idle cores, 30 s at a load of 40
def test_the_batched_insert_groups_to_the_bit_as_matching_each_candidate_alone(tmp_path):
    # mutual_k 2 and 3 inliers: more pairs per match (RANSAC draws) and more fusions.
    cfg = replace(load("memory"), batch_size=40, mutual_k=2, min_inliers=3)
    trajs = _corpus(6, 100, seed=3)
    fast = TrajectoryMemory(str(tmp_path / "fast"), cfg)
    slow = _PerCandidateMemory(str(tmp_path / "slow"), cfg)
    assert [d.action for d in fast.insert_many(trajs)] == [d.action for d in slow.insert_many(trajs)]
    got, want = _grouping(fast), _grouping(slow)
    actions = {d["action"] for d in want["decisions"]}
    assert {"new", "merge", "fuse"} <= actions and len(want["summaries"]) < 40  # groups grew, fused
    assert got == want
    assert set(fast.seconds) >= {"prepare", "candidates", "similarity", "pairs", "ransac", "update", "commit"}


# The writer plan's decisions as the code before ``memory.fast_path`` (cc13053) made them
# (under ``_FIXTURE_KERNELS``).
_PLAN_DECISIONS = Path(__file__).parent / "data" / "writer_plan_decisions.json"


def _writer_plan(tmp_path, fast_path: bool) -> TrajectoryMemory:
    """8 homes, 200 walks, grouped with more pairs per match (mutual_k 2: RANSAC draws), more
    fusions (3 inliers) and an inverted file from 100 summary nodes (trained, trained again,
    rows added to its lists and laid out again)."""
    cfg = replace(load("memory"), batch_size=40, mutual_k=2, min_inliers=3, ivf_min_nodes=100,
                  ivf_train_sample=2048, ivf_probes=6, fast_path=fast_path)
    memory = TrajectoryMemory(str(tmp_path / f"plan-{fast_path}"), cfg)
    memory.insert_many(_corpus(8, 200, seed=13))
    return memory


def _decided(memory: TrajectoryMemory) -> list:
    """The decisions as the fixture keeps them (transforms to 9 decimals)."""
    rows = memory.store.read(DECISIONS, ["seq", "trajectory_id", "action", "group_id", "other_id",
                                         "transform"]).sort_by("seq").to_pylist()
    return [[d["seq"], d["trajectory_id"], d["action"], d["group_id"], d["other_id"],
             None if d["transform"] is None else [round(v, 9) for v in d["transform"]]] for d in rows]


@pytest.mark.slow  # two memories of 200 walks: ~12 s at a load of 3
def test_the_fast_path_groups_to_the_bit_as_the_path_before(tmp_path):
    fast, before = _writer_plan(tmp_path, True), _writer_plan(tmp_path, False)
    assert fast.index._centroids is not None  # the inverted file did the candidate search
    assert fast.index.read_ahead_used > 50  # its searches read ahead, memory.lookahead walks at a time
    got = _grouping(fast)
    assert {"new", "merge", "fuse", "redundant"} <= {d["action"] for d in got["decisions"]}
    # Every decision, chunk row and summary (positions, sectors, edges) to the bit.
    assert got == _grouping(before)


# OpenBLAS's kernels round differently with and without FMA (Haswell and later against
# Sandybridge / Nehalem), and the grouping follows the last bits at near-ties: cc13053 itself
# decides the plan differently from the 25th decision on under the two. The fixture was made
# with the kernels without FMA, which every x86-64 OpenBLAS carries; the check runs under them.
_FIXTURE_KERNELS = {"OPENBLAS_CORETYPE": "Nehalem", "OPENBLAS_NUM_THREADS": "1"}
_PLAN_SCRIPT = """
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import test_writer
with tempfile.TemporaryDirectory() as folder:
    print(json.dumps(test_writer._decided(test_writer._writer_plan(Path(folder), True))))
"""


@pytest.mark.slow  # one memory of 200 walks in a fresh interpreter: ~10 s
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="the fixture's kernels are x86-64 OpenBLAS's (OPENBLAS_CORETYPE=Nehalem)")
def test_the_fast_path_makes_the_decisions_the_code_before_it_made():
    """The decisions, group ids and transforms cc13053 (before ``memory.fast_path``) made on the
    writer plan, under the fixture's BLAS kernels (set before numpy loads, hence a subprocess)."""
    package = Path(trajrag.__file__).resolve().parents[1]
    env = {**os.environ, **_FIXTURE_KERNELS,
           "PYTHONPATH": os.pathsep.join([str(package), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _PLAN_SCRIPT, str(Path(__file__).parent)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == json.loads(_PLAN_DECISIONS.read_text())["decisions"]


def _quality(store) -> tuple[float, float]:
    stats = corpus_stats(store)
    return stats["purity"], stats["completeness"]


@pytest.mark.slow  # ~8 s on idle cores
def test_writers_split_by_scene_group_as_well_as_one_and_readers_see_one_memory(tmp_path):
    cfg = replace(load("memory"), batch_size=40)
    trajs = _corpus(8, 120, seed=5)
    single = TrajectoryMemory(str(tmp_path / "single"), cfg)
    single.insert_many(trajs)
    sharded = ShardedMemory(str(tmp_path / "sharded"), cfg, 3)
    for start in range(0, len(trajs), cfg.batch_size):
        sharded.insert_many(trajs[start:start + cfg.batch_size])
    (p1, c1), (p3, c3) = _quality(single.store), _quality(sharded.store)
    # Nothing lost (a shard's candidates are never another shard's homes, so it can gain).
    assert p3 >= p1 - 0.01 and c3 >= c1 - 0.01
    assert sharded.n_chunks == single.n_chunks and sharded.n_groups > 0
    # Each scene's groups are its shard's: group id modulo 3 = the scene's shard.
    rows = sharded.store.read(CHUNKS, ["group_id", "scene_hint"]).to_pylist()
    assert all(r["group_id"] % 3 == shard_of(SimpleNamespace(scene_hint=r["scene_hint"]), 3) for r in rows)
    # The retriever's view (one TrajectoryMemory over the store) holds every shard's groups.
    reader = TrajectoryMemory(MemoryStore(sharded.store.uri, read_only=True), cfg)
    assert reader.n_groups == sharded.n_groups == sharded.store.count_groups()
    decisions = sharded.store.read(DECISIONS, ["seq"]).column("seq").to_pylist()
    assert sorted(decisions) == list(range(len(decisions)))


@pytest.mark.slow  # ~4 s on idle cores
def test_a_failed_sharded_commit_stores_nothing_and_the_retry_builds_the_same_memory(tmp_path, monkeypatch):
    cfg = replace(load("memory"), batch_size=30)
    trajs = _corpus(4, 60, seed=9)
    clean = ShardedMemory(str(tmp_path / "clean"), cfg, 2)
    for part in (trajs[:30], trajs[30:]):
        clean.insert_many(part)
    faulty = ShardedMemory(str(tmp_path / "faulty"), cfg, 2)
    faulty.insert_many(trajs[:30])
    commit = faulty.store.commit

    def fail_once(batch):
        monkeypatch.setattr(faulty.store, "commit", commit)
        raise StoreError("disk full")

    monkeypatch.setattr(faulty.store, "commit", fail_once)
    with pytest.raises(StoreError):
        faulty.insert_many(trajs[30:])
    assert faulty.n_chunks == 30 - sum(d["action"] == "redundant" for d in _grouping(faulty)["decisions"])
    faulty.insert_many(trajs[30:])
    # The same decisions; positions agree to float32, the precision the shards reloaded them at.
    got, want = _grouping(faulty), _grouping(clean)
    decided = lambda g: [(d["seq"], d["trajectory_id"], d["action"], d["group_id"]) for d in g["decisions"]]
    assert decided(got) == decided(want)
    assert [(c["trajectory_id"], c["group_id"]) for c in got["chunks"]] == \
        [(c["trajectory_id"], c["group_id"]) for c in want["chunks"]]
    for a, b in zip(got["summaries"], want["summaries"]):
        np.testing.assert_allclose(a["node_xy"], b["node_xy"], atol=1e-4)
    # A writer restarted on the store skips everything already decided.
    again = ShardedMemory(str(tmp_path / "faulty"), cfg, 2)
    assert {d.action for d in again.insert_many(trajs)} == {"duplicate"}
