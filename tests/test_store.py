"""The TrajRAG memory in LanceDB: incremental insert, grouping, idempotency, readers, rollback."""

from __future__ import annotations

import json
import math
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import lancedb
import numpy as np
import pyarrow as pa
import pytest

from trajrag.config import load
from trajrag.memory import grouping
from trajrag.memory.grouping import PHASES, TrajectoryMemory
from trajrag.memory.prepare import trajectory_key
from trajrag.memory.matching import EVIDENCE
from trajrag.memory.regroup import regroup
from trajrag.memory.schema import (
    CHUNKS, COMMITS, DECISION_SCHEMA, DECISIONS, MARK_COLUMNS, SUMMARIES, chunk_schema)
from trajrag.memory.stats import completeness_ceiling, corpus_stats
from trajrag.memory.store import MemoryStore, StoreError
from trajrag.memory.synthetic import perturb, synthetic_scene, synthetic_trajectory
from trajrag.memory.value_log import TABLE as VALUE_TABLE, ValueLog
from trajrag.topo.trajectory import TopoPolarTrajectory


@pytest.fixture(scope="module")
def cfg():
    return load("memory")


@pytest.fixture(scope="module")
def homes():
    rng = np.random.default_rng(7)
    return [synthetic_scene(rng, f"home{i:02d}") for i in range(12)]


def _memory(tmp_path: Path, cfg, **overrides) -> TrajectoryMemory:
    return TrajectoryMemory(str(tmp_path / "memory"), replace(cfg, **overrides))


def _trajs(homes, n: int, seed: int, prefix: str, **kw) -> list[TopoPolarTrajectory]:
    rng = np.random.default_rng(seed)
    return [synthetic_trajectory(homes[k % len(homes)], rng, f"{prefix}{k}", **kw) for k in range(n)]


def _counts(store: MemoryStore) -> tuple[int, int, int]:
    return store.count(CHUNKS), store.count(SUMMARIES), store.count(DECISIONS)


def _angle_error_deg(a: float, b: float) -> float:
    return abs(math.degrees((a - b + math.pi) % (2 * math.pi) - math.pi))


@pytest.mark.slow
def test_same_id_twice_is_a_no_op_and_same_nodes_new_id_is_redundant(tmp_path, cfg, homes):
    memory = _memory(tmp_path, cfg)
    traj = _trajs(homes, 1, 0, "ep", length=(12, 20))[0]
    first = memory.insert(traj)
    assert first.action == "new"
    before, versions = _counts(memory.store), memory.store.versions()

    again = memory.insert(traj)
    assert again.action == "duplicate"
    assert _counts(memory.store) == before and memory.store.versions() == versions

    copy = replace(traj, episode_id="ep0-again")
    decision = memory.insert(copy)
    assert decision.action == "redundant" and decision.other_id == trajectory_key(traj)
    assert memory.store.count(CHUNKS) == 1
    assert memory.store.read(DECISIONS, where="action = 'redundant'").num_rows == 1


def test_a_member_contained_in_a_new_trajectory_is_dropped(tmp_path, cfg, homes):
    memory = _memory(tmp_path, cfg)
    long = _trajs(homes, 1, 1, "long", length=(16, 24), label_noise=0.0, unknown_rate=0.0)[0]
    short = TopoPolarTrajectory(long.node_xy[:8], long.sectors[:8], long.categories, long.goal,
                                long.reference_yaw, episode_id="short", scene_id=long.scene_id)
    assert memory.insert(short).action == "new"
    decision = memory.insert(long)
    assert decision.action == "merge" and decision.superseded == [trajectory_key(short)]
    assert memory.store.get_chunk(trajectory_key(short)) is None
    assert memory.store.get_chunk(trajectory_key(long))["group_id"] == decision.group_id
    assert memory.insert(short).action == "duplicate"  # dropped for good, not re-added


@pytest.mark.parametrize("theta_deg", [120.0, -60.0, 47.0])
def test_moved_copy_merges_into_its_group_with_the_transform_recovered(tmp_path, cfg, homes, theta_deg):
    memory = _memory(tmp_path, cfg)
    rng = np.random.default_rng(2)
    traj = _trajs(homes, 1, 2, "ep", length=(12, 20))[0]
    first = memory.insert(traj)
    moved, R_back, t_back = perturb(traj, rng, theta=math.radians(theta_deg), label_noise=0.03)
    # Another goal, so that the copy is not redundant and is merged.
    moved = replace(moved, goal="toilet" if traj.goal != "toilet" else "bed")
    decision = memory.insert(moved)
    assert decision.action == "merge" and decision.group_id == first.group_id
    T = decision.transform
    assert _angle_error_deg(T.theta, math.atan2(R_back[1, 0], R_back[0, 0])) < 3.0
    assert np.linalg.norm(T.t - t_back) < 0.1
    # Every node was already in the summary: merging added none.
    assert memory.summaries[first.group_id].n_nodes == len(traj)
    row = memory.store.get_chunk(trajectory_key(moved))
    np.testing.assert_allclose(row["group_transform"], T.as_list(), atol=1e-5)


