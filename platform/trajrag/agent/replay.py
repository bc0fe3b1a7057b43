"""An episode walked by a TrajRAG navigator with every decision kept: the candidates, what was
retrieved for each, the scores and the choice (``decision.png``, ``retrieval/viz.py``)."""

from __future__ import annotations

from typing import Any

from trajrag.agent.episode_runner import run_episode
from trajrag.retrieval.viz import RecordedDecision


def record_decisions(agent: Any, sim: Any, episode: Any, scene: Any, episode_cfg: Any) -> list[RecordedDecision]:
    """Run ``episode`` with a navigator whose planner is a ``ScoringPlanner`` and return its
    decisions (``episode_cfg``: the ``episodes`` section)."""
    planner = agent.planner
    decisions: list[RecordedDecision] = []
    choose = planner.choose

    def recording(ctx):
        choice = choose(ctx)
        decisions.append(RecordedDecision(ctx, planner.last_retrieval, planner.last_scores, choice))
        return choice

    planner.choose = recording
    try:
        run_episode(sim, agent, episode, scene, cfg=episode_cfg)
    finally:
        planner.choose = choose
    return decisions
