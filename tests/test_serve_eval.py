"""The evaluation job on Ray with the TrajRAG planner and retriever on Ray Serve.

One local Ray (the session's ``ray_session``), loopback only: Serve's HTTP proxy on 127.0.0.1 at
a free port, evaluators reaching the planner app through DeploymentHandles. The memory is the
``nav_memory`` fixture (3 train homes, untrained encoder); the app also scores with a frontier value
model. The episodes are 2 val homes x 2, with 160x120 renders and a 70-step budget (a few planner
decisions each). Faults are real process deaths: a replica actor killed with ``ray.kill``
mid-evaluation, an evaluator that ``os._exit``s.
Serve is shut down before and after this module so other tests never see its apps.
"""

from __future__ import annotations

import json
import shutil
import socket
import urllib.error
import urllib.request
from collections import Counter

import pytest

from conftest import FAST_SIM
from trajrag import config
from trajrag.distributed.evaluate import EvalFaultPlan, evaluate_ray, job_config
from trajrag.planners.scoring import shared_retriever
from trajrag.distributed.serve_planner import (PLANNER, RETRIEVER, app_name, deploy_planner_app, http_url,
                                              replica_actor_names)
from trajrag.world.datasets import load_episodes, load_scenes

# Homes the session's small memory walked (nav_memory: procedural:train:3), so that the served
# planner prices where those walks saw the goal (retrieval.home_goals) as the in-process one does.
SCENES, EPISODES = "procedural:train:2", "generated:2"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The test Ray has 2 CPUs: 2 evaluators take them, the Serve replicas reserve none.
PORT = _free_port()
JOB = [*FAST_SIM, "episodes.max_steps=70", "eval_job.serve.retriever_num_cpus=0",
       f"eval_job.serve.port={PORT}", "eval_job.serve.health_check_period_s=1"]


@pytest.fixture(scope="module")
def serve_clean(ray_session):
    """No Serve before this module's tests, none after (its apps and proxy stop)."""
    from ray import serve

    serve.shutdown()
    yield
    serve.shutdown()


@pytest.fixture(scope="module")
def value_model(tmp_path_factory) -> str:
    """A frontier value model (random weights, farther worse) and its experience table for the
    planner app to score with: the app has no map, so the evaluator must send the value features
    with each request."""
    import numpy as np

    from trajrag.planners.frontier_value import FrontierValueModel, ValueDecision, feature_names, save_experience

    vocabulary = list(config.load("navigator").vocabulary)
    goals = list(config.load("episodes").goal_categories)
    names = feature_names(vocabulary, goals)
    rng = np.random.default_rng(0)
    weights = rng.normal(size=len(names))
    weights[0] = -1.0  # farther is worse, as every fitted model has it
    path = tmp_path_factory.mktemp("value") / "value.json"
    model = FrontierValueModel(vocabulary, goals, names, np.zeros(len(names)), np.ones(len(names)), weights,
                               config.load("value"), {})
    model.save(path)
    past = [ValueDecision("home", goal, rng.normal(size=(3, len(names))), rng.uniform(1.0, 9.0, size=3))
            for goal in goals for _ in range(20)]  # and an experience table for the app to search
    save_experience(model, past, path)
    return str(path)


@pytest.fixture(scope="module")
def job(nav_memory, value_model, serve_clean):
    """(settings, scenes, episodes, planned keys) of the evaluation under test."""
    store, model = nav_memory
    settings = config.settings([f"retrieval.store={store}", f"retrieval.model_dir={model}",
                                f"scoring.value_model={value_model}", *JOB])
    scenes = load_scenes(SCENES, settings)
    episodes = load_episodes(EPISODES, scenes, settings)
    planned = {(e.scene_key, str(e.episode_id)) for e in episodes}
    assert len(planned) == len(episodes) == 4
    return settings, scenes, episodes, planned