def test_trajectories_of_different_homes_do_not_merge(tmp_path, cfg, homes):
    memory = _memory(tmp_path, cfg)
    memory.insert_many(_trajs(homes[:2], 40, 3, "pair"))
    stats = corpus_stats(memory.store)
    assert stats["purity"] == 1.0
    assert stats["groups"] >= 2
    assert set(stats) >= {"chunks", "groups", "actions", "purity", "completeness", "bytes_per_chunk"}
    assert stats["bytes_per_chunk"] <= 4096


def test_completeness_ceiling_groups_chunks_by_their_true_overlap():
    line = np.stack([np.arange(8.0), np.zeros(8)], axis=1)  # places 1 m apart in scene a
    chunks = [line[0:5], line[1:6] + 0.1, line[4:8], line[0:3] + [0.0, 5.0], line[0:3]]
    scenes = ["a", "a", "a", "a", "b"]
    # 1st and 2nd share 4 places; the 3rd shares 2 with them; the 4th none (5 m away).
    assert completeness_ceiling(chunks, scenes, min_shared=4, radius_m=0.5) == pytest.approx(3 / 5)
    assert completeness_ceiling(chunks, scenes, min_shared=2, radius_m=0.5) == pytest.approx(4 / 5)
    assert completeness_ceiling(chunks, [None] * 5, min_shared=2, radius_m=0.5) is None


@pytest.mark.parametrize("dies, made_before_marks", [("chunks", False), ("decisions", False),
                                                      ("decisions", True)])
@pytest.mark.slow
def test_insert_is_idempotent_across_reopen_and_a_crash_mid_commit(tmp_path, cfg, homes, dies,
                                                                   made_before_marks):
    if made_before_marks:  # a store whose batches were journalled in `commits` (a writer upgrades it)
        import lancedb

        lancedb.connect(str(tmp_path / "memory")).create_table(DECISIONS, schema=pa.schema(
            [f for f in DECISION_SCHEMA if f.name not in MARK_COLUMNS]))
    batch = _trajs(homes, 24, 4, "b")
    memory = _memory(tmp_path, cfg, batch_size=8)
    assert memory.store.marks_batches
    journal_rows = memory.store.count(COMMITS)
    memory.insert_many(batch)
    after_once = _counts(memory.store)
    # A batch's journal mark rides on its decisions' append: three table writes, not four.
    assert memory.store.count(COMMITS) == journal_rows

    reopened = _memory(tmp_path, cfg, batch_size=8)
    assert {d.action for d in reopened.insert_many(batch)} == {"duplicate"}
    assert _counts(reopened.store) == after_once

    # The process dies while one write of a batch (the chunks, or the decisions that carry its
    # journal mark) is under way and the others are written.
    more = _trajs(homes, 8, 5, "c")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("simulated crash")

    table = reopened.store.table(dies)
    table.add = killed
    with pytest.raises(KeyboardInterrupt):
        reopened.insert_many(more)
    reopened.store.close()  # the dead process's other writes are finished (or never happen)
    assert _counts(reopened.store) != after_once  # a half-written batch is on disk

    recovered = _memory(tmp_path, cfg, batch_size=8)  # the next writer undoes it
    assert _counts(recovered.store) == after_once
    recovered.insert_many(more)
    recovered.insert_many(more)
    ids = recovered.store.read(CHUNKS, ["trajectory_id"]).column("trajectory_id").to_pylist()
    assert len(ids) == len(set(ids)) == recovered.n_chunks
    assert recovered.n_chunks > after_once[0]


