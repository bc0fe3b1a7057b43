"""Experience for the frontier value: decisions in homes whose goals are known afterwards.

A nearest-frontier navigator walks episodes in the memory's homes (train scenes). At each of its
decisions, every candidate's features (``planners.frontier_value.candidate_features``, from the
agent's own map) are recorded with the candidate's true cost to the goal through its frontier
(the decision audit's privileged geodesic field, ``agent.decisions.FrontierGoalDistance``). In
those homes the cost is hindsight, like the oracle walks of the corpus; the fitted model never
sees the simulator at evaluation time.
"""

from __future__ import annotations

from typing import Sequence

from tqdm import tqdm

from trajrag.agent.decisions import AuditConfig, FrontierGoalDistance
from trajrag.agent.episode_runner import run_episode
from trajrag.agent.navigator import make_frontier_agent
from trajrag.planners.frontier_value import ValueConfig, ValueDecision, candidate_features
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.episode_gen import EpisodeConfig, scene_goal_field
from trajrag.world.scene import Scene
from trajrag.world.sim import GridSimulator


def collect_value_decisions(scenes: Sequence[Scene], episodes: Sequence[ObjectNavEpisode], goals: Sequence[str],
                            sim_cfg, episode_cfg: EpisodeConfig, audit: AuditConfig, cfg: ValueConfig,
                            overrides: Sequence[str] = (), progress: bool = True) -> tuple[list[ValueDecision], list[str]]:
    """Walk every episode with nearest frontier and record its decisions; returns them and the
    agent's vocabulary (the model's object columns)."""
    agent = make_frontier_agent(sim_cfg, overrides)
    sim = GridSimulator(sim_cfg)
    by_name = {scene.name: scene for scene in scenes}
    decisions: list[ValueDecision] = []
    current: dict = {}

    def record(ctx, choice: int, planner) -> None:
        decisions.append(ValueDecision(scene=current["scene"], goal=ctx.goal,
                                       features=candidate_features(ctx, goals, cfg),
                                       cost_m=current["to_goal"].cost_through(ctx)))

    agent.decision_observer = record
    for episode in tqdm(episodes, desc="value decisions", unit="ep", disable=not progress):
        scene = by_name[episode.scene_key]
        field = scene_goal_field(scene, episode.object_category, episode_cfg)
        current.update(scene=scene.name, to_goal=FrontierGoalDistance(scene, field, audit.search_radius_m))
        run_episode(sim, agent, episode, scene, cfg=episode_cfg)
    return decisions, list(agent.builder.vocabulary)
