"""Fit the learned match verifier (``memory.verifier``) on a memory of homes with known identity.

The thresholds of ``memory.*`` accept a match on its inlier pairs alone. Whether a pose is
right shows in more than that (``matching.pose_evidence``: how many nodes land on alike summary
nodes, whether the objects they see agree), and how those weigh against one another is learnt
here from a memory whose chunks name their home (``scene_hint``): the source's chunks, with
their maps, are replayed through a fresh memory under the given settings (as ``corpus
regroup`` does), every candidate match with a pose and at least ``verifier.min_inliers``
consistent pairs is one example, labelled true when the candidate group's majority home is the
trajectory's, and a logistic regression over ``log1p`` of the evidence is fitted by Newton's
method. Fit on homes the memory you will build never holds (the labels are the very measure
that ``corpus stats`` reports).

The report says how the fitted verifier would have decided the same examples, under 5-fold
cross-validation, next to the decisions the replay made (``replay``: the thresholds, or the
verifier given): true and false accepts at ``memory.verifier.threshold`` and at the threshold
that makes as many false accepts as the replay did.
"""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from dataclasses import dataclass

import numpy as np

from trajrag.memory.grouping import MemoryConfig, TrajectoryMemory
from trajrag.memory.matching import EVIDENCE, MatchResult
from trajrag.memory.regroup import replay
from trajrag.memory.schema import CHUNKS
from trajrag.memory.store import MemoryStore

# Ridge penalty on the weights (not the bias) of the logistic fit, in units of the mean
# log-likelihood. chosen: enough to keep Newton's method finite on separable folds, small
# against the ~1e4 examples a 2,000-trajectory memory gives.
RIDGE = 1e-3
NEWTON_STEPS = 50
FOLDS = 5


@dataclass
class Examples:
    """Evidence (n, len(EVIDENCE)) per candidate match, the label, and the replay's decision."""

    evidence: np.ndarray
    true_home: np.ndarray
    replay_accepted: np.ndarray


def collect(source_uri: str, cfg: MemoryConfig, progress: bool = False) -> Examples:
    """Replay ``source_uri`` under ``cfg`` (its settings decide the replay: the thresholds, or
    a verifier already on) and gather one example per candidate match with a pose and at least
    ``cfg.verifier.min_inliers`` consistent pairs."""
    scenes = MemoryStore(source_uri, read_only=True).read(CHUNKS, ["trajectory_id", "scene_hint"])
    scene_of = dict(zip(*(scenes.column(c).to_pylist() for c in ("trajectory_id", "scene_hint"))))
    if not any(scene_of.values()):
        raise ValueError(f"{source_uri}: no chunk names its home (scene_hint); nothing to learn from")
    floor = cfg.verifier.min_inliers
    rows: list[list[float]] = []
    labels: list[bool] = []
    accepted: list[bool] = []
    with tempfile.TemporaryDirectory(prefix="trajrag-verifier-") as scratch:
        # With an observer, matches down to the verifier's floor reach it (grouping).
        memory = TrajectoryMemory(scratch, cfg)

        def observe(prep, gid: int, result: MatchResult) -> None:
            if result.transform is None or result.n_inliers < floor or not prep.scene_hint:
                return
            homes = Counter(scene_of.get(t) for t in memory.group_members(gid))
            evidence = memory.pose_evidence(prep, memory.summaries[gid], result)
            rows.append([float(evidence[name]) for name in EVIDENCE])
            labels.append(bool(homes) and homes.most_common(1)[0][0] == prep.scene_hint)
            accepted.append(result.accepted)

        memory.on_match = observe
        replay(source_uri, memory, progress)
        memory.store.close()
    return Examples(np.asarray(rows, dtype=np.float64).reshape(-1, len(EVIDENCE)),
                    np.asarray(labels, dtype=bool), np.asarray(accepted, dtype=bool))


def fit_logistic(X: np.ndarray, y: np.ndarray, ridge: float = RIDGE) -> tuple[float, np.ndarray]:
    """(bias, weights) of a ridge-penalised logistic regression of ``y`` on ``X`` (Newton)."""
    n, d = X.shape
    A = np.hstack([np.ones((n, 1)), X])
    w = np.zeros(d + 1)
    penalty = np.full(d + 1, ridge * n)
    penalty[0] = 0.0
    for _ in range(NEWTON_STEPS):
        p = 1.0 / (1.0 + np.exp(-np.clip(A @ w, -30, 30)))
        grad = A.T @ (p - y) + penalty * w
        hess = (A * (p * (1 - p))[:, None]).T @ A + np.diag(penalty) + 1e-9 * np.eye(d + 1)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return float(w[0]), w[1:]


def _cross_validated_logits(X: np.ndarray, y: np.ndarray, seed: int) -> np.ndarray:
    order = np.random.default_rng(seed).permutation(len(y))
    logits = np.zeros(len(y))
    for fold in np.array_split(order, FOLDS):
        train = np.setdiff1d(order, fold)
        bias, weights = fit_logistic(X[train], y[train])
        logits[fold] = bias + X[fold] @ weights
    return logits


def fit(examples: Examples, cfg: MemoryConfig) -> dict:
    """The fitted verifier and its cross-validated decisions next to the replay's (one JSON-able
    dict; ``overrides`` are the ``--set`` arguments that switch it on)."""
    X, y = np.log1p(examples.evidence), examples.true_home.astype(np.float64)
    if min(y.sum(), len(y) - y.sum()) < 2 * FOLDS:
        raise ValueError(f"{len(y)} candidate matches, {int(y.sum())} of them true: fewer than "
                         f"{2 * FOLDS} of each kind, too few to fit and cross-validate a verifier")
    bias, weights = fit_logistic(X, y)
    logits = _cross_validated_logits(X, y, cfg.seed)
    truth, replayed = examples.true_home, examples.replay_accepted
    replay_false = int((replayed & ~truth).sum())
    # The threshold at which the cross-validated verifier makes as many false accepts as the replay.
    false_logits = np.sort(logits[~truth])[::-1]
    matched = float(false_logits[replay_false]) + 1e-9 if replay_false < len(false_logits) else -math.inf

    def decided(threshold: float) -> dict:
        accepted = logits >= threshold
        return {"threshold": round(threshold, 4), "true_accepts": int((accepted & truth).sum()),
                "false_accepts": int((accepted & ~truth).sum())}

    weight_map = {name: round(float(w), 4) for name, w in zip(EVIDENCE, weights)}
    # Cross-validated AUC: how often a true match outscores a false one (ranks, ties halved).
    ranks = np.empty(len(logits))
    ranks[np.argsort(logits, kind="stable")] = np.arange(1, len(logits) + 1)
    n_true, n_false = int(truth.sum()), int((~truth).sum())
    auc = (ranks[truth].sum() - n_true * (n_true + 1) / 2) / (n_true * n_false)
    threshold = cfg.verifier.threshold
    return {
        "examples": len(y), "true_home": n_true, "auc": round(float(auc), 4),
        "replay": {"true_accepts": int((replayed & truth).sum()), "false_accepts": replay_false},
        "verifier": decided(threshold),
        "verifier_at_replay_false_accepts": decided(matched),
        "bias": round(bias, 4), "weights": weight_map,
        "overrides": ["memory.verifier.enabled=true", f"memory.verifier.bias={bias:.4f}",
                      *(f"memory.verifier.weights.{k}={v}" for k, v in weight_map.items())],
    }
