"""The frontier value: learned from past decisions, it ranks frontiers by what they look out on."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trajrag import config
from trajrag.cli import main
from trajrag.memory.value_log import ValueLog
from trajrag.planners.frontier_value import (
    FrontierValueModel,
    ValueDecision,
    feature_names,
    fit_value_model,
    load_decisions,
    ranking_quality,
    save_decisions,
    save_experience,
)

VOCABULARY = ["toilet", "bed", "sink", "wardrobe"]
GOALS = ["toilet", "bed"]
FAST_SIM = ["sim.width=160", "sim.height=120"]


def _decisions(n: int, seed: int) -> list[ValueDecision]:
    """Decisions whose best frontier is the one near the goal's room-mate (sink for a toilet,
    wardrobe for a bed), not the nearest one: what nearest frontier cannot know."""
    rng = np.random.default_rng(seed)
    mate = {"toilet": "sink", "bed": "wardrobe"}
    names = feature_names(VOCABULARY, GOALS)
    out = []
    for i in range(n):
        goal = GOALS[i % 2]
        k = int(rng.integers(2, 5))
        x = np.zeros((k, len(names)))
        x[:, 0] = rng.uniform(1.0, 8.0, size=k)  # distance_m
        x[:, 1:6] = rng.uniform(0.0, 1.0, size=(k, 5))
        best = int(rng.integers(k))
        for j in range(k):  # every candidate sees some object; only the best sees the goal's mate
            seen = mate[goal] if j == best else str(rng.choice(["sink", "wardrobe"] if j % 2 else ["bed"]))
            if seen == mate[goal] and j != best:
                seen = "bed"
            col = VOCABULARY.index(seen)
            x[j, 6 + col] = 1.0
            x[j, 6 + len(VOCABULARY) * (1 + GOALS.index(goal)) + col] = 1.0
        cost = x[:, 0] + 10.0
        cost[best] = x[best, 0]
        out.append(ValueDecision(scene=f"home{i % 5}", goal=goal, features=x, cost_m=cost))
    return out


def _fit(decisions):
    return fit_value_model(decisions, VOCABULARY, GOALS, config.load("value"))


@pytest.mark.slow
def test_the_value_learns_which_object_leads_to_which_goal_and_beats_nearest_frontier():
    model = _fit(_decisions(300, seed=0))
    held_out = _decisions(200, seed=1)
    value = ranking_quality(held_out, lambda x, goal: model.score(x), tolerance_m=0.25)
    nearest = ranking_quality(held_out, lambda x, goal: -x[:, 0], tolerance_m=0.25)
    assert value["best_rate"] > 0.9 and value["best_rate"] > nearest["best_rate"] + 0.3
    assert value["regret_m"] < nearest["regret_m"]
    w = dict(zip(model.feature_names, model.weights))
    # a sink means "toilet beyond" only when looking for a toilet
    assert w["near:sink|goal:toilet"] > 0 and w["near:sink|goal:toilet"] > w["near:sink|goal:bed"]
    assert model.per_metre >= 0.0


def test_a_saved_model_scores_the_same_and_a_damaged_one_is_named(tmp_path):
    model = _fit(_decisions(60, seed=2))
    path = tmp_path / "value.json"
    model.save(path)
    loaded = FrontierValueModel.load(path)
    x = _decisions(3, seed=3)[0].features
    np.testing.assert_allclose(loaded.score(x), model.score(x))
    payload = json.loads(path.read_text())
    payload["weights"] = payload["weights"][:-1]
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="corrupted frontier value model"):
        FrontierValueModel.load(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a frontier value model"):
        FrontierValueModel.load(path)
    with pytest.raises(ValueError, match="fit it again"):
        model.check_vocabulary(["chair", *VOCABULARY])


@pytest.mark.parametrize("field, value", [("scale", 0.0), ("scale", float("nan")), ("scale", float("inf")),
                                          ("scale", -1.0), ("mean", float("nan")), ("mean", float("-inf"))])
def test_a_model_whose_standardisation_would_make_every_score_nan_is_named(tmp_path, field, value):
    path = tmp_path / "value.json"
    _fit(_decisions(40, seed=2)).save(path)
    payload = json.loads(path.read_text())
    payload[field][3] = value
    path.write_text(json.dumps(payload))  # json writes NaN / Infinity, and reads them back
    with pytest.raises(ValueError, match=rf"value\.json: .*field '{field}'"):
        FrontierValueModel.load(path)


def test_kept_decisions_read_back_the_same_and_a_damaged_file_is_named(tmp_path):
    kept = _decisions(20, seed=4)
    kept[0].cost_m[1] = np.inf  # no known way to the goal survives the round trip
    path = tmp_path / "decisions.npz"
    save_decisions(path, kept, VOCABULARY, GOALS)
    decisions, vocabulary, goals = load_decisions(path)
    assert (vocabulary, goals) == (VOCABULARY, GOALS) and len(decisions) == len(kept)
    for a, b in zip(decisions, kept):
        assert (a.scene, a.goal) == (b.scene, b.goal)
        np.testing.assert_array_equal(a.features, b.features)
        np.testing.assert_array_equal(a.cost_m, b.cost_m)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="decisions.npz: not a value decisions file"):
        load_decisions(path)


@pytest.mark.slow
def test_a_memory_with_a_damaged_walk_record_names_it_and_keeps_the_others(tmp_path, capsys):
    from trajrag.planners.frontier_value import decisions_to_bytes

    store = str(tmp_path / "memory")
    log = ValueLog(store)
    good = decisions_to_bytes(_decisions(20, seed=4), VOCABULARY, GOALS)
    assert log.append([("home/0/explore", good), ("home/1/explore", good[:100])]) == 2
    assert log.append([("home/0/explore", good)]) == 0  # an id already kept is skipped
    assert main(["value", "fit", "--store", store, "--out", str(tmp_path / "v.json")]) == 2
    assert "value_decisions[home/1/explore]: not a value decisions file" in capsys.readouterr().err
    assert sorted(tid for tid, _ in ValueLog(store).rows()) == ["home/0/explore", "home/1/explore"]  # nothing lost


def test_decisions_without_a_known_way_to_the_goal_teach_nothing_and_none_is_an_error():
    blind = ValueDecision(scene="a", goal="bed", features=np.zeros((2, len(feature_names(VOCABULARY, GOALS)))),
                          cost_m=np.array([np.inf, np.inf]))
    with pytest.raises(ValueError, match="collect more episodes"):
        _fit([blind])


@pytest.mark.slow
def test_a_value_walk_that_dies_keeps_the_scenes_it_walked_and_the_rerun_walks_only_the_rest(
        tmp_path, capsys, monkeypatch):
    """A rollout fit walks for hours: --save-decisions keeps each scene as it is walked
    (D.npz.parts/), a re-run walks only the scenes not kept, and one with other settings is
    refused rather than mixed in. Once all are in, D.npz is written and the parts go."""
    from trajrag.agent import value_data
    from trajrag.agent.value_parts import DecisionParts

    kept = tmp_path / "decisions.npz"
    walk = ["value", "fit", "--scenes", "procedural:train:2", "--episodes", "generated:1",
            "--out", str(tmp_path / "v.json"), "--save-decisions", str(kept), "--json",
            *[a for o in (*FAST_SIM, "episodes.max_steps=200") for a in ("--set", o)]]
    walked_scenes, dying_in = [], {"procedural/train/0001"}
    real_run = value_data.run_episode

    def walk_or_die(sim, agent, episode, scene, cfg=None):
        walked_scenes.append(scene.name)
        if scene.name in dying_in:
            raise RuntimeError("the node went away")
        return real_run(sim, agent, episode, scene, cfg=cfg)

    monkeypatch.setattr(value_data, "run_episode", walk_or_die)
    with pytest.raises(RuntimeError, match="the node went away"):
        main(walk)
    parts = DecisionParts(kept, {})
    assert not kept.exists() and parts.path("procedural/train/0000").exists()
    assert not parts.path("procedural/train/0001").exists()
    first, _, _ = load_decisions(parts.path("procedural/train/0000"))
    assert first and {d.scene for d in first} == {"procedural/train/0000"}

    # Other settings would mix two walks in one fit: refused, naming what differs; nothing lost.
    assert main([*walk, "--set", "episodes.max_steps=150"]) == 2
    err = capsys.readouterr().err
    assert "walked with other settings" in err and "episodes.max_steps=150" in err
    assert parts.path("procedural/train/0000").exists()
    # A folder that keeps no scene yet (its walk failed at once: a typo) takes the new settings.
    empty = DecisionParts(tmp_path / "other.npz", {"overrides": ["a typo"]})
    assert empty.open(["x"]) == set()
    assert DecisionParts(tmp_path / "other.npz", {"overrides": ["fixed"]}).open(["x"]) == set()

    walked_scenes.clear()
    dying_in.clear()
    assert main(walk) == 0
    assert walked_scenes == ["procedural/train/0001"]  # the first home was not walked again
    assert json.loads(capsys.readouterr().out)["scenes"] == 2
    decisions, _, _ = load_decisions(kept)
    assert [d.scene for d in decisions[:len(first)]] == [d.scene for d in first]
    for a, b in zip(first, decisions):
        np.testing.assert_array_equal(a.features, b.features)
    assert {d.scene for d in decisions} == {"procedural/train/0000", "procedural/train/0001"}
    assert not parts.folder.exists()


@pytest.mark.slow
def test_a_scene_that_fails_on_ray_is_named_after_the_others_are_handed_on(ray_session):
    """One Ray task per scene: a scene whose walk raises must not take the finished ones with it."""
    import dataclasses

    from trajrag.agent.value_parts import ValueWalkError
    from trajrag.distributed.value_decisions import collect_value_decisions_ray
    from trajrag.world.datasets import load_episodes, load_scenes

    settings = config.settings([*FAST_SIM, "episodes.max_steps=100"])
    scenes = load_scenes("procedural:train:2", settings)
    episodes = load_episodes("generated:1", scenes, settings)
    broken = [e if e.scene_key == scenes[0].name else dataclasses.replace(e, start_position=[-50.0, 0.0, -50.0])
              for e in episodes]
    handed_on = []
    with pytest.raises(ValueWalkError, match=r"1 of 2 scenes failed \(procedural/train/0001: .*traversable"):
        collect_value_decisions_ray(scenes, broken, settings, progress=False, on_scene=lambda name, found, vocabulary: handed_on.append(name))
    assert handed_on == [scenes[0].name]


@pytest.mark.slow
def test_value_fit_walks_train_homes_and_its_model_drives_the_planners(tmp_path, capsys, nav_memory, ray_session):
    out, kept = tmp_path / "value.json", tmp_path / "decisions.npz"
    walk = ["--scenes", "procedural:train:2", "--episodes", "generated:1",
            *[a for o in (*FAST_SIM, "episodes.max_steps=200") for a in ("--set", o)]]
    assert main(["value", "fit", *walk, "--out", str(out), "--save-decisions", str(kept), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # The same walks as Ray tasks (one per scene, on the running Ray): the same decisions, in order.
    assert main(["value", "fit", *walk, "--workers", "2", "--out", str(tmp_path / "ray.json"),
                 "--save-decisions", str(tmp_path / "ray.npz"), "--json"]) == 0
    capsys.readouterr()
    (walked, vocabulary, _), (on_ray, ray_vocabulary, _) = load_decisions(kept), load_decisions(tmp_path / "ray.npz")
    assert ray_vocabulary == vocabulary and [d.scene for d in on_ray] == [d.scene for d in walked]
    for a, b in zip(walked, on_ray, strict=True):
        np.testing.assert_array_equal(a.features, b.features)
        np.testing.assert_array_equal(a.cost_m, b.cost_m)
    assert report["decisions"] > 5 and report["held_out_scenes"] == ["procedural/train/0001"]
    assert set(report["held_out"]) == {"value", "value_and_experience", "nearest_frontier"}
    assert 0.0 <= report["held_out"]["value"]["best_rate"] <= 1.0
    model = FrontierValueModel.load(out)
    assert model.goals == list(config.load("episodes").goal_categories)
    # Refitted from the kept decisions, without walking: the same model.
    assert main(["value", "fit", "--decisions", str(kept), "--out", str(tmp_path / "again.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["held_out"] == report["held_out"]
    np.testing.assert_allclose(FrontierValueModel.load(tmp_path / "again.json").weights, model.weights)
    assert main(["value", "fit", "--decisions", str(kept), "--scenes", "procedural:train:2", "--out", "x.json"]) == 2
    assert "needs either --scenes and --episodes" in capsys.readouterr().err

    # Walked by a value planner instead (value.walker=value, DAgger): the decisions recorded are
    # where that planner's choices lead. A model that prefers the farthest frontier leaves nearest
    # frontier's walks at its first choice among two or more.
    far = FrontierValueModel.load(out)
    far.weights = np.zeros_like(far.weights)
    far.weights[far.feature_names.index("distance_m")] = 10.0
    far.save(tmp_path / "far.json")
    walker = ["--set", "value.walker=value", "--set", f"scoring.value_model={tmp_path / 'far.json'}",
              "--set", "scoring.w_experience=0"]
    assert main(["value", "fit", *walk, *walker, "--out", str(tmp_path / "dagger.json"),
                 "--save-decisions", str(tmp_path / "dagger.npz"), "--json"]) == 0
    capsys.readouterr()
    by_far, _, _ = load_decisions(tmp_path / "dagger.npz")
    assert by_far and any(len(a.cost_m) != len(b.cost_m) or not np.array_equal(a.features, b.features)
                          for a, b in zip(walked, by_far))
    assert main(["value", "fit", *walk, "--set", "value.walker=value", "--out", str(tmp_path / "x.json")]) == 2
    assert "scoring.value_model" in capsys.readouterr().err
    assert main(["value", "fit", *walk, "--set", "value.walker=oracle", "--out", str(tmp_path / "x.json")]) == 2
    assert "value.walker must be one of" in capsys.readouterr().err

    store, encoder = nav_memory
    common = ["--scenes", "procedural:val:1", "--episodes", "generated:1", "--out", str(tmp_path / "eval"), "--json",
              "--store", store, "--model", encoder, *[a for o in (*FAST_SIM, "episodes.max_steps=200") for a in ("--set", o)],
              "--set", f"scoring.value_model={out}"]
    assert main(["eval", "--planner", "value,trajrag", "--audit-decisions", *common]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert runs["value"]["episodes"] == runs["trajrag"]["episodes"] == 1
    records = [json.loads(line) for line in (tmp_path / "eval" / "trajrag" / "episodes.jsonl").open()]
    assert all({"value", "experience"} <= set(d["terms"]) for r in records for d in r["decisions"])  # in the score


@pytest.mark.slow
def test_a_corpus_keeps_its_exploration_walks_decisions_once_and_the_value_fits_on_them(tmp_path, capsys):
    store = str(tmp_path / "memory")
    small = [a for o in (*FAST_SIM, "episodes.max_steps=120") for a in ("--set", o)]
    build = ["corpus", "build", "--scenes", "procedural:train:2", "--episodes-per-scene", "1", "--json", *small]
    assert main([*build, "--policy", "explore", "--store", store]) == 0
    assert json.loads(capsys.readouterr().out)["walks_with_value_decisions"] == 2
    assert main([*build, "--policy", "explore", "--store", store]) == 0  # a rerun stores nothing twice
    assert json.loads(capsys.readouterr().out)["walks_with_value_decisions"] == 2
    assert main(["value", "fit", "--store", store, "--out", str(tmp_path / "value.json"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["walks"] == 2 and report["decisions"] > 2 and report["scenes"] == 2
    # Kept decisions files and memories fit together: one walk's record (plain .npz) adds its decisions.
    _, walk = next(ValueLog(store).rows())
    (tmp_path / "walk.npz").write_bytes(walk)
    assert main(["value", "fit", "--store", store, "--decisions", str(tmp_path / "walk.npz"),
                 "--out", str(tmp_path / "both.json"), "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert both["decisions"] == report["decisions"] + len(load_decisions(tmp_path / "walk.npz")[0])
    # Oracle walks make no frontier decisions: nothing to fit on, and the error says what to do.
    oracle = str(tmp_path / "oracle")
    assert main([*build, "--policy", "oracle", "--store", oracle]) == 0
    capsys.readouterr()
    assert main(["value", "fit", "--store", oracle, "--out", str(tmp_path / "x.json")]) == 2
    assert "keeps no exploration walks' decisions" in capsys.readouterr().err


def test_the_value_planner_without_a_model_says_how_to_make_one(tmp_path, capsys):
    code = main(["eval", "--planner", "value", "--scenes", "procedural:val:1", "--episodes", "generated:1",
                 "--out", str(tmp_path), "--json"])
    assert code == 2 and "trajrag value fit" in capsys.readouterr().err


def test_retrieved_experience_penalises_candidates_like_those_that_fell_behind(tmp_path):
    from trajrag.planners.scoring import ScoringPlanner
    from trajrag.retrieval.experience import ExperienceError, ExperienceIndex, experience_path

    model = _fit(_decisions(300, seed=0))
    path = tmp_path / "value.json"
    model.save(path)
    assert save_experience(model, _decisions(300, seed=5), path) > 300
    model.experience = ExperienceIndex(experience_path(path), len(model.feature_names), k=16)
    held_out = _decisions(100, seed=6)
    queried = ExperienceIndex(experience_path(path), len(model.feature_names), k=16, in_memory=False)
    for d in held_out[:10]:  # the copy in memory and the LanceDB query find the same past candidates
        vectors = model.standardise(d.features)
        np.testing.assert_allclose(model.experience.advantage(vectors, d.goal), queried.advantage(vectors, d.goal),
                                   atol=1e-4)
    # the retrieved past candidates of the best frontier were behind less than those of the others
    wins = [int(np.argmin(model.experience_advantage(d.features, d.goal))) == int(np.argmin(d.cost_m))
            for d in held_out]
    assert np.mean(wins) > 0.8
    assert not model.experience_advantage(held_out[0].features, "sofa").any()  # a goal never walked: no penalty
    with pytest.raises(ExperienceError, match="another model"):
        ExperienceIndex(experience_path(path), len(model.feature_names) + 1, k=16)
    with pytest.raises(ExperienceError, match="trajrag value fit"):
        ExperienceIndex(tmp_path / "nothing.experience", len(model.feature_names), k=16)
    model.experience = None  # a model file without its table, while the experience weight is on
    with pytest.raises(ExperienceError, match="w_experience=0"):
        ScoringPlanner(None, config.load("scoring"), model)


def test_a_model_copied_without_its_experience_or_with_a_damaged_one_is_one_line(tmp_path, capsys):
    from trajrag.retrieval.experience import ExperienceError, ExperienceIndex, experience_path

    vocabulary, goals = config.load("navigator").vocabulary, config.load("episodes").goal_categories
    names = feature_names(vocabulary, goals)
    path = tmp_path / "value.json"
    FrontierValueModel(vocabulary, goals, names, np.zeros(len(names)), np.ones(len(names)), np.zeros(len(names)),
                       config.load("value"), {}).save(path)  # the file alone, as if copied without value.experience/
    code = main(["eval", "--planner", "value", "--scenes", "procedural:val:1", "--episodes", "generated:1",
                 "--out", str(tmp_path / "eval"), "--json", "--set", f"scoring.value_model={path}"])
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the run's headline
    assert code == 2 and err.startswith("trajrag eval: error: ") and "Traceback" not in err
    assert f"{experience_path(path)}: no experience table beside" in err and not experience_path(path).exists()

    model = _fit(_decisions(60, seed=0))
    model.save(path)
    save_experience(model, _decisions(60, seed=5), path)
    for data in (experience_path(path) / "frontier_candidates.lance" / "data").glob("*.lance"):
        data.write_bytes(data.read_bytes()[:100])  # truncated
    for in_memory in (True, False):
        with pytest.raises(ExperienceError, match=r"value\.experience: the frontier experience table cannot be read"):
            index = ExperienceIndex(experience_path(path), len(model.feature_names), k=4, in_memory=in_memory)
            index.advantage(model.standardise(_decisions(1, seed=1)[0].features), "toilet")


def test_experience_held_in_memory_finds_what_the_lancedb_query_finds(capsys):
    assert main(["bench", "experience", "--chunks", "3000", "--json", "--set", "experience_bench.decisions=20",
                 "--set", "experience_bench.warmup=2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["experience_rows"] == 3000 and out["decisions"] == 20 and out["k"] == config.load("scoring").experience_k
    # Both searches are exact: the same neighbours, bar a float32 near-tie swapping one at the k-th place.
    assert out["agreement"] >= 0.95 and out["max_difference_m"] <= config.load("value").experience_cap_m / out["k"]
    assert out["experience_ms_p50"] > 0 and out["lancedb_ms_p50"] > 0 and out["speedup_p50"] > 0


@pytest.mark.slow
def test_a_few_decisions_refine_a_prior_model_instead_of_replacing_it(tmp_path):
    """value.prior_model: a few hundred costly (rollout) decisions adjust a value fitted on many
    cheap ones; fitted from nothing on so few, the value would forget what the many taught."""
    from dataclasses import replace

    from trajrag.planners.frontier_value import ValueModelError

    prior = _fit(_decisions(300, seed=0))
    prior.save(tmp_path / "prior.json")
    # a few decisions, all looking for a toilet: alone they teach nothing about beds
    few, held_out = [d for d in _decisions(12, seed=4) if d.goal == "toilet"], _decisions(200, seed=1)
    with_prior = replace(config.load("value"), prior_model=str(tmp_path / "prior.json"))
    refined = fit_value_model(few, VOCABULARY, GOALS, with_prior)
    np.testing.assert_array_equal(refined.mean, prior.mean)  # the prior's standardisation, so its weights mean the same
    scratch = _fit(few)
    best = {name: ranking_quality(held_out, lambda x, goal, m=m: m.score(x), tolerance_m=0.25)["best_rate"]
            for name, m in (("prior", prior), ("refined", refined), ("scratch", scratch))}
    assert best["refined"] >= best["prior"] - 0.02 and best["refined"] > best["scratch"] + 0.1
    assert refined.config.prior_model == str(tmp_path / "prior.json")  # the file says where it came from

    with pytest.raises(ValueModelError, match="prior_model .* other features"):
        fit_value_model(few, [*VOCABULARY, "chair"], GOALS, with_prior)


def _rare_jackpots(n: int, seed: int) -> list[ValueDecision]:
    """Two candidates a decision, alike but for a long frontier (``log_frontier_length_m`` 1):
    it is 2 m worse in four decisions of five and 30 m better in the fifth."""
    rng = np.random.default_rng(seed)
    names = feature_names(VOCABULARY, GOALS)
    out = []
    for i in range(n):
        x = np.zeros((2, len(names)))
        x[:, 0] = 4.0
        x[1, 1] = 1.0
        jackpot = rng.random() < 0.2
        cost = np.array([40.0, 10.0]) if jackpot else np.array([10.0, 12.0])
        out.append(ValueDecision(scene=f"home{i % 5}", goal=GOALS[i % 2], features=x, cost_m=cost))
    return out


def test_the_expected_regret_fit_weighs_how_far_behind_a_choice_falls_not_only_how_often():
    """value.loss: the logit fit learns that the long frontier is usually not the best (its soft
    target barely tells 2 m from 30 m) and loses 30 m where it was; the expected-regret fit
    takes it, 2 m behind four times in five, and falls behind less on decisions it never saw."""
    from dataclasses import replace

    training, held_out = _rare_jackpots(400, seed=0), _rare_jackpots(400, seed=1)
    logit = _fit(training)
    regret = fit_value_model(training, VOCABULARY, GOALS, replace(config.load("value"), loss="expected_regret"))
    quality = {name: ranking_quality(held_out, lambda x, goal, m=m: m.score(x), tolerance_m=0.25)
               for name, m in (("logit", logit), ("regret", regret))}
    assert quality["logit"]["regret_m"] > 4.0 and quality["regret"]["regret_m"] < 2.5
    assert regret.config.loss == "expected_regret"  # the file says how it was fitted


def test_a_geometry_value_leaves_every_object_column_at_zero_and_still_prices_distance():
    from dataclasses import replace

    from trajrag.planners.frontier_value import GEOMETRY_FEATURES

    geometry = fit_value_model(_decisions(300, seed=0), VOCABULARY, GOALS,
                               replace(config.load("value"), features="geometry"))
    assert not geometry.weights[len(GEOMETRY_FEATURES):].any()
    assert geometry.per_metre > 0  # the costs grow with distance: nearer is better, all else alike
    with pytest.raises(ValueError, match="value.features must be one of"):
        replace(config.load("value"), features="objects")
