"""`trajrag run` (make run): the whole pipeline end to end, tiny."""

from __future__ import annotations

import json

import pytest

from conftest import FAST_SIM
from trajrag.cli import main
from trajrag.cli.run import RUN_LOCK
from trajrag.file_locks import claim


@pytest.mark.slow
def test_run_builds_memory_trains_encoder_evaluates_and_draws(ray_session, tmp_path, capsys):
    out = tmp_path / "run"
    sizes = ["run.corpus_scenes=procedural:train:4", "run.corpus_episodes_per_scene=3", "run.encoder_epochs=1",
             "encoder.train.min_held_out_scenes=1",
             "episodes.max_steps=200", *FAST_SIM]
    argv = ["run", "--scenes", "procedural:val:1", "--episodes", "generated:1", "--agents", "trajrag,frontier",
            "--out", str(out), "--json", *[a for s in sizes for a in ("--set", s)]]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["corpus"]["collected"] == 12 and result["corpus"]["chunks"] >= 6
    assert result["encoder"]["embedded_chunks"] == result["corpus"]["chunks"]
    assert set(result["summaries"]) == {"trajrag", "frontier"}
    assert result["summaries"]["trajrag"]["planner_calls"] > 0
    assert (out / "model" / "encoder.json").is_file() and (out / "encoder_eval.json").is_file()
    # The value is fitted on the decisions of the corpus's own exploration walks (no walking again).
    explored = result["corpus"]["walks_with_value_decisions"]
    assert 0 < explored < 12 and result["value"]["walks"] == explored and (out / "value.json").is_file()
    table = (out / "results.md").read_text()
    assert "| trajrag |" in table and "| frontier |" in table
    assert (out / "episode.png").stat().st_size > 10_000 and (out / "decision.png").stat().st_size > 10_000
    decision_written = (out / "decision.png").stat().st_mtime_ns
    assert main(argv) == 0  # a rerun resumes: nothing collected, the encoder kept, no episode rerun
    again = json.loads(capsys.readouterr().out)
    assert again["corpus"]["collected"] == 0 and again["encoder"] == result["encoder"]
    assert again["value"] == result["value"]  # kept
    assert len((out / "trajrag" / "episodes.jsonl").read_text().splitlines()) == 1
    assert (out / "decision.png").stat().st_mtime_ns == decision_written  # not replayed again


@pytest.mark.slow
def test_a_second_run_in_a_folder_being_written_is_refused_before_it_starts(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    with claim(out / RUN_LOCK, "the first trajrag run", AssertionError):
        assert main(["run", "--out", str(out), "--json"]) == 2
    error = capsys.readouterr().err
    assert "being written by another trajrag run" in error and "the first trajrag run" in error
    assert [p.name for p in out.iterdir()] == [RUN_LOCK]  # no stage began: no memory, no model
