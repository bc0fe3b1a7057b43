"""The corpus build on Ray (trajrag.distributed.corpus): exactly-once under crashes, and resume.

One local Ray (the session's ``ray_session``), loopback only. Each build is small: 2 procedural
train homes x 3 episodes, oracle walks (exploration walks where their decisions are under test)
with 64x48 images (the pipeline is under test, not the images). A crash is a real process exit
(``os._exit``) of a collector or of the grouping actor, fired once through a marker file.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from trajrag import config
from trajrag.agent.collect import collector_settings, trajectory_id
from trajrag.distributed.corpus import FaultPlan, build_corpus_ray
from trajrag.memory.store import CHUNKS, DECISIONS, MemoryStore, StoreClaimedError, claim_store
from trajrag.memory.value_log import ValueLog
from trajrag.world.datasets import load_scenes
from trajrag.world.episode_gen import generate_episodes
from trajrag.world.geodesic import Motion

SCENES, PER_SCENE, POLICY = "procedural:train:2", 3, "oracle"
# Tiny images (mapping stride 1 keeps every pixel): the same pipeline, ~0.1 s an episode.
TINY = ["sim.width=64", "sim.height=48", "mapping.pixel_stride=1"]


def planned_episodes() -> list:
    """The episodes of the build's plan, in plan order, computed independently of the job (for
    the collectors' motion)."""
    settings = config.settings(TINY)
    cfg = settings.episodes
    motion = Motion.from_sim_config(collector_settings(settings).sim)
    return generate_episodes(load_scenes(SCENES, settings), PER_SCENE, cfg, cfg.seed, motion)


def planned_ids(policy: str) -> set[str]:
    """The trajectory ids the build must end up with."""
    return {trajectory_id(e, policy) for e in planned_episodes()}


@pytest.fixture(scope="module")
def planned() -> set[str]:
    return planned_ids(POLICY)


def build(store, faults=None, workers=2, policy=POLICY) -> dict:
    return build_corpus_ray(SCENES, PER_SCENE, policy, str(store), config.settings(TINY), workers=workers,
                            progress=False, faults=faults)


def assert_exactly_once(store, planned: set[str]) -> None:
    """Every planned id is decided once: a chunk, or dropped as redundant / rejected."""
    db = MemoryStore(str(store), read_only=True)
    chunks = db.read(CHUNKS, ["trajectory_id"]).column("trajectory_id").to_pylist()
    decisions = db.read(DECISIONS, ["trajectory_id", "action"]).to_pylist()
    by_action: dict[str, list[str]] = {}
    for d in decisions:
        by_action.setdefault(d["action"], []).append(d["trajectory_id"])
    redundant, rejected = set(by_action.get("redundant", [])), by_action.get("rejected", [])
    assert len(chunks) == len(set(chunks)), f"duplicate chunks: {Counter(chunks).most_common(2)}"
    assert len(rejected) == len(set(rejected)), "a trajectory was rejected twice"
    inserted = Counter(by_action.get("new", []) + by_action.get("merge", []))
    assert not inserted or max(inserted.values()) == 1, f"inserted twice: {inserted.most_common(1)}"
    assert set(chunks) | redundant | set(rejected) == planned
    assert len(chunks) + len(redundant) + len(rejected) == len(planned)


@pytest.mark.slow
def test_collector_crash_requeues_its_shard_and_loses_nothing(ray_session, tmp_path, planned):
    marker = tmp_path / "collector-crashed"
    summary = build(tmp_path / "store", FaultPlan(str(marker), collector_exit_after_episodes=1))
    assert marker.exists(), "the fault did not fire"
    assert summary["faults"]["collector_interruptions"] >= 1
    assert summary["faults"]["episodes_requeued"] >= 1
    assert summary["failed"] == 0 and summary["collected"] == len(planned)
    assert_exactly_once(tmp_path / "store", planned)


@pytest.mark.slow
def test_trajectories_reach_the_memory_in_plan_order_whatever_order_collectors_finish(ray_session, tmp_path):
    """Grouping depends on the order of insertion: a crashed collector's episodes come back late,
    yet the writer must see the plan's order, or two builds of one plan give two memories."""
    in_plan_order = [trajectory_id(e, POLICY) for e in planned_episodes()]
    marker = tmp_path / "collector-crashed"
    summary = build(tmp_path / "store", FaultPlan(str(marker), collector_exit_after_episodes=1))
    assert marker.exists() and summary["faults"]["episodes_requeued"] >= 1
    decided = MemoryStore(str(tmp_path / "store"), read_only=True).read(DECISIONS, ["trajectory_id"])
    assert decided.column("trajectory_id").to_pylist() == in_plan_order
    # One process walks the plan in order: the same memory, chunk for chunk and group for group.
    from trajrag.agent.corpus import build_corpus

    build_corpus(SCENES, PER_SCENE, POLICY, str(tmp_path / "one"), config.settings(TINY), progress=False)
    assert _groups(tmp_path / "one") == _groups(tmp_path / "store")


