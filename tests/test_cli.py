"""The command line as a user runs it: the dataset doctor and the main job."""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import bz2
import subprocess
import sys
from pathlib import Path

import pytest

from trajrag import config
from trajrag.cli import main
from trajrag.memory.store import MemoryStore

SMALL_SIM = ["--set", "sim.width=160", "--set", "sim.height=120"]


@pytest.mark.slow
def test_doctor_reports_the_keys_users_read(capsys):
    assert main(["episodes", "check", "--scenes", "procedural:val:2", "--episodes", "generated:6", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["episodes"] == 12
    assert report["starts_traversable"] == 12 and report["goals_reachable"] == 12
    assert report["mean_geodesic_m"] >= 1.0  # habitat-lab's shortest episode
    assert sum(row["episodes"] for row in report["per_category"].values()) == 12


@pytest.mark.slow
def test_doctor_on_gibson_train(gibson_train_path, capsys):
    assert main(["episodes", "check", "--scenes", str(gibson_train_path), "--episodes", "generated:1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["scenes"] == 25
    assert report["starts_traversable_frac"] == 1.0 and report["goals_reachable_frac"] == 1.0


def test_a_reader_that_stops_early_ends_the_command_quietly():
    """`trajrag ... --json | head`: no traceback when the pipe closes before the output is out."""
    command = [sys.executable, "-m", "trajrag", "episodes", "check", "--scenes", "procedural:val:1",
               "--episodes", "generated:2", "--json"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # long before the command prints
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err

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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_corpus_show_draws_a_group_and_names_a_missing_one(nav_memory, tmp_path, capsys):
    store, _ = nav_memory
    picture = tmp_path / "group.png"
    assert main(["corpus", "show", "--store", store, "--out", str(picture)]) == 0
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 10_000
    bare = tmp_path / "bare"  # no suffix: the PNG is the file named, as printed, not bare.png
    assert main(["corpus", "show", "--store", store, "--out", str(bare)]) == 0
    assert capsys.readouterr().out.split()[-1] == str(bare) and bare.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["corpus", "show", "--store", store, "--group", "99999", "--out", str(picture)]) == 2
    assert "no group 99999" in capsys.readouterr().err
    assert main(["corpus", "show", "--store", store, "--group", "biggest", "--out", str(picture)]) == 2
    assert "'largest' or 'mixed'" in capsys.readouterr().err


# -- trajrag eval: the records, run.json and summaries it reads back --------------------------------
EVAL = ["eval", "--scenes", "procedural:val:1", "--episodes", "generated:2", "--planner", "frontier", "--json",
        "--set", "sim.width=320", "--set", "sim.height=240"]


def _strict_json(text: str):
    """JSON as a strict reader parses it: NaN and Infinity are refused."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _record(episode_id: str, **metrics) -> dict:
    """An episode record as `trajrag eval` writes it (the keys a summary reads), ``metrics`` replaced."""
    base = {"episode_id": episode_id, "scene_key": "home", "category": "chair", "success": True, "spl": 0.5,
            "distance_to_goal": 0.0, "path_length": 4.0, "geodesic_distance": 2.0, "steps": 40, "collisions": 0,
            "called_stop": True}
    return {"scene_key": "home", "episode_id": episode_id, "metrics": {**base, **metrics}}


def _without_spl(record: dict) -> dict:
    return {**record, "metrics": {k: v for k, v in record["metrics"].items() if k != "spl"}}


BAD_LINES = [
    (b"{not json", "not JSON"),
    (b"{}", "scene_key must be a string, got null"),
    (b"123", "expected a JSON object, got 123"),
    (b"null", "expected a JSON object, got null"),
    (json.dumps(_without_spl(_record("1"))).encode(), "metrics lack spl"),
    (json.dumps(_record("1", success="yes")).encode(), 'metrics.success must be true or false, got "yes"'),
    (json.dumps(_record("1", spl=float("nan"))).encode(), "metrics.spl must be a number from 0 to 1, got NaN"),
]


@pytest.mark.parametrize("line,needle", BAD_LINES)
def test_a_bad_record_in_the_middle_is_named_by_file_and_line(tmp_path, line, needle):
    from trajrag.agent.run_records import PAIRED_METRICS, AgentRun, RecordsError
    from trajrag.distributed.evaluate import ShardedRun

    path = tmp_path / "frontier" / "episodes.jsonl"
    path.parent.mkdir()
    path.write_bytes(b"\n".join([json.dumps(_record("0")).encode(), line, json.dumps(_record("2")).encode()]) + b"\n")
    before = path.read_bytes()
    # as eval reads them, as the Ray job does, and as compare does (success and SPL only)
    for run, metrics in ((AgentRun("frontier", path.parent), {}), (ShardedRun("frontier", path.parent), {}),
                         (AgentRun("frontier", path.parent), {"metrics": PAIRED_METRICS})):
        with pytest.raises(RecordsError, match=re.escape(f"{path}:2: not an episode record: ")) as error:
            run.finished(**metrics)
        assert needle in str(error.value)
    assert path.read_bytes() == before  # nothing re-run over it, nothing cut


def test_a_torn_last_line_is_left_out_then_cut_before_the_next_append(tmp_path, capsys):
    from trajrag.agent.run_records import AgentRun, cut_torn_tail

    path = tmp_path / "frontier" / "episodes.jsonl"
    path.parent.mkdir()
    whole = (json.dumps(_record("0")) + "\n").encode()
    torn = json.dumps(_record("1")).encode()[:50]
    path.write_bytes(whole + torn)
    assert list(AgentRun("frontier", path.parent).finished()) == [("home", "0")]  # reading changes nothing
    assert path.read_bytes() == whole + torn
    cut_torn_tail(path)
    assert path.read_bytes() == whole
    assert f"warning: {path}: cut a torn last line (50 bytes" in capsys.readouterr().err
    # a whole record whose newline the crash took is kept, and ended
    path.write_bytes(whole + whole[:-1])
    cut_torn_tail(path)
    assert path.read_bytes() == whole + whole and not capsys.readouterr().err


@pytest.mark.slow
def test_eval_resume_cuts_a_torn_last_record_and_keeps_the_ones_before(tmp_path, capsys):
    out = tmp_path / "eval"
    argv = [*EVAL, "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    records = out / "frontier" / "episodes.jsonl"
    first, second = records.read_bytes().splitlines(keepends=True)
    torn = second[: len(second) // 2]
    records.write_bytes(first + torn)  # killed while writing the second record
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert f"{records}: cut a torn last line ({len(torn)} bytes" in printed.err
    assert _strict_json(printed.out)["episodes"] == 2
    data = records.read_bytes()
    assert data.startswith(first) and data.endswith(b"\n")
    assert [json.loads(line)["episode_id"] for line in data.splitlines()] == [json.loads(r)["episode_id"]
                                                                             for r in (first, second)]
    assert main(argv) == 0 and records.read_bytes() == data  # resumed: nothing left to run
    # a damaged line that is not the last is named, and nothing runs over it
    records.write_bytes(first + b"{}\n" + data[len(first):])
    assert main(argv) == 2
    assert f"{records}:2: not an episode record" in capsys.readouterr().err
    assert records.read_bytes() == first + b"{}\n" + data[len(first):]


@pytest.mark.parametrize("stored", ["[1, 2]", '"str"', "null", '{"overrides": ["sim.width=320"]}',
                                    '{"planner": "frontier", "inputs": []}', "{not json"])
def test_a_run_json_of_another_shape_is_named_and_left_alone(tmp_path, stored):
    from trajrag.agent.run_claims import RunSettingsError, claim_runs, run_settings

    (tmp_path / "frontier").mkdir()
    (tmp_path / "frontier" / "run.json").write_text(stored)
    with pytest.raises(RunSettingsError, match="run.json: not a run settings file"):
        with claim_runs(tmp_path, {"frontier": run_settings("frontier", config.settings([]))}):
            pass
    assert (tmp_path / "frontier" / "run.json").read_text() == stored


def test_a_run_that_finished_no_episode_is_claimed_again(tmp_path, capsys):
    """A failed eval (a bad path, a bad --set) leaves a run.json and no record: the corrected
    command must not be told its 0 episodes would mix."""
    from trajrag.agent.run_claims import RunSettingsError, claim_runs, run_settings

    failed, fixed = (run_settings("frontier", config.settings([o])) for o in ("retrieval.model_dir=/nonexist", "sim.width=320"))
    for settings in (failed, fixed):
        with claim_runs(tmp_path, {"frontier": settings}):
            pass
    assert json.loads((tmp_path / "frontier" / "run.json").read_text()) == fixed
    assert "finished no episode; claimed again" in capsys.readouterr().err
    (tmp_path / "frontier" / "episodes.jsonl").write_text(json.dumps(_record("0")) + "\n")
    with pytest.raises(RunSettingsError, match="its 1 finished episodes would mix"):
        with claim_runs(tmp_path, {"frontier": failed}):
            pass


# Two evaluations of one label: run.json settings that differ only in the simulator's width.
NARROW, WIDE = ("sim.width=160",), ("sim.width=320",)


def test_of_two_claimers_of_one_label_at_once_exactly_one_wins(tmp_path, monkeypatch, capsys):
    """The race of two `trajrag eval` on one --out and label, played out in one process: the
    second claimer comes while the first is between reading run.json and writing it (both see no
    run.json, or one whose run finished no episode, which may be claimed again)."""
    from trajrag.agent import run_claims
    from trajrag.agent.run_claims import RunClaimedError, claim_runs, run_settings

    first, second = run_settings("frontier", config.settings(NARROW)), run_settings("frontier", config.settings(WIDE))
    check, refused = run_claims._to_claim, []

    def checked_while_the_second_comes(run, wanted, alone=True):
        if not refused:
            with pytest.raises(RunClaimedError) as error:
                with claim_runs(tmp_path, {"frontier": second}):
                    pass
            refused.append(str(error.value))
        return check(run, wanted, alone)

    monkeypatch.setattr(run_claims, "_to_claim", checked_while_the_second_comes)
    with claim_runs(tmp_path, {"frontier": first}):
        assert json.loads((tmp_path / "frontier" / "run.json").read_text()) == first
        # once claimed, while its first episode is still walking (0 finished): refused all the same
        for settings in (first, second):
            with pytest.raises(RunClaimedError, match=f"pid {os.getpid()} on "):
                with claim_runs(tmp_path, {"frontier": settings}):
                    pass
    assert refused and f"{tmp_path / 'frontier'}: run 'frontier' is being walked by another process" in refused[0]
    assert json.loads((tmp_path / "frontier" / "run.json").read_text()) == first
    # released: the label's run finished no episode, so other settings claim it again
    monkeypatch.setattr(run_claims, "_to_claim", check)
    with claim_runs(tmp_path, {"frontier": second}):
        pass
    assert json.loads((tmp_path / "frontier" / "run.json").read_text()) == second
    assert "claimed again" in capsys.readouterr().err


def test_shards_of_one_evaluation_share_a_label_that_other_settings_cannot_take(tmp_path):
    from trajrag.agent.run_claims import RunClaimedError, claim_runs, run_settings

    first, second = run_settings("frontier", config.settings(NARROW)), run_settings("frontier", config.settings(WIDE))
    shard = [f"episodes.shard-{i}-of-3.jsonl" for i in range(3)]
    with claim_runs(tmp_path, {"frontier": first}, shard[0]), claim_runs(tmp_path, {"frontier": first}, shard[1]):
        with pytest.raises(RunClaimedError, match="walks it with other settings \\(sim.width: 160 -> 320"):
            with claim_runs(tmp_path, {"frontier": second}, shard[2]):
                pass
    assert json.loads((tmp_path / "frontier" / "run.json").read_text()) == first


CLAIMER = """
import sys
from pathlib import Path
from trajrag import config
from trajrag.agent.run_claims import claim_runs, run_settings
with claim_runs(Path(sys.argv[1]), {"frontier": run_settings("frontier", config.settings(["sim.width=160"]))}):
    print("claimed", flush=True)
    sys.stdin.read()  # holds the label until killed
"""


@pytest.mark.slow
def test_a_claim_of_a_killed_eval_is_stale_and_a_rerun_takes_the_label(tmp_path):
    """A process killed mid-run leaves its lock files, with its pid, behind: they hold nothing."""
    import signal
    import subprocess
    import sys

    import trajrag
    from trajrag.agent.run_claims import RunClaimedError, claim_runs, run_settings

    env = {**os.environ, "PYTHONPATH": str(Path(trajrag.__file__).parents[1])}
    other = subprocess.Popen([sys.executable, "-c", CLAIMER, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert other.stdout.readline().strip() == "claimed"
        with pytest.raises(RunClaimedError, match=f"pid {other.pid} on "):
            with claim_runs(tmp_path, {"frontier": run_settings("frontier", config.settings(NARROW))}):
                pass
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait(timeout=30)
    assert f"pid {other.pid} on " in (tmp_path / "frontier" / "episodes.jsonl.lock").read_text()
    with claim_runs(tmp_path, {"frontier": run_settings("frontier", config.settings(WIDE))}):  # its run finished no episode
        assert (tmp_path / "frontier" / "episodes.jsonl.lock").read_text().startswith(f"pid {os.getpid()} on ")
    assert json.loads((tmp_path / "frontier" / "run.json").read_text()) == run_settings("frontier", config.settings(WIDE))


@pytest.mark.parametrize("args,needle", [
    (["--scenes", "procedural:vla:1"], "unknown split"),
    (["--set", "sim.width=abc"], "sim.yaml"),
    (["--shard", "3/2"], "need 0 <= I < N"),
])
def test_a_bad_eval_input_leaves_no_folder_behind(tmp_path, args, needle, capsys):
    out = tmp_path / "eval"
    assert main([*EVAL, "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("variant,needle", [
    ("[retreival.coarse=false]", "no config section 'retreival'"),  # a section no command would load
    ("[retrieval.corse=false]", "did you mean retrieval.coarse"),
    ("[retrieval.coarse=maybe]", "retrieval.yaml"),
    ("[coarse]", "expected SECTION.KEY=VALUE"),
])
def test_a_bad_override_of_a_variant_is_named_with_the_variant_before_any_folder(tmp_path, variant, needle,
                                                                                   capsys):
    out = tmp_path / "eval"
    assert main([*EVAL, "--planner", "trajrag", "--store", str(tmp_path / "memory"), "--variant", "full,typo",
                 "--out", str(out), "--set", f"eval.variants.typo={variant}"]) == 2
    err = capsys.readouterr().err
    assert "error: variant 'typo' (eval.variants.typo): override " in err and needle in err, err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_a_bad_value_model_is_named_before_the_run_is_claimed(tmp_path, capsys):
    model = tmp_path / "value.json"
    model.write_text('{"format": "something else"}')
    out = tmp_path / "eval"
    assert main([*EVAL, "--planner", "value", "--out", str(out), "--set", f"scoring.value_model={model}"]) == 2
    assert str(model) in capsys.readouterr().err
    assert not out.exists()


def test_a_damaged_summary_of_another_run_is_named_and_left_out_of_the_table(tmp_path, capsys):
    from trajrag.cli.eval import _all_runs

    for label, text in (("frontier", '{"episodes": 2, "sr": 1.0}'), ("torn", '{"episodes": 2, "s'),
                        ("listed", "[1, 2]")):
        (tmp_path / label).mkdir()
        (tmp_path / label / "summary.json").write_text(text)
    assert _all_runs(tmp_path) == {"frontier": {"episodes": 2, "sr": 1.0}}
    err = capsys.readouterr().err
    assert f"{tmp_path / 'torn' / 'summary.json'}: not a run summary" in err
    assert f"{tmp_path / 'listed' / 'summary.json'}: not a run summary (expected a JSON object, got list)" in err


def test_summaries_are_strict_json_written_in_one_rename(tmp_path):
    from trajrag.agent.run_records import write_json
    from trajrag.distributed.evaluate import records_summary

    summary = records_summary([])  # the means over no episode are NaN
    assert math.isnan(summary["sr"])
    write_json(tmp_path / "summary.json", summary)
    assert _strict_json((tmp_path / "summary.json").read_text())["sr"] is None
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary file left


def test_planner_counters_report_the_llm_parse_failures():
    from trajrag.agent.run_records import planner_counters

    llm = [{"planner_stats": {"fallbacks": 1, "parse_failures": n, "retrieval_ms": []}} for n in (2, 3)]
    assert planner_counters(llm)["parse_failures"] == 5 and planner_counters(llm)["fallbacks"] == 2
    assert planner_counters([{"planner_stats": {"fallbacks": 0}}])["parse_failures"] is None  # asks no LLM


def test_pending_episodes_of_the_ray_job_name_a_bad_record(tmp_path):
    from trajrag.agent.run_records import RecordsError
    from trajrag.distributed.evaluate import pending_episodes

    (tmp_path / "frontier").mkdir()
    (tmp_path / "frontier" / "episodes.shard-0-of-2.jsonl").write_text("null\n" + json.dumps(_record("0")) + "\n")
    with pytest.raises(RecordsError, match=r"episodes.shard-0-of-2.jsonl:1: "):
        pending_episodes("frontier", [], tmp_path)


@pytest.mark.slow
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
    assert "--quick: 100 steps" in bench and "read by the scale, experience, store and build benches only" in bench
    build = " ".join(help_of("corpus", "build").split())
    assert "default: mix" in build and "distributed/corpus.py); default: 0" in build
    assert "no Ray); default: 0" in " ".join(help_of("value", "fit").split())
    assert "purity" in help_of("corpus", "stats")
    assert f"run.scenes = {config.load('run').scenes}" in " ".join(help_of("run").split())


def test_progress_shows_on_a_terminal_even_with_json_and_never_in_a_log(monkeypatch, capsys):
    """`--json` keeps stdout one JSON object; the progress bar goes to stderr when someone watches it
    (a terminal), not into a log file or a pipe."""
    argv = ["episodes", "check", "--scenes", "procedural:val:1", "--episodes", "generated:1", "--json"]
    assert main(argv) == 0
    logged = capsys.readouterr()
    assert json.loads(logged.out)["episodes"] == 1 and "goal mapping" not in logged.err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(argv) == 0
    watched = capsys.readouterr()
    assert json.loads(watched.out) == json.loads(logged.out) and "goal mapping" in watched.err
