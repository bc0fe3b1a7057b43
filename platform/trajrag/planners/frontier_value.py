"""A frontier value learned from past decisions: which frontier leads to the goal.

The decision audit (``agent/decisions.py``) showed that the retrieved chunks' similarity and
object context carry almost no information about where the goal is in an unseen home, while a
planner that ranks the same frontiers by the true way to the goal gains far more over nearest
frontier than any retrieval term (``--planner frontier-oracle``; docs/results.md). What carries information is *what a frontier looks
out on*: the objects already mapped around it (a sink next to a door: a bathroom, so a toilet
beyond), how much unknown space lies behind it, how far it is. This module learns that from
experience in the memory's homes, where the way to the goal is known afterwards.

Per candidate, ``candidate_features`` reads only the agent's own map (never the simulator):

* geometry: geodesic metres to the frontier, log(1 + frontier length in metres), share of
  unknown cells around it, its distance from the centre of the explored free space
  ("outwardness"), the straight-line metres to it, and the candidate path's detour;
* objects: which vocabulary objects are mapped within ``object_radius_m`` of it, once on their
  own and once per goal category (the goal-conditioned part: "near a sink" means something for
  a toilet, nothing for a bed).

``FrontierValueModel`` is a conditional logit over one decision's candidates: score = w . x on
standardised features, fitted (``fit_value_model``) so that the softmax over a decision's
candidates matches a soft target that prefers the lower true cost to the goal through the
frontier (``exp(-(cost - min cost) / temperature_m)``); with ``loss: expected_regret`` the logit fit is
then refined to minimise the metres a candidate drawn from that softmax is behind its decision's
best, which tells a choice 2 m behind from one 30 m behind where the soft target barely does.
``features: geometry`` keeps the object columns at weight 0. Numpy + scipy, no torch; the model is a
small JSON file (feature names, standardisation, weights, goals, vocabulary), loaded without
pickle.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
from scipy.optimize import minimize

from trajrag import artefacts
from trajrag.planners.base import PlannerContext, candidate_distances, hysteresis_bonus, worst_known
from trajrag.retrieval.experience import ExperienceError, ExperienceIndex, experience_path, write_experience

GEOMETRY_FEATURES = ("distance_m", "log_frontier_length_m", "unknown_share", "outwardness_m", "straight_m",
                     "detour_m")
MODEL_FORMAT = "trajrag-frontier-value/1"


class ValueModelError(ValueError):
    """A frontier value model file is missing from the config, damaged, or fits another agent."""


# Who walks ``trajrag value fit``'s episodes (``ValueConfig.walker``): "frontier" = nearest
# frontier; "value" = the value planner of scoring.value_model (its own decisions).
WALKERS = ("frontier", "value")
# What a recorded candidate costs (``ValueConfig.target``): "myopic" = metres to the goal through
# its frontier (hindsight geodesics); "rollout" = metres walked after taking it (agent/rollouts.py).
TARGETS = ("myopic", "rollout")
# What the fit minimises (``ValueConfig.loss``): "logit" = cross-entropy against the soft target of
# ``temperature_m``; "expected_regret" = the metres a candidate drawn by the model's softmax is
# behind its decision's best, started from the logit fit.
LOSSES = ("logit", "expected_regret")
# Which columns the fit may weigh (``ValueConfig.features``): "all", or "geometry" (the object
# columns keep weight 0: the map's shape alone).
FEATURE_SETS = ("all", "geometry")


@dataclass
class ValueConfig:
    """``configs/value.yaml``: feature radii (metres) and the fit's settings."""

    object_radius_m: float
    unknown_radius_m: float
    temperature_m: float
    l2: float
    max_iterations: int
    held_out_share: float
    experience_cap_m: float
    # Who walks the episodes whose decisions are recorded (configs/value.yaml); models fitted
    # before the key existed were walked by nearest frontier.
    walker: str = "frontier"
    # The fit's cost of a candidate (configs/value.yaml; models fitted before the key: myopic).
    target: str = "myopic"
    rollout_decisions_per_episode: int = 3
    # A fitted model to refine (configs/value.yaml): its standardisation is kept and the L2 pulls
    # towards its weights instead of towards 0.
    prior_model: str = ""
    # The fit's objective and its columns (configs/value.yaml; models fitted before the keys:
    # logit on all).
    loss: str = "logit"
    features: str = "all"

    def __post_init__(self) -> None:
        if self.walker not in WALKERS:
            raise ValueError(f"value.walker must be one of {WALKERS}, got {self.walker!r}")
        if self.target not in TARGETS:
            raise ValueError(f"value.target must be one of {TARGETS}, got {self.target!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"value.loss must be one of {LOSSES}, got {self.loss!r}")
        if self.features not in FEATURE_SETS:
            raise ValueError(f"value.features must be one of {FEATURE_SETS}, got {self.features!r}")
        if self.rollout_decisions_per_episode < 1:
            raise ValueError(f"value.rollout_decisions_per_episode must be >= 1, "
                             f"got {self.rollout_decisions_per_episode}")


@dataclass
class ValueDecision:
    """One decision's training example: features (C, F) of its candidates, in the order of
    ``feature_names``, and each candidate's true cost to the goal through its frontier (metres:
    the agent's way to the frontier + the frontier's geodesic distance to the goal region;
    ``inf`` where the frontier has no known way to the goal)."""

    scene: str
    goal: str
    features: np.ndarray
    cost_m: np.ndarray


DECISIONS_FORMAT = "trajrag-value-decisions/1"


def save_decisions(path: str | Path, decisions: Sequence[ValueDecision], vocabulary: Sequence[str],
                   goals: Sequence[str]) -> None:
    """Write collected decisions (``.npz``, plain arrays: read back without pickle) so a model can
    be fitted again, or on several collections together, without walking the episodes again."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(decisions_to_bytes(decisions, vocabulary, goals))


def decisions_to_bytes(decisions: Sequence[ValueDecision], vocabulary: Sequence[str], goals: Sequence[str]) -> bytes:
    """The ``save_decisions`` file as bytes (the corpus keeps those of each exploration walk)."""
    sizes = np.array([len(d.cost_m) for d in decisions], dtype=np.int64)
    width = len(feature_names(vocabulary, goals))
    features = np.vstack([d.features for d in decisions]) if decisions else np.zeros((0, width))
    costs = np.concatenate([d.cost_m for d in decisions]) if decisions else np.zeros(0)
    out = io.BytesIO()
    np.savez_compressed(out, format=np.array(DECISIONS_FORMAT), vocabulary=np.array(list(vocabulary), dtype=str),
                        goals=np.array(list(goals), dtype=str),
                        scene=np.array([d.scene for d in decisions], dtype=str),
                        goal=np.array([d.goal for d in decisions], dtype=str), sizes=sizes,
                        features=features.astype(np.float64), cost_m=costs.astype(np.float64))
    return out.getvalue()


def load_decisions(source: str | Path | io.BytesIO, name: str | None = None
                   ) -> tuple[list[ValueDecision], list[str], list[str]]:
    """(decisions, vocabulary, goals) written by ``save_decisions`` (a path, or the bytes of
    ``decisions_to_bytes`` in a ``BytesIO``); ``ValueModelError`` naming the file (or ``name``)
    when it is not such a file or its arrays do not fit together."""
    path = name or source
    try:
        with np.load(source, allow_pickle=False) as data:
            if str(data["format"]) != DECISIONS_FORMAT:
                raise ValueError(f"format {str(data['format'])!r}, expected {DECISIONS_FORMAT!r}")
            arrays = {key: data[key] for key in ("vocabulary", "goals", "scene", "goal", "sizes", "features", "cost_m")}
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        raise ValueModelError(f"{path}: not a value decisions file ({err})") from None
    vocabulary, goals = [str(v) for v in arrays["vocabulary"]], [str(g) for g in arrays["goals"]]
    sizes, features, costs = arrays["sizes"], arrays["features"], arrays["cost_m"]
    n = len(sizes)
    if (len(arrays["scene"]) != n or len(arrays["goal"]) != n or (sizes < 1).any() or features.ndim != 2
            or features.shape != (int(sizes.sum()), len(feature_names(vocabulary, goals))) or len(costs) != len(features)):
        raise ValueModelError(f"{path}: a corrupted value decisions file (its arrays do not fit together)")
    bounds = np.cumsum(np.concatenate([[0], sizes]))
    decisions = [ValueDecision(scene=str(arrays["scene"][i]), goal=str(arrays["goal"][i]),
                               features=features[bounds[i]:bounds[i + 1]], cost_m=costs[bounds[i]:bounds[i + 1]])
                 for i in range(n)]
    return decisions, vocabulary, goals


def feature_names(vocabulary: Sequence[str], goals: Sequence[str]) -> list[str]:
    """The columns of ``candidate_features`` for this vocabulary and goal set."""
    return [*GEOMETRY_FEATURES, *(f"near:{name}" for name in vocabulary),
            *(f"near:{name}|goal:{goal}" for goal in goals for name in vocabulary)]


def candidate_features(ctx: PlannerContext, goals: Sequence[str], cfg: ValueConfig) -> np.ndarray:
    """float (C, F): the features of every candidate of one decision (``feature_names`` order).

    Objects: the map's object channels within a square of half-side ``object_radius_m`` around
    the frontier's centroid cell. A goal outside ``goals`` leaves the goal-conditioned block at 0.
    """
    sem = ctx.sem_map
    cell = sem.cell_size
    centre = _free_centre(sem.free())
    unknown_half = int(round(cfg.unknown_radius_m / cell))
    half = int(round(cfg.object_radius_m / cell))
    distance = candidate_distances(ctx)
    n_objects = len(sem.categories)
    goal_index = list(goals).index(ctx.goal) if ctx.goal in goals else -1
    rows = []
    for i, candidate in enumerate(ctx.candidates):
        frontier = ctx.frontiers[candidate.frontier_index]
        r, c = (int(v) for v in frontier.centroid_cell)
        near = sem.objects[:, max(0, r - half): r + half + 1, max(0, c - half): c + half + 1].any(axis=(1, 2))
        by_goal = np.zeros(len(goals) * n_objects)
        if goal_index >= 0:
            by_goal[goal_index * n_objects:(goal_index + 1) * n_objects] = near
        geometry = [distance[i], np.log1p(frontier.size * cell), _unknown_share(sem.explored, r, c, unknown_half),
                    float(np.hypot(*(np.array([r, c]) - centre))) * cell,
                    float(np.linalg.norm(np.asarray(frontier.centroid_xy) - ctx.pose.xy)),
                    candidate.length_m - distance[i]]
        rows.append(np.concatenate([np.asarray(geometry, dtype=float), near.astype(float), by_goal]))
    return np.vstack(rows)


def _free_centre(free: np.ndarray) -> np.ndarray:
    """The mean (row, col) of the free cells (0, 0 without any), searched inside their bounding
    box: the map is 1440 x 1440 cells and a walk explores a corner of it."""
    rows, cols = np.flatnonzero(free.any(axis=1)), np.flatnonzero(free.any(axis=0))
    if not len(rows):
        return np.zeros(2)
    return np.argwhere(free[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]).mean(axis=0) + [rows[0], cols[0]]


def _unknown_share(explored: np.ndarray, r: int, c: int, half: int) -> float:
    """The share of unexplored cells in the square of half-side ``half`` cells around (r, c),
    cells off the map counting as unexplored."""
    h, w = explored.shape
    r0, r1, c0, c1 = max(r - half, 0), min(r + half + 1, h), max(c - half, 0), min(c + half + 1, w)
    inside = max(r1 - r0, 0) * max(c1 - c0, 0)
    seen = np.count_nonzero(explored[r0:r1, c0:c1]) if inside else 0
    return 1.0 - seen / float((2 * half + 1) ** 2)


@dataclass
class FrontierValueModel:
    """A fitted conditional logit over candidate features (see the module docstring)."""

    vocabulary: list[str]
    goals: list[str]
    feature_names: list[str]
    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray
    config: ValueConfig
    report: dict
    # The past candidates the model was fitted on, searchable (``retrieval.experience``; loaded
    # by ``load_value_model`` when the table exists beside the file, never saved in it).
    experience: Optional[ExperienceIndex] = None
    # The file ``load`` read, for errors that name it (None when fitted in this process).
    source: Optional[str] = field(default=None, compare=False)

    def standardise(self, features: np.ndarray) -> np.ndarray:
        return (np.asarray(features, dtype=float) - self.mean) / self.scale

    def score(self, features: np.ndarray) -> np.ndarray:
        """float (C,): the value of each candidate (higher = leads to the goal sooner)."""
        return self.standardise(features) @ self.weights

    def require_experience(self) -> ExperienceIndex:
        """The experience table; ``ExperienceError`` saying what to do when there is none."""
        if self.experience is None:
            where = (f"{experience_path(self.source)}: no experience table beside the frontier value model "
                     f"{self.source} (`trajrag value fit` writes both: copy the folder with the file)"
                     if self.source else "this frontier value model has no experience table beside it")
            raise ExperienceError(f"{where}; fit it again with `trajrag value fit`, or set scoring.w_experience=0")
        return self.experience

    def experience_advantage(self, features: np.ndarray, goal: str) -> np.ndarray:
        """float (C,): metres the past candidates most like each one were behind their decision's
        best (``ExperienceIndex.advantage``)."""
        return self.require_experience().advantage(self.standardise(features), goal)

    def score_with_experience(self, features: np.ndarray, goal: str, w_experience: float) -> np.ndarray:
        """float (C,): ``score`` minus ``w_experience`` times ``experience_advantage`` (the value
        alone at 0, without touching the table)."""
        scores = self.score(features)
        return scores - w_experience * self.experience_advantage(features, goal) if w_experience > 0 else scores

    @property
    def per_metre(self) -> float:
        """Score lost per metre of distance to the frontier (the planner's hysteresis scale)."""
        return float(max(0.0, -self.weights[0] / self.scale[0]))

    def check_vocabulary(self, vocabulary: Sequence[str]) -> None:
        if list(vocabulary) != self.vocabulary:
            raise ValueModelError(f"the frontier value model was fitted with the vocabulary {self.vocabulary}, the agent "
                             f"maps {list(vocabulary)} (configs/navigator.yaml): fit it again with `trajrag value fit`")

    def save(self, path: str | Path) -> None:
        payload = {"format": MODEL_FORMAT, "vocabulary": self.vocabulary, "goals": self.goals,
                   "feature_names": self.feature_names, "mean": self.mean.tolist(), "scale": self.scale.tolist(),
                   "weights": self.weights.tolist(), "config": asdict(self.config), "report": self.report}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "FrontierValueModel":
        """Read a model written by ``save`` (a path or URI, ``trajrag.artefacts``);
        ``ValueModelError`` naming the file if it is not one."""
        try:
            payload = json.loads(artefacts.local_copy(path).read_text())
            if payload.get("format") != MODEL_FORMAT:
                raise ValueError(f"format {payload.get('format')!r}, expected {MODEL_FORMAT!r}")
            model = cls(vocabulary=list(payload["vocabulary"]), goals=list(payload["goals"]),
                        feature_names=list(payload["feature_names"]), mean=np.asarray(payload["mean"], dtype=float),
                        scale=np.asarray(payload["scale"], dtype=float),
                        weights=np.asarray(payload["weights"], dtype=float), config=ValueConfig(**payload["config"]),
                        report=dict(payload.get("report", {})), source=str(path))
        except FileNotFoundError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueModelError(f"{path}: not a frontier value model ({err})") from None
        expected = feature_names(model.vocabulary, model.goals)
        sizes = {len(model.mean), len(model.scale), len(model.weights)}
        if model.feature_names != expected or sizes != {len(expected)} or not np.isfinite(model.weights).all():
            raise ValueModelError(f"{path}: a corrupted frontier value model (features or weights do not fit its vocabulary)")
        # Scores are (x - mean) / scale . weights: one NaN, infinity or zero scale makes every
        # score NaN, and the planner's argmax then picks the first candidate whatever it sees.
        finite_mean = np.isfinite(model.mean)
        if not finite_mean.all():
            bad = _first_bad(finite_mean)
            raise ValueModelError(f"{path}: a corrupted frontier value model (field 'mean' must be finite, "
                                  f"feature {model.feature_names[bad]!r} has {model.mean[bad]})")
        good_scale = np.isfinite(model.scale) & (model.scale > 0)
        if not good_scale.all():
            bad = _first_bad(good_scale)
            raise ValueModelError(f"{path}: a corrupted frontier value model (field 'scale' must be finite and > 0, "
                                  f"feature {model.feature_names[bad]!r} has {model.scale[bad]})")
        return model


def _first_bad(ok: np.ndarray) -> int:
    """Index of the first False in ``ok``."""
    return int(np.flatnonzero(~ok)[0])


def metres_behind_best(cost_m: np.ndarray) -> np.ndarray:
    """float (C,): each candidate's cost minus its decision's best (metres); candidates without a
    known way to the goal count as the worst known one."""
    cost = worst_known(cost_m)
    return cost - cost.min()


def soft_target(cost_m: np.ndarray, temperature_m: float) -> np.ndarray:
    """The training target of one decision: a softmax preferring lower cost (metres,
    ``metres_behind_best``)."""
    logits = -metres_behind_best(cost_m) / temperature_m
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def usable(decisions: Sequence[ValueDecision]) -> list[ValueDecision]:
    """Decisions that teach something: two or more candidates, at least one with a known cost."""
    return [d for d in decisions if len(d.cost_m) >= 2 and np.isfinite(d.cost_m).any()]


def fit_value_model(decisions: Sequence[ValueDecision], vocabulary: Sequence[str], goals: Sequence[str],
                    cfg: ValueConfig) -> FrontierValueModel:
    """Fit the conditional logit (L-BFGS, L2 ``cfg.l2`` on the standardised weights; with
    ``cfg.prior_model``, on their difference from that model's, in its standardisation) on the
    columns ``cfg.features`` names, by ``cfg.loss``."""
    decisions = usable(decisions)
    if not decisions:
        raise ValueError("no decision with two candidates and a known way to the goal: collect more episodes")
    features = np.vstack([d.features for d in decisions])
    prior = _prior_model(cfg.prior_model, vocabulary, goals)
    if prior is not None:
        mean, scale, start = prior.mean, prior.scale, prior.weights
    else:
        mean, scale, start = features.mean(axis=0), features.std(axis=0), np.zeros(features.shape[1])
        scale = np.where(scale > 0, scale, 1.0)
    # A slice, not an index array: the standardised matrix stays the contiguous one BLAS got before
    # the option existed, so a fit on all columns keeps its weights to the bit.
    columns = slice(len(GEOMETRY_FEATURES)) if cfg.features == "geometry" else slice(None)
    batch = _DecisionBatch(decisions, ((features - mean) / scale)[:, columns], cfg.temperature_m)
    weights = np.zeros(features.shape[1])
    weights[columns] = _minimise(batch.logit_loss, start[columns], start[columns], cfg)
    if cfg.loss == "expected_regret":
        weights[columns] = _minimise(batch.expected_regret, weights[columns], start[columns], cfg)
    return FrontierValueModel(vocabulary=list(vocabulary), goals=list(goals),
                              feature_names=feature_names(vocabulary, goals), mean=mean, scale=scale,
                              weights=weights, config=cfg, report={"decisions": len(decisions),
                                                                   "candidates": int(len(features))})


class _DecisionBatch:
    """Standardised candidate features (N, F) of many decisions, with each decision's softmax
    and the two objectives of the fit (per decision, means over decisions)."""

    def __init__(self, decisions: Sequence[ValueDecision], x: np.ndarray, temperature_m: float) -> None:
        sizes = [len(d.cost_m) for d in decisions]
        self.x, self.count = x, len(decisions)
        self.starts = np.cumsum([0] + sizes[:-1])
        self.group = np.repeat(np.arange(len(decisions)), sizes)
        self.target = np.concatenate([soft_target(d.cost_m, temperature_m) for d in decisions])
        self.regret_m = np.concatenate([metres_behind_best(d.cost_m) for d in decisions])

    def _softmax(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(logits - each decision's top, per-candidate sum of its decision's exp, probabilities)."""
        logits = self.x @ w
        shifted = logits - np.maximum.reduceat(logits, self.starts)[self.group]
        exp = np.exp(shifted)
        total = np.add.reduceat(exp, self.starts)[self.group]
        return shifted, total, exp / total

    def logit_loss(self, w: np.ndarray) -> tuple[float, np.ndarray]:
        shifted, total, prob = self._softmax(w)
        nll = -np.sum(self.target * (shifted - np.log(total))) / self.count
        return nll, self.x.T @ (prob - self.target) / self.count

    def expected_regret(self, w: np.ndarray) -> tuple[float, np.ndarray]:
        _, _, prob = self._softmax(w)
        weighted = prob * self.regret_m
        mean_regret = np.add.reduceat(weighted, self.starts)[self.group]
        return float(weighted.sum()) / self.count, self.x.T @ (weighted - prob * mean_regret) / self.count


def _minimise(loss_and_grad, start: np.ndarray, anchor: np.ndarray, cfg: ValueConfig) -> np.ndarray:
    """L-BFGS from ``start`` on ``loss_and_grad`` plus ``cfg.l2`` times the squared distance from
    ``anchor`` (the prior model's weights, or zeros)."""

    def penalised(w: np.ndarray) -> tuple[float, np.ndarray]:
        loss, grad = loss_and_grad(w)
        shift = w - anchor
        return loss + cfg.l2 * float(shift @ shift), grad + 2 * cfg.l2 * shift

    return minimize(penalised, start.copy(), jac=True, method="L-BFGS-B", options={"maxiter": cfg.max_iterations}).x


def _prior_model(path: str, vocabulary: Sequence[str], goals: Sequence[str]) -> Optional[FrontierValueModel]:
    """``value.prior_model`` loaded (None when unset); it must have the decisions' feature columns."""
    if not path:
        return None
    prior = FrontierValueModel.load(path)
    if prior.feature_names != feature_names(vocabulary, goals):
        raise ValueModelError(f"value.prior_model {path} was fitted with other features (vocabulary "
                              f"{prior.vocabulary}, goals {prior.goals}) than these decisions "
                              f"({list(vocabulary)}, {list(goals)})")
    return prior


def ranking_quality(decisions: Sequence[ValueDecision], scorer, tolerance_m: float) -> dict:
    """How well ``scorer(features, goal) -> scores`` ranks each decision's candidates by true cost:
    the best-pick rate (within ``tolerance_m``), the mean regret (metres) and the mean Spearman
    correlation of score with lower cost (decisions with three or more known candidates)."""
    from scipy.stats import spearmanr

    best, regret, rhos = [], [], []
    for d in usable(decisions):
        scores = np.asarray(scorer(d.features, d.goal), dtype=float)
        behind = metres_behind_best(d.cost_m)
        regret.append(float(behind[int(np.argmax(scores))]))
        best.append(regret[-1] <= tolerance_m)
        if len(behind) >= 3 and np.isfinite(d.cost_m).all() and np.ptp(scores) > 0 and np.ptp(behind) > 0:
            rhos.append(float(spearmanr(scores, -behind)[0]))
    return {"decisions": len(best), "best_rate": _mean(best), "regret_m": _mean(regret), "rho": _mean(rhos)}


def save_experience(model: FrontierValueModel, decisions: Sequence[ValueDecision], model_path: str | Path) -> int:
    """Write the experience table beside ``model_path``: every usable decision's candidates,
    standardised with ``model``, with their advantage (metres behind the decision's best, capped
    at ``experience_cap_m``). Returns the row count."""
    decisions = usable(decisions)
    goals = [d.goal for d in decisions for _ in range(len(d.cost_m))]
    vectors = model.standardise(np.vstack([d.features for d in decisions]))
    behind = np.concatenate([metres_behind_best(d.cost_m) for d in decisions])
    advantage = np.minimum(behind, model.config.experience_cap_m)
    return write_experience(experience_path(model_path), goals, vectors, advantage)


def _mean(values: list) -> Optional[float]:
    return round(float(np.mean(values)), 4) if values else None


def load_value_model(path: str, vocabulary: Sequence[str], scoring: Any) -> Optional[FrontierValueModel]:
    """The model at ``path`` checked against the agent's ``vocabulary`` (``navigator.vocabulary``),
    with its experience table read as the ``scoring`` section says (``experience_k``,
    ``experience_in_memory``); None for an empty path (no value term)."""
    if not path:
        return None
    model = FrontierValueModel.load(path)
    model.check_vocabulary(vocabulary)
    if artefacts.exists(experience_path(path)):
        model.experience = ExperienceIndex(artefacts.local_copy(experience_path(path)), len(model.feature_names),
                                           scoring.experience_k, scoring.experience_in_memory)
    return model


class FrontierValuePlanner:
    """``--planner value``: the frontier value without trajectory retrieval (the ablation of the
    scoring planner's value and experience terms): the best ``score`` minus ``w_experience``
    times the retrieved past candidates' metres behind (0: the linear value alone), plus the
    nearest-frontier hysteresis in metres converted by the model's own price of a metre."""

    name = "value"

    def __init__(self, model: FrontierValueModel, hysteresis_m: float, w_experience: float = 0.0) -> None:
        if w_experience > 0:
            model.require_experience()  # no table: say so before the first episode
        self.model = model
        self.hysteresis_m = hysteresis_m
        self.w_experience = w_experience
        self.last_scores: Optional[np.ndarray] = None

    def reset(self, goal: str, seed: int) -> None:
        pass

    def choose(self, ctx: PlannerContext) -> int:
        features = candidate_features(ctx, self.model.goals, self.model.config)
        scores = self.model.score_with_experience(features, ctx.goal, self.w_experience)
        self.last_scores = scores + hysteresis_bonus(ctx, self.hysteresis_m, self.model.per_metre)
        return int(np.argmax(self.last_scores))