def _groups(store) -> list[tuple[str, int]]:
    db = MemoryStore(str(store), read_only=True)
    return sorted((r["trajectory_id"], int(r["group_id"]))
                  for r in db.resolve_chunks(db.read(CHUNKS, ["trajectory_id", "group_id"]), db.group_aliases()))


@pytest.mark.slow
def test_writer_crash_after_commit_resends_and_skips_what_was_committed(ray_session, tmp_path):
    # Exploration walks: their decisions (for the frontier value) go through the writer too.
    planned = planned_ids("explore")
    marker = tmp_path / "writer-crashed"
    summary = build(tmp_path / "store", FaultPlan(str(marker), writer_exit_after_commits=1), policy="explore")
    assert marker.exists(), "the fault did not fire"
    assert summary["faults"]["writer_failures"] >= 1 and summary["faults"]["batches_resent"] >= 1
    # The batch committed just before the crash came back as already stored, not twice.
    assert summary["decisions"].get("duplicate", 0) >= 1
    assert summary["collected"] == len(planned)
    assert_exactly_once(tmp_path / "store", planned)
    walks = [tid for tid, _ in ValueLog(str(tmp_path / "store")).rows()]
    assert sorted(walks) == sorted(planned) and summary["walks_with_value_decisions"] == len(planned)


@pytest.mark.slow  # a Ray build with a crash, then a one-process build
def test_sharded_writers_build_exactly_once_through_a_writer_crash_as_one_process_does(ray_session, tmp_path,
                                                                                      planned):
    # One collector and two half-CPU shard actors fit the session's 2 CPUs.
    overrides = [*TINY, "corpus_job.shard_num_cpus=0.5"]
    marker = tmp_path / "writer-crashed"
    summary = build_corpus_ray(SCENES, PER_SCENE, POLICY, str(tmp_path / "store"), config.settings(overrides), workers=1,
                               progress=False, writers=2,
                               faults=FaultPlan(str(marker), writer_exit_after_commits=1))
    assert marker.exists() and summary["faults"]["writer_failures"] >= 1
    assert summary["decisions"].get("duplicate", 0) >= 1
    assert_exactly_once(tmp_path / "store", planned)
    from trajrag.agent.corpus import build_corpus

    build_corpus(SCENES, PER_SCENE, POLICY, str(tmp_path / "one"), config.settings(TINY), progress=False, writers=2)
    assert _groups(tmp_path / "one") == _groups(tmp_path / "store")


@pytest.mark.slow
def test_cli_build_with_workers_then_rerun_collects_nothing(ray_session, tmp_path, planned, capsys):
    from trajrag.cli import main
    from trajrag.agent.corpus import build_corpus

    store = tmp_path / "store"
    argv = ["corpus", "build", "--scenes", SCENES, "--episodes-per-scene", str(PER_SCENE),
            "--policy", POLICY, "--store", str(store), "--workers", "2", "--json"]
    for override in TINY:
        argv += ["--set", override]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["collected"] == len(planned) and first["workers"] == 2
    assert sum(a["episodes"] for a in first["actors"]["collectors"]) == len(planned)
    assert first["chunks"] + first["decisions"].get("rejected", 0) <= len(planned)
    # While another job writes the store, a second build (on Ray or in one process) is refused
    # at once, naming that job, and the store is left as it was.
    versions = MemoryStore(str(store), read_only=True).versions()
    with claim_store(str(store), "corpus build in another shell"):
        assert main(argv) == 2
        assert "being written by another job" in capsys.readouterr().err
        with pytest.raises(StoreClaimedError, match="corpus build in another shell"):
            build_corpus(SCENES, PER_SCENE, POLICY, str(store), config.settings(TINY), progress=False)
    assert MemoryStore(str(store), read_only=True).versions() == versions
    second = build(store, workers=1)
    assert second["collected"] == 0 and second["skipped_already_stored"] == len(planned)
    assert second["chunks"] == first["chunks"] and second["groups"] == first["groups"]
    assert_exactly_once(store, planned)


@pytest.mark.slow
def test_map_summaries_hold_the_places_the_collectors_saw_not_only_walked(ray_session, tmp_path, planned):
    store = tmp_path / "store"
    build_corpus_ray(SCENES, PER_SCENE, POLICY, str(store), config.settings([*TINY, "memory.summary_geometry=map"]),
                     workers=2, progress=False)
    assert_exactly_once(store, planned)
    db = MemoryStore(str(store), read_only=True)
    aliases = db.group_aliases()
    walked: dict[int, set[int]] = {}
    for row in db.resolve_chunks(db.read(CHUNKS, ["group_id", "summary_nodes"]), aliases):
        walked.setdefault(int(row["group_id"]), set()).update(int(n) for n in row["summary_nodes"])
    summaries = {int(r["group_id"]): len(r["node_xy"]) // 2 for r in db.read_summaries(["group_id", "node_xy"]).to_pylist()}
    assert set(walked) <= set(summaries)
    assert all(max(nodes) < summaries[g] for g, nodes in walked.items())  # chunk nodes index their summary
    # Each collector's map travelled with its walk through Ray: the summaries hold seen, unwalked places.
    assert sum(summaries[g] - len(nodes) for g, nodes in walked.items()) > 0
