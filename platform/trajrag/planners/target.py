"""From a place a planner wants to reach to the candidate path that leads there.

A planner with a navigation target (the Embodied-RAG forest's leaf, a NavProbe subgoal) still
moves by frontiers (``agent.navigator``): the waypoint is always a candidate's frontier. The way
to a target is priced as the walk to a frontier plus the straight line on from it to the target,
as ``scoring.goal_beyond`` prices the way to a remembered goal: the frontier through which the
target is reached soonest, by a path of known length and a guess for the unknown rest.
"""

from __future__ import annotations

import numpy as np

from trajrag.mapping.semantic_map import SemanticMap
from trajrag.planners.base import PlannerContext, candidate_distances


def frontier_xy(ctx: PlannerContext) -> np.ndarray:
    """float (C, 2): each candidate's frontier centroid, map-frame metres."""
    return np.array([ctx.frontiers[c.frontier_index].centroid_xy for c in ctx.candidates], dtype=float).reshape(-1, 2)


def target_gaps(ctx: PlannerContext, target_xy: np.ndarray) -> np.ndarray:
    """float (C,): metres in a straight line from each candidate's frontier to ``target_xy``."""
    return np.linalg.norm(frontier_xy(ctx) - np.asarray(target_xy, dtype=float)[None, :], axis=1)


def cost_via_frontier(ctx: PlannerContext, target_xy: np.ndarray) -> np.ndarray:
    """float (C,): metres to each candidate's frontier (geodesic, ``candidate_distances``) plus
    the straight line on from there to ``target_xy``."""
    return candidate_distances(ctx) + target_gaps(ctx, target_xy)


def explored_share(sem_map: SemanticMap, xy: np.ndarray, radius_m: float) -> float:
    """The share of the map cells within ``radius_m`` of ``xy`` (metres) that are explored;
    cells off the map count as unexplored."""
    row, col = (int(v) for v in sem_map.to_cell(np.asarray(xy, dtype=float)))
    reach = int(np.ceil(radius_m / sem_map.cell_size))
    offsets = np.arange(-reach, reach + 1)
    area = int((offsets[:, None] ** 2 + offsets[None, :] ** 2 <= reach ** 2).sum())
    h, w = sem_map.shape
    r0, r1, c0, c1 = max(row - reach, 0), min(row + reach + 1, h), max(col - reach, 0), min(col + reach + 1, w)
    if r0 >= r1 or c0 >= c1:
        return 0.0
    rr, cc = np.ogrid[r0:r1, c0:c1]
    disk = (rr - row) ** 2 + (cc - col) ** 2 <= reach ** 2
    return float((np.asarray(sem_map.explored[r0:r1, c0:c1], dtype=bool) & disk).sum() / area)