@pytest.mark.slow
def test_readers_keep_reading_whole_batches_while_the_writer_appends(tmp_path, cfg, homes):
    memory = _memory(tmp_path, cfg)
    memory.insert(_trajs(homes, 1, 6, "seed")[0])  # the store exists before the reader opens it
    boundaries = {memory.store.count(CHUNKS)}
    reader = MemoryStore(str(tmp_path / "memory"), read_only=True)
    seen: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def read_loop() -> None:
        try:
            while not stop.is_set():
                latest = reader.read(CHUNKS, ["trajectory_id"]).column("trajectory_id").to_pylist()
                assert len(latest) == len(set(latest))
                reader.checkout(reader.snapshot())  # whole batches only, all tables in step
                ids = reader.read(CHUNKS, ["trajectory_id"]).column("trajectory_id").to_pylist()
                reader.checkout_latest()
                assert len(ids) == len(set(ids))
                seen.append(len(ids))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=read_loop)
    thread.start()
    try:
        trajs = _trajs(homes, 60, 7, "w")
        for start in range(0, 60, 6):
            memory.insert_many(trajs[start:start + 6])
            boundaries.add(memory.store.count(CHUNKS))
            reads = len(seen)
            deadline = time.monotonic() + 10
            while len(seen) == reads and not errors and time.monotonic() < deadline:
                time.sleep(0.005)  # let the reader read at least once between two batches
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors
    assert len(seen) >= 10
    assert set(seen) <= boundaries  # a snapshot never holds part of a batch
    assert seen == sorted(seen)
    assert reader.count(CHUNKS) == memory.n_chunks


def test_rollback_restores_the_previous_version_after_a_bad_batch(tmp_path, cfg, homes):
    memory = _memory(tmp_path, cfg)
    good = _trajs(homes[:3], 15, 8, "good")
    memory.insert_many(good)
    versions, counts, groups = memory.versions(), _counts(memory.store), memory.n_groups

    bad = _trajs(homes[3:], 15, 9, "bad")
    memory.insert_many(bad)
    assert memory.store.count(CHUNKS) > counts[0]
    memory.rollback(versions)
    assert _counts(memory.store) == counts and memory.n_groups == groups
    assert memory.n_chunks == counts[0]
    assert memory.insert(bad[0]).action != "duplicate"  # really gone, not just hidden

    # A commit that fails part-way leaves the store as it was.
    before = _counts(memory.store)
    table = memory.store.table(CHUNKS)
    original_add = table.add
    table.add = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("disk full"))
    with pytest.raises(StoreError, match="rolled back"):
        memory.insert(bad[1])
    table.add = original_add
    assert _counts(memory.store) == before
    assert memory.insert(bad[1]).action in {"new", "merge"}


def test_bad_trajectories_are_rejected_with_a_reason_and_change_nothing(tmp_path, cfg, homes):
    memory = _memory(tmp_path, cfg)
    memory.insert(_trajs(homes, 1, 10, "ok")[0])
    chunks, summaries = memory.store.count(CHUNKS), memory.store.count(SUMMARIES)
    good = _trajs(homes, 1, 11, "x")[0]
    fields = dict(node_xy=good.node_xy, sectors=good.sectors, edges=good.edges,
                  categories=good.categories, goal="chair", reference_yaw=0.0, scene_id="s")
    one_node = SimpleNamespace(**dict(fields, node_xy=good.node_xy[:1], sectors=good.sectors[:1],
                                      episode_id="one"))
    nan_xy = good.node_xy.copy()
    nan_xy[2, 0] = np.nan
    with_nan = SimpleNamespace(**dict(fields, node_xy=nan_xy, episode_id="nan"))
    bad_labels = good.sectors.copy()
    bad_labels[0, 0] = 99
    unknown_label = SimpleNamespace(**dict(fields, sectors=bad_labels, episode_id="label"))
    reasons = {}
    for traj in (one_node, with_nan, unknown_label):
        decision = memory.insert(traj)
        assert decision.action == "rejected"
        reasons[traj.episode_id] = decision.reason
    assert "at least 2 nodes" in reasons["one"]
    assert "non-finite" in reasons["nan"]
    assert "99" in reasons["label"]
    assert (memory.store.count(CHUNKS), memory.store.count(SUMMARIES)) == (chunks, summaries)
    logged = memory.store.read(DECISIONS, where="action = 'rejected'").column("reason").to_pylist()
    assert sorted(logged) == sorted(reasons.values())


def test_a_rejected_walk_is_decided_once_whatever_the_reruns(tmp_path, cfg, homes):
    """A re-run of a build (a new writer on the same store, as after a crash) neither walks a
    rejected trajectory again nor logs it twice: `corpus build` "collects only the ids missing"."""
    good = _trajs(homes, 1, 11, "x")[0]
    one_node = SimpleNamespace(node_xy=good.node_xy[:1], sectors=good.sectors[:1], edges=np.zeros((0, 2)),
                               categories=good.categories, goal="chair", reference_yaw=0.0, scene_id="s",
                               episode_id="one")
    first = _memory(tmp_path, cfg).insert_many([good, one_node, one_node])
    assert [d.action for d in first] == ["new", "rejected", "duplicate"]
    rerun = _memory(tmp_path, cfg)
    assert rerun.known(first[1].trajectory_id)
    assert [d.action for d in rerun.insert_many([good, one_node])] == ["duplicate", "duplicate"]
    assert corpus_stats(rerun.store)["actions"] == {"new": 1, "rejected": 1}


