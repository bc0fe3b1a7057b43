"""Rollout costs for the frontier value: what a choice costs for the rest of the episode.

The value's default target (``value.target: myopic``) is the metres to the goal through a
frontier as if the goal became known there, a poor proxy for navigation; the metres the walker
actually walks after a choice agreed with it (docs/notes/2026-12-code-history.md). Here,
at up to ``value.rollout_decisions_per_episode`` decisions of each walk (at random, seeded by the
episode), every candidate is taken in turn and the walker goes on to the end of the episode; the
candidate's cost is the metres walked from the decision to success (``inf`` on failure: it ranks
last). The episode is replayed from its start with that one choice forced (``ForcedChoice``):
the walk is deterministic, so the replay reaches the same decision, and it needs no copy of the
agent's planner (which may hold a memory store or a served model). The cost is C + 1 episodes per
sampled decision of C candidates: a cluster job (``trajrag value fit --workers N`` walks each
scene as a Ray task).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field

import numpy as np

from trajrag.agent.episode_runner import EpisodeResult, run_episode
from trajrag.planners.base import PlannerContext
from trajrag.planners.frontier_value import ValueDecision
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.metrics import path_length
from trajrag.world.scene import Scene

# A rollout of the walker's own choice must repeat the walk: its path may differ by float noise only.
REPLAY_TOLERANCE_M = 1e-6


class ForcedChoice:
    """Wraps a planner so that its planner call number ``at`` (0-based) picks candidate ``choice``;
    every other call, and every attribute, is the wrapped planner's. ``step_at``: the actions
    taken before the forced call (None until it happens)."""

    def __init__(self, planner, at: int, choice: int) -> None:
        self.planner, self.at, self.choice = planner, at, choice
        self.calls = 0
        self.step_at: int | None = None

    def __getattr__(self, name: str):
        return getattr(self.planner, name)

    def reset(self, goal: str, seed: int) -> None:
        self.calls, self.step_at = 0, None
        self.planner.reset(goal, seed)

    def choose(self, ctx: PlannerContext) -> int:
        picked = self.planner.choose(ctx)  # the wrapped planner keeps its own state as in the walk
        if self.calls == self.at:
            if self.choice >= len(ctx.candidates):
                raise RuntimeError(f"rollout: decision {self.at} has {len(ctx.candidates)} candidates on replay, "
                                   f"not the walk's; the walker is not deterministic")
            picked, self.step_at = self.choice, ctx.step
        self.calls += 1
        return picked


@dataclass
class RolloutStats:
    """Counters over ``rollout_decisions`` calls: sampled decisions, replayed episodes, and replays
    of the walker's own choice that did not repeat its walk (0 when the walk is deterministic)."""

    decisions: int = 0
    rollouts: int = 0
    replay_mismatches: int = 0
    mismatched: list[str] = field(default_factory=list)


def metres_after(result: EpisodeResult, step: int) -> float:
    """Metres walked from the pose after ``step`` actions to the end of the episode."""
    return path_length([p[:2] for p in result.poses[step:]])


def rollout_decisions(agent, sim, scene: Scene, episode: ObjectNavEpisode, episode_cfg, recorder,
                      per_episode: int, stats: RolloutStats) -> list[ValueDecision]:
    """Walk ``episode`` once with ``agent`` (a navigator) recording its decisions with ``recorder``
    (``ValueDecisionRecorder``: the candidates' features), then replace the costs of up to
    ``per_episode`` sampled decisions (two or more candidates) by their rollout costs; returns
    those decisions only. A decision whose replay of the walker's own choice does not repeat the
    walk is dropped and counted in ``stats`` (a walker that is not deterministic)."""
    choices: list[int] = []

    def observe(ctx: PlannerContext, choice: int, planner) -> None:
        recorder(ctx, choice, planner)
        choices.append(choice)

    recorder.start(scene, episode)
    agent.decision_observer = observe
    try:
        walk = run_episode(sim, agent, episode, scene, cfg=episode_cfg)
    finally:
        agent.decision_observer = None
    recorded = recorder.take()
    choosable = [i for i, d in enumerate(recorded) if len(d.cost_m) > 1]
    rng = np.random.default_rng(zlib.crc32(f"{scene.name}:{episode.episode_id}".encode()))
    sampled = sorted(rng.choice(choosable, size=min(per_episode, len(choosable)), replace=False).tolist())
    planner, out = agent.planner, []
    try:
        for index in sampled:
            cost = np.full(len(recorded[index].cost_m), math.inf)
            for candidate in range(len(cost)):
                agent.planner = forced = ForcedChoice(planner, index, candidate)
                result = run_episode(sim, agent, episode, scene, cfg=episode_cfg)
                stats.rollouts += 1
                if result.metrics.success and forced.step_at is not None:
                    cost[candidate] = metres_after(result, forced.step_at)
                if candidate == choices[index] and _differs(result, walk):
                    stats.replay_mismatches += 1
                    stats.mismatched.append(f"{scene.name}:{episode.episode_id} decision {index}")
                    break  # the replay left the walk: this decision's costs mean nothing
            else:
                stats.decisions += 1
                out.append(ValueDecision(scene=recorded[index].scene, goal=recorded[index].goal,
                                         features=recorded[index].features, cost_m=cost))
    finally:
        agent.planner = planner
    return out


def _differs(replay: EpisodeResult, walk: EpisodeResult) -> bool:
    return (replay.metrics.success != walk.metrics.success
            or abs(replay.metrics.path_length - walk.metrics.path_length) > REPLAY_TOLERANCE_M)
