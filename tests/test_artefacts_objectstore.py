"""Model, value and evaluation outputs at object-store URIs (``s3://...``), read and written by
the same code as local paths (``trajrag.artefacts``), against moto's S3 server on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import FAST_SIM, S3_BUCKET
from test_frontier_value import GOALS, VOCABULARY, _decisions
from trajrag import artefacts
from trajrag.cli import main
from trajrag.encoder.model import load_model_dir
from trajrag.planners.frontier_value import FrontierValueModel, save_decisions
from trajrag.retrieval.experience import ExperienceIndex, experience_path


def _keys(s3, prefix: str) -> set[str]:
    listing = s3.list_objects_v2(Bucket=S3_BUCKET, Prefix=prefix)
    return {o["Key"][len(prefix):] for o in listing.get("Contents", [])}


@pytest.mark.slow
def test_an_encoder_folder_on_s3_loads_as_the_local_one(s3_env, nav_memory, tmp_path, monkeypatch):
    monkeypatch.setenv(artefacts.CACHE_ENV, str(tmp_path / "cache"))
    _store, model_dir = nav_memory
    uri = f"s3://{S3_BUCKET}/encoder-test/model"
    artefacts.publish(model_dir, uri)
    local_model, local_meta = load_model_dir(model_dir)
    remote_model, remote_meta = load_model_dir(uri)
    assert remote_meta == local_meta
    for (name, a), (_, b) in zip(local_model.state_dict().items(), remote_model.state_dict().items()):
        assert np.array_equal(a.numpy(), b.numpy()), name
    # A second load on this node reads its cached copy; a rewritten model is fetched again.
    assert artefacts.local_copy(uri) == artefacts.local_copy(uri)
    s3_env.put_object(Bucket=S3_BUCKET, Key="encoder-test/model/encoder.json", Body=b"{}")
    with pytest.raises(Exception, match="encoder.json"):
        load_model_dir(uri)


def test_a_value_model_fitted_to_an_s3_uri_keeps_its_experience_beside_it(s3_env, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(artefacts.CACHE_ENV, str(tmp_path / "cache"))
    decisions = tmp_path / "decisions.npz"
    save_decisions(decisions, _decisions(120, seed=1), VOCABULARY, GOALS)
    uri = f"s3://{S3_BUCKET}/value-test/value.json"
    assert main(["value", "fit", "--decisions", str(decisions), "--out", uri, "--json"]) == 0
    keys = _keys(s3_env, "value-test/")
    assert "value.json" in keys and any(k.startswith("value.experience/") for k in keys)
    assert not Path("s3:").exists()  # nothing written to a local folder named after the scheme
    model = FrontierValueModel.load(uri)
    held_out = _decisions(20, seed=7)
    wins = [int(np.argmax(model.score(d.features))) == int(np.argmin(d.cost_m)) for d in held_out]
    assert np.mean(wins) > 0.8  # the fitted model, not an empty one
    experience = ExperienceIndex(artefacts.local_copy(experience_path(uri)), len(model.feature_names), k=8)
    assert experience.advantage(model.standardise(held_out[0].features), held_out[0].goal).shape == (
        len(held_out[0].features),)
    capsys.readouterr()


@pytest.mark.slow
def test_an_evaluation_into_an_s3_uri_writes_its_records_there_and_resumes_from_them(
        s3_env, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(artefacts.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    uri = f"s3://{S3_BUCKET}/eval-test/out"
    command = ["eval", "--planner", "frontier", "--scenes", "procedural:val:1", "--episodes", "generated:2",
               "--out", uri, "--json", *(a for o in FAST_SIM for a in ("--set", o))]
    assert main(command) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["out"] == uri and first["episodes"] == 2
    keys = _keys(s3_env, "eval-test/out/")
    assert {"frontier/episodes.jsonl", "frontier/run.json", "results.md", "results.csv"} <= keys
    records = s3_env.get_object(Bucket=S3_BUCKET, Key="eval-test/out/frontier/episodes.jsonl")["Body"].read()
    assert len(records.decode().splitlines()) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # nothing left in the working folder
    # A rerun (another node, an empty cache) finds both episodes in the bucket and walks none.
    monkeypatch.setenv(artefacts.CACHE_ENV, str(tmp_path / "other-node"))
    assert main(command) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["sr"] == first["sr"] and again["spl"] == first["spl"]
    assert s3_env.get_object(Bucket=S3_BUCKET, Key="eval-test/out/frontier/episodes.jsonl")["Body"].read() == records


def test_two_jobs_writing_one_uri_keep_each_others_files(s3_env, tmp_path, monkeypatch):
    """Evaluation shards share an --out: a job uploads only what it wrote, not its stale copy of the rest."""
    monkeypatch.setenv(artefacts.CACHE_ENV, str(tmp_path / "cache"))
    uri = f"s3://{S3_BUCKET}/shards-test/out"
    with artefacts.output_folder(uri) as first:
        (first / "shard-0.jsonl").write_text("a\n")
    with artefacts.output_folder(uri) as second, artefacts.output_folder(uri) as third:
        (second / "shard-0.jsonl").write_text("a\nb\n")   # shard 0 goes on
        (third / "shard-1.jsonl").write_text("c\n")        # shard 1 finishes after it
    assert artefacts.local_copy(artefacts.join(uri, "shard-0.jsonl")).read_text() == "a\nb\n"
    assert artefacts.local_copy(artefacts.join(uri, "shard-1.jsonl")).read_text() == "c\n"


@pytest.mark.slow
def test_a_model_uri_with_nothing_there_is_one_line_naming_it(s3_env, tmp_path, monkeypatch, capsys, nav_memory):
    monkeypatch.setenv(artefacts.CACHE_ENV, str(tmp_path / "cache"))
    store, _model = nav_memory
    uri = f"s3://{S3_BUCKET}/missing/model"
    assert main(["encoder", "eval", "--store", store, "--model", uri, "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and uri in err[0]
