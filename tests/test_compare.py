"""`trajrag compare`: runs paired episode by episode inside each eval folder, pooled over folders."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trajrag import config
from trajrag.agent.paired import compare_runs
from trajrag.cli import main


def write_run(folder, label, outcomes):
    """Episode records as `trajrag eval` writes them: {episode id: (success, spl)}."""
    (folder / label).mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"scene_key": "home", "episode_id": eid, "metrics": {"success": ok, "spl": spl}})
             for eid, (ok, spl) in outcomes.items()]
    (folder / label / "episodes.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture
def two_seeds(tmp_path):
    """Two folders (two episode seeds) that reuse the same episode ids for different episodes."""
    seed0, seed1 = tmp_path / "O0", tmp_path / "O1"
    write_run(seed0, "frontier", {"0": (True, 0.4), "1": (False, 0.0)})
    write_run(seed0, "trajrag", {"0": (True, 0.6), "1": (True, 0.5)})
    write_run(seed1, "frontier", {"0": (True, 0.8), "1": (True, 0.2)})
    write_run(seed1, "trajrag", {"0": (True, 0.7), "1": (True, 0.3), "2": (True, 1.0)})  # 2: no baseline
    return seed0, seed1


def test_pairs_inside_each_folder_and_pools_the_pairs(two_seeds):
    (result,) = compare_runs(two_seeds, "frontier")
    assert result.run == "trajrag" and result.episodes == 4  # episode 2 has nothing to pair with
    # per-episode SPL differences: +0.2, +0.5 (seed 0); -0.1, +0.1 (seed 1)
    assert result.d_spl == pytest.approx(0.7 / 4)
    assert result.d_sr == pytest.approx(0.25)
    assert result.spl == pytest.approx(2.1 / 4) and result.baseline_spl == pytest.approx(1.4 / 4)
    low, high = result.d_spl_interval
    assert -0.1 <= low <= result.d_spl <= high <= 0.5
    assert [(f["episodes"], round(f["d_spl"], 6)) for f in result.folders] == [(2, 0.35), (2, 0.0)]


def test_the_interval_does_not_depend_on_the_order_of_the_folders(tmp_path):
    rng = np.random.default_rng(0)
    folders = [tmp_path / f"O{seed}" for seed in range(3)]
    for folder in folders:
        for label in ("frontier", "trajrag"):
            write_run(folder, label, {str(i): (bool(spl), float(spl)) for i, spl in enumerate(rng.random(20))})
    forward, backward = (compare_runs(order, "frontier")[0] for order in (folders, folders[::-1]))
    assert forward.d_spl_interval == backward.d_spl_interval
    assert forward.d_sr_interval == backward.d_sr_interval
    assert [f["folder"] for f in backward.folders] == list(map(str, folders[::-1]))  # as given


def test_cli_prints_json_and_a_table(two_seeds, capsys):
    assert main(["compare", *map(str, two_seeds), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["baseline"] == "frontier"
    assert out["runs"][0]["episodes"] == 4 and out["runs"][0]["d_sr"] == pytest.approx(0.25)
    assert main(["compare", *map(str, two_seeds), "--runs", "trajrag"]) == 0
    table = capsys.readouterr().out
    assert "| trajrag | 4 |" in table and "+25.0 [" in table and "+17.5 [" in table


@pytest.mark.parametrize("args, needle", [
    (["--baseline", "oracle"], "no records of the baseline 'oracle'"),
    (["--runs", "llm"], "run 'llm' shares no finished episode with 'frontier'"),
])
def test_missing_runs_are_named_in_one_line(two_seeds, args, needle, capsys):
    assert main(["compare", *map(str, two_seeds), *args]) == 2
    assert needle in capsys.readouterr().err


def test_a_missing_folder_is_named(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nowhere")]) == 2
    assert "nowhere: no such evaluation folder" in capsys.readouterr().err


def test_the_results_table_of_one_folder_shows_the_same_paired_differences(two_seeds):
    from trajrag.agent.results_table import write_results_table

    seed0 = two_seeds[0]
    table = write_results_table({"frontier": {"episodes": 2}, "trajrag": {"episodes": 2}}, seed0)
    (result,) = compare_runs([seed0], "frontier", ["trajrag"])
    low, high = result.d_spl_interval
    assert "| trajrag | 2 | +0.500 [" in table and f"+0.350 [{low:+.3f}, {high:+.3f}]" in table


def test_runs_walked_in_another_world_are_flagged(two_seeds, capsys):
    """A run paired with a baseline walked at another resolution (or episode budget) compares
    worlds, not planners: the comparison says so, from the runs' run.json."""
    from trajrag.agent.run_claims import run_settings

    seed0, seed1 = two_seeds
    trajrag = {seed0: ["sim.width=320", "scoring.w_value=2"],
               seed1: ["sim.width=160", "scoring.w_value=2", "episodes.max_steps=100"]}
    for folder, overrides in trajrag.items():
        (folder / "frontier" / "run.json").write_text(json.dumps(run_settings("frontier", config.settings(["sim.width=320"]))))
        (folder / "trajrag" / "run.json").write_text(json.dumps(run_settings("trajrag", config.settings(overrides))))
    (result,) = compare_runs(two_seeds, "frontier")
    # planner settings (scoring) may differ; world settings (sim, episodes) may not
    assert result.warnings == [f"{seed1}: episodes.max_steps: 100 (trajrag) vs (default) (frontier)",
                               f"{seed1}: sim.width: 160 (trajrag) vs 320 (frontier)"]
    assert main(["compare", *map(str, two_seeds)]) == 0
    assert "warning: not walked in the same world" in capsys.readouterr().err

    # a baseline scored by an older trajrag (success inside the goal region only) is flagged too
    older = {**run_settings("frontier", config.settings(["sim.width=320"])), "format": "trajrag-eval-run/1"}
    (seed0 / "frontier" / "run.json").write_text(json.dumps(older))
    (result,) = compare_runs(two_seeds, "frontier")
    assert result.warnings[0] == (f"{seed0}: format: trajrag-eval-run/2 (trajrag) vs trajrag-eval-run/1 (frontier): "
                                  f"success scored differently")

    # so is a baseline walked before run.json existed; two such runs pair without a word
    (seed0 / "frontier" / "run.json").unlink()
    (result,) = compare_runs([seed0], "frontier")
    assert result.warnings[0].startswith(f"{seed0}: format: trajrag-eval-run/2 (trajrag) vs no run.json")
    (seed0 / "trajrag" / "run.json").unlink()
    assert compare_runs([seed0], "frontier")[0].warnings == []


