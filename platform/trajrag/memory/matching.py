"""Semantic (Eq. 8) and geometric (Eq. 9) matching of a topo-polar trajectory to a summary, and
the evidence a learned verifier weighs (``pose_evidence``).

Which groups a trajectory is matched against at all is the prefilter's call
(``memory.prefilter``); the SE(2) transform and its RANSAC estimation live in ``memory.se2``.

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
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from trajrag.memory.se2 import Transform2D, ransac_se2
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

    @functools.cached_property
    def n_inliers(self) -> int:
        """Trajectory nodes with a consistent pair."""
        return int(len(np.unique(self.pairs[self.inliers, 0]))) if len(self.pairs) else 0



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
    if k == 1:  # the largest, as the partitions below find it, a few times faster
        row_kth, col_kth = S.max(axis=1), S.max(axis=0)
    else:
        row_kth = -np.partition(-S, min(k, m) - 1, axis=1)[:, min(k, m) - 1]
        col_kth = -np.partition(-S, min(k, n) - 1, axis=0)[min(k, n) - 1, :]
    keep = (S >= row_kth[:, None]) & (S >= col_kth[None, :]) & (S >= min_similarity) & (S > 0)
    return np.argwhere(keep)



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
    return fit_pose(traj, summary, sim_all, *node_pairs(sim_all, params), params, rng)


def node_pairs(sim_all: np.ndarray, params: MatchParams) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 8's S (each pair's best similarity over the 12 shifts) and its mutual-KNN pairs
    (``mutual_knn``), ordered by trajectory node: the pairs ``fit_pose`` fits."""
    S = sim_all.max(axis=0)
    return S, mutual_knn(S, params.mutual_k, params.min_node_similarity)


def fit_pose(traj: SectorNodes, summary: SectorNodes, sim_all: np.ndarray, S: np.ndarray,
             pairs: np.ndarray, params: MatchParams, rng: Any, *,
             edge_sets: tuple[set, set] | None = None, skip_hopeless: bool = False) -> MatchResult:
    """The rest of ``match_similarity`` after ``node_pairs``: Eq. 9's RANSAC SE(2) over the
    pairs, with the heading check, then the acceptance thresholds.

    The writer's fast path: ``edge_sets``, the trajectory's and the summary's edges as sets of
    (low, high) node pairs (made once per trajectory, and kept by a summary); ``skip_hopeless``
    returns a match that no pose could make accepted (``could_be_accepted``) as rejected
    without its RANSAC: the same accepted matches, but a rejected one may lack its pose."""
    empty = np.zeros(len(pairs), dtype=bool)
    if len(pairs) < max(2, params.min_inliers):
        return MatchResult(0.0, None, pairs, empty, False)
    if skip_hopeless:
        edge_sets = edge_sets or (edge_set(traj.edges), edge_set(summary.edges))
        if not could_be_accepted(pairs, traj, summary, *edge_sets, params):
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
    support = edge_support(pairs[inliers], *(edge_sets or (traj.edges, summary.edges)),
                           T.apply(np.asarray(traj.node_xy)), np.asarray(summary.node_xy),
                           sets_given=edge_sets is not None)
    accepted = (n_in >= params.min_inliers and score >= params.min_score
                and support >= params.min_edge_support)
    return MatchResult(float(score), T, pairs, inliers, accepted, support)


# Metres of rounding a rigid transform computed in float64 may add to a distance.
_RIGID_SLACK_M = 1e-6


