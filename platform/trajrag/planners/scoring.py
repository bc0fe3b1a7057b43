"""The retrieval-scoring planner: TrajRAG without an LLM (the offline default).

Each candidate path is scored by the experience retrieved for it (``retrieval.Retriever``):

* **similarity**: the mean fine-stage cosine similarity of the retrieved chunks that reached
  the same goal (others count 0): "trajectories like this one, walked towards this goal,
  succeeded before";
* **context**: how much the objects around the candidate's end (its last path node and the
  frontier node) look like the objects around the ends of those trajectories, where the goal
  was found (cosine of object-label histograms, the goal itself left out since an unseen goal
  is what the agent looks for): "in past homes, the goal was next to what lies ahead here";
* **cost**: the geodesic distance to the frontier, in metres (the nearest-frontier criterion),
  plus the nearest-frontier planner's hysteresis so re-decisions do not dither; with
  ``retrieval.project_goal``, plus the straight line on from the frontier to where past walks
  through this place found the goal (``goal_beyond``), when the coarse stage recognised the place;
  with ``retrieval.home_goals``, in a home the memory has walked, to where its walks saw the goal
  (``Retriever.home_goal_points``: the robot is localised in its home's map), less the places the
  agent has since walked to without finding it.

* **value** (with ``scoring.value_model``): the frontier value learned from past decisions in
  the memory's homes (``planners.frontier_value``): what the objects mapped around a frontier,
  the unknown space behind it and its distance say about the way to this goal;
* **experience** (with the value model's experience table): the metres the past candidates
  most like this one were behind their decision's best (``retrieval.experience``), retrieved.

score = w_similarity * similarity + w_context * context + w_value * value - w_experience *
behind - w_distance_per_m * distance, where a value model replaces w_distance_per_m by
``w_distance_per_m_with_value`` (the value prices distance itself). With both experience weights
at 0 and no value model this is the nearest-frontier planner. While goal points are projected,
the two experience terms are scaled by ``w_priors_with_goal_points`` (0: the way to the
remembered goal alone decides).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from trajrag import config
from trajrag.config import Settings
from trajrag.planners.base import PlannerContext, RetrievalTimings, candidate_distances, hysteresis_bonus
from trajrag.planners.frontier_value import FrontierValueModel, candidate_features, load_value_model
from trajrag.planners.target import explored_share
from trajrag.retrieval.retriever import LruCache, load_retriever
from trajrag.retrieval.types import DecisionRetrieval, Experience


@dataclass
class ScoringConfig:
    """``configs/scoring.yaml``: the weights of the score (units in the names)."""

    w_similarity: float
    w_context: float
    w_distance_per_m: float
    w_distance_per_m_with_value: float
    hysteresis_m: float
    end_nodes: int
    keep_goal_points: bool
    forget_home_point_m: float
    forget_explored_share: float
    w_priors_with_goal_points: float
    value_model: str
    w_value: float
    w_experience: float
    experience_k: int
    experience_in_memory: bool


class ScoringPlanner(RetrievalTimings):
    """Picks the candidate with the best experience-weighted score (see the module docstring).

    ``retriever``: anything with ``retrieve(trajectories, goal) -> DecisionRetrieval`` (and a
    ``place`` third argument when its ``uses_place`` is true). After each
    ``choose``, ``last_retrieval`` and ``last_scores`` hold what the decision was based on.
    """

    name = "trajrag"

    def __init__(self, retriever: Any, cfg: ScoringConfig, value: FrontierValueModel | None = None) -> None:
        super().__init__()
        self.retriever = retriever
        self.cfg = cfg
        self.value = value
        if value is not None and cfg.w_experience > 0:
            value.require_experience()  # no table: say so before the first episode
        self.last_retrieval: DecisionRetrieval | None = None
        self.last_scores: np.ndarray | None = None
        self.last_terms: dict[str, np.ndarray] = {}  # per candidate, higher = preferred
        self.goal_points = np.zeros((0, 2))  # this episode's projected goal points (map frame, m)
        self.home_points: np.ndarray | None = None  # where this home's walks saw the goal, not yet visited

    def reset(self, goal: str, seed: int) -> None:
        super().reset(goal, seed)
        self.goal_points = np.zeros((0, 2))
        self.home_points = None

    @property
    def wants_place(self) -> bool:
        """Whether the navigator should pass the whole map (``PlannerContext.place``)."""
        return bool(getattr(self.retriever, "uses_place", False))

    def choose(self, ctx: PlannerContext) -> int:
        trajectories = [c.trajectory for c in ctx.candidates]
        # The map only goes to a retriever that asked for it (``uses_place``).
        retrieval = (self.retriever.retrieve(trajectories, ctx.goal, ctx.place) if ctx.place is not None
                     else self.retriever.retrieve(trajectories, ctx.goal))
        if self.cfg.keep_goal_points:
            retrieval = with_kept_points(retrieval, self.goal_points)
            if retrieval.goal_points is not None:
                self.goal_points = retrieval.goal_points
        retrieval = with_home_points(retrieval, self._unvisited_home_points(ctx))
        self.last_retrieval = retrieval
        self.add_timings(retrieval.total_ms, retrieval.coarse_ms, retrieval.encode_ms)
        scores = self.score(ctx, retrieval)
        self.last_scores = scores
        return int(np.argmax(scores))

    def _unvisited_home_points(self, ctx: PlannerContext) -> np.ndarray:
        """``unvisited_home_points`` of the places where the memory's walks of this home saw the
        goal, read from the retriever at the episode's first decision."""
        if self.home_points is None:  # the episode's first decision
            lookup = getattr(self.retriever, "home_goal_points", None)  # the Serve app's scorer has none
            self.home_points = np.zeros((0, 2)) if lookup is None else lookup(ctx.trajectory.scene_id, ctx.goal)
        self.home_points = unvisited_home_points(self.home_points, ctx, self.cfg)
        return self.home_points

    def score(self, ctx: PlannerContext, retrieval: DecisionRetrieval,
              value_features: np.ndarray | None = None) -> np.ndarray:
        """The score of every candidate (higher is better). ``value_features``: the value model's
        candidate features when computed elsewhere (the Serve app gets no map); else from ``ctx``."""
        cfg = self.cfg
        distance = candidate_distances(ctx)
        similarity = np.array([goal_similarity(exps, ctx.goal) for exps in retrieval.experiences])
        context = np.array([
            goal_context(end_objects(c.trajectory, cfg.end_nodes), exps, ctx.goal, retrieval.names, cfg.end_nodes)
            for c, exps in zip(ctx.candidates, retrieval.experiences)])
        beyond = goal_beyond(ctx, retrieval.goal_points)
        priors = cfg.w_similarity * similarity + cfg.w_context * context
        if retrieval.goal_points is not None and len(retrieval.goal_points):
            # Where the goal was seen before, the way to it outranks what goals tend to be near.
            priors = cfg.w_priors_with_goal_points * priors
        # With a value model the distance is priced by the value (its own per_metre) instead.
        per_metre = cfg.w_distance_per_m if self.value is None else cfg.w_distance_per_m_with_value
        # The way on from a frontier to a remembered goal is priced per metre with or without a
        # value model: the value knows nothing of places remembered.
        scores = priors - per_metre * distance - cfg.w_distance_per_m * beyond
        self.last_terms = {"similarity": similarity, "context": context, "nearness": -distance}
        if retrieval.goal_points is not None:
            self.last_terms["goal_projection"] = -beyond
        if self.value is not None:
            if value_features is None:
                value_features = candidate_features(ctx, self.value.goals, self.value.config)
            value = self.value.score(value_features)
            scores = scores + cfg.w_value * value
            per_metre += cfg.w_value * self.value.per_metre
            self.last_terms["value"] = value
            if cfg.w_experience > 0:
                behind = self.value.experience_advantage(value_features, ctx.goal)
                scores = scores - cfg.w_experience * behind
                self.last_terms["experience"] = -behind
        # keep the previous target unless it is clearly worse
        return scores + hysteresis_bonus(ctx, cfg.hysteresis_m, per_metre)


