"""SE(2) transforms and their robust estimation: RANSAC over 2-point samples, then Procrustes
refits with Huber weights (the paper's Eq. 9 alignment of a trajectory to a summary).

Numpy only. A transform maps the new trajectory's frame into the summary (group) frame:
``q = R(theta) @ p + t``, as ``Transform2D(theta, tx, ty)`` (radians, metres).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Transform2D:
    """SE(2) map ``q = R(theta) p + t`` (radians, metres)."""

    theta: float
    tx: float
    ty: float

    @classmethod
    def identity(cls) -> "Transform2D":
        return cls(0.0, 0.0, 0.0)

    @classmethod
    def from_rt(cls, R: np.ndarray, t: np.ndarray) -> "Transform2D":
        return cls(float(math.atan2(R[1, 0], R[0, 0])), float(t[0]), float(t[1]))

    @property
    def R(self) -> np.ndarray:
        c, s = math.cos(self.theta), math.sin(self.theta)
        return np.array([[c, -s], [s, c]])

    @property
    def t(self) -> np.ndarray:
        return np.array([self.tx, self.ty])

    def apply(self, xy: np.ndarray) -> np.ndarray:
        """Transform points (K, 2) metres."""
        return np.asarray(xy, dtype=np.float64) @ self.R.T + self.t

    def inverse(self) -> "Transform2D":
        R_inv = self.R.T
        t_inv = -R_inv @ self.t
        return Transform2D(-self.theta, float(t_inv[0]), float(t_inv[1]))

    def compose(self, inner: "Transform2D") -> "Transform2D":
        """``self o inner``: apply ``inner`` first, then ``self``."""
        t = self.R @ inner.t + self.t
        return Transform2D(_wrap(self.theta + inner.theta), float(t[0]), float(t[1]))

    def as_list(self) -> list[float]:
        return [self.theta, self.tx, self.ty]


def _wrap(angle: float) -> float:
    return (angle + math.pi) % (2.0 * math.pi) - math.pi



def _procrustes(P: np.ndarray, Q: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted least-squares rotation + translation with Q ~ R P + t (2D Kabsch)."""
    w = w / w.sum()
    mp, mq = w @ P, w @ Q
    H = ((P - mp) * w[:, None]).T @ (Q - mq)
    theta = math.atan2(H[0, 1] - H[1, 0], H[0, 0] + H[1, 1])
    c, s = math.cos(theta), math.sin(theta)
    R = np.array([[c, -s], [s, c]])
    return R, mq - R @ mp


def _huber_weights(residual: np.ndarray, delta: float) -> np.ndarray:
    return np.where(residual <= delta, 1.0, delta / np.maximum(residual, 1e-12))


@functools.lru_cache(maxsize=256)
def _all_pairs(c: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.triu_indices(c, 1)``, kept: RANSAC asks for the same few sizes thousands of times."""
    a, b = np.triu_indices(c, 1)
    a.flags.writeable = b.flags.writeable = False
    return a, b


def ransac_se2(
    P: np.ndarray,
    Q: np.ndarray,
    threshold_m: float,
    iterations: int,
    rng: np.random.Generator,
    huber_delta_m: float | None = None,
    refit_iterations: int = 0,
    pair_ok: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """RANSAC SE(2) with 2-point minimal samples, then a robust refit (Eq. 9).

    P, Q: (c, 2) metres, corresponding points (Q ~ R P + t). Hypotheses come from every pair of
    correspondences when there are at most ``iterations`` pairs, else from ``iterations`` random
    pairs drawn with ``rng``; all hypotheses are scored at once. A pair is an inlier when its
    residual is below ``threshold_m`` and, if given, ``pair_ok(thetas (H,)) -> (H, c) bool``
    accepts it (used for heading consistency). The best hypothesis (most inliers, then smallest
    residual) is refitted on its inliers by weighted Procrustes with Huber IRLS weights
    (``huber_delta_m``), ``refit_iterations`` times, re-selecting inliers each time.

    Returns (R (2, 2), t (2,), inlier_mask (c,)); an all-False mask and the identity when fewer
    than 2 correspondences or no hypothesis has 2 inliers.
    """
    P = np.asarray(P, dtype=np.float64)
    Q = np.asarray(Q, dtype=np.float64)
    c = len(P)
    if c < 2:
        return _no_transform(c)
    n_all = c * (c - 1) // 2
    if n_all <= iterations:
        a, b = _all_pairs(c)
    else:
        a = rng.integers(0, c, size=iterations)
        b = (a + rng.integers(1, c, size=iterations)) % c
    dp, dq = P[b] - P[a], Q[b] - Q[a]
    len_p, len_q = _row_norms(dp), _row_norms(dq)
    # A rigid map preserves distances: skip samples that cannot fit, and degenerate ones.
    valid = (np.abs(len_p - len_q) <= 2.0 * threshold_m) & (len_p > threshold_m)
    if not valid.any():
        return _no_transform(c)
    a, b, dp, dq = a[valid], b[valid], dp[valid], dq[valid]
    thetas = np.arctan2(dq[:, 1], dq[:, 0]) - np.arctan2(dp[:, 1], dp[:, 0])
    cos, sin = np.cos(thetas), np.sin(thetas)
    mid_p, mid_q = (P[a] + P[b]) / 2.0, (Q[a] + Q[b]) / 2.0
    t = mid_q - np.stack([cos * mid_p[:, 0] - sin * mid_p[:, 1],
                          sin * mid_p[:, 0] + cos * mid_p[:, 1]], axis=1)
    moved_x = cos[:, None] * P[None, :, 0] - sin[:, None] * P[None, :, 1] + t[:, 0:1]
    moved_y = sin[:, None] * P[None, :, 0] + cos[:, None] * P[None, :, 1] + t[:, 1:2]
    residual = np.hypot(moved_x - Q[None, :, 0], moved_y - Q[None, :, 1])  # (H, c)
    inl = residual < threshold_m
    if pair_ok is not None:
        inl &= pair_ok(thetas)
    counts = inl.sum(axis=1)
    cost = np.where(inl, residual, threshold_m).sum(axis=1)
    best = int(np.lexsort((cost, -counts))[0])
    if counts[best] < 2:
        return _no_transform(c)
    mask = inl[best]
    R = np.array([[cos[best], -sin[best]], [sin[best], cos[best]]])
    tt = t[best]
    delta = threshold_m / 2.0 if huber_delta_m is None else huber_delta_m
    for _ in range(refit_iterations):
        P_in, Q_in = P[mask], Q[mask]
        res = _row_norms(P_in @ R.T + tt - Q_in)
        R_new, t_new = _procrustes(P_in, Q_in, _huber_weights(res, delta))
        res_all = _row_norms(P @ R_new.T + t_new - Q)
        new_mask = res_all < threshold_m
        if pair_ok is not None:
            new_mask &= pair_ok(np.array([math.atan2(R_new[1, 0], R_new[0, 0])]))[0]
        if new_mask.sum() < 2:
            break
        R, tt = R_new, t_new
        if (new_mask == mask).all():
            break
        mask = new_mask
    return R, tt, mask


def _no_transform(c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``ransac_se2``'s answer when no transform fits ``c`` correspondences."""
    return np.eye(2), np.zeros(2), np.zeros(c, dtype=bool)


def _row_norms(xy: np.ndarray) -> np.ndarray:
    """``np.linalg.norm(xy, axis=1)`` of a real array, to the bit (its own arithmetic:
    sqrt(add.reduce(x * x)) along the rows), without its argument checks."""
    return np.sqrt(np.add.reduce(xy * xy, axis=1))
