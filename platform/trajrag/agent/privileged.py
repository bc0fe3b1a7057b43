"""The frontier oracle: the ceiling of every planner that ranks frontiers (analysis only).

Nearest frontier, TrajRAG's scoring planner and the LLM planner all pick one of the same
candidate frontiers at the same decisions; they differ only in how they rank them. This planner
ranks them with the simulator's knowledge, as the decision audit measures it
(``agent/decisions.py``): the cost to the goal through each frontier, the agent's geodesic
metres to the frontier over the mapped free space plus the frontier's true geodesic metres to the
goal region. Its SR and SPL are what a perfect frontier ranker reaches with this mapping,
decision trigger and local policy, so the gap to nearest frontier is the room a retrieval-scoring
planner has.

With ``audit.oracle_follow_p`` below 1 it follows the privileged ranking at that share of its
decisions (drawn per decision, seeded per episode) and picks as nearest frontier otherwise: SPL
against how often a planner knows which frontier leads to the goal.
"""

from __future__ import annotations

import numpy as np

from trajrag.agent.decisions import AuditConfig, FrontierGoalDistance
from trajrag.config import ConfigError
from trajrag.planners.base import PlannerContext
from trajrag.planners.frontier import NearestFrontierPlanner
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.episode_gen import EpisodeConfig, scene_goal_field
from trajrag.world.scene import Scene


class FrontierOraclePlanner:
    """Picks the candidate with the lowest cost to the goal through its frontier (metres), with
    probability ``follow_p`` per decision; the nearest frontier (with hysteresis) otherwise.
    ``see_episode`` (the navigator's ``episode_observer``) reads the episode's goal field."""

    name = "frontier-oracle"

    def __init__(self, audit: AuditConfig, episode_cfg: EpisodeConfig, hysteresis_m: float) -> None:
        if not 0.0 <= audit.oracle_follow_p <= 1.0:
            raise ConfigError(f"audit.oracle_follow_p must be in [0, 1], got {audit.oracle_follow_p}")
        self.audit = audit
        self.episode_cfg = episode_cfg
        self.nearest = NearestFrontierPlanner(hysteresis_m)
        self.to_goal: FrontierGoalDistance | None = None
        self.last_scores: np.ndarray | None = None
        self._rng = np.random.default_rng(0)

    def see_episode(self, episode: ObjectNavEpisode, scene: Scene) -> None:
        field = scene_goal_field(scene, episode.object_category, self.episode_cfg)
        self.to_goal = FrontierGoalDistance(scene, field, self.audit.search_radius_m)

    def reset(self, goal: str, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def choose(self, ctx: PlannerContext) -> int:
        if self.to_goal is None:
            raise RuntimeError("the frontier oracle needs see_episode() with the episode first")
        # one draw per decision whatever follow_p is, so runs at different p share their draws
        follow = self._rng.random() < self.audit.oracle_follow_p
        cost = self.to_goal.cost_through(ctx)
        if not follow or not np.isfinite(cost).any():
            choice = self.nearest.choose(ctx)
            self.last_scores = self.nearest.last_scores
            return choice
        self.last_scores = -cost
        return int(np.argmax(self.last_scores))
