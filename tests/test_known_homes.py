"""Known homes (issue 47): the revisit benchmark, implicit queries and global questions."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace

import numpy as np
import pytest

from trajrag import config
from trajrag.cli import main
from trajrag.queries import QueryError
from trajrag.queries.inventory import (
    Inventory,
    count_objects,
    scene_inventory,
    score_inventory,
    sector_sightings,
    summarize_scores,
)
from trajrag.revisit import RevisitError
from trajrag.revisit.agent import PerHomeAgent
from trajrag.revisit.walks import coincides, plan_walks
from trajrag.world.datasets import load_scenes
from trajrag.world.episode_gen import generate_episodes
from trajrag.world.geodesic import Motion
from trajrag.world.scene import Scene

MOTION = Motion.from_sim_config(config.load("sim"))  # the simulator's steps and turns
FAST = ["--set", "sim.width=160", "--set", "sim.height=120"]


@pytest.fixture(scope="module")
def homes():
    return load_scenes("procedural:val:2", config.settings())


# -- the earlier walks ------------------------------------------------------------------------------
def test_revisit_walks_never_coincide_with_the_evaluated_episodes(homes):
    cfg = config.load("episodes")
    evaluated = generate_episodes(homes, 2, cfg, seed=0, motion=MOTION)
    # an evaluated episode that is exactly the first walk the revisit seed draws must push it out
    first_walk = generate_episodes(homes[:1], 1, cfg, seed=4747, motion=MOTION)[0]
    evaluated.append(replace(first_walk, episode_id="planted"))
    plan = plan_walks(homes, evaluated, 2, 4747, 1, cfg, MOTION)
    assert sorted(plan) == sorted(h.name for h in homes)
    by_name = {h.name: h for h in homes}
    for home, walks in plan.items():
        assert len(walks) == 2 and all(w.scene_key == home for w in walks)
        assert not any(coincides(w, e, by_name[home]) for w in walks for e in evaluated)
        assert not {w.episode_id for w in walks} & {e.episode_id for e in evaluated}
    assert plan[homes[0].name][0].start_position != first_walk.start_position


def test_a_home_without_evaluated_episodes_gets_no_walks(homes):
    # an MP3D scan holding none of the goals has no episodes: it must not stop the benchmark
    evaluated = generate_episodes(homes[:1], 2, config.load("episodes"), seed=0, motion=MOTION)
    plan = plan_walks(homes, evaluated, 2, 4747, 1, config.load("episodes"), MOTION)
    assert sorted(plan) == [homes[0].name]


def test_revisit_walks_drawn_with_the_evaluated_seed_are_refused(homes):
    cfg = config.load("episodes")
    evaluated = generate_episodes(homes[:1], 2, cfg, seed=7, motion=MOTION)
    with pytest.raises(RevisitError, match="only 0 of 2 earlier walks could be drawn apart"):
        plan_walks(homes[:1], evaluated, 2, 7, 0, cfg, MOTION)


def test_a_per_home_agent_is_made_for_each_home_in_turn(homes):
    made = []

    class Stub:
        decision_observer = None

        def __init__(self, home):
            self.home, self.reset_with = home, []

        def reset(self, episode, scene):
            self.reset_with.append(episode)

    agent = PerHomeAgent(lambda home: made.append(Stub(home)) or made[-1])
    agent.decision_observer = "audit"
    episodes = generate_episodes(homes, 2, config.load("episodes"), seed=0, motion=MOTION)
    for episode in episodes:
        agent.reset(episode, next(h for h in homes if h.name == episode.scene_key))
    assert [m.home for m in made] == [h.name for h in homes]  # one agent per home, in episode order
    assert all(len(m.reset_with) == 2 and m.decision_observer == "audit" for m in made)
    assert agent.home == homes[-1].name  # attributes are the current home's agent's


# -- implicit queries -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def implicit():
    from trajrag.cli.known_homes import implicit_queries

    return implicit_queries(config.load("queries"), config.load("encoder").node,
                            config.load("episodes").goal_categories)


def test_every_need_of_the_query_table_resolves_to_its_category(implicit):
    table = config.load("queries").implicit
    assert set(table) == set(config.load("episodes").goal_categories)  # a need for every goal
    needs = [need for category in table.values() for need in category]
    resolved = implicit.resolver.resolve_many(needs)
    assert {need: category for need, (category, _) in zip(needs, resolved) if category != implicit.intended[need]} == {}
    assert [implicit.resolve(need) for need in needs] == resolved  # one at a time, as episodes ask


def test_needs_answered_in_advance_are_the_encoders_answers_and_pickle_without_it(implicit):
    answered = implicit.answered_in_advance()
    needs = list(implicit.intended)
    assert [answered.resolve(need) for need in needs] == [implicit.resolve(need) for need in needs]
    assert len(pickle.dumps(answered)) < 10_000  # what each evaluator is handed: no text encoder
    with pytest.raises(QueryError, match="unknown need"):
        answered.resolve("find me a fire hydrant")


def test_an_unknown_need_or_a_goal_without_needs_is_a_clear_error(implicit):
    with pytest.raises(QueryError, match="unknown need 'find me a fire hydrant': not in queries.implicit"):
        implicit.resolve("find me a fire hydrant")
    with pytest.raises(QueryError, match=r"no need for goal categories \['bathtub'\]"):
        implicit.check_categories(["bed", "bathtub"])


def test_an_implicit_agent_walks_to_the_resolved_category(implicit, homes):
    from trajrag.queries.implicit import ImplicitQueryAgent

    seen = []

    class Stub:
        def reset(self, episode, scene):
            seen.append(episode.object_category)

    episode = generate_episodes(homes[:1], 1, config.load("episodes"), seed=0, motion=MOTION)[0]
    agent = ImplicitQueryAgent(Stub(), implicit)
    agent.reset(episode, homes[0])
    extras = agent.episode_extras()["query"]
    assert extras["need"] in config.load("queries").implicit[episode.object_category]
    assert seen == [extras["resolved"]] == [episode.object_category]
    implicit.resolver._resolved[extras["need"]] = ("toilet", 0.0)  # a resolver that gets it wrong ...
    agent.reset(episode, homes[0])
    assert seen[-1] == "toilet"  # ... sends the agent after the wrong goal; the episode keeps its own


# -- global questions -------------------------------------------------------------------------------
def test_inventory_scores_against_a_hand_made_truth():
    truth = Inventory({"bed": 2, "chair": 4, "toilet": 1, "sofa": 1})
    answer = Inventory({"bed": 1, "chair": 4, "plant": 1})
    score = score_inventory(answer, truth, ["bed", "chair", "toilet"])
    assert score["precision"] == pytest.approx(2 / 3) and score["recall"] == pytest.approx(2 / 4)
    assert score["missed"] == ["sofa", "toilet"] and score["wrong"] == ["plant"]
    assert score["counts"]["bed"] == {"answer": 1, "truth": 2, "exact": False, "abs_error": 1}
    assert score["counts"]["chair"]["exact"] and score["counts"]["toilet"]["answer"] == 0
    summary = summarize_scores([score, score_inventory(truth, truth, ["bed", "chair", "toilet"])])
    assert summary["precision"] == pytest.approx((2 / 3 + 1) / 2) and summary["count_exact"] == pytest.approx(4 / 6)
    assert score_inventory(Inventory(), truth, [])["precision"] is None  # nothing answered


def test_scene_inventory_counts_instances_of_the_vocabulary():
    instances = np.zeros((6, 6), np.int32)
    instances[0, 0], instances[0, 5], instances[5, 5] = 1, 2, 3
    category_of = np.array([-1, 0, 0, 1], np.int16)
    scene = Scene("hand", ("bed", "vase"), np.ones((6, 6), bool), np.ones((6, 6), bool), instances,
                  category_of[instances], category_of)
    assert scene_inventory(scene, ["bed", "chair"]).counts == {"bed": 2}


def test_sightings_fall_along_the_sector_ray_and_cluster_into_objects():
    sectors = np.full((2, 12), -1)
    sectors[0, 0] = 4  # sector 0 points left of the reference heading: +y for yaw 0
    sectors[1, 3] = 4  # sector 3: a quarter turn on, -x
    points, labels = sector_sightings(np.array([[0.0, 0.0], [5.0, 0.0]]), sectors, 0.0, 0.75)
    assert labels.tolist() == [4, 4]
    assert np.allclose(points, [[0.0, 0.75], [4.25, 0.0]])
    assert count_objects(points, 1.5) == 2 and count_objects(points, 5.0) == 1 and count_objects(points[:0], 1.5) == 0


# -- trajrag eval --revisit, end to end -----------------------------------------------------------------
@pytest.fixture(scope="module")
def revisit_run(tmp_path_factory):
    """One tiny revisit evaluation: 2 procedural homes, 1 earlier (oracle) walk each, graphrag
    reading each home's memory and nearest frontier, with the global questions."""
    out = tmp_path_factory.mktemp("revisit") / "eval"
    argv = ["eval", "--scenes", "procedural:val:2", "--episodes", "generated:1", "--planner", "frontier,graphrag",
            "--revisit", "1", "--global-questions", "--out", str(out), "--json", *FAST,
            "--set", "revisit.policy=oracle"]
    assert main(argv) == 0
    return out, argv