def read_records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_each_once(records: list[dict], planned: set) -> None:
    keys = [(r["scene_key"], r["episode_id"]) for r in records]
    assert len(keys) == len(set(keys)), f"duplicate records: {Counter(keys).most_common(1)}"
    assert set(keys) == planned and len(keys) == len(planned)


@pytest.mark.slow
def test_cli_eval_on_ray_matches_in_process_eval_and_resumes(job, nav_memory, value_model, tmp_path, capsys):
    """With a value model: the Serve app gets no map, the evaluator sends the value features."""
    from trajrag.agent.evaluate import evaluate_agent
    from trajrag.agent.registry import make_agent
    from trajrag.cli import main
    from trajrag.world.sim import GridSimulator

    settings, scenes, episodes, planned = job
    store, model = nav_memory
    argv = ["eval", "--scenes", SCENES, "--episodes", EPISODES, "--planner", "trajrag", "--store", store,
            "--model", model, "--out", str(tmp_path / "ray"), "--workers", "2", "--json"]
    for override in (f"scoring.value_model={value_model}", *JOB):
        argv += ["--set", override]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 4 and summary["evaluated"] == 4 and summary["failed"] == 0
    assert summary["complete"] and summary["workers"] == 2
    assert [a["episodes"] for a in summary["actors"]["evaluators"]] == [2, 2]
    assert summary["planner_calls"] > 0 and summary["retrieval_ms_p50"] > 0 and summary["serve_ms_p50"] > 0
    # the split: the retriever's stages, and what the round trip adds to them
    assert summary["coarse_ms_p50"] > 0 and summary["search_ms_p50"] > 0
    assert 0 < summary["serve_overhead_ms_p50"] < summary["serve_ms_p50"]
    records = read_records(tmp_path / "ray" / "trajrag" / "episodes.jsonl")
    assert_each_once(records, planned)

    # The same episodes in one process, with the in-process planner: the same walks, also where
    # the memory's walks of the home saw the goal (the evaluators asked the app for those places).
    retriever = shared_retriever(settings)  # the one the in-process planner below reads
    assert any(len(retriever.home_goal_points(e.scene_key, e.object_category)) for e in episodes)
    local = evaluate_agent("trajrag", lambda: make_agent("trajrag", settings), GridSimulator(settings.sim),
                           episodes, scenes, tmp_path / "local", settings.episodes, progress=False)
    by_key = {(r["scene_key"], r["episode_id"]): r for r in read_records(tmp_path / "local" / "trajrag" / "episodes.jsonl")}
    for r in records:
        assert r["actions"] == by_key[(r["scene_key"], r["episode_id"])]["actions"]
    assert (summary["sr"], summary["spl"]) == (local["sr"], local["spl"])

    # Rerun: nothing left to do, nothing written twice, the same summary.
    again = evaluate_ray("trajrag", "trajrag", scenes, episodes, tmp_path / "ray", settings, workers=2, progress=False)
    assert again["evaluated"] == 0 and again["skipped_already_done"] == 4 and again["spl"] == summary["spl"]
    assert_each_once(read_records(tmp_path / "ray" / "trajrag" / "episodes.jsonl"), planned)


@pytest.mark.slow
def test_a_finished_run_is_summarised_without_starting_ray(tmp_path, capsys, monkeypatch):
    """A resumed cross-validation calls `trajrag eval --workers N` on many finished runs: each must
    only be summarised, not wait for a Ray to start."""
    from trajrag.cli import main
    from trajrag.distributed import evaluate as job_module

    argv = ["eval", "--scenes", SCENES, "--episodes", EPISODES, "--planner", "frontier",
            "--out", str(tmp_path), "--workers", "2", "--json", *[a for o in JOB for a in ("--set", o)]]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray started for a finished run")

    monkeypatch.setattr(job_module, "ray_for_eval", no_ray)
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["evaluated"] == 0 and again["skipped_already_done"] == first["episodes"] == 4
    assert (again["sr"], again["spl"]) == (first["sr"], first["spl"])