def test_a_corrupted_table_gives_a_clear_error_and_the_previous_version_stays_readable(
        tmp_path, cfg, homes):
    memory = _memory(tmp_path, cfg)
    memory.insert_many(_trajs(homes, 6, 12, "v1"))
    v1, n1 = memory.versions(), memory.store.count(CHUNKS)
    memory.insert_many(_trajs(homes, 6, 13, "v2"))
    data = sorted((tmp_path / "memory" / "chunks.lance" / "data").glob("*.lance"),
                  key=lambda p: p.stat().st_mtime)
    data[-1].write_bytes(b"not a lance file")  # the newest fragment is damaged

    store = MemoryStore(str(tmp_path / "memory"), read_only=True)
    with pytest.raises(StoreError, match="chunks.*unreadable"):
        store.verify()
    store.checkout(v1)
    assert store.read(CHUNKS, ["trajectory_id"]).num_rows == n1


def _kill_creation(folder: Path) -> None:
    """What a process killed while LanceDB created the table at ``folder`` leaves: its files, no
    version (LanceDB still lists the table, and cannot open it)."""
    shutil.rmtree(folder / "_versions")


def test_a_table_whose_creation_was_killed_is_created_anew_and_nothing_stored_is_lost(tmp_path, cfg, homes):
    memory = _memory(tmp_path, cfg)
    memory.insert_many(_trajs(homes, 4, 21, "a"))
    stored = memory.store.count(CHUNKS)
    uri = memory.store.uri
    ValueLog(uri).append([("a0", b"decisions")])
    _kill_creation(Path(uri) / f"{VALUE_TABLE}.lance")  # killed in its first append
    walks = ValueLog(uri)  # opens (the corpus writer's start-up failed here before)
    assert walks.table is None and len(walks) == 0
    assert walks.append([("a1", b"decisions")]) == 1 and [t for t, _ in ValueLog(uri).rows()] == ["a1"]

    # A memory table's creation killed (a store's first start): the writer creates it again,
    # a reader says which table is missing, and the tables that were stored keep their rows.
    fresh = tmp_path / "fresh"
    MemoryStore(str(fresh), embedding_dim=8)
    _kill_creation(fresh / f"{SUMMARIES}.lance")
    with pytest.raises(StoreError, match="summaries"):
        MemoryStore(str(fresh), read_only=True)
    assert MemoryStore(str(fresh), embedding_dim=8).count(SUMMARIES) == 0
    # Compaction passes over a side table whose creation was killed (it failed opening it before).
    lancedb.connect(uri).create_table("killed_side_table", pa.table({"x": [1]}))
    _kill_creation(Path(uri) / "killed_side_table.lance")
    memory = _memory(tmp_path, cfg)
    memory.store.compact(keep_versions=1)
    assert memory.store.count(CHUNKS) == stored and len(ValueLog(uri)) == 1


@pytest.mark.slow
def test_opening_a_mistyped_path_names_it_and_creates_nothing(tmp_path, capsys):
    from trajrag.cli import main

    missing = tmp_path / "nosuch"
    for kwargs in ({"read_only": True}, {}):  # a reader, and a writer that cannot create (no embedding_dim)
        with pytest.raises(StoreError, match=f"{missing}: no such folder"):
            MemoryStore(str(missing), **kwargs)
    for argv in (["corpus", "stats"], ["corpus", "show", "--out", str(tmp_path / "g.png")],
                 ["encoder", "eval", "--model", str(tmp_path / "model")]):
        assert main([*argv, "--store", str(missing)]) == 2
        assert "no such folder" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_stored_chunk_reads_back_as_the_trajectory(tmp_path, cfg, homes):
    memory = _memory(tmp_path, cfg)
    traj = _trajs(homes, 1, 14, "rt")[0]
    memory.insert(traj)
    back = memory.load_trajectory(trajectory_key(traj))
    np.testing.assert_allclose(back.node_xy, traj.node_xy, atol=1e-5)
    names = [[traj.categories[c] if c >= 0 else c for c in row] for row in traj.sectors.tolist()]
    names_back = [[back.categories[c] if c >= 0 else c for c in row] for row in back.sectors.tolist()]
    assert names_back == names and back.goal == traj.goal
    assert "Goal:" in memory.store.get_chunk(trajectory_key(traj))["description"]


