"""Exploration baselines: nearest frontier (the classic of Yamauchi 1997) and random frontier."""

from __future__ import annotations

import numpy as np

from trajrag.planners.base import PlannerContext, candidate_distances, hysteresis_bonus


class NearestFrontierPlanner:
    """Picks the frontier with the shortest geodesic distance from the agent (metres).

    hysteresis_m: keep going to the previous target while it is at most this much farther than
    the nearest one, so that re-deciding at every topo node does not dither between two
    frontiers at similar distances.
    """

    name = "frontier"

    def __init__(self, hysteresis_m: float = 0.0) -> None:
        self.hysteresis_m = hysteresis_m
        self.last_scores: np.ndarray | None = None

    def reset(self, goal: str, seed: int) -> None:
        pass

    def choose(self, ctx: PlannerContext) -> int:
        # score = -distance, and the previous target counts hysteresis_m metres nearer
        self.last_scores = -candidate_distances(ctx) + hysteresis_bonus(ctx, self.hysteresis_m, 1.0)
        return int(np.argmax(self.last_scores))


class RandomFrontierPlanner:
    """Picks a candidate uniformly at random (seeded per episode): the lower bound of exploration."""

    name = "random"

    def __init__(self) -> None:
        self._rng = np.random.default_rng(0)

    def reset(self, goal: str, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def choose(self, ctx: PlannerContext) -> int:
        return int(self._rng.integers(len(ctx.candidates)))