@pytest.mark.slow
def test_http_ingress_on_loopback_answers_like_the_handle(job):
    from ray import serve

    from trajrag.bench.pipeline import record_decisions

    settings, scenes, episodes, _ = job
    cfg = job_config(settings.eval_job).serve
    assert cfg.host == "127.0.0.1"
    name, _ = deploy_planner_app(settings, cfg)  # already running after the test above
    request = record_decisions(scenes, episodes, settings, at_least=1)[0]
    by_handle = serve.get_app_handle(name).decide.remote(request).result(timeout_s=60)
    http = urllib.request.Request(http_url(name, cfg), data=json.dumps(request).encode(), method="POST",
                                  headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(http, timeout=60) as response:
        by_http = json.loads(response.read())
    assert by_http["choice"] == by_handle["choice"] and by_http["scores"] == pytest.approx(by_handle["scores"])
    bad = urllib.request.Request(http_url(name, cfg), data=b'{"goal": "chair"}', method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(bad, timeout=60)
    assert err.value.code == 400 and "candidates" in err.value.read().decode()
    without_features = {k: v for k, v in request.items() if k != "value_features"}
    bad = urllib.request.Request(http_url(name, cfg), data=json.dumps(without_features).encode(), method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:  # the app scores with a value model: it needs them
        urllib.request.urlopen(bad, timeout=60)
    assert err.value.code == 400 and "value_features" in err.value.read().decode()


@pytest.mark.slow
def test_a_replica_that_cannot_start_names_its_error_and_leaves_no_app(job, value_model, tmp_path):
    """A value model copied without its experience table: Serve itself says only "Failed to update
    the deployments"; the user gets the replica's own error line."""
    from ray import serve

    settings, _, _, _ = job
    alone = tmp_path / "value.json"
    shutil.copy(value_model, alone)
    broken = config.settings([f"retrieval.store={settings.retrieval.store}",
                              f"retrieval.model_dir={settings.retrieval.model_dir}",
                              f"scoring.value_model={alone}", *JOB])
    cfg = job_config(broken.eval_job).serve
    with pytest.raises(RuntimeError) as err:
        deploy_planner_app(broken, cfg)
    message = str(err.value)
    assert "ExperienceError" in message and "no experience table beside the frontier value model" in message
    assert str(alone) in message and "Failed to update the deployments" not in message
    assert app_name(broken, cfg) not in serve.status().applications


@pytest.mark.slow
def test_killed_serve_replicas_are_replaced_and_every_episode_is_written_once(job, tmp_path):
    import ray

    settings, scenes, episodes, planned = job
    name = app_name(settings, job_config(settings.eval_job).serve)
    killed: list[str] = []

    def kill_replicas(record: dict) -> None:
        if killed:
            return
        for deployment in (RETRIEVER, PLANNER):
            for actor in replica_actor_names(name, deployment):
                ray.kill(ray.get_actor(actor, namespace="serve"), no_restart=True)
                killed.append(actor)

    summary = evaluate_ray("killed-replicas", "trajrag", scenes, episodes, tmp_path, settings, workers=2,
                           progress=False, on_record=kill_replicas)
    # the app as configured: one Planner replica retrieving itself, or a Planner and a Retriever
    expected = 1 if job_config(settings.eval_job).serve.retriever_in_planner else 2
    assert len(killed) == expected, f"expected {expected} replica(s), killed {killed}"
    assert summary["evaluated"] == 4 and summary["failed"] == 0
    records = read_records(tmp_path / "killed-replicas" / "episodes.jsonl")
    assert_each_once(records, planned)
    # Later episodes still decided through the app, on new replicas.
    assert sum(r["agent_stats"]["planner_calls"] for r in records[1:]) > 0
    assert not set(killed) & set(replica_actor_names(name, RETRIEVER) + replica_actor_names(name, PLANNER))


@pytest.mark.slow
def test_killed_evaluator_requeues_its_episodes_and_every_episode_is_written_once(job, tmp_path):
    settings, scenes, episodes, planned = job
    marker = tmp_path / "evaluator-died"
    summary = evaluate_ray("killed-evaluator", "trajrag", scenes, episodes, tmp_path, settings, workers=2,
                           progress=False, faults=EvalFaultPlan(str(marker), evaluator_exit_after_episodes=1))
    assert marker.exists(), "the fault did not fire"
    assert summary["faults"]["evaluator_interruptions"] >= 1 and summary["faults"]["episodes_requeued"] >= 1
    assert summary["evaluated"] == 4 and summary["failed"] == 0 and summary["episodes"] == 4
    assert_each_once(read_records(tmp_path / "killed-evaluator" / "episodes.jsonl"), planned)


@pytest.mark.slow
def test_shards_split_the_episodes_and_together_complete_the_run(job, tmp_path):
    settings, scenes, episodes, planned = job
    first = evaluate_ray("sharded", "frontier", scenes, episodes, tmp_path, settings, workers=1,
                         shard=(0, 2), progress=False)
    assert first["episodes_planned"] == 2 and not first["complete"]
    assert not (tmp_path / "sharded" / "summary.json").exists()
    second = evaluate_ray("sharded", "frontier", scenes, episodes, tmp_path, settings, workers=1,
                          shard=(1, 2), progress=False)
    assert second["episodes_planned"] == 2 and second["complete"]
    records = [r for path in sorted((tmp_path / "sharded").glob("episodes.shard-*.jsonl")) for r in read_records(path)]
    assert_each_once(records, planned)
    assert json.loads((tmp_path / "sharded" / "summary.json").read_text())["episodes"] == 4


@pytest.mark.slow
def test_a_torn_last_record_is_cut_and_its_episode_runs_again(ray_session, tmp_path, capsys):
    """A job killed while the driver wrote a record: the resumed job cuts the fragment off (the next
    record would run into it) and walks that episode again; the records before stay as they were."""
    settings = config.settings(JOB)
    scenes = load_scenes("procedural:val:1", settings)
    episodes = load_episodes(EPISODES, scenes, settings)
    first = evaluate_ray("torn", "frontier", scenes, episodes, tmp_path, settings, workers=1, progress=False)
    assert first["evaluated"] == 2
    path = tmp_path / "torn" / "episodes.jsonl"
    whole, last = path.read_bytes().splitlines(keepends=True)
    torn = last[: len(last) // 2]
    path.write_bytes(whole + torn)
    again = evaluate_ray("torn", "frontier", scenes, episodes, tmp_path, settings, workers=1, progress=False)
    assert again["evaluated"] == 1 and again["skipped_already_done"] == 1
    assert f"{path}: cut a torn last line ({len(torn)} bytes" in capsys.readouterr().err
    assert path.read_bytes().startswith(whole)
    assert_each_once(read_records(path), {(e.scene_key, str(e.episode_id)) for e in episodes})


@pytest.mark.slow  # three app deployments
def test_the_serve_replay_splits_each_apps_latency_and_compares_it_with_the_uncached_retriever(job):
    from trajrag.bench.pipeline import SERVE_VARIANTS, record_decisions, serve_comparison

    settings, scenes, episodes, _ = job
    requests = record_decisions(scenes, episodes, settings, at_least=4)
    result = serve_comparison(requests[:3], requests[3:4], settings)
    assert result["serve_requests"] == 3 and result["serve_speedup_p50"] > 0
    for prefix, _ in SERVE_VARIANTS:  # the retriever as before, the app as two deployments, as configured
        assert result[f"{prefix}_ms_p50"] > result[f"{prefix}_retrieval_ms_p50"] > 0
        assert result[f"{prefix}_coarse_ms_p50"] > 0 and result[f"{prefix}_overhead_ms_p50"] > 0