def test_compaction_keeps_the_current_summaries_and_everything_readable(tmp_path, cfg, homes):
    memory = _memory(tmp_path, cfg, batch_size=4)
    memory.insert_many(_trajs(homes[:3], 30, 15, "k"))
    groups = memory.store.list_groups()
    rows_before = memory.store.count(SUMMARIES)
    assert rows_before > len(groups)  # revisions and tombstones pile up between compactions
    memory.store.compact()
    # One row per group left, plus the tombstones that point fused groups' chunks onward.
    assert memory.store.count(SUMMARIES) == len(groups) + len(memory.store.group_aliases())
    assert memory.store.list_groups() == groups
    reopened = _memory(tmp_path, cfg)
    assert reopened.n_groups == len(groups) and reopened.n_chunks == memory.n_chunks
    assert {g: s.n_nodes for g, s in reopened.summaries.items()} == {
        g: s.n_nodes for g, s in memory.summaries.items()}


def _bridge_case(homes) -> tuple[TopoPolarTrajectory, TopoPolarTrajectory, TopoPolarTrajectory]:
    """The two ends of one long walk, which share no place, and the whole walk (another goal,
    so it is not redundant), each in its own episode frame."""
    rng = np.random.default_rng(16)
    long = next(t for t in _trajs(homes, 40, 16, "long", length=(22, 26), label_noise=0.0,
                                  unknown_rate=0.0) if len(t) >= 20)

    def part(lo: int, hi: int, name: str) -> TopoPolarTrajectory:
        piece = TopoPolarTrajectory(long.node_xy[lo:hi], long.sectors[lo:hi], long.categories,
                                    long.goal, long.reference_yaw, episode_id=name,
                                    scene_id=long.scene_id)
        return perturb(piece, rng, episode_id=name)[0]

    bridge = replace(part(0, len(long), "bridge"), goal="toilet" if long.goal != "toilet" else "bed")
    return part(0, 8, "first"), part(len(long) - 8, len(long), "second"), bridge


