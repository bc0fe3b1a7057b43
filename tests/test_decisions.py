"""The decision audit: each planner decision scored against the simulator's geodesic field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trajrag import config
from trajrag.agent.decisions import DecisionAudit, decision_quality
from trajrag.agent.evaluate import evaluate_agent
from trajrag.agent.registry import make_agent
from trajrag.world.datasets import load_episodes, load_scenes
from trajrag.world.episode_gen import scene_goal_field
from trajrag.world.sim import GridSimulator

OVERRIDES = ["sim.width=160", "sim.height=120", "episodes.max_steps=150"]  # a few decisions per walk
AUDIT = config.load("audit")


def _decision(chosen, to_frontier, to_goal, scores=None):
    return {"step": 0, "chosen": chosen, "to_frontier_m": to_frontier, "frontier_to_goal_m": to_goal,
            "scores": scores}


def test_a_planner_whose_score_points_at_the_goal_has_rho_one_and_no_regret():
    good = _decision(2, [1.0, 1.0, 1.0], [6.0, 4.0, 2.0], scores=[0.1, 0.5, 0.9])
    good["terms"] = {"hint": [0.0, 1.0, 2.0], "noise": [1.0, 0.0, 1.0], "wrong": [3.0, 2.0, 1.0]}
    q = decision_quality([[good]], tolerance_m=0.25)
    assert q["decision_score_rho"] == pytest.approx(1.0)
    assert q["decision_best_rate"] == 1.0 and q["decision_regret_m"] == 0.0
    # each term of a score on its own: which part points at the goal
    assert q["decision_term_rho"]["hint"] == pytest.approx(1.0) and q["decision_term_rho"]["wrong"] == pytest.approx(-1.0)
    assert abs(q["decision_term_rho"]["noise"]) < 0.6


def test_picking_away_from_the_goal_costs_the_difference_and_reverses_rho():
    bad = _decision(0, [1.0, 2.0, 3.0], [6.0, 4.0, 1.0], scores=[3.0, 2.0, 1.0])
    q = decision_quality([[bad]], tolerance_m=0.25)
    assert q["decision_score_rho"] == pytest.approx(-1.0)
    assert q["decision_regret_m"] == pytest.approx(7.0 - 4.0) and q["decision_best_rate"] == 0.0


def test_frontiers_without_a_field_value_and_scoreless_planners_are_handled():
    unknown = _decision(1, [1.0, 2.0], [None, 3.0])  # a random planner: no scores
    nothing = _decision(0, [1.0, 2.0], [None, None])
    q = decision_quality([[unknown, nothing]], tolerance_m=0.25)
    assert q["decisions_audited"] == 2
    assert q["decision_best_rate"] == 1.0  # the only candidate with a known way to the goal
    assert q["decision_score_rho"] is None and q["decision_score_rho_n"] == 0


@pytest.mark.slow
def test_a_frontier_on_the_goal_is_zero_metres_from_it_and_one_off_the_grid_is_unknown():
    scene = load_scenes("procedural:val:1", config.settings())[0]
    episode = load_episodes("generated:1", [scene], config.settings())[0]
    field = scene_goal_field(scene, episode.object_category, config.load("episodes"))
    audit = DecisionAudit(scene, field, AUDIT.search_radius_m)
    on_goal = scene.to_xy(np.argwhere(field.region)[:1])
    assert audit.to_goal(on_goal) == 0.0
    assert audit.to_goal(np.array([[-100.0, -100.0]])) is None


def _evaluate(name, agent, out, audit=AUDIT, overrides=()):
    """``agent`` (a registry name) on 2 episodes of one val home, into ``out/name``."""
    settings = config.settings(OVERRIDES)
    scenes = load_scenes("procedural:val:1", settings)
    return evaluate_agent(name, lambda: make_agent(agent, settings.with_overrides(overrides)),
                          GridSimulator(settings.sim), load_episodes("generated:2", scenes, config.settings()), scenes,
                          out, settings.episodes, progress=False, audit=audit)


@pytest.fixture(scope="module")
def audited_frontier(tmp_path_factory) -> tuple[dict, Path]:
    """Nearest frontier's audited evaluation (summary, records file), shared by the tests below."""
    out = tmp_path_factory.mktemp("audited")
    return _evaluate("frontier", "frontier", out), out / "frontier" / "episodes.jsonl"


@pytest.mark.slow
def test_an_audited_evaluation_records_every_decision_and_walks_exactly_as_without(audited_frontier, tmp_path):
    plain = _evaluate("frontier", "frontier", tmp_path / "plain", audit=None)
    audited, records_file = audited_frontier
    assert audited["spl"] == plain["spl"] and audited["planner_calls"] == plain["planner_calls"]
    assert "decision_best_rate" not in plain
    assert audited["decisions_audited"] == audited["planner_calls"] > 0
    assert 0.0 <= audited["decision_best_rate"] <= 1.0 and audited["decision_regret_m"] >= 0.0
    records = [json.loads(line) for line in records_file.open()]
    for record in records:
        assert len(record["decisions"]) == record["agent_stats"]["planner_calls"]
        for d in record["decisions"]:
            n = len(d["to_frontier_m"])
            assert len(d["frontier_to_goal_m"]) == len(d["scores"]) == n and 0 <= d["chosen"] < n
            assert int(np.argmax(d["scores"])) == d["chosen"]  # nearest frontier exposes its scores
            assert any(g is not None for g in d["frontier_to_goal_m"])


@pytest.mark.slow
def test_the_frontier_oracle_picks_every_best_frontier_and_at_p_zero_walks_as_nearest_frontier(
        audited_frontier, tmp_path):
    oracle = _evaluate("oracle-1", "frontier-oracle", tmp_path)
    assert oracle["decision_best_rate"] == 1.0 and oracle["decision_regret_m"] == 0.0
    assert oracle["decision_score_rho"] > 0.5  # its score is the (negated) cost to the goal
    nearest, _ = audited_frontier
    never = _evaluate("oracle-0", "frontier-oracle", tmp_path, overrides=["audit.oracle_follow_p=0"])
    assert never["spl"] == nearest["spl"] and never["planner_calls"] == nearest["planner_calls"]
    assert oracle["spl"] >= nearest["spl"]
    with pytest.raises(ValueError, match="oracle_follow_p"):
        make_agent("frontier-oracle", config.settings([*OVERRIDES, "audit.oracle_follow_p=1.5"]))


@pytest.mark.slow
def test_a_rerun_of_the_same_evaluation_walks_nothing_and_says_so(audited_frontier, tmp_path):
    """`trajrag run --set run.workers=0` reads these counts (it crashed on a summary without them)."""
    summary, records_file = audited_frontier
    assert (summary["evaluated"], summary["skipped_already_done"]) == (2, 0)
    again = _evaluate("frontier", "frontier", records_file.parent.parent)
    assert (again["evaluated"], again["skipped_already_done"]) == (0, 2)
    assert again["sr"] == summary["sr"] and again["spl"] == summary["spl"]
