"""Semantic (Eq. 8) and geometric (Eq. 9) matching of a topo-polar trajectory to a summary.

Numpy only. Sector vectors hold one label per 30-degree sector (``topo.labels``: a category id
``>= 0``, ``FREE``, ``OBSTACLE`` or ``UNKNOWN``) in the frame of a *reference heading* (the
episode's start heading): sector ``i`` looks along ``reference_yaw + pi/2 + i * 30 deg``.

Conventions used throughout:

* ``rotate_sectors(s, k) = np.roll(s, k)``: the label seen in sector ``i`` moves to sector
  ``i + k``. That is what happens to a vector when its reference heading turns by ``-k * 30 deg``
  (or the world turns by ``+k * 30 deg``).
* ``sim(a, b)`` = (number of sectors where ``a`` and ``b`` carry the same *known* label) / 12.
  ``UNKNOWN`` is no evidence: it never matches, not even another ``UNKNOWN``, so two nodes at the
  edge of the explored area do not look alike for lack of information. ``sim`` is in [0, 1].
* An SE(2) transform maps the new trajectory's frame into the summary (group) frame:
  ``q = R(theta) @ p + t``. It is returned as ``Transform2D(theta, tx, ty)`` (radians, metres).
* Heading consistency: if ``T`` rotates by ``theta``, a node seen with reference ``ref_a`` must
  match a summary node of reference ``ref_b`` at shift ``k* = (theta + ref_a - ref_b) / 30 deg``
  (fractional when ``theta`` is not a multiple of 30 deg). A pair is heading-consistent when its
  similarity at ``floor(k*)`` or ``ceil(k*)`` is within ``heading_slack`` of its best similarity
  over all 12 shifts. Comparing similarities rather than ``best_shift == k*`` keeps nodes whose
  sectors are symmetric (a corridor matches at ``k`` and ``k + 6`` equally) from being dropped.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol, Sequence

import numpy as np

from trajrag.topo.labels import UNKNOWN

N_SECTORS = 12
SECTOR_ANGLE = 2.0 * math.pi / N_SECTORS


class SectorNodes(Protocol):
    """What matching needs from a trajectory or a summary (duck-typed)."""

    node_xy: np.ndarray  # float (K, 2) metres
    sectors: np.ndarray  # int (K, 12) labels
    reference_yaw: float  # radians
    edges: Any  # (E, 2) int array or a set of (a, b) node pairs


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


@dataclass(frozen=True)
class MatchParams:
    """Thresholds of one match (a view of ``MemoryConfig``; see configs/memory.yaml)."""

    mutual_k: int
    min_node_similarity: float
    ransac_threshold_m: float
    ransac_iterations: int
    huber_delta_m: float
    refit_iterations: int
    heading_slack: float
    min_inliers: int
    min_score: float
    min_edge_support: int


@dataclass
class MatchResult:
    """Outcome of matching a trajectory (a) against a summary (b).

    score: inlier ratio |C_in| / |C| (Eq. 9's geometric similarity), counted over the trajectory
        nodes that have a pair (ties in mutual KNN give a node several pairs), 0 if none match.
    transform: a-frame -> b-frame, or None when no valid transform was found.
    pairs: (c, 2) int node indices (i in a, j in b) from mutual KNN.
    inliers: (c,) bool, pairs consistent with ``transform`` (distance and heading).
    accepted: score, inlier count, edge support and transform pass the configured thresholds.
    edge_support: trajectory edges whose two nodes are inliers matched to one summary node or
        to two summary nodes joined by an edge (a shared stretch of path, not scattered points).
    """

    score: float
    transform: Transform2D | None
    pairs: np.ndarray
    inliers: np.ndarray
    accepted: bool
    edge_support: int = 0

    @property
    def n_inliers(self) -> int:
        """Trajectory nodes with a consistent pair."""
        return int(len(np.unique(self.pairs[self.inliers, 0]))) if len(self.pairs) else 0


def _wrap(angle: float) -> float:
    return (angle + math.pi) % (2.0 * math.pi) - math.pi


def rotate_sectors(sectors: np.ndarray, shift: int) -> np.ndarray:
    """Cyclically rotate sector vectors (..., 12) by ``shift`` sectors (label i -> i + shift)."""
    return np.roll(sectors, shift, axis=-1)


# rolled[k, i, s] = A[i, (s - k) % 12] == np.roll(A[i], k)[s]: A[:, _ROLL_INDEX] is (n, 12, 12).
_ROLL_INDEX = (np.arange(N_SECTORS)[None, :] - np.arange(N_SECTORS)[:, None]) % N_SECTORS


def _one_hot(sectors: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(..., 12) labels -> (..., 12 * V) float32 one-hot over ``values`` (UNKNOWN excluded)."""
    hot = sectors[..., None] == values
    return hot.reshape(*sectors.shape[:-1], -1).astype(np.float32)


def sector_similarity_all(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """sim(Rot(a_i, k), b_j) for every shift k: (12, n, m) in [0, 1].

    A: (n, 12), B: (m, 12) integer labels. One batched matmul of one-hot encodings over the
    labels present in both inputs.
    """
    A = np.asarray(A)
    B = np.asarray(B)
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != N_SECTORS or B.shape[1] != N_SECTORS:
        raise ValueError(f"sector arrays must be (n, {N_SECTORS}) and (m, {N_SECTORS}), "
                         f"got {A.shape} and {B.shape}")
    n, m = len(A), len(B)
    values = np.intersect1d(np.unique(A), np.unique(B))
    values = values[values != UNKNOWN]
    if n == 0 or m == 0 or len(values) == 0:
        return np.zeros((N_SECTORS, n, m), dtype=np.float32)
    rolled = A[:, _ROLL_INDEX].transpose(1, 0, 2)  # (12, n, 12)
    left = _one_hot(rolled, values).reshape(N_SECTORS * n, -1)
    right = _one_hot(B, values)
    counts = (left @ right.T).reshape(N_SECTORS, n, m)
    return counts / np.float32(N_SECTORS)


def sector_similarity_batch(A: np.ndarray, Bs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``sector_similarity_all(A, B)`` for every B of ``Bs`` (a trajectory against its candidate
    summaries) with one matmul: (12, n, m_i) float32 each, equal to the bit. The counts are sums
    of 0/1 products (at most 12), exact in float32 whatever the summation order, and labels
    that only some of the inputs hold add zeros."""
    A = np.asarray(A)
    Bs = [np.asarray(B) for B in Bs]
    if not Bs:
        return []
    if A.ndim != 2 or A.shape[1] != N_SECTORS or any(B.ndim != 2 or B.shape[1] != N_SECTORS for B in Bs):
        raise ValueError(f"sector arrays must be (n, {N_SECTORS}) and (m, {N_SECTORS}), "
                         f"got {A.shape} and {[B.shape for B in Bs]}")
    n, sizes = len(A), [len(B) for B in Bs]
    stacked = np.concatenate(Bs)
    values = np.intersect1d(np.unique(A), np.unique(stacked))
    values = values[values != UNKNOWN]
    if n == 0 or len(stacked) == 0 or len(values) == 0:
        return [np.zeros((N_SECTORS, n, m), dtype=np.float32) for m in sizes]
    rolled = A[:, _ROLL_INDEX].transpose(1, 0, 2)  # (12, n, 12), as in sector_similarity_all
    left = _one_hot(rolled, values).reshape(N_SECTORS * n, -1)
    counts = (left @ _one_hot(stacked, values).T).reshape(N_SECTORS, n, -1) / np.float32(N_SECTORS)
    return np.split(counts, np.cumsum(sizes)[:-1], axis=2)


def sector_similarity(A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 8: S_ij = max_k sim(Rot(a_i, k), b_j) and the arg-max shift.

    Returns S (n, m) float32 in [0, 1] and best_shift (n, m) int in [0, 12). Ties (frequent for
    symmetric nodes) resolve to the smallest shift.
    """
    all_k = sector_similarity_all(A, B)
    return all_k.max(axis=0), all_k.argmax(axis=0)


def mutual_knn(S: np.ndarray, k: int, min_similarity: float = 0.0) -> np.ndarray:
    """Mutual top-k pairs of a similarity matrix: (c, 2) int (row, column).

    (i, j) is kept when S_ij is among the k largest of row i *and* of column j, ties included
    (a tie at rank k keeps every tied entry, so equally good candidates are not dropped at
    random), and S_ij >= min_similarity and S_ij > 0.
    """
    S = np.asarray(S)
    if k < 1:
        raise ValueError(f"mutual_knn: k must be >= 1, got {k}")
    if S.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    n, m = S.shape
    row_kth = -np.partition(-S, min(k, m) - 1, axis=1)[:, min(k, m) - 1]
    col_kth = -np.partition(-S, min(k, n) - 1, axis=0)[min(k, n) - 1, :]
    keep = (S >= row_kth[:, None]) & (S >= col_kth[None, :]) & (S >= min_similarity) & (S > 0)
    return np.argwhere(keep)


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
    identity = (np.eye(2), np.zeros(2), np.zeros(c, dtype=bool))
    if c < 2:
        return identity
    n_all = c * (c - 1) // 2
    if n_all <= iterations:
        a, b = _all_pairs(c)
    else:
        a = rng.integers(0, c, size=iterations)
        b = (a + rng.integers(1, c, size=iterations)) % c
    dp, dq = P[b] - P[a], Q[b] - Q[a]
    len_p, len_q = np.linalg.norm(dp, axis=1), np.linalg.norm(dq, axis=1)
    # A rigid map preserves distances: skip samples that cannot fit, and degenerate ones.
    valid = (np.abs(len_p - len_q) <= 2.0 * threshold_m) & (len_p > threshold_m)
    if not valid.any():
        return identity
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
        return identity
    mask = inl[best]
    R = np.array([[cos[best], -sin[best]], [sin[best], cos[best]]])
    tt = t[best]
    delta = threshold_m / 2.0 if huber_delta_m is None else huber_delta_m
    for _ in range(refit_iterations):
        res = np.linalg.norm(P[mask] @ R.T + tt - Q[mask], axis=1)
        R_new, t_new = _procrustes(P[mask], Q[mask], _huber_weights(res, delta))
        res_all = np.linalg.norm(P @ R_new.T + t_new - Q, axis=1)
        new_mask = res_all < threshold_m
        if pair_ok is not None:
            new_mask &= pair_ok(np.array([math.atan2(R_new[1, 0], R_new[0, 0])]))[0]
        if new_mask.sum() < 2:
            break
        R, tt = R_new, t_new
        if np.array_equal(new_mask, mask):
            break
        mask = new_mask
    return R, tt, mask


def heading_checker(
    sim_all_pairs: np.ndarray, best_sim: np.ndarray, ref_a: float, ref_b: float, slack: float
) -> Callable[[np.ndarray], np.ndarray]:
    """A ``pair_ok`` for ``ransac_se2``: is each pair's similarity at the implied shift near its best?

    sim_all_pairs: (12, c) similarity of each pair at every shift; best_sim: (c,) its maximum.
    ref_a, ref_b: reference headings (radians) of the two sector frames. The shift implied by a
    rotation ``theta`` is ``(theta + ref_a - ref_b) / 30 deg``; both neighbouring integer shifts
    are tried, so rotations that are not multiples of 30 deg are handled.
    """

    def ok(thetas: np.ndarray) -> np.ndarray:
        k = (np.asarray(thetas) + ref_a - ref_b) / SECTOR_ANGLE
        k0 = np.floor(k).astype(np.int64) % N_SECTORS
        k1 = (k0 + 1) % N_SECTORS
        at = np.maximum(sim_all_pairs[k0], sim_all_pairs[k1])  # (H, c)
        return at >= best_sim[None, :] - slack - 1e-6

    return ok


def implied_shift(theta: float, ref_a: float, ref_b: float) -> int:
    """The integer sector shift that takes a-frame sectors into b's frame under rotation theta."""
    return int(round((theta + ref_a - ref_b) / SECTOR_ANGLE)) % N_SECTORS


def match(traj: SectorNodes, summary: SectorNodes, params: MatchParams,
          rng: np.random.Generator) -> MatchResult:
    """Match a trajectory's nodes to a summary's: Eq. 8 + mutual KNN, then Eq. 9 (RANSAC SE(2)).

    Both arguments need ``node_xy`` (K, 2) metres, ``sectors`` (K, 12) labels in one shared label
    vocabulary, and ``reference_yaw`` (radians). The transform maps the trajectory's frame into
    the summary's. Both need ``edges`` too (an (E, 2) array or a set of pairs). ``accepted``
    requires at least ``min_inliers`` consistent pairs, an inlier ratio of at least ``min_score``
    and ``min_edge_support`` edges of the trajectory found again in the summary.
    """
    return match_similarity(traj, summary, sector_similarity_all(traj.sectors, summary.sectors),
                            params, rng)


def match_similarity(traj: SectorNodes, summary: SectorNodes, sim_all: np.ndarray,
                     params: MatchParams, rng: Any) -> MatchResult:
    """``match`` given ``sim_all = sector_similarity_all(traj.sectors, summary.sectors)`` (from
    ``sector_similarity_batch`` when a trajectory meets several summaries). ``rng``: anything
    with a numpy Generator's ``integers``, drawn from only when there are more pairs of
    correspondences than ``ransac_iterations``."""
    S = sim_all.max(axis=0)
    pairs = mutual_knn(S, params.mutual_k, params.min_node_similarity)
    empty = np.zeros(len(pairs), dtype=bool)
    if len(pairs) < max(2, params.min_inliers):
        return MatchResult(0.0, None, pairs, empty, False)
    i, j = pairs[:, 0], pairs[:, 1]
    pair_ok = heading_checker(sim_all[:, i, j], S[i, j], float(traj.reference_yaw),
                              float(summary.reference_yaw), params.heading_slack)
    R, t, inliers = ransac_se2(
        np.asarray(traj.node_xy)[i], np.asarray(summary.node_xy)[j],
        params.ransac_threshold_m, params.ransac_iterations, rng,
        huber_delta_m=params.huber_delta_m, refit_iterations=params.refit_iterations,
        pair_ok=pair_ok,
    )
    n_in = len(np.unique(i[inliers]))
    if n_in < 2:
        return MatchResult(0.0, None, pairs, inliers, False)
    # |C| counts trajectory nodes, not pairs: a node with k tied candidates adds k pairs of which
    # at most one can be right, and should not dilute the ratio k-fold.
    score = n_in / len(np.unique(i))
    T = Transform2D.from_rt(R, t)
    support = edge_support(pairs[inliers], traj.edges, summary.edges,
                           T.apply(np.asarray(traj.node_xy)), np.asarray(summary.node_xy))
    accepted = (n_in >= params.min_inliers and score >= params.min_score
                and support >= params.min_edge_support)
    return MatchResult(float(score), T, pairs, inliers, accepted, support)


def _edge_set(edges: Any) -> set[tuple[int, int]]:
    if isinstance(edges, (set, frozenset)):
        return {(min(a, b), max(a, b)) for a, b in edges}
    arr = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    return {(min(a, b), max(a, b)) for a, b in arr.tolist()}


def edge_support(inlier_pairs: np.ndarray, traj_edges: Any, summary_edges: Any,
                 moved_xy: np.ndarray, summary_xy: np.ndarray) -> int:
    """Trajectory edges whose ends are inliers matched to one summary node or to the two ends of
    a summary edge. Each trajectory node takes its closest inlier pair (``moved_xy``: trajectory
    nodes in the summary frame)."""
    best: dict[int, tuple[float, int]] = {}
    for i, j in np.asarray(inlier_pairs).tolist():
        d = float(np.linalg.norm(moved_xy[i] - summary_xy[j]))
        if i not in best or d < best[i][0]:
            best[i] = (d, j)
    if len(best) < 2:
        return 0
    target = _edge_set(summary_edges)
    support = 0
    for a, b in _edge_set(traj_edges):
        if a in best and b in best:
            u, v = best[a][1], best[b][1]
            support += u == v or (min(u, v), max(u, v)) in target
    return support


# -- learned verification of a pose --------------------------------------------------------------

# The evidence ``pose_evidence`` measures, in the order the verifier's weights are reported.
EVIDENCE = ("inliers", "pairs", "score", "edge_support", "nodes", "summary_nodes", "overlap",
            "agreeing", "category_agree", "category_conflict", "summary_near", "summary_covered",
            "edges_landed", "edges_agree")


@dataclass
class VerifierConfig:
    """A logistic verifier of a match's pose (``memory.verifier``; fitted by ``trajrag corpus
    fit-verifier``). It accepts when ``bias + sum_f weights[f] * log1p(evidence[f]) >=
    threshold`` and the match has at least ``min_inliers`` consistent pairs; names of
    ``EVIDENCE`` missing from ``weights`` weigh 0."""

    enabled: bool
    min_inliers: int
    threshold: float
    bias: float
    weights: dict[str, float]

    def __post_init__(self) -> None:
        unknown = sorted(set(self.weights) - set(EVIDENCE))
        if unknown:
            raise ValueError(f"memory.verifier.weights: unknown evidence {unknown}; known: {list(EVIDENCE)}")

    def logit(self, evidence: dict[str, float]) -> float:
        return self.bias + sum(w * math.log1p(evidence[name]) for name, w in self.weights.items())


def pose_evidence(traj: SectorNodes, summary: SectorNodes, result: MatchResult,
                  min_similarity: float, radius_m: float) -> dict[str, float]:
    """What supports a match's pose beyond its inlier pairs (all counts >= 0).

    The rule-based acceptance sees only the mutual-KNN pairs; with the pose fixed, every
    trajectory node can be checked against the summary node it lands on (the nearest within
    ``radius_m``): ``overlap`` nodes land on one, ``agreeing`` of those look alike at the
    implied sector shift (similarity >= ``min_similarity``), and over their sectors
    ``category_agree`` / ``category_conflict`` count object labels that are the same / another
    object. A true pose of a place seen twice lands many alike nodes; a chance alignment of two
    look-alike homes lands nodes whose objects differ."""
    T = result.transform
    xy, sxy = np.asarray(traj.node_xy, dtype=np.float64), np.asarray(summary.node_xy, dtype=np.float64)
    evidence = {"inliers": result.n_inliers, "pairs": len(result.pairs), "score": result.score,
                "edge_support": result.edge_support, "nodes": len(xy), "summary_nodes": len(sxy),
                "overlap": 0, "agreeing": 0, "category_agree": 0, "category_conflict": 0,
                "summary_near": 0, "summary_covered": 0, "edges_landed": 0, "edges_agree": 0}
    if T is None or len(xy) == 0 or len(sxy) == 0:
        return evidence
    d = np.linalg.norm(T.apply(xy)[:, None, :] - sxy[None, :, :], axis=2)
    nearest = d.argmin(axis=1)
    lands = d[np.arange(len(xy)), nearest] <= radius_m
    if not lands.any():
        return evidence
    a = rotate_sectors(np.asarray(traj.sectors)[lands],
                       implied_shift(T.theta, float(traj.reference_yaw), float(summary.reference_yaw)))
    b = np.asarray(summary.sectors)[nearest[lands]]
    same = (a == b) & (a != UNKNOWN)
    objects = (a >= 0) & (b >= 0)
    # From the summary's side: its nodes inside the explored area (near some trajectory node)
    # and those a trajectory node lands on. A wrong pose leaves the area's summary nodes bare.
    to_summary = d.min(axis=0)
    # Trajectory edges whose two ends land, and those landing on one summary node or an edge.
    landed = np.where(lands, nearest, -1)
    target = _edge_set(summary.edges)
    ends = [(landed[u], landed[v]) for u, v in _edge_set(traj.edges) if landed[u] >= 0 and landed[v] >= 0]
    evidence.update(overlap=int(lands.sum()),
                    agreeing=int((same.mean(axis=1) >= min_similarity).sum()),
                    category_agree=int((same & objects).sum()),
                    category_conflict=int((objects & (a != b)).sum()),
                    summary_near=int((to_summary <= 2.0 * radius_m).sum()),
                    summary_covered=int((to_summary <= radius_m).sum()),
                    edges_landed=len(ends),
                    edges_agree=sum(u == v or (min(u, v), max(u, v)) in target for u, v in ends))
    return evidence


# -- candidate prefilter ------------------------------------------------------------------------

# Sector labels are int8 in the store: codes from UNKNOWN (-3) to 127 shift to 0..130.
_LABEL_SPAN = 131
_OFFSETS = np.arange(1, N_SECTORS // 2 + 1)  # every distinct angular offset on the 12-cycle
# Nodes added since the inverted lists were laid out are gathered row by row at search time;
# beyond this share of all rows the lists are laid out contiguously again (a copy of the index,
# ~0.1 s at 100k nodes; rare, since the share is of a growing index).
_MAX_EXTRA_SHARE = 0.1


def node_descriptors(sectors: np.ndarray, dim: int) -> np.ndarray:
    """Rotation-invariant node descriptors (K, dim) float32, unit L2 norm (zero if no evidence).

    Each node contributes the words (label at sector i, label at sector i + d, d) for every
    sector i and offset d = 1..6: which labels it sees and at what angle from one another.
    A cyclic shift of the sectors maps the multiset of words onto itself, so no heading
    alignment is needed. Words with an UNKNOWN side carry no evidence. Words are hashed into
    ``dim`` bins; counts are square-rooted (damping the ubiquitous free/obstacle words) and
    normalised, so the dot product of two descriptors approximates Eq. 8's similarity cheaply.
    """
    a = np.asarray(sectors, dtype=np.int64)
    k = len(a)
    if k == 0:
        return np.zeros((0, dim), dtype=np.float32)
    idx = (np.arange(N_SECTORS)[:, None] + _OFFSETS[None, :]) % N_SECTORS  # (12, 6)
    first = np.broadcast_to(a[:, :, None], (k, N_SECTORS, len(_OFFSETS)))
    second = a[:, idx]
    valid = (first != UNKNOWN) & (second != UNKNOWN)
    word = ((first - UNKNOWN) * _LABEL_SPAN + (second - UNKNOWN)) * len(_OFFSETS) + _OFFSETS - 1
    # Multiplicative hashing spreads the structured word ids over all bins.
    bins = (word * 2654435761) % (2**32) % dim
    rows = np.broadcast_to(np.arange(k)[:, None, None], bins.shape)
    flat = np.bincount((rows * dim + bins)[valid], minlength=k * dim)
    desc = np.sqrt(flat.reshape(k, dim).astype(np.float32))
    norm = np.linalg.norm(desc, axis=1, keepdims=True)
    return desc / np.where(norm > 0, norm, 1.0)


@dataclass(frozen=True)
class IVFParams:
    """Inverted-file search over node descriptors (see ``NodeIndex``); configs/memory.yaml."""

    min_nodes: int  # below this many nodes, exact search
    lists_per_sqrt: float  # lists = lists_per_sqrt * sqrt(nodes at training)
    probes: int  # lists searched per query node
    train_sample: int  # nodes the k-means sees
    kmeans_iterations: int
    seed: int


class NodeIndex:
    """In-memory index of every summary node's descriptor, for picking candidate groups.

    ``candidates(sectors, n, neighbours)``: each node of the query retrieves its ``neighbours``
    most similar summary nodes (dot product of ``node_descriptors``) and votes for their groups;
    the ``n`` best-voted groups are returned. Node-level votes keep partial trajectories
    findable: a group-level bag of labels is dominated by the labels every home has.

    Search is exact over all N nodes (one (K x D) @ (D x N) product) until N reaches
    ``ivf.min_nodes``; then an inverted file takes over: spherical k-means splits the nodes into
    ~``lists_per_sqrt * sqrt(N)`` lists, and each query node searches only the ``probes`` lists
    whose centroids are closest, so a query costs O(sqrt(N)) instead of O(N). The lists are
    retrained whenever the index has doubled since the last training (amortised O(1) per
    insert); nodes added in between join their nearest list.

    At training the descriptors are reordered so that each list is one contiguous block of
    rows: a probe is then a slice (no gather of scattered rows, which cost more than the dot
    products). Nodes added since sit at the end, listed per inverted list in ``_extra``.
    """

    def __init__(self, dim: int, ivf: IVFParams | None = None) -> None:
        self.dim = dim
        self.ivf = ivf
        self._desc = np.zeros((1024, dim), dtype=np.float32)
        self._owner = np.full(1024, -1, dtype=np.int64)
        self._rows: dict[int, np.ndarray] = {}
        self._used = 0
        self._dead = 0
        self._centroids: np.ndarray | None = None
        # Trained rows of list l: [_bounds[l], _bounds[l + 1]); rows that joined it since: _extra[l]
        # (a numpy copy of each in _extra_rows, refreshed when the list grew).
        self._bounds: list[int] = [0]
        self._extra: list[list[int]] = []
        self._extra_rows: list[np.ndarray] = []
        self._list_of = np.full(1024, -1, dtype=np.int64)  # inverted list of each row (-1: none)
        self._trained_at = 0

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def n_nodes(self) -> int:
        return self._used - self._dead

    @property
    def _n_extra(self) -> int:
        """Rows added since the lists were laid out: all of them sit after the blocks."""
        return self._used - self._bounds[-1]

    def set_group(self, group_id: int, sectors: np.ndarray) -> None:
        """Index (or re-index) all nodes of a group."""
        desc = node_descriptors(sectors, self.dim)
        rows = self._rows.get(group_id)
        if rows is not None and len(rows) <= len(desc):
            extra = self._alloc(len(desc) - len(rows))
            rows = np.concatenate([rows, extra])
        else:
            if rows is not None:
                self.remove_group(group_id)
            extra = rows = self._alloc(len(desc))
        self._desc[rows] = desc
        self._owner[rows] = group_id
        self._rows[group_id] = rows
        if self._centroids is not None and len(extra):
            # Rows already indexed keep their list: filling UNKNOWN sectors moves them little.
            lists = (desc[-len(extra):] @ self._centroids.T).argmax(1)
            self._list_of[extra] = lists
            for row, lst in zip(extra.tolist(), lists.tolist()):
                self._extra[lst].append(row)
            if self._n_extra > self._used * _MAX_EXTRA_SHARE:
                self._repack()  # lays the lists out contiguously again
        self._maybe_train()

    def remove_group(self, group_id: int) -> None:
        rows = self._rows.pop(group_id, None)
        if rows is None:
            return
        self._desc[rows] = 0.0
        self._owner[rows] = -1
        self._dead += len(rows)
        if self._dead > max(1024, self._used // 4):
            self._repack()

    def _alloc(self, n: int) -> np.ndarray:
        if self._used + n > len(self._desc):
            grow = max(n, len(self._desc))
            self._desc = np.concatenate([self._desc, np.zeros((grow, self.dim), np.float32)])
            self._owner = np.concatenate([self._owner, np.full(grow, -1, np.int64)])
            self._list_of = np.concatenate([self._list_of, np.full(grow, -1, np.int64)])
        rows = np.arange(self._used, self._used + n)
        self._used += n
        return rows

    def _repack(self) -> None:
        """Drop removed rows; with an inverted file, lay the lists out contiguously again."""
        live = np.where(self._owner[: self._used] >= 0)[0]
        self._layout(live, self._list_of[live] if self._centroids is not None else None)

    def _layout(self, live: np.ndarray, lists: np.ndarray | None) -> None:
        """Keep only rows ``live``, ordered by inverted list ``lists`` (stable) when given."""
        order = np.argsort(lists, kind="stable") if lists is not None else np.arange(len(live))
        keep = live[order]
        remap = np.full(self._used, -1, dtype=np.int64)
        remap[keep] = np.arange(len(keep))
        n = len(keep)
        self._desc[:n], self._owner[:n] = self._desc[keep], self._owner[keep]
        self._list_of[:n] = self._list_of[keep] if lists is None else lists[order]
        self._desc[n: self._used] = 0.0
        self._owner[n: self._used] = -1
        self._list_of[n: self._used] = -1
        self._rows = {g: remap[r] for g, r in self._rows.items()}
        if lists is not None:
            n_lists = len(self._centroids)
            self._bounds = np.searchsorted(self._list_of[:n], np.arange(n_lists + 1)).tolist()
            self._extra = [[] for _ in range(n_lists)]
            self._extra_rows = [np.zeros(0, np.int64) for _ in range(n_lists)]
        self._used, self._dead = n, 0

    def _maybe_train(self) -> None:
        ivf = self.ivf
        if ivf is None or self.n_nodes < ivf.min_nodes or self.n_nodes < 2 * self._trained_at:
            return
        live = np.where(self._owner[: self._used] >= 0)[0]
        rng = np.random.default_rng(ivf.seed)
        sample = self._desc[rng.choice(live, min(len(live), ivf.train_sample), replace=False)]
        n_lists = min(len(sample), int(math.ceil(ivf.lists_per_sqrt * math.sqrt(len(live)))))
        centroids = sample[rng.choice(len(sample), n_lists, replace=False)]
        for _ in range(ivf.kmeans_iterations):  # spherical k-means: unit centroids, dot products
            nearest = (sample @ centroids.T).argmax(axis=1)
            sums = np.zeros_like(centroids)
            np.add.at(sums, nearest, sample)
            norms = np.linalg.norm(sums, axis=1, keepdims=True)
            centroids = np.where(norms > 0, sums / np.maximum(norms, 1e-12), centroids)
        self._centroids = centroids.astype(np.float32)
        assign = np.concatenate([(self._desc[chunk] @ self._centroids.T).argmax(axis=1)
                                 for chunk in np.array_split(live, max(1, len(live) // 8192))])
        self._layout(live, assign)
        self._trained_at = len(live)

    def _probed(self, query_node: np.ndarray, lists: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Similarities of one query node to the rows of ``lists``, and those rows' groups
        (-1: a removed row)."""
        sims, owners = [], []
        for lst in lists:
            lo, hi = self._bounds[lst], self._bounds[lst + 1]
            sims.append(self._desc[lo:hi] @ query_node)
            owners.append(self._owner[lo:hi])
            if self._extra[lst]:
                if len(self._extra_rows[lst]) != len(self._extra[lst]):
                    self._extra_rows[lst] = np.asarray(self._extra[lst], dtype=np.int64)
                rows = self._extra_rows[lst]
                sims.append(self._desc[rows] @ query_node)
                owners.append(self._owner[rows])
        return np.concatenate(sims), np.concatenate(owners)

    def candidates(self, sectors: np.ndarray, n: int, neighbours: int) -> list[int]:
        """Group ids of the ``n`` best-voted groups for a query's sector vectors, best first.

        Each query node retrieves its ``neighbours`` most similar summary nodes; a retrieved
        node votes for its group with sqrt(similarity - the query node's next-best similarity),
        so a node that looks like many others (a plain corridor) casts almost no vote while a
        distinctive one counts; a group takes its best vote from each query node.
        """
        if not self._rows or len(sectors) == 0:
            return []
        return _ranked(*_top_votes(*self._similarities(sectors), neighbours), n)

    def node_votes(self, sectors: np.ndarray, neighbours: int) -> list[dict[int, float]]:
        """Per query node, its vote for each group (see ``candidates``); callers that see the
        same nodes again (a navigator re-deciding along one trajectory) can cache them."""
        if not self._rows or len(sectors) == 0:
            return [{} for _ in range(len(sectors))]
        return _votes(*self._similarities(sectors), neighbours)

    def _similarities(self, sectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Query nodes x searched nodes: descriptor similarities (-inf: padding) and the searched
        nodes' groups (-1: none), per column (exact search) or per entry (inverted file)."""
        query = node_descriptors(sectors, self.dim)
        if self._centroids is None:
            return query @ self._desc[: self._used].T, self._owner[: self._used]
        probes = min(self.ivf.probes, len(self._centroids))
        near = np.argpartition(-(query @ self._centroids.T), probes - 1, axis=1)[:, :probes]
        probed = [self._probed(q, lists) for q, lists in zip(query, near.tolist())]
        # One (query nodes x longest) matrix: padding has no similarity and no group.
        width = max(len(sims) for sims, _ in probed)
        sim = np.full((len(probed), width), -np.inf, dtype=np.float32)
        owner = np.full((len(probed), width), -1, dtype=np.int64)
        for k, (sims, owners) in enumerate(probed):
            sim[k, : len(sims)], owner[k, : len(owners)] = sims, owners
        return sim, owner


def _votes(sim: np.ndarray, owner: np.ndarray, neighbours: int) -> list[dict[int, float]]:
    """Per row of ``sim`` (query nodes x indexed nodes; -inf: no node there): the best vote for
    each group among the row's ``neighbours`` most similar nodes (see ``NodeIndex.candidates``).
    ``owner`` holds the indexed nodes' groups (-1: none), per column or per entry."""
    groups, weights = _top_votes(sim, owner, neighbours)
    votes = []
    for q_owners, q_weights in zip(groups.tolist(), weights.tolist()):
        best: dict[int, float] = {}
        for g, w in zip(q_owners, q_weights):
            if g >= 0 and w > best.get(g, 0.0):
                best[g] = w
        votes.append(best)
    return votes


def _ranked(groups: np.ndarray, weights: np.ndarray, n: int) -> list[int]:
    """``rank_votes(_votes(...), n)`` from ``_top_votes``' arrays without a dict per query node,
    to the bit: each group's votes (its best per query node) are summed in float64 in query
    node order, as ``rank_votes`` adds them."""
    rows = np.broadcast_to(np.arange(len(groups))[:, None], groups.shape).ravel()
    groups, weights = groups.ravel(), weights.ravel().astype(np.float64)
    keep = (groups >= 0) & (weights > 0)
    rows, groups, weights = rows[keep], groups[keep], weights[keep]
    # The best vote of each (query node, group): sorted by node, group, vote descending.
    order = np.lexsort((-weights, groups, rows))
    rows, groups, weights = rows[order], groups[order], weights[order]
    first = np.ones(len(rows), dtype=bool)
    first[1:] = (rows[1:] != rows[:-1]) | (groups[1:] != groups[:-1])
    ids, dense = np.unique(groups[first], return_inverse=True)
    scores = np.bincount(dense, weights=weights[first], minlength=len(ids))
    ranked = np.lexsort((ids, -scores))[:n]
    return ids[ranked].tolist()


def _top_votes(sim: np.ndarray, owner: np.ndarray, neighbours: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``sim``: the groups of its ``neighbours`` most similar nodes and their votes
    (sqrt of the margin over the next node), (rows, m) each; see ``_votes``."""
    total = sim.shape[1]
    if total == 0:
        return np.zeros((len(sim), 0), np.int64), np.zeros((len(sim), 0), np.float32)
    m = min(neighbours, total)
    if m < total:
        # The m + 1 largest per row (partitioning ``sim`` itself: no negated copy).
        top = np.argpartition(sim, total - m - 1, axis=1)[:, total - m - 1:]
        sims = np.take_along_axis(sim, top, axis=1)
        order = np.argsort(-sims, axis=1)
        top, sims = np.take_along_axis(top, order, 1), np.take_along_axis(sims, order, 1)
        # Similarities are >= 0: a row with no (m + 1)-th node measures its margin from 0.
        weights = np.sqrt(np.maximum(sims[:, :m] - np.maximum(sims[:, m:], 0.0), 0.0))
        top = top[:, :m]
    else:
        top = np.broadcast_to(np.arange(total), sim.shape)
        weights = np.sqrt(np.maximum(sim, 0.0))
    groups = owner[top] if owner.ndim == 1 else np.take_along_axis(owner, top, axis=1)
    return groups, weights


def rank_votes(votes: Iterable[dict[int, float]], n: int) -> list[int]:
    """The ``n`` groups with the largest summed node votes, best first (ties: lower id)."""
    scores: dict[int, float] = {}
    for best in votes:
        for g, w in best.items():
            scores[g] = scores.get(g, 0.0) + w
    ranked = sorted(scores.items(), key=lambda gw: (-gw[1], gw[0]))
    return [g for g, _ in ranked[:n]]
