"""The command line as a user runs it: the dataset doctor and the main job."""

from __future__ import annotations

import json
import pickle
import bz2

import pytest

from trajrag import config
from trajrag.cli import main
from trajrag.memory.store import MemoryStore

SMALL_SIM = ["--set", "sim.width=160", "--set", "sim.height=120"]


def test_doctor_reports_the_keys_users_read(capsys):
    assert main(["episodes", "check", "--scenes", "procedural:val:2", "--episodes", "generated:6", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["episodes"] == 12
    assert report["starts_traversable"] == 12 and report["goals_reachable"] == 12
    assert report["mean_geodesic_m"] >= 1.0  # habitat-lab's shortest episode
    assert sum(row["episodes"] for row in report["per_category"].values()) == 12


def test_doctor_on_gibson_train(gibson_train_path, capsys):
    assert main(["episodes", "check", "--scenes", str(gibson_train_path), "--episodes", "generated:1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["scenes"] == 25
    assert report["starts_traversable_frac"] == 1.0 and report["goals_reachable_frac"] == 1.0


@pytest.mark.parametrize("scenes,episodes,needle", [
    ("procedural:nope:3", "generated:1", "procedural:SPLIT:N"),
    ("procedural:val:1", "generated:zero", "generated:K"),
    ("/nonexistent/x_info.pbz2", "generated:1", "x_info.pbz2"),
])
def test_doctor_bad_specs_give_one_line_and_exit_2(scenes, episodes, needle, capsys):
    assert main(["episodes", "check", "--scenes", scenes, "--episodes", episodes]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


@pytest.mark.parametrize("scenes,needle", [
    ("procedural:dev:3", "unknown split"),
    ("procedural:train:5-2", "empty range"),
    ("/no/such/train_info.pbz2@rest", "no such file"),
    ("GIBSON@all", "@held_out or @rest"),
])
def test_distributed_jobs_name_a_bad_scene_spec_in_one_line(scenes, needle, gibson_train_path, tmp_path, capsys,
                                                           monkeypatch):
    # The scenes load before a Ray cluster is asked for, so a typo costs seconds, not a cluster start.
    import trajrag.distributed.corpus as corpus_job

    monkeypatch.setattr(corpus_job, "ensure_ray", lambda *a, **k: pytest.fail("Ray started before the scenes loaded"))
    scenes = scenes.replace("GIBSON", str(gibson_train_path))
    for argv in (["corpus", "build", "--episodes-per-scene", "1", "--store", str(tmp_path / "memory")],
                 ["value", "fit", "--episodes", "generated:1", "--out", str(tmp_path / "value.json")]):
        assert main([*argv, "--scenes", scenes, "--workers", "2"]) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err
    assert not (tmp_path / "memory").exists() and not (tmp_path / "value.json").exists()  # nothing written


def test_doctor_rejects_a_pickle_carrying_code(tmp_path, capsys):
    evil = tmp_path / "evil_info.pbz2"
    evil.write_bytes(bz2.compress(pickle.dumps({"Scene": {0: {"origin": print}}})))
    assert main(["episodes", "check", "--scenes", str(evil), "--episodes", "generated:1"]) == 2
    assert "evil_info.pbz2" in capsys.readouterr().err


def test_run_writes_records_table_and_picture_and_resumes(ray_session, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["run", "--scenes", "procedural:val:1", "--episodes", "generated:2", "--agents", "oracle",
            "--out", str(out), "--json", *SMALL_SIM]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)["summaries"]["oracle"]
    assert summary["episodes"] == 2 and summary["sr"] == 1.0
    records = (out / "oracle" / "episodes.jsonl").read_text().splitlines()
    assert len(records) == 2
    table = (out / "results.md").read_text()
    assert table.count("| oracle |") == 1 and "decision_best_rate" not in table  # audit columns: audited runs only
    assert (out / "episode.png").stat().st_size > 10_000
    assert main(argv) == 0  # a rerun skips finished episodes
    assert len((out / "oracle" / "episodes.jsonl").read_text().splitlines()) == 2


def test_corpus_stats_reports_grouping_quality_and_its_ceiling(nav_memory, capsys):
    store, _ = nav_memory
    assert main(["corpus", "stats", "--store", store, "--json", "--ceiling"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["chunks"] == 15 - stats["actions"].get("redundant", 0) - stats["actions"].get("rejected", 0)
    assert stats["scenes"] == 3 and 0.0 < stats["purity"] <= 1.0
    # The real matcher needs the same overlap and finds fewer of the pairs (recall < 1).
    assert stats["completeness"] <= stats["completeness_ceiling"] <= 1.0


def _grouping(uri: str) -> set[frozenset[str]]:
    """The partition of a store's trajectory ids into (current) groups."""
    from trajrag.memory.store import CHUNKS, MemoryStore

    store = MemoryStore(uri, read_only=True)
    chunks = store.read(CHUNKS, ["trajectory_id", "group_id"])
    groups: dict[int, set[str]] = {}
    for tid, gid in zip(chunks.column("trajectory_id").to_pylist(),
                        store.resolve_groups(chunks.column("group_id").to_pylist())):
        groups.setdefault(gid, set()).add(tid)
    return {frozenset(g) for g in groups.values()}


def test_corpus_regroup_replays_a_memory_under_other_settings(nav_memory, tmp_path, capsys):
    store, _ = nav_memory
    source_versions = MemoryStore(store, read_only=True).versions()
    same = str(tmp_path / "same")
    assert main(["corpus", "regroup", "--store", store, "--out", same, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["replayed"] == summary["chunks"] == len(set().union(*_grouping(store)))
    assert _grouping(same) == _grouping(store)  # same settings, same order: the same groups
    strict = str(tmp_path / "strict")
    assert main(["corpus", "regroup", "--store", store, "--out", strict, "--json",
                 "--set", "memory.min_inliers=1000"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["groups"] == summary["chunks"] == summary["actions"]["new"]  # nothing matches
    assert MemoryStore(store, read_only=True).versions() == source_versions  # source only read
    # a target that already holds chunks would mix two groupings
    assert main(["corpus", "regroup", "--store", store, "--out", same]) == 2
    assert "already holds" in capsys.readouterr().err


def test_corpus_regroup_replays_the_maps_and_fit_verifier_names_too_little_evidence(nav_memory, tmp_path, capsys):
    store, _ = nav_memory
    # Collected chunks keep the maps they were walked in, so a map replay groups by maps.
    assert MemoryStore(store, read_only=True).keeps_maps
    assert main(["corpus", "regroup", "--store", store, "--out", str(tmp_path / "maps"), "--json",
                 "--set", "memory.summary_geometry=map"]) == 0
    assert "before chunks kept their maps" not in capsys.readouterr().err
    # 15 walks in 3 homes give too few false matches to learn from: one clear line, exit 2.
    assert main(["corpus", "fit-verifier", "--store", store, "--json"]) == 2
    assert "too few to fit" in capsys.readouterr().err


def test_a_preset_is_its_overrides_a_set_wins_over_it_and_bad_ones_are_named(nav_memory, tmp_path, monkeypatch,
                                                                              capsys):
    from trajrag import config

    store, _ = nav_memory
    overrides = config.preset_overrides(["home_groups"])
    memory = config.load("memory", overrides + ["memory.verifier.threshold=1.0"])
    assert memory.summary_geometry == "map" and memory.verifier.enabled and memory.verifier.threshold == 1.0
    assert config.load("corpus", overrides).oracle_look_around_at_goal_turns == 12
    # A regroup with the preset groups exactly as one with its overrides spelled out.
    by_preset, by_hand = str(tmp_path / "preset"), str(tmp_path / "hand")
    assert main(["corpus", "regroup", "--store", store, "--out", by_preset, "--json", "--preset", "home_groups"]) == 0
    spelled = [arg for o in overrides for arg in ("--set", o)]
    assert main(["corpus", "regroup", "--store", store, "--out", by_hand, "--json", *spelled]) == 0
    assert _grouping(by_preset) == _grouping(by_hand)
    capsys.readouterr()
    # an unknown preset, or a preset with a key its section does not have: one line, exit 2
    assert main(["corpus", "stats", "--store", store, "--preset", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'nope'" in err and "home_groups" in err
    (tmp_path / "typo.yaml").write_text("memory:\n  verifier:\n    threshhold: 0.5\n")
    monkeypatch.setattr(config, "presets_dir", lambda: tmp_path)
    assert main(["corpus", "stats", "--store", store, "--preset", "typo"]) == 2
    assert "preset 'typo'" in capsys.readouterr().err


def test_corpus_show_draws_a_group_and_names_a_missing_one(nav_memory, tmp_path, capsys):
    store, _ = nav_memory
    picture = tmp_path / "group.png"
    assert main(["corpus", "show", "--store", store, "--out", str(picture)]) == 0
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 10_000
    assert main(["corpus", "show", "--store", store, "--group", "99999", "--out", str(picture)]) == 2
    assert "no group 99999" in capsys.readouterr().err
    assert main(["corpus", "show", "--store", store, "--group", "biggest", "--out", str(picture)]) == 2
    assert "'largest' or 'mixed'" in capsys.readouterr().err


def test_help_shows_defaults_and_what_each_bench_measures(capsys):
    from trajrag.cli.bench import BENCHES

    def help_of(*argv: str) -> str:
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        return capsys.readouterr().out

    bench = help_of("bench")
    assert {line.split()[0] for line in bench.splitlines() if line.startswith("  ") and not line.startswith("   ")} \
        >= set(BENCHES)  # one entry per bench
    bench = " ".join(bench.split())  # argparse wraps the options' help
    assert "--quick: 100 steps" in bench and "read by the scale and experience benches only" in bench
    build = " ".join(help_of("corpus", "build").split())
    assert "default: mix" in build and "distributed/corpus.py); default: 0" in build
    assert "no Ray); default: 0" in " ".join(help_of("value", "fit").split())
    assert "purity" in help_of("corpus", "stats")
    assert f"run.scenes = {config.load('run').scenes}" in " ".join(help_of("run").split())