def test_a_bridging_trajectory_fuses_two_groups_and_their_chunks_follow(tmp_path, cfg, homes):
    memory = _memory(tmp_path, cfg)
    first, second, bridge = _bridge_case(homes)
    assert memory.insert(first).action == "new" and memory.insert(second).action == "new"
    decision = memory.insert(bridge)
    assert decision.action == "merge" and memory.n_groups == 1
    assert memory.store.read(DECISIONS, where="action = 'fuse'").num_rows == 1
    summary = memory.store.get_summary(decision.group_id)
    nodes_xy = np.asarray(summary["node_xy"]).reshape(-1, 2)
    for traj in (first, second, bridge):
        row = memory.store.get_chunk(trajectory_key(traj))
        assert row["group_id"] == decision.group_id
        theta, tx, ty = row["group_transform"]
        R = np.array([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
        in_group = np.asarray(row["node_xy"]).reshape(-1, 2) @ R.T + [tx, ty]
        np.testing.assert_allclose(in_group, nodes_xy[row["summary_nodes"]], atol=0.3)
    assert len(memory.store.get_group_chunks(decision.group_id)) == 3
    assert _memory(tmp_path, cfg).n_groups == 1  # the same after reopening


def test_fuse_check_refuses_a_fusion_the_two_summaries_do_not_support(tmp_path, cfg, homes,
                                                                       monkeypatch):
    # A true bridge passes the check: the summary it merged into now holds the whole walk and
    # matches the other end's group on its own.
    memory = _memory(tmp_path / "true", cfg, fuse_check=True)
    first, second, bridge = _bridge_case(homes)
    for part in (first, second):
        memory.insert(part)
    assert memory.insert(bridge).action == "merge" and memory.n_groups == 1
    # When the two summaries do not match each other, the groups stay apart and the refusal is
    # logged with its reason (here the summary-to-summary match is made to fail).
    real_match = grouping.match

    def summaries_never_match(a, b, params, rng):
        result = real_match(a, b, params, rng)
        return replace(result, accepted=False) if isinstance(a, grouping.Summary) else result

    monkeypatch.setattr(grouping, "match", summaries_never_match)
    memory = _memory(tmp_path / "refused", cfg, fuse_check=True)
    for part in (first, second):
        memory.insert(part)
    decision = memory.insert(bridge)
    assert decision.action == "merge" and memory.n_groups == 2
    refused = memory.store.read(DECISIONS, where="action = 'fuse_refused'").to_pylist()
    assert len(refused) == 1 and "do not match each other" in refused[0]["reason"]
    assert memory.store.read(DECISIONS, where="action = 'fuse'").num_rows == 0
    assert len(memory.store.get_group_chunks(decision.group_id)) == 2  # the bridge and one end
    assert _memory(tmp_path / "refused", cfg).n_groups == 2  # the same after reopening


def test_map_summaries_group_walks_that_saw_the_same_place_without_sharing_a_step(tmp_path, cfg, homes):
    from trajrag.topo.candidates import MapPlace

    rng = np.random.default_rng(21)
    long = next(t for t in _trajs(homes, 40, 16, "long", length=(22, 26), label_noise=0.0,
                                  unknown_rate=0.0) if len(t) >= 20)

    def walked_in_map(lo: int, hi: int, name: str) -> TopoPolarTrajectory:
        """Nodes lo..hi of the long walk, in an episode whose map holds all of it."""
        seen = perturb(long, rng, episode_id=name)[0]
        walk = replace(seen, node_xy=seen.node_xy[lo:hi], sectors=seen.sectors[lo:hi],
                       node_visit_steps=seen.node_visit_steps[lo:hi], node_ids=np.arange(lo, hi))
        walk.place = MapPlace(seen.node_xy, seen.sectors, seen.edges, seen.categories, seen.reference_yaw)
        return walk

    a, b = walked_in_map(0, 8, "first"), walked_in_map(len(long) - 8, len(long), "second")
    by_walk = _memory(tmp_path / "walk", cfg)
    assert [d.action for d in by_walk.insert_many([a, b])] == ["new", "new"]  # no shared step
    by_map = _memory(tmp_path / "map", cfg, summary_geometry="map")
    decisions = by_map.insert_many([a, b])
    assert [d.action for d in decisions] == ["new", "merge"] and by_map.n_groups == 1
    summary = next(iter(by_map.summaries.values()))
    assert summary.n_nodes >= len(long) - 2  # the map's nodes, not only the 16 walked
    # The chunks stay the walks; their summary nodes land where the walks were, in the group frame.
    rows = {r["trajectory_id"]: r for r in by_map.store.read(CHUNKS).to_pylist()}
    assert rows[trajectory_key(b)]["n_nodes"] == 8
    T = decisions[1].transform
    nodes = np.asarray(rows[trajectory_key(b)]["summary_nodes"])
    assert np.linalg.norm(summary.node_xy[nodes] - T.apply(b.node_xy), axis=1).max() < cfg.merge_radius_m
    # A map that does not hold its walk's nodes is rejected, and nothing is stored for it.
    bad = replace(walked_in_map(0, 8, "bad"), node_ids=np.arange(8) + 100)
    bad.place = a.place
    assert by_map.insert(bad).action == "rejected"
    assert by_map.n_chunks == 2
    with pytest.raises(ValueError, match="summary_geometry"):
        _memory(tmp_path / "typo", cfg, summary_geometry="maps")
    # The chunks keep their maps, so a replay groups by maps as the build did.
    assert rows[trajectory_key(b)]["map_xy"] is not None and by_map.store.keeps_maps
    # The perfect-matcher ceiling (chunks in their home's frame): the walks share no place, the
    # maps share every one.
    in_home = _memory(tmp_path / "ceiling", cfg)
    for lo, hi, name in ((0, 8, "c1"), (len(long) - 8, len(long), "c2")):
        walk = replace(long, node_xy=long.node_xy[lo:hi], sectors=long.sectors[lo:hi], episode_id=name,
                       node_visit_steps=long.node_visit_steps[lo:hi], node_ids=np.arange(lo, hi))
        walk.place = MapPlace(long.node_xy, long.sectors, long.edges, long.categories, long.reference_yaw)
        in_home.insert(walk)
    stats = corpus_stats(in_home.store, ceiling=(cfg.min_inliers, cfg.merge_radius_m))
    assert stats["completeness_ceiling"] == 0.5 and stats["completeness_ceiling_maps"] == 1.0
    regroup(by_map.store.uri, str(tmp_path / "replayed"), replace(cfg, summary_geometry="map"))
    replayed = TrajectoryMemory(str(tmp_path / "replayed"), cfg)
    assert replayed.n_groups == 1 and replayed.n_chunks == 2


def test_a_store_made_before_chunks_kept_maps_still_opens_and_grows(tmp_path, cfg, homes, caplog):
    import lancedb

    # The chunks table as stores were made before the map columns existed.
    lancedb.connect(str(tmp_path / "memory")).create_table(CHUNKS, schema=chunk_schema(cfg.embedding_dim, with_maps=False))
    memory = _memory(tmp_path, cfg)
    assert not memory.store.keeps_maps
    memory.insert_many(_trajs(homes, 3, 17, "old"))
    assert _memory(tmp_path, cfg).n_chunks == 3
    with caplog.at_level("WARNING"):
        assert regroup(memory.store.uri, str(tmp_path / "re"), replace(cfg, summary_geometry="map")) == 3
    assert "before chunks kept their maps" in caplog.text


def test_the_verifier_decides_inserts_when_it_is_on(tmp_path, cfg, homes):
    traj = _trajs(homes, 1, 31, "v", length=(15, 20))[0]
    moved = perturb(traj, np.random.default_rng(1), episode_id="moved")[0]
    never = replace(cfg.verifier, enabled=True, bias=-100.0, weights={})
    memory = _memory(tmp_path / "never", cfg, verifier=never)
    seen = []
    memory.on_match = lambda prep, gid, result: seen.append((prep.trajectory_id, gid, result.n_inliers))
    assert [d.action for d in memory.insert_many([traj, moved])] == ["new", "new"]
    assert seen and seen[0][0] == trajectory_key(moved) and seen[0][2] >= cfg.verifier.min_inliers
    always = replace(never, bias=100.0)
    first, second = _memory(tmp_path / "always", cfg, verifier=always).insert_many([traj, moved])
    assert second.action == "redundant" and second.group_id == first.group_id  # the same place


@pytest.mark.slow
def test_a_fitted_verifier_accepts_more_true_matches_than_the_thresholds(tmp_path, cfg, homes):
    from trajrag.memory.verifier import collect, fit

    # Short, noisy walks: the thresholds accept few of their true matches.
    cfg = replace(cfg, candidates=12, verifier=replace(cfg.verifier, min_inliers=2))
    memory = _memory(tmp_path, cfg)
    memory.insert_many(_trajs(homes, 200, 33, "fit", length=(4, 12), label_noise=0.2, unknown_rate=0.2))
    report = fit(collect(memory.store.uri, cfg), cfg)
    assert report["examples"] > report["true_home"] > 0 and set(report["weights"]) == set(EVIDENCE)
    # Cross-validated, at as many false accepts as the thresholds made, it accepts more true ones.
    same_false = report["verifier_at_replay_false_accepts"]
    assert same_false["false_accepts"] == report["replay"]["false_accepts"]
    assert same_false["true_accepts"] >= report["replay"]["true_accepts"] + 10
    assert report["auc"] >= 0.75
    # Its overrides switch it on; a regroup with it merges more and stays pure.
    fitted = load("memory", report["overrides"] + [f"memory.verifier.threshold={same_false['threshold']}",
                                                    "memory.candidates=12", "memory.verifier.min_inliers=2"])
    assert fitted.verifier.enabled and fitted.verifier.weights == report["weights"]
    regroup(memory.store.uri, str(tmp_path / "verified"), fitted)
    before, after = corpus_stats(memory.store), corpus_stats(str(tmp_path / "verified"))
    assert after["completeness"] > before["completeness"] and after["purity"] >= 0.95
    blind = _memory(tmp_path / "blind", cfg)
    blind.insert_many([replace(t, scene_id="") for t in _trajs(homes, 3, 34, "blind")])
    with pytest.raises(ValueError, match="scene_hint"):
        collect(blind.store.uri, cfg)


def test_embeddings_fill_the_empty_column_later(tmp_path, cfg, homes):
    memory = _memory(tmp_path, cfg)
    trajs = _trajs(homes, 3, 17, "emb")
    memory.insert_many(trajs)
    ids = [trajectory_key(t) for t in trajs]
    assert memory.store.get_chunk(ids[0])["embedding"] is None
    z = np.random.default_rng(0).normal(size=(2, memory.store.embedding_dim)).astype(np.float32)
    assert memory.store.update_embeddings(ids[:2], z, "enc-1") == 2
    row = memory.store.get_chunk(ids[0])
    np.testing.assert_allclose(row["embedding"], z[0], rtol=1e-6)
    assert row["encoder_version"] == "enc-1" and memory.store.get_chunk(ids[2])["embedding"] is None
    assert _memory(tmp_path, cfg).n_chunks == 3  # the journal knows the update: nothing undone
    assert memory.store.get_chunk(ids[1])["embedding"] is not None


@pytest.mark.slow
def test_compaction_prunes_history_to_the_versions_kept(tmp_path, cfg, homes):
    memory = _memory(tmp_path, cfg)
    walks = ValueLog(memory.store.uri)  # a table kept beside the memory's own, compacted with them
    for i, traj in enumerate(_trajs(homes, 12, 18, "h")):
        memory.insert(traj)  # one commit each: a dozen versions per table
        walks.append([(f"walk/{i}", b"npz bytes")])
        time.sleep(0.06)  # commits further apart than the pruning margin (50 ms)
    before = {name: len(memory.store.table(name).list_versions()) for name in (CHUNKS, DECISIONS)}
    before_walks = len(walks.table.list_versions())
    memory.store.compact(keep_versions=3)
    for name in (CHUNKS, DECISIONS):
        # 3 kept, a couple more inside the pruning margin, and the compaction's own versions.
        assert len(memory.store.table(name).list_versions()) <= before[name] - 5
    walk_table = ValueLog(memory.store.uri).table
    assert len(walk_table.list_versions()) <= before_walks - 5
    assert walk_table.stats()["fragment_stats"]["num_fragments"] == 1
    assert len(list(ValueLog(memory.store.uri).rows())) == 12  # merged, nothing lost
    reopened = _memory(tmp_path, cfg)  # the journal's snapshot survived the pruning
    assert reopened.n_chunks == memory.n_chunks
    versions = reopened.versions()
    reopened.insert_many(_trajs(homes, 3, 19, "after"))
    reopened.rollback(versions)
    assert reopened.n_chunks == memory.n_chunks


@pytest.mark.slow
def test_bench_store_prints_latency_and_size_and_cleans_its_workdir(tmp_path, capsys):
    from trajrag.cli import main

    assert main(["bench", "store", "--quick", "--json", "--workdir", str(tmp_path / "work")]) == 0
    result = json.loads(capsys.readouterr().out)
    for size in ("1k", "2k"):
        assert 0 < result[f"insert_ms_p50_{size}"] <= result[f"insert_ms_p95_{size}"]
        # The path before (memory.fast_path: false) timed in the same run, and where time goes.
        assert 0 < result[f"reference_insert_ms_p50_{size}"] <= result[f"reference_insert_ms_p95_{size}"]
        assert result[f"speedup_batched_insert_p50_{size}"] > 0
        assert set(result[f"profile_ms_per_traj_{size}"]) == set(PHASES)
        single = result[f"profile_single_insert_ms_{size}"]
        assert single["commit"] > 0 and single["candidates"] > 0 and single["ransac"] > 0
        # The walks carry their chunk text, as collectors hand them over: the writer writes none.
        assert single["describe"] == 0 and result[f"profile_ms_per_traj_{size}"]["describe"] == 0
        assert result[f"fs_write_rename_ms_{size}"] > 0
        assert result[f"chunks_{size}"] > 0.9 * int(size[:-1]) * 1000
    assert result["chunk_text_ms_per_traj"] > 0  # the collectors' share, reported beside
    assert 0 < result["bytes_per_chunk"] <= 4096  # the memory issue's size goal, no embedding
    assert result["purity"] >= 0.95  # synthetic homes do not merge with one another
    assert result["blas_kernels"] not in ("", "unknown")  # the figures' kernels (FMA or not)
    assert list((tmp_path / "work").iterdir()) == []


@pytest.mark.slow  # a local Ray and 300 trajectories into one, then two writers: ~20 s
def test_bench_build_feeds_one_and_two_writers_and_reports_their_rates(tmp_path, capsys):
    from trajrag.cli import main

    assert main(["bench", "build", "--quick", "--json", "--workdir", str(tmp_path / "work")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["sizes"] == [300]
    # The machine's load beside the rates: a rate from shared cores is read against it.
    assert result["load_average"] >= 0 and result["load_average_end"] >= 0
    for writers in (1, 2):
        assert result[f"build_traj_per_s_{writers}w_300"] > 0 and result[f"build_seconds_{writers}w"] > 0
        assert result[f"groups_{writers}w"] > 0
    # Writers split by scene group the walks as one writer does, near enough (equal on this plan
    # here; a near-tie in the candidates could move a walk on other BLAS kernels).
    assert abs(result["chunks_1w"] - result["chunks_2w"]) <= 0.02 * result["chunks_1w"]
    assert abs(result["groups_1w"] - result["groups_2w"]) <= max(1, 0.05 * result["groups_1w"])
    assert result["build_speedup_1w_300"] == 1.0
    assert result["blas_kernels"] not in ("", "unknown")
    assert list((tmp_path / "work").iterdir()) == []