def could_be_accepted(pairs: np.ndarray, traj: SectorNodes, summary: SectorNodes,
                      traj_edges: set, summary_edges: set, params: MatchParams) -> bool:
    """Whether any pose could make a match of ``pairs`` accepted (False: rejected whatever
    RANSAC finds). ``pairs`` come ordered by trajectory node, as ``mutual_knn`` gives them.

    An edge (a, b) of the trajectory is supported only by inlier pairs (a, u) and (b, v) with
    u == v or (u, v) a summary edge; and two inliers of one rigid pose lie within the RANSAC
    threshold of their partners each, so their distances agree: | |p - p'| - |q - q'| | < 2 *
    threshold. Hence n inlier nodes need n nodes each with a pair that agrees so with n - 1
    pairs of other nodes, which bounds the inlier count and ratio, and a supported edge needs
    two such pairs that agree with each other. The first check (no distances) is the cheap one."""
    by_node: dict[int, list[tuple[int, int]]] = {}
    for k, (a, u) in enumerate(pairs.tolist()):
        by_node.setdefault(a, []).append((k, u))
    edge_pairs = [(k, m) for a, b in traj_edges for k, u in by_node.get(a, ()) for m, v in by_node.get(b, ())
                  if u == v or (min(u, v), max(u, v)) in summary_edges]
    if params.min_edge_support >= 1 and not edge_pairs:
        return False
    i = pairs[:, 0]
    xy = np.asarray(traj.node_xy, dtype=np.float64)[i]
    p = xy[:, 0] + 1j * xy[:, 1]
    xy = np.asarray(summary.node_xy, dtype=np.float64)[pairs[:, 1]]
    q = xy[:, 0] + 1j * xy[:, 1]
    reach = 2.0 * params.ransac_threshold_m + _RIGID_SLACK_M
    agree = (np.abs(np.abs(p[:, None] - p) - np.abs(q[:, None] - q)) < reach) & (i[:, None] != i)
    # The largest n with n nodes whose best pair agrees with >= n - 1 pairs of other nodes.
    starts = np.flatnonzero(np.concatenate([[True], i[1:] != i[:-1]]))
    ranked = np.sort(np.maximum.reduceat(agree.sum(axis=1), starts))[::-1]
    most_inliers = int((ranked >= np.arange(len(ranked))).sum())
    if most_inliers < params.min_inliers or most_inliers / len(ranked) < params.min_score:
        return False
    return params.min_edge_support < 1 or any(k == m or agree[k, m] for k, m in edge_pairs)


def edge_set(edges: Any) -> set[tuple[int, int]]:
    """Edges (an (E, 2) array or node pairs) as a set of (low, high) node pairs."""
    if isinstance(edges, (set, frozenset)):
        return {(min(a, b), max(a, b)) for a, b in edges}
    arr = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    return {(min(a, b), max(a, b)) for a, b in arr.tolist()}


def edge_support(inlier_pairs: np.ndarray, traj_edges: Any, summary_edges: Any,
                 moved_xy: np.ndarray, summary_xy: np.ndarray, *, sets_given: bool = False) -> int:
    """Trajectory edges whose ends are inliers matched to one summary node or to the two ends of
    a summary edge. Each trajectory node takes its closest inlier pair (``moved_xy``: trajectory
    nodes in the summary frame). ``sets_given``: both edge arguments are sets of (low, high)
    pairs already."""
    best = closest_pairs(inlier_pairs, moved_xy, summary_xy)
    if len(best) < 2:
        return 0
    target = summary_edges if sets_given else edge_set(summary_edges)
    support = 0
    for a, b in (traj_edges if sets_given else edge_set(traj_edges)):
        if a in best and b in best:
            u, v = best[a], best[b]
            support += u == v or (min(u, v), max(u, v)) in target
    return support


def closest_pairs(pairs: np.ndarray, moved_xy: np.ndarray, target_xy: np.ndarray) -> dict[int, int]:
    """Each node i of ``pairs`` (i, j): the j of its pair closest to ``moved_xy[i]`` (the first
    of equally close ones). A node with one pair takes it unmeasured."""
    pairs = np.asarray(pairs).tolist()
    several = {i for i, n in Counter(i for i, _ in pairs).items() if n > 1}
    best: dict[int, tuple[float, int]] = {}
    for i, j in pairs:
        if i not in several:
            best[i] = (0.0, j)
            continue
        d = float(np.linalg.norm(moved_xy[i] - target_xy[j]))
        if i not in best or d < best[i][0]:
            best[i] = (d, j)
    return {i: j for i, (_, j) in best.items()}


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
    target = edge_set(summary.edges)
    ends = [(landed[u], landed[v]) for u, v in edge_set(traj.edges) if landed[u] >= 0 and landed[v] >= 0]
    evidence.update(overlap=int(lands.sum()),
                    agreeing=int((same.mean(axis=1) >= min_similarity).sum()),
                    category_agree=int((same & objects).sum()),
                    category_conflict=int((objects & (a != b)).sum()),
                    summary_near=int((to_summary <= 2.0 * radius_m).sum()),
                    summary_covered=int((to_summary <= radius_m).sum()),
                    edges_landed=len(ends),
                    edges_agree=sum(u == v or (min(u, v), max(u, v)) in target for u, v in ends))
    return evidence