def goal_beyond(ctx: PlannerContext, goal_points: np.ndarray | None) -> np.ndarray:
    """Per candidate, metres in a straight line from its frontier to the nearest point where a
    past walk through this place found the goal (``retrieval.project_goal``); zeros without
    such points, so the score is then unchanged."""
    if goal_points is None or not len(goal_points):
        return np.zeros(len(ctx.candidates))
    frontiers = np.array([ctx.frontiers[c.frontier_index].centroid_xy for c in ctx.candidates], dtype=float)
    gaps = np.linalg.norm(frontiers[:, None, :] - np.asarray(goal_points, dtype=float)[None, :, :], axis=2)
    return gaps.min(axis=1)


def unvisited_home_points(points: np.ndarray, ctx: PlannerContext, cfg: ScoringConfig) -> np.ndarray:
    """float (P, 2) map-frame metres: ``points`` (where the memory's walks of this home saw the
    goal) less those searched without finding it: within ``forget_home_point_m`` of a node
    walked, or with ``forget_explored_share`` of the map that near them explored (as the
    semantic forest forgets its places: ``planners.embodied_rag``)."""
    if not len(points):
        return points
    walked = np.asarray(ctx.trajectory.node_xy, dtype=float).reshape(-1, 2)
    if len(walked):
        gaps = np.linalg.norm(points[:, None, :] - walked[None, :, :], axis=2).min(axis=1)
        points = points[gaps > cfg.forget_home_point_m]
    unexplored = [explored_share(ctx.sem_map, p, cfg.forget_home_point_m) < cfg.forget_explored_share
                  for p in points]
    return points[np.asarray(unexplored, dtype=bool)].reshape(-1, 2)


