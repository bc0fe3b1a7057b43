"""Auditing planner decisions against the privileged geodesic field (analysis only).

An episode's SPL mixes every decision with mapping, the local policy and luck, so two planners
need hundreds of episodes to be told apart. The audit asks a sharper question at each decision:
did the planner pick the frontier that leads to the goal? For every candidate it records the
agent's geodesic distance to the frontier over the mapped free space (what the planner sees) and
the frontier's true geodesic distance to the goal region (``world.geodesic.GoalField``: the
simulator's privileged knowledge, never shown to the agent). Per run, ``decision_quality`` gives:

* ``decision_best_rate``: share of decisions whose pick has the lowest cost to the goal
  (to-frontier + frontier-to-goal, metres), within ``tolerance_m``;
* ``decision_regret_m``: mean metres the pick's cost exceeds the best candidate's;
* ``decision_score_rho``: mean Spearman correlation, within one decision, between the planner's
  scores and the candidates' negated frontier-to-goal distance (positive: the score points at
  the goal; 0: no information). Only planners that expose ``last_scores``, decisions with at
  least three candidates and non-constant scores count;
* ``decision_term_rho``: the same for each term of the score, for planners that expose
  ``last_terms`` (name -> per-candidate values, higher = preferred): which part of a score
  carries the information (the retrieved experience, or the distance).

Greedy cost is a proxy: a frontier farther from the goal may reveal the goal sooner (it opens a
view), so a planner can lose on regret and still win on SPL. The rank correlation is the cleaner
signal of whether a score carries information about where the goal is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Iterable, Optional, Sequence

import numpy as np
from scipy.ndimage import minimum_filter
from scipy.stats import rankdata

from trajrag.planners.base import candidate_distances, worst_known

if TYPE_CHECKING:
    from trajrag.world.geodesic import GoalField
    from trajrag.world.scene import Scene


@dataclass
class AuditConfig:
    """``configs/audit.yaml``: search_radius_m (a frontier's distance to the goal is taken from
    the best traversable cell this close to it) and tolerance_m (a pick this close to the best
    candidate's cost counts as the best), metres; oracle_follow_p: the share of decisions in
    which ``agent/privileged.py``'s frontier oracle follows the privileged ranking."""

    search_radius_m: float
    tolerance_m: float
    oracle_follow_p: float


@dataclass
class AuditedDecision:
    """One decision. Lists are per candidate (planner order); metres. ``frontier_to_goal_m`` is
    ``None`` where no traversable cell lies within the audit's search radius of the frontier."""

    step: int
    chosen: int
    to_frontier_m: list[float]
    frontier_to_goal_m: list[Optional[float]]
    scores: Optional[list[float]] = None
    terms: Optional[dict[str, list[float]]] = None


class FrontierGoalDistance:
    """A frontier's true geodesic distance to the goal region (privileged: the simulator's field).

    search_radius_m: the distance is the field's minimum over traversable cells within this
    radius of the frontier's cells (frontier cells themselves may hug a wall). The map frame is
    the scene frame (poses are exact in these evaluations).
    """

    def __init__(self, scene: Scene, field: GoalField, search_radius_m: float) -> None:
        self.scene = scene
        size = 2 * max(0, int(round(search_radius_m / scene.cell_size))) + 1
        self.near_goal_m = minimum_filter(field.distance, size=size, mode="constant", cval=np.inf)

    def __call__(self, xy: np.ndarray) -> Optional[float]:
        """Geodesic metres to the goal region from the best traversable cell near the map-frame
        points ``xy`` (float (K, 2), metres); ``None`` if none is near."""
        cells = self.scene.to_cell(np.asarray(xy, dtype=float).reshape(-1, 2))
        cells = cells[self.scene.in_bounds(cells)]
        best = float(self.near_goal_m[cells[:, 0], cells[:, 1]].min()) if len(cells) else np.inf
        return round(best, 3) if np.isfinite(best) else None

    def cost_through(self, ctx) -> np.ndarray:
        """float (C,): each candidate's cost to the goal through its frontier, metres: the
        agent's way to the frontier + the frontier's distance to the goal (``inf`` where unknown)."""
        metres = [self(ctx.sem_map.to_xy(ctx.frontiers[c.frontier_index].cells)) for c in ctx.candidates]
        return candidate_distances(ctx) + np.array([np.inf if m is None else m for m in metres], dtype=float)


class DecisionAudit:
    """A navigator's ``decision_observer`` for one episode: records every decision
    (``search_radius_m`` as in ``FrontierGoalDistance``)."""

    def __init__(self, scene: Scene, field: GoalField, search_radius_m: float) -> None:
        self.to_goal = FrontierGoalDistance(scene, field, search_radius_m)
        self.decisions: list[AuditedDecision] = []

    def __call__(self, ctx, choice: int, planner) -> None:
        frontiers = [ctx.frontiers[c.frontier_index] for c in ctx.candidates]
        scores = getattr(planner, "last_scores", None)
        terms = getattr(planner, "last_terms", None)
        self.decisions.append(AuditedDecision(
            step=int(ctx.step), chosen=int(choice),
            to_frontier_m=[round(float(d), 3) for d in candidate_distances(ctx)],
            frontier_to_goal_m=[self.to_goal(ctx.sem_map.to_xy(f.cells)) for f in frontiers],
            scores=None if scores is None else _rounded(scores),
            terms=None if terms is None else {name: _rounded(values) for name, values in terms.items()}))

    def records(self) -> list[dict]:
        """The decisions as JSON-able dicts (one episode record's ``decisions``)."""
        return [asdict(d) for d in self.decisions]


def _rounded(values) -> list[float]:
    return [round(float(v), 4) for v in np.asarray(values, dtype=float)]


def decision_quality(episodes: Iterable[Sequence[dict]], tolerance_m: float) -> dict:
    """Summary of audited decisions (see the module docstring); ``episodes`` holds each
    episode's list of ``AuditedDecision`` dicts."""
    best, regret, rhos, n = [], [], [], 0
    term_rhos: dict[str, list[float]] = {}
    for decisions in episodes:
        for d in decisions:
            n += 1
            to_goal = np.array([np.inf if g is None else g for g in d["frontier_to_goal_m"]], dtype=float)
            if not np.isfinite(to_goal).any():
                continue
            cost = worst_known(np.asarray(d["to_frontier_m"], dtype=float) + to_goal)
            regret.append(float(cost[d["chosen"]] - cost.min()))
            best.append(regret[-1] <= tolerance_m)
            rho = _score_rho(d.get("scores"), to_goal)
            if rho is not None:
                rhos.append(rho)
            for name, values in (d.get("terms") or {}).items():
                rho = _score_rho(values, to_goal)
                if rho is not None:
                    term_rhos.setdefault(name, []).append(rho)
    return {"decisions_audited": n,
            "decision_best_rate": float(np.mean(best)) if best else None,
            "decision_regret_m": float(np.mean(regret)) if regret else None,
            "decision_score_rho": float(np.mean(rhos)) if rhos else None,
            "decision_score_rho_n": len(rhos),
            "decision_term_rho": {name: round(float(np.mean(v)), 4) for name, v in sorted(term_rhos.items())}}


def _score_rho(scores: Optional[Sequence[float]], to_goal: np.ndarray) -> Optional[float]:
    if scores is None or len(scores) < 3 or not np.isfinite(to_goal).all():
        return None
    s = np.asarray(scores, dtype=float)
    if np.ptp(s) == 0 or np.ptp(to_goal) == 0:
        return None
    # rankdata gives tied values their average rank, as Spearman's rho needs
    return float(np.corrcoef(rankdata(s), rankdata(-to_goal))[0, 1])