def write_walks(folder, label, walks, scene):
    """Full episode records over a real ``scene``: {episode id: (success, spl, steps)}, each walk a
    short straight track between two traversable cells of the scene, looking for its first category."""
    (folder / label).mkdir(parents=True, exist_ok=True)
    cells = np.argwhere(scene.traversable)
    track = [list(scene.to_xy(cells[0])) + [0.0], list(scene.to_xy(cells[len(cells) // 2])) + [0.0]]
    goal = scene.present_categories()[0]
    lines = [json.dumps({"scene_key": scene.name, "episode_id": eid, "category": goal,
                         "outcome": "success" if ok else "step_budget_exhausted", "poses": track,
                         "metrics": {"success": ok, "spl": spl, "steps": steps}})
             for eid, (ok, spl, steps) in walks.items()]
    (folder / label / "episodes.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def home():
    from trajrag.world.datasets import load_scenes

    return load_scenes("procedural:train:1", config.settings())[0]


@pytest.fixture
def one_home_runs(tmp_path, home):
    """One folder: trajrag loses episodes 0 and 1 (1 the worse) and wins 2; 3 both succeed."""
    write_walks(tmp_path, "frontier", {"0": (True, 0.3, 80), "1": (True, 0.9, 40), "2": (False, 0.0, 500),
                                       "3": (True, 0.5, 60)}, home)
    write_walks(tmp_path, "trajrag", {"0": (False, 0.0, 500), "1": (False, 0.0, 500), "2": (True, 0.6, 90),
                                      "3": (True, 0.7, 50)}, home)
    return tmp_path


def test_lost_and_won_episodes_come_worst_first(one_home_runs):
    from trajrag.agent.paired import discordant_pairs

    lost, won = discordant_pairs([one_home_runs], "frontier", "trajrag")
    assert [p.run["episode_id"] for p in lost] == ["1", "0"]  # SPL lost: 0.9, then 0.3
    assert [p.run["episode_id"] for p in won] == ["2"] and won[0].d_spl == pytest.approx(0.6)


@pytest.mark.slow
def test_pictures_draw_the_lost_and_won_episodes_with_an_index(one_home_runs, home, tmp_path, capsys):
    """A researcher asks where a planner loses: --pictures draws those episodes, both walks."""
    out = tmp_path / "pics"
    assert main(["compare", str(one_home_runs), "--runs", "trajrag", "--pictures", str(out),
                 "--scenes", "procedural:train:1", "--pictures-per-kind", "1", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    folder = out / "trajrag-vs-frontier"
    assert printed["pictures"] == {"trajrag": str(folder / "index.md")}
    assert sorted(p.name for p in folder.glob("*.png")) == ["lost-01.png", "won-01.png"]  # one of each kind
    assert (folder / "lost-01.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    index = (folder / "index.md").read_text()
    assert "2 lost (only frontier succeeded), 1 won" in index
    assert "| [lost-01.png](lost-01.png) |" in index and "| 1 |" in index  # the worse loss, episode 1


def test_pictures_draw_each_run_in_the_world_it_walked(one_home_runs, home, tmp_path, monkeypatch):
    """A run walked with world settings (here another draw of the procedural homes) is drawn in that
    world, not in the one configs/*.yaml builds: its goals and walls as the agent met them."""
    from trajrag.agent import results_table
    from trajrag.agent.run_claims import run_settings
    from trajrag.world.datasets import load_scenes

    world = ["procedural.split_offsets.train=7"]
    for label in ("frontier", "trajrag"):
        settings = run_settings(label, config.settings(world))
        (one_home_runs / label / "run.json").write_text(json.dumps(settings))
    drawn = []
    monkeypatch.setattr(results_table, "render_pair_png", lambda scene, *args: drawn.append(scene))
    assert main(["compare", str(one_home_runs), "--runs", "trajrag", "--pictures", str(tmp_path / "pics"),
                 "--scenes", "procedural:train:1", "--json"]) == 0
    walked = load_scenes("procedural:train:1", config.settings(world))[0]
    assert walked.traversable.shape != home.traversable.shape or (walked.traversable != home.traversable).any()
    assert len(drawn) == 3 and all(np.array_equal(s.traversable, walked.traversable) for s in drawn)


@pytest.mark.parametrize("args, needle", [
    (["--pictures", "PICS"], "--pictures needs --scenes"),
    (["--pictures", "PICS", "--scenes", "procedural:train:1-2"], "which --scenes procedural:train:1-2 does not hold"),
])
def test_pictures_without_the_right_scenes_say_so(one_home_runs, tmp_path, args, needle, capsys):
    args = [str(tmp_path / "pics") if a == "PICS" else a for a in args]
    assert main(["compare", str(one_home_runs), "--runs", "trajrag", *args]) == 2
    assert needle in capsys.readouterr().err


def test_a_folder_with_only_the_baseline_is_named_with_the_runs_found(tmp_path, capsys):
    write_run(tmp_path, "frontier", {"0": (True, 0.4)})
    assert main(["compare", str(tmp_path), "--json"]) == 2
    err = capsys.readouterr().err
    assert f"no run to compare with the baseline 'frontier' in {tmp_path}" in err and "['frontier']" in err


@pytest.mark.parametrize("line, needle", [
    ('{"scene_key": "home", "episode_id": "1", "metrics": {"success": "yes", "spl": 0.5}}',
     'metrics.success must be true or false, got "yes"'),
    ('{"scene_key": "home", "episode_id": "1", "metrics": {"success": true, "spl": NaN}}',
     "metrics.spl must be a number from 0 to 1, got NaN"),
    ('{"scene_key": "home", "episode_id": "1", "metrics": {"success": true}}', "metrics lack spl"),
    ("123", "expected a JSON object, got 123"),
])
def test_a_bad_record_is_named_by_file_and_line(two_seeds, line, needle, capsys):
    path = two_seeds[1] / "trajrag" / "episodes.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], line, *lines[1:]]) + "\n")
    assert main(["compare", *map(str, two_seeds), "--json"]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: not an episode record: {needle}" in err and "Traceback" not in err


def test_help_shows_percent_signs_once(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "95% paired bootstrap intervals" in text and "%%" not in text


def test_the_results_table_names_a_run_with_a_bad_record_instead_of_dropping_its_pairs(two_seeds, capsys):
    from trajrag.agent.results_table import write_results_table

    seed0 = two_seeds[0]
    path = seed0 / "trajrag" / "episodes.jsonl"
    path.write_text("[]\n" + path.read_text())
    table = write_results_table({"frontier": {"episodes": 2}, "trajrag": {"episodes": 2}}, seed0)
    assert "| trajrag | 2 |" in table and "Paired differences" not in table  # the table, without pairs
    assert f"{path}:1: not an episode record" in capsys.readouterr().err
