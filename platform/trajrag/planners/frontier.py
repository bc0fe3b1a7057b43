"""Exploration baselines: nearest frontier (the classic of Yamauchi 1997) and random frontier."""

from __future__ import annotations

import numpy as np

from trajrag.planners.base import PlannerContext


class NearestFrontierPlanner:
    """Picks the frontier with the shortest geodesic distance from the agent (metres).

    hysteresis_m: keep going to the previous target while it is at most this much farther than
    the nearest one, so that re-deciding at every topo node does not dither between two
    frontiers at similar distances.
    """

    name = "frontier"

    def __init__(self, hysteresis_m: float = 0.0) -> None:
        self.hysteresis_m = hysteresis_m

    def reset(self, goal: str, seed: int) -> None:
        pass

    def choose(self, ctx: PlannerContext) -> int:
        distances = np.array([ctx.frontier_distances[c.frontier_index] for c in ctx.candidates])
        fallback = np.array([c.length_m for c in ctx.candidates])
        distances = np.where(np.isfinite(distances), distances, fallback)
        best = int(np.argmin(distances))
        if ctx.current_waypoint is not None:
            centroids = np.array([ctx.frontiers[c.frontier_index].centroid_xy for c in ctx.candidates])
            same = np.linalg.norm(centroids - ctx.current_waypoint, axis=1) <= self.hysteresis_m
            if same.any():
                kept = int(np.flatnonzero(same)[np.argmin(distances[same])])
                if distances[kept] <= distances[best] + self.hysteresis_m:
                    return kept
        return best


class RandomFrontierPlanner:
    """Picks a candidate uniformly at random (seeded per episode): the lower bound of exploration."""

    name = "random"

    def __init__(self) -> None:
        self._rng = np.random.default_rng(0)

    def reset(self, goal: str, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def choose(self, ctx: PlannerContext) -> int:
        return int(self._rng.integers(len(ctx.candidates)))
