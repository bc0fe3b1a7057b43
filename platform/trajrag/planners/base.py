"""The planner interface: given the candidate paths of one decision, pick one.

Every planner (nearest frontier, random frontier, the retrieval-scoring TrajRAG planner, the LLM
planner) implements ``Planner``; the navigation loop (``agent/navigator.py``) calls ``choose`` when
the agent reaches a new topo node, reaches its waypoint or finds it unreachable (paper Sec. 3.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

import numpy as np

from trajrag.mapping.frontiers import Frontier
from trajrag.mapping.semantic_map import SemanticMap
from trajrag.topo.candidates import CandidatePath, MapPlace
from trajrag.topo.trajectory import TopoPolarTrajectory
from trajrag.world.frames import Pose2D


@dataclass
class PlannerContext:
    """Everything a planner may read at one decision.

    goal: goal category name. step: actions taken so far. pose: map-frame pose (m, rad).
    trajectory: the topo-polar trajectory walked so far. candidates: one per valid frontier
    (non-empty). frontiers: all frontiers of the current map (``candidates[i].frontier_index``
    indexes them). frontier_distances: float (F,) geodesic metres from the agent to each
    frontier over the explored free space (``inf`` if none). current_waypoint: the map-frame
    target of the previous decision (None at the first). place: every node of the current map's
    topo graph with its sector vector (``topo.candidates.map_place``); only computed for a
    planner whose ``wants_place`` is true, else None.
    """

    goal: str
    step: int
    pose: Pose2D
    sem_map: SemanticMap
    trajectory: TopoPolarTrajectory
    candidates: Sequence[CandidatePath]
    frontiers: Sequence[Frontier]
    frontier_distances: np.ndarray
    current_waypoint: Optional[np.ndarray] = None
    place: Optional[MapPlace] = None


def candidate_distances(ctx: PlannerContext) -> np.ndarray:
    """Geodesic metres to each candidate's frontier (the path length where none was found)."""
    geodesic = np.array([ctx.frontier_distances[c.frontier_index] for c in ctx.candidates], dtype=float)
    fallback = np.array([c.length_m for c in ctx.candidates], dtype=float)
    return np.where(np.isfinite(geodesic), geodesic, fallback)


def worst_known(cost_m: np.ndarray) -> np.ndarray:
    """``cost_m`` (float (C,), metres, at least one finite) with every unknown (infinite) cost
    replaced by the worst known one: a candidate with no known way to the goal ranks last."""
    cost = np.asarray(cost_m, dtype=float)
    return np.where(np.isfinite(cost), cost, cost[np.isfinite(cost)].max())


def previous_target(ctx: PlannerContext, radius_m: float) -> np.ndarray:
    """bool (C,): the candidates whose frontier lies within ``radius_m`` of the previous
    decision's waypoint (none at the first decision). Planners favour them so that re-deciding
    at every topo node does not dither between similar frontiers."""
    if ctx.current_waypoint is None:
        return np.zeros(len(ctx.candidates), dtype=bool)
    centroids = np.array([ctx.frontiers[c.frontier_index].centroid_xy for c in ctx.candidates])
    return np.linalg.norm(centroids - ctx.current_waypoint, axis=1) <= radius_m


def hysteresis_bonus(ctx: PlannerContext, hysteresis_m: float, score_per_m: float) -> np.ndarray:
    """float (C,): the score added to the previous target's candidates (``previous_target`` within
    ``hysteresis_m``) so that a planner scoring ``-score_per_m`` per metre of distance keeps it
    while it is at most ``hysteresis_m`` metres farther than the best alternative."""
    return previous_target(ctx, hysteresis_m) * score_per_m * hysteresis_m


class RetrievalTimings:
    """Per-episode retrieval timings for the evaluation records: a planner that retrieves calls
    ``add_timings`` once per decision (or appends to ``retrieval_ms`` alone, when its retrieval
    has no stages) and gets ``reset`` and ``episode_stats`` from here.

    Per decision, milliseconds: ``retrieval_ms`` (the retriever's whole compute time) and its
    split, ``coarse_ms`` + ``encode_ms`` (embedding the candidates) + ``search_ms``."""

    def __init__(self) -> None:
        self.reset_timings()

    def reset(self, goal: str, seed: int) -> None:
        self.reset_timings()

    def reset_timings(self) -> None:
        self.retrieval_ms: list[float] = []
        self.coarse_ms: list[float] = []
        self.encode_ms: list[float] = []
        self.search_ms: list[float] = []

    def add_timings(self, total_ms: float, coarse_ms: float = 0.0, encode_ms: float = 0.0) -> None:
        """One decision's retrieval time and its coarse and encoding parts (the rest: search)."""
        self.retrieval_ms.append(total_ms)
        self.coarse_ms.append(coarse_ms)
        self.encode_ms.append(encode_ms)
        self.search_ms.append(max(total_ms - coarse_ms - encode_ms, 0.0))

    def episode_stats(self) -> dict:
        """Per-episode counters for the evaluation records (``agent/evaluate.py``)."""
        return {**{name: [round(t, 3) for t in getattr(self, name)] for name in TIMING_LISTS}, "fallbacks": 0}


# The per-decision timing lists of ``RetrievalTimings`` (records' ``planner_stats``).
TIMING_LISTS = ("retrieval_ms", "coarse_ms", "encode_ms", "search_ms")


class Planner(Protocol):
    """Chooses a candidate path; ``choose`` returns an index into ``ctx.candidates``.

    A planner that reads ``ctx.place`` has an attribute ``wants_place = True`` (the navigator
    computes it only then: a sector vector per map node).
    """

    name: str

    def reset(self, goal: str, seed: int) -> None: ...

    def choose(self, ctx: PlannerContext) -> int: ...
