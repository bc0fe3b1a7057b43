"""The Ray Tune sweep of the TrajRAG planner (trajrag.distributed.sweep): Optuna + ASHA, W&B offline.

A 2-trial sweep on one procedural train home x 2 episodes (chunks of 1, a 50-step budget,
160x120 renders) over the ``nav_memory`` fixture, on the session's local Ray (2 CPUs: the two
trials side by side). Also: the default tuning scenes are train homes the corpus and the val
tables never use.
"""

from __future__ import annotations

import csv
import json
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import FAST_SIM
from trajrag import config
from trajrag.cli import UserError
from trajrag.distributed.sweep import SweepParam, check_config, sweep

TINY_SWEEP = [*FAST_SIM, "episodes.max_steps=50", "sweep.scenes=procedural:train:40-41",
              "sweep.episodes=generated:2", "sweep.chunk_episodes=1", "sweep.num_samples=2",
              "sweep.max_concurrent_trials=2"]


def wandb_temp(folder: str) -> set[Path]:
    return set(Path(folder).glob("tmp*wandb-media"))


@pytest.mark.slow
def test_two_trial_sweep_writes_best_config_results_and_offline_wandb_runs(ray_session, nav_memory, tmp_path):
    store, model = nav_memory
    out = tmp_path / "sweep"
    temp_before = wandb_temp(tempfile.gettempdir())
    summary = sweep(store, model, out, config.settings(TINY_SWEEP), progress=False)
    cfg = config.load("sweep")
    assert summary["trials"] == 2 and summary["trial_errors"] == 0 and summary["chunks"] == 2
    assert summary["objective"] == "spl" and summary["search"] == "optuna"

    best = json.loads((out / "best_config.json").read_text())
    assert set(best["params"]) == set(cfg.params)
    for key, value in best["params"].items():  # inside the searched ranges, ints where randint
        p = cfg.params[key]
        assert p.low <= value <= p.high
        assert isinstance(value, int) == (p.kind == "randint")
    # The best setting is usable as --set overrides.
    assert config.load("scoring", best["overrides"]).w_context == pytest.approx(best["params"]["scoring.w_context"])
    assert config.load("retrieval", best["overrides"]).top_k == best["params"]["retrieval.top_k"]

    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    for row in rows:  # a result after each chunk; ASHA may stop a trial after the first
        assert int(row["training_iteration"]) in (1, 2) and int(row["episodes"]) == int(row["training_iteration"])
        assert 0.0 <= float(row["spl"]) <= float(row["sr"]) <= 1.0
    # Every trial logged to W&B, offline, inside the experiment folder.
    runs = list((out / "tune").glob("*/*/wandb/offline-run-*"))
    assert len(runs) == 2, runs
    # wandb's import-time temporary folders too (one per trial process; Tune may run both trials
    # in one): in /tmp nothing would ever remove them.
    assert list((out / "tune").glob("*/*/*wandb-media"))
    assert not wandb_temp(tempfile.gettempdir()) - temp_before


def test_default_tuning_scenes_are_train_homes_the_corpus_never_saw():
    from trajrag.world.datasets import load_scenes, parse_procedural_range

    cfg = config.load("sweep")
    split, start, stop = parse_procedural_range(cfg.scenes)
    corpus = config.load("run").corpus_scenes  # the corpus of `trajrag run` / make run
    corpus_split, corpus_start, corpus_stop = parse_procedural_range(corpus)
    assert split == corpus_split == "train" and corpus_start == 0 and start >= corpus_stop and stop > start
    names = {s.name for s in load_scenes("procedural:train:40-42", config.settings())}
    assert names == {"procedural/train/0040", "procedural/train/0041"}


def test_sweep_config_errors_name_the_bad_value():
    cfg = config.load("sweep")
    cfg.params["scoring.no_such_weight"] = SweepParam("uniform", 0.0, 1.0)
    with pytest.raises(UserError, match="scoring.no_such_weight"):
        check_config(cfg)
    cfg = config.load("sweep", ["sweep.objective=reward"])
    with pytest.raises(UserError, match="objective"):
        check_config(cfg)


# What a Ray worker does with W&B (a training worker, a sweep trial): a run stopped early, then
# the worker's children killed (wandb-core among them: Ray kills a worker's child processes) and
# the worker gone before interpreter exit, so wandb's atexit teardown never runs.
WORKER = """
import os, sys
import psutil
os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
from trajrag.ray_cluster import finish_wandb, import_wandb
wandb = import_wandb(sys.argv[1])
run = wandb.init(project="t", dir=sys.argv[1])
try:
    try:
        run.log({"loss": 1.0})
        raise SystemExit(0)  # what Tune raises in a trial ASHA stops
    finally:
        finish_wandb(run)
finally:
    for child in psutil.Process().children(recursive=True):
        child.kill()
    os._exit(0)
"""


@pytest.mark.slow
def test_a_killed_worker_leaves_no_wandb_service_folder_in_tmp(tmp_path):
    import subprocess
    import sys

    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path)], stderr=subprocess.PIPE, text=True)
    _, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    assert list(tmp_path.glob("wandb/offline-run-*")), "no offline run written"
    # wandb-core's socket folder is named after the Python process that started it
    left = list(Path(tempfile.gettempdir()).glob(f"wandb-{worker.pid}-*"))
    for folder in left:  # this test's own, even when it fails
        shutil.rmtree(folder, ignore_errors=True)
    assert not left, err
