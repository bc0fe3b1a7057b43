"""Exploration baselines: nearest frontier (the classic of Yamauchi 1997) and random frontier."""

from __future__ import annotations

import numpy as np

from trajrag.planners.base import PlannerContext


class NearestFrontierPlanner:
    """Picks the candidate with the shortest path (topo path + last leg, metres)."""

    name = "frontier"

    def reset(self, goal: str, seed: int) -> None:
        pass

    def choose(self, ctx: PlannerContext) -> int:
        return int(np.argmin([c.length_m for c in ctx.candidates]))


class RandomFrontierPlanner:
    """Picks a candidate uniformly at random (seeded per episode): the lower bound of exploration."""

    name = "random"

    def __init__(self) -> None:
        self._rng = np.random.default_rng(0)

    def reset(self, goal: str, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def choose(self, ctx: PlannerContext) -> int:
        return int(self._rng.integers(len(ctx.candidates)))