@pytest.mark.slow
def test_eval_revisit_records_k_and_builds_one_memory_per_home(revisit_run, capsys):
    from trajrag.memory.store import CHUNKS, MemoryStore

    out, argv = revisit_run
    for run in ("frontier", "graphrag"):
        assert json.loads((out / run / "run.json").read_text())["overrides"]["revisit.walks"] == "1"
    for home in ("procedural/val/0000", "procedural/val/0001"):
        store = MemoryStore(str(out / "revisit" / home.replace("/", "__")), read_only=True)
        hints = store.read(CHUNKS, ["scene_hint", "trajectory_id"]).to_pylist()
        assert hints and all(row["scene_hint"] == home for row in hints)  # home A's memory: walks of A only
        assert all(":revisit:" in row["trajectory_id"] for row in hints)
    answers = json.loads((out / "revisit" / "global_questions.json").read_text())
    assert answers["summary"]["homes"] == 2 and answers["summary"]["precision"] is not None
    # a resume with another K is refused, naming the difference, and changes nothing
    capsys.readouterr()
    assert main([*argv[:argv.index("--revisit")], "--revisit", "2", *argv[argv.index("--revisit") + 2:]]) == 2
    assert "revisit.walks: 1 -> 2" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_revisit_and_implicit_queries_on_two_evaluators_walk_as_in_one_process(nav_memory, tmp_path):
    """``--revisit K --queries implicit --workers N``: each evaluator makes the known-homes agent
    and reads each home's memory itself (no Serve app), asks the needs resolved in the driver, and
    every episode walks step for step as in one process."""
    _store, model_dir = nav_memory
    argv = ["eval", "--scenes", "procedural:val:2", "--episodes", "generated:1", "--planner", "trajrag",
            "--revisit", "1", "--queries", "implicit", "--model", model_dir, "--json", *FAST,
            "--set", "revisit.policy=oracle"]
    assert main([*argv, "--out", str(tmp_path / "one")]) == 0
    assert main([*argv, "--out", str(tmp_path / "two"), "--workers", "2"]) == 0

    def walked(out, run):
        records = [json.loads(line) for line in (out / run / "episodes.jsonl").read_text().splitlines()]
        return sorted((r["scene_key"], r["episode_id"], r["actions"], r["outcome"], r.get("query")) for r in records)

    alone, spread = walked(tmp_path / "one", "trajrag-implicit"), walked(tmp_path / "two", "trajrag-implicit")
    assert len(alone) == 2 and spread == alone
    assert [query["kind"] for *_, query in spread] == ["implicit"] * 2
    summary = json.loads((tmp_path / "two" / "trajrag-implicit" / "summary.json").read_text())
    assert summary["planner_calls"] > 0  # the planner decided, reading the homes' memories


def test_revisit_on_shards_or_another_ray_is_refused_before_anything_is_written(tmp_path, capsys):
    base = ["eval", "--scenes", "procedural:val:2", "--episodes", "generated:1", "--planner", "frontier",
            "--out", str(tmp_path / "eval"), *FAST]
    assert main([*base, "--revisit", "1", "--shard", "0/2"]) == 2
    assert "evaluators elsewhere cannot read" in capsys.readouterr().err
    assert main([*base, "--revisit", "1", "--ray-address", "127.0.0.1:6379"]) == 2
    assert "without --shard/--ray-address" in capsys.readouterr().err
    assert not (tmp_path / "eval").exists()
