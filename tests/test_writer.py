"""The grouping writer's speed work: the fast insert path groups exactly as the per-candidate one."""

from __future__ import annotations

import zlib
from dataclasses import replace

import numpy as np
import pytest

from trajrag.bench.store import synthetic_scene, synthetic_trajectory
from trajrag.config import load
from trajrag.memory.grouping import TrajectoryMemory
from trajrag.memory.matching import match
from trajrag.memory.store import CHUNKS, DECISIONS


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
    assert set(fast.seconds) >= {"prepare", "candidates", "similarity", "geometry", "update", "commit"}