def with_home_points(retrieval: DecisionRetrieval, home: np.ndarray) -> DecisionRetrieval:
    """``retrieval`` whose goal points also hold the unvisited ``home`` places (float (P, 2), map
    frame, metres); unchanged without any."""
    if not len(home):
        return retrieval
    known = np.zeros((0, 2)) if retrieval.goal_points is None else retrieval.goal_points
    return replace(retrieval, goal_points=np.vstack([np.reshape(known, (-1, 2)), home]))


def with_kept_points(retrieval: DecisionRetrieval, kept: np.ndarray) -> DecisionRetrieval:
    """``retrieval`` with its goal points joined by the episode's ``kept`` ones (float (P, 2),
    map frame, metres; each point once); unchanged when it projects no goal at all (None)."""
    if retrieval.goal_points is None:
        return retrieval
    both = np.vstack([np.asarray(kept, dtype=float).reshape(-1, 2),
                      np.asarray(retrieval.goal_points, dtype=float).reshape(-1, 2)])
    return replace(retrieval, goal_points=np.unique(both, axis=0) if len(both) else both)


def goal_similarity(experiences: Sequence[Experience], goal: str) -> float:
    """Mean fine-stage similarity of the experiences, counting only successes towards ``goal``."""
    if not experiences:
        return 0.0
    return float(np.mean([max(e.similarity, 0.0) if (e.goal == goal and e.success) else 0.0
                          for e in experiences]))


def end_objects(trajectory: Any, end_nodes: int) -> Counter:
    """Object names around the last ``end_nodes`` nodes of a topo-polar trajectory (sector counts)."""
    sectors = np.asarray(trajectory.sectors)[-end_nodes:]
    return Counter(str(trajectory.categories[c]) for c in sectors.ravel() if c >= 0)


def _chunk_end_objects(experience: Experience, names: Mapping[int, str], end_nodes: int) -> Counter:
    return Counter(names.get(int(c), str(c)) for c in experience.sectors[-end_nodes:].ravel() if c >= 0)


def goal_context(objects: Counter, experiences: Iterable[Experience], goal: str,
                 names: Mapping[int, str], end_nodes: int) -> float:
    """Mean cosine similarity between ``objects`` and the objects around the ends of the
    experiences that reached ``goal`` (the goal category left out of both)."""
    query = {k: v for k, v in objects.items() if k != goal}
    values = []
    for e in experiences:
        if e.goal != goal or not e.success:
            continue
        ends = {k: v for k, v in _chunk_end_objects(e, names, end_nodes).items() if k != goal}
        values.append(_cosine(query, ends))
    return float(np.mean(values)) if values else 0.0


def _cosine(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    if not a or not b:
        return 0.0
    dot = sum(v * b.get(k, 0.0) for k, v in a.items())
    return float(dot / (np.sqrt(sum(v * v for v in a.values())) * np.sqrt(sum(v * v for v in b.values()))))


# -- factories (agent/registry.py) ------------------------------------------------------------
# The retrievers of the last few configurations: the revisit benchmark reads one memory per home,
# home after home, and keeping every home's retriever grew an evaluation past a gigabyte.
_RETRIEVERS = LruCache(4)


def shared_retriever(settings: Settings) -> Any:
    """One retriever per process and configuration: the values of the ``retrieval``, ``memory``
    and ``encoder`` sections it is made of (loading one reads the whole store and the encoder,
    seconds; every agent of an evaluation shares it). The four last used are kept."""
    key = json.dumps([config.to_dict(section) for section in (settings.retrieval, settings.memory, settings.encoder)],
                     sort_keys=True)
    retriever = _RETRIEVERS.get_recent(key)
    if retriever is None:
        retriever = load_retriever(settings)
        _RETRIEVERS.put(key, retriever)
    return retriever


def make_scoring_planner(settings: Settings) -> ScoringPlanner:
    """TrajRAG's planner of the ``scoring`` section over the shared retriever."""
    cfg = settings.scoring
    return ScoringPlanner(shared_retriever(settings), cfg,
                          load_value_model(cfg.value_model, settings.navigator.vocabulary, cfg))
