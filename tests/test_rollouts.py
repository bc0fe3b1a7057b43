"""Rollout costs for the frontier value: each candidate taken in turn, the walk replayed to its end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trajrag import config
from trajrag.agent.episode_runner import run_episode
from trajrag.agent.registry import make_frontier_agent
from trajrag.agent.rollouts import ForcedChoice, RolloutStats, metres_after, rollout_decisions
from trajrag.agent.value_data import ValueDecisionRecorder
from trajrag.cli import main
from trajrag.planners.frontier_value import load_decisions
from trajrag.world.datasets import load_episodes, load_scenes
from trajrag.world.sim import GridSimulator

FAST = ["sim.width=160", "sim.height=120", "episodes.max_steps=300"]


@pytest.fixture(scope="module")
def walk_setup():
    settings = config.settings(FAST)
    scenes = load_scenes("procedural:train:1", settings)
    episode = load_episodes("generated:1", scenes, settings)[0]
    sim_cfg, episode_cfg = settings.sim, settings.episodes
    agent = make_frontier_agent(settings)
    recorder = ValueDecisionRecorder(list(episode_cfg.goal_categories), episode_cfg, settings.audit, settings.value)
    return agent, GridSimulator(sim_cfg), scenes[0], episode, episode_cfg, recorder


@pytest.mark.slow
def test_forcing_the_walkers_own_choice_repeats_the_walk_and_another_changes_it(walk_setup):
    agent, sim, scene, episode, episode_cfg, _ = walk_setup
    choices = []
    agent.decision_observer = lambda ctx, choice, planner: choices.append((len(ctx.candidates), choice, ctx.step))
    walk = run_episode(sim, agent, episode, scene, cfg=episode_cfg)
    agent.decision_observer = None
    index = next(i for i, (n, _, _) in enumerate(choices) if n > 1)
    n, own, step = choices[index]
    planner = agent.planner
    try:
        agent.planner = forced = ForcedChoice(planner, index, own)
        replay = run_episode(sim, agent, episode, scene, cfg=episode_cfg)
        assert forced.step_at == step and replay.poses == walk.poses
        assert forced.name == planner.name  # everything else is the wrapped planner's
        agent.planner = ForcedChoice(planner, index, (own + 1) % n)
        other = run_episode(sim, agent, episode, scene, cfg=episode_cfg)
    finally:
        agent.planner = planner
    assert other.poses[:step + 1] == walk.poses[:step + 1] and other.poses != walk.poses
    if walk.metrics.success:
        assert metres_after(walk, 0) == pytest.approx(walk.metrics.path_length)


@pytest.mark.slow
def test_rollout_costs_are_the_metres_walked_after_each_choice(walk_setup):
    agent, sim, scene, episode, episode_cfg, recorder = walk_setup
    stats = RolloutStats()
    decisions = rollout_decisions(agent, sim, scene, episode, episode_cfg, recorder, per_episode=1, stats=stats)
    assert len(decisions) == 1 and stats.decisions == len(decisions)
    assert stats.rollouts == sum(len(d.cost_m) for d in decisions) and stats.replay_mismatches == 0
    for d in decisions:
        assert len(d.features) == len(d.cost_m) > 1 and d.goal == episode.object_category
        finite = d.cost_m[np.isfinite(d.cost_m)]
        assert (finite >= 0).all()
    assert any(np.isfinite(d.cost_m).any() for d in decisions)
    assert agent.planner.__class__.__name__ != "ForcedChoice" and agent.decision_observer is None


@pytest.mark.slow
def test_value_fit_on_rollout_costs(tmp_path, capsys):
    walk = ["--scenes", "procedural:train:2", "--episodes", "generated:1", "--set", "value.target=rollout",
            "--set", "value.rollout_decisions_per_episode=1",
            *[a for o in [*FAST, "episodes.max_steps=150"] for a in ("--set", o)]]  # shorter rollouts
    kept = tmp_path / "rollouts.npz"
    assert main(["value", "fit", *walk, "--out", str(tmp_path / "v.json"), "--save-decisions", str(kept),
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    decisions, _, _ = load_decisions(kept)
    assert 1 <= len(decisions) <= 2 and report["decisions"] >= 1
    assert main(["value", "fit", *walk, "--set", "value.target=greedy", "--out", str(tmp_path / "x.json")]) == 2
    assert "value.target must be one of" in capsys.readouterr().err
