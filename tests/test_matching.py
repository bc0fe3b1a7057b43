"""Semantic (Eq. 8) and geometric (Eq. 9) matching of topo-polar trajectories."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from trajrag.config import load
from trajrag.memory.matching import (
    EVIDENCE,
    VerifierConfig,
    edge_set,
    fit_pose,
    match,
    match_similarity,
    mutual_knn,
    node_pairs,
    pose_evidence,
    rotate_sectors,
    sector_similarity,
    sector_similarity_all,
    sector_similarity_batch,
)
from trajrag.memory.prefilter import (
    IVFParams,
    NodeIndex,
    _best_of,
    _best_votes,
    _positive_votes,
    _query_key,
    _top_votes,
    _votes,
    node_descriptors,
    rank_vote_arrays,
    rank_votes,
)
from trajrag.memory.se2 import Transform2D, ransac_se2
from trajrag.memory.summary import Summary, fold_nodes
from trajrag.memory.synthetic import perturb, sample_sectors, synthetic_scene, synthetic_trajectory
from trajrag.topo.labels import FREE, UNKNOWN


@pytest.fixture(scope="module")
def params():
    return load("memory").match_params()


def _angle_error_deg(a: float, b: float) -> float:
    return abs(math.degrees((a - b + math.pi) % (2 * math.pi) - math.pi))


def test_sector_similarity_is_max_over_rotations_and_matches_a_plain_loop():
    rng = np.random.default_rng(0)
    A = rng.integers(-3, 6, size=(7, 12))
    B = rng.integers(-3, 6, size=(9, 12))
    A[2] = rng.integers(-2, 6, size=12)  # fully observed
    B[4] = np.roll(A[2], 5)  # a node seen again from a heading 5 sectors away
    S, shift = sector_similarity(A, B)
    loop = np.zeros((7, 9))
    for i in range(7):
        for j in range(9):
            loop[i, j] = max(((np.roll(A[i], k) == B[j]) & (B[j] != UNKNOWN)).sum() / 12 for k in range(12))
    np.testing.assert_allclose(S, loop, atol=1e-6)
    assert S[2, 4] == pytest.approx(1.0) and shift[2, 4] == 5
    np.testing.assert_array_equal(rotate_sectors(A[2], int(shift[2, 4])), B[4])


def test_unknown_sectors_are_no_evidence():
    unknown = np.full((1, 12), UNKNOWN)
    assert sector_similarity(unknown, unknown)[0][0, 0] == 0.0
    half = np.array([[FREE] * 6 + [UNKNOWN] * 6])
    assert sector_similarity(half, np.full((1, 12), FREE))[0][0, 0] == pytest.approx(0.5)
    assert sector_similarity_all(half, half).shape == (12, 1, 1)


def test_mutual_knn_keeps_only_reciprocal_best_pairs():
    S = np.array([[0.9, 0.8, 0.0],
                  [0.95, 0.1, 0.0],
                  [0.0, 0.7, 0.6]])
    pairs = {tuple(p) for p in mutual_knn(S, 1)}
    # row 0's best (col 0) prefers row 1; row 2's best (col 1) prefers row 0 -> only (1, 0).
    assert pairs == {(1, 0)}
    assert {(1, 0), (0, 1), (2, 1), (0, 0)} <= {tuple(p) for p in mutual_knn(S, 2)}
    assert len(mutual_knn(S, 1, min_similarity=0.99)) == 0
    # A tie for the best keeps every tied pair.
    tied = np.array([[0.6, 0.6], [0.2, 0.6]])
    assert {tuple(p) for p in mutual_knn(tied, 1)} == {(0, 0), (0, 1), (1, 1)}


def test_one_similarity_product_for_several_summaries_matches_as_one_match_each(params):
    """The retriever's fast path: ``sector_similarity_batch`` then ``match_similarity`` per group
    gives each group's ``match`` result, bit for bit, drawing the same random numbers."""
    rng = np.random.default_rng(8)
    homes = [synthetic_scene(rng, f"home{i}") for i in range(3)]
    traj = synthetic_trajectory(homes[0], rng, "q", length=(25, 30))
    summaries = [synthetic_trajectory(homes[k % 3], rng, f"s{k}", length=(5, 40)) for k in range(7)]
    one_by_one, batched = np.random.default_rng(1), np.random.default_rng(1)
    sims = sector_similarity_batch(traj.sectors, [s.sectors for s in summaries])
    results = []
    for summary, sim in zip(summaries, sims):
        want = match(traj, summary, params, one_by_one)
        got = match_similarity(traj, summary, sim, params, batched)
        assert (got.score, got.transform, got.accepted, got.edge_support) == \
            (want.score, want.transform, want.accepted, want.edge_support)
        assert np.array_equal(got.pairs, want.pairs) and np.array_equal(got.inliers, want.inliers)
        results.append(got)
    assert any(r.accepted for r in results) and not all(r.accepted for r in results)
    assert one_by_one.bit_generator.state == batched.bit_generator.state


def test_ransac_recovers_a_rigid_transform_among_outliers():
    rng = np.random.default_rng(1)
    P = rng.uniform(-5, 5, size=(30, 2))
    theta, t = 0.7, np.array([3.0, -2.0])
    R = np.array([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
    Q = P @ R.T + t + rng.normal(0, 0.03, size=P.shape)
    outliers = rng.choice(30, size=12, replace=False)
    Q[outliers] = rng.uniform(-8, 8, size=(12, 2))
    R_est, t_est, inliers = ransac_se2(P, Q, 0.3, 200, rng, huber_delta_m=0.15, refit_iterations=5)
    assert _angle_error_deg(math.atan2(R_est[1, 0], R_est[0, 0]), theta) < 1.0
    assert np.linalg.norm(t_est - t) < 0.1
    assert inliers.sum() >= 17 and not inliers[outliers].any()


@pytest.mark.parametrize("theta_deg", [90.0, -150.0, 47.0])
def test_moved_copy_matches_and_the_transform_is_recovered(params, theta_deg):
    rng = np.random.default_rng(2)
    scene = synthetic_scene(rng, "home")
    traj = synthetic_trajectory(scene, rng, "ep", length=(15, 25), label_noise=0.0, unknown_rate=0.0)
    moved, R_back, t_back = perturb(traj, rng, theta=math.radians(theta_deg), label_noise=0.03)
    result = match(moved, traj, params, np.random.default_rng(0))
    assert result.accepted and result.score > 0.8
    assert _angle_error_deg(result.transform.theta, math.atan2(R_back[1, 0], R_back[0, 0])) < 3.0
    assert np.linalg.norm(result.transform.t - t_back) < 0.1


def test_heading_check_rejects_geometry_that_contradicts_the_sectors(params):
    rng = np.random.default_rng(3)
    scene = synthetic_scene(rng, "home")
    traj = synthetic_trajectory(scene, rng, "ep", length=(15, 25), label_noise=0.0, unknown_rate=0.0)
    # Positions turned by 90 deg, but the sectors claim the world did not turn.
    moved, _, _ = perturb(traj, rng, theta=math.radians(90), shift_sectors=False)
    moved.reference_yaw = traj.reference_yaw
    assert match(moved, traj, params, np.random.default_rng(0)).accepted is False


def test_pose_evidence_sees_a_place_seen_twice_and_not_a_wrong_pose(params):
    rng = np.random.default_rng(5)
    scene = synthetic_scene(rng, "home")
    traj = synthetic_trajectory(scene, rng, "ep", length=(15, 25), label_noise=0.0, unknown_rate=0.0)
    moved, _, _ = perturb(traj, rng, theta=math.radians(60))
    result = match(moved, traj, params, np.random.default_rng(0))
    right = pose_evidence(moved, traj, result, params.min_node_similarity, params.ransac_threshold_m)
    assert set(right) == set(EVIDENCE)
    n = len(traj)
    # At the true pose every node lands on itself, looks alike and sees the same objects.
    assert right["overlap"] == right["agreeing"] == n and right["category_conflict"] == 0
    assert right["summary_covered"] == n and right["edges_agree"] == right["edges_landed"] == n - 1
    # Half a metre and 30 degrees off, fewer nodes land and fewer of those look alike.
    T = result.transform
    off = pose_evidence(moved, traj, replace(result, transform=Transform2D(T.theta + math.radians(30), T.tx + 0.5, T.ty)),
                        params.min_node_similarity, params.ransac_threshold_m)
    assert off["agreeing"] < right["agreeing"] / 2


def test_verifier_weighs_log_evidence_and_names_unknown_evidence():
    verifier = VerifierConfig(enabled=True, min_inliers=3, threshold=0.0, bias=-1.0,
                              weights={"agreeing": 2.0, "category_conflict": -1.0})
    evidence = dict.fromkeys(EVIDENCE, 0.0) | {"agreeing": math.e - 1, "category_conflict": 0.0}
    assert verifier.logit(evidence) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown evidence.*agreed"):
        VerifierConfig(enabled=True, min_inliers=3, threshold=0.0, bias=0.0, weights={"agreed": 1.0})


def test_trajectories_of_different_homes_do_not_match(params):
    rng = np.random.default_rng(4)
    homes = [synthetic_scene(rng, f"home{i}") for i in range(6)]
    accepted = 0
    for k in range(60):
        a = synthetic_trajectory(homes[k % 6], rng, f"a{k}")
        b = synthetic_trajectory(homes[(k + 1) % 6], rng, f"b{k}")
        accepted += match(a, b, params, np.random.default_rng(k)).accepted
    assert accepted == 0


def test_node_descriptors_are_rotation_invariant_and_index_finds_the_home():
    rng = np.random.default_rng(5)
    sectors = rng.integers(-3, 15, size=(20, 12))
    d = node_descriptors(sectors, 128)
    np.testing.assert_allclose(node_descriptors(np.roll(sectors, 4, axis=1), 128), d, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(d, axis=1), 1.0, atol=1e-5)
    homes = [synthetic_scene(rng, f"home{i}") for i in range(30)]
    index = NodeIndex(128)
    for g, home in enumerate(homes):
        # A summary: every node of the home, seen from one heading.
        index.set_group(g, sample_sectors(home, np.arange(len(home.node_xy)), rng.uniform(0, 6)))
    hits = sum(g in index.candidates(synthetic_trajectory(homes[g], rng, f"q{g}").sectors, 5, 10)
               for g in range(30))
    assert hits >= 27
    index.remove_group(3)
    assert 3 not in index.candidates(homes[3].labels[:, ::3], 30, 10)


def test_the_inverted_file_keeps_finding_homes_beyond_the_exact_search():
    rng = np.random.default_rng(6)
    homes = [synthetic_scene(rng, f"home{i}") for i in range(60)]
    ivf = IVFParams(min_nodes=500, lists_per_sqrt=4.0, probes=16, train_sample=4096,
                    kmeans_iterations=5, seed=0)
    index = NodeIndex(128, ivf)
    for g, home in enumerate(homes):
        index.set_group(g, sample_sectors(home, np.arange(len(home.node_xy)), rng.uniform(0, 6)))
    assert index._centroids is not None  # trained once the index passed min_nodes
    queries = [(g, synthetic_trajectory(homes[g], rng, f"q{g}").sectors) for g in range(60)]
    hits = sum(g in index.candidates(q, 5, 60) for g, q in queries)
    assert hits >= 50
    index.remove_group(0)
    index.set_group(0, homes[0].labels[:, ::3])  # re-added nodes join their nearest lists
    assert 0 in index.candidates(homes[0].labels[:, ::3], 5, 60)


def test_a_decisions_nodes_voted_at_once_vote_as_each_alone_and_as_the_plain_product():
    """The retriever votes all of a decision's new nodes in one product (index on the left, a
    single node padded to two) and keeps the votes as arrays: the votes and rankings are those
    of one node at a time and of the dicts, to the bit, and those of the product
    ``query @ index.T`` (another kernel: the same bits with OpenBLAS's kernels without FMA,
    float32 rounding apart with its FMA ones)."""
    rng = np.random.default_rng(11)
    index = NodeIndex(128)
    shared = rng.integers(-3, 15, size=(20, 12))  # nodes many summaries hold: tied descriptors
    for g in range(150):
        own = rng.integers(-3, 15, size=(int(rng.integers(2, 8)), 12))
        index.set_group(g, shared[rng.integers(0, 20, size=len(own))] if g % 2 else own)
    query = np.concatenate([shared[:3], rng.integers(-3, 15, size=(9, 12))])
    together = index.node_votes(query, 20)
    assert together == [index.node_votes(row[None], 20)[0] for row in query]
    rows = index._used
    plain = _votes(node_descriptors(query, 128) @ index._desc[:rows].T, index._owner[:rows], 20)
    assert [sorted(v) for v in together] == [sorted(v) for v in plain]
    for mine, theirs in zip(together, plain):
        assert all(mine[g] == pytest.approx(theirs[g], abs=1e-5) for g in mine)
    arrays = index.node_vote_arrays(query, 20)
    assert [dict(zip(g.tolist(), w.tolist())) for g, w in arrays] == together
    for part in (slice(None), slice(0, 1), slice(2, 8)):
        for n in (1, 5, 40):
            assert rank_vote_arrays(arrays[part], n) == rank_votes(together[part], n)
    # Ties rank the lower group id first, either way.
    tied = [{7: 0.5, 2: 0.25}, {2: 0.25, 9: 1.0}]
    as_arrays = [(np.array(sorted(v)), np.array([v[g] for g in sorted(v)])) for v in tied]
    assert rank_votes(tied, 3) == rank_vote_arrays(as_arrays, 3) == [9, 2, 7]
    assert rank_vote_arrays([], 3) == [] and index.node_vote_arrays(query[:0], 20) == []


def test_probing_every_list_finds_what_the_exact_search_finds_after_adds_and_removals():
    """The inverted lists are laid out in blocks and re-laid out as nodes come and go: with
    every list probed, the index must vote exactly as a search over all live nodes."""
    rng = np.random.default_rng(7)
    # Random labels: distinct descriptors, so no ties decide which nodes are the nearest.
    groups = [rng.integers(-3, 15, size=(int(rng.integers(5, 25)), 12)) for _ in range(80)]
    ivf = IVFParams(min_nodes=400, lists_per_sqrt=1.0, probes=10_000, train_sample=4096,
                    kmeans_iterations=3, seed=0)
    index, exact = NodeIndex(128, ivf), NodeIndex(128)
    one_probe = NodeIndex(128, replace(ivf, probes=1))
    for g, sectors in enumerate(groups):
        for ix in (index, exact, one_probe):
            ix.set_group(g, sectors)
            if g % 7 == 3:  # removals leave dead rows in blocks and in the lists added since
                ix.remove_group(g - 2)
            if g % 5 == 4:  # re-indexed with more nodes: keeps its rows and adds some
                ix.set_group(g, np.concatenate([sectors, sectors[:3]]))
    assert index._centroids is not None and index._n_extra > 0
    for g in range(0, 80, 9):
        query = rng.integers(-3, 15, size=(12, 12))
        # A vote is sqrt(margin): float32 sums in another order move a margin by ~1e-7, which
        # the square root makes ~2e-4 near zero.
        got, want = ([{g: w for g, w in v.items() if w > 1e-3} for v in ix.node_votes(query, 30)]
                     for ix in (index, exact))
        assert [sorted(v) for v in got] == [sorted(v) for v in want]
        for v, w in zip(got, want):
            np.testing.assert_allclose([v[k] for k in sorted(v)], [w[k] for k in sorted(w)], atol=2e-4)
    # Each node sits in the list of its nearest centroid: one probe finds a group's own nodes.
    live = [g for g in range(80) if g in exact._rows]
    assert all(one_probe.candidates(groups[g], 1, 5) == [g] for g in live)
    # The inverted file's votes as arrays are its dicts, to the bit.
    query = rng.integers(-3, 15, size=(12, 12))
    assert [dict(zip(g.tolist(), w.tolist())) for g, w in index.node_vote_arrays(query, 30)] == \
        index.node_votes(query, 30)


def _tied_index(ivf: IVFParams | None, rng: np.random.Generator) -> tuple[NodeIndex, np.ndarray]:
    """An index whose groups share node sectors (``shared``: ties among the nearest), with
    groups re-indexed larger and removed (dead rows, rows added to the inverted lists since)."""
    index = NodeIndex(128, ivf)
    shared = rng.integers(-3, 15, size=(20, 12))
    for g in range(160):
        own = rng.integers(-3, 15, size=(int(rng.integers(2, 9)), 12))
        sectors = shared[rng.integers(0, 20, size=len(own))] if g % 2 else own
        index.set_group(g, sectors)
        if g % 9 == 4:
            index.remove_group(g - 3)
        if g % 7 == 5:
            index.set_group(g, np.concatenate([sectors, shared[:2]]))
    return index, shared


@pytest.mark.parametrize("inverted_file", [False, True])
def test_the_writers_fast_vote_finds_the_same_votes_and_candidates_to_the_bit(inverted_file):
    """``NodeIndex(fast=True)``: the probes written into one matrix are ``_probed``'s products,
    and the votes above zero found without ordering the neighbours are the votes the
    neighbours cast, ties among the nearest nodes included."""
    rng = np.random.default_rng(21)
    ivf = IVFParams(min_nodes=300, lists_per_sqrt=2.0, probes=4, train_sample=4096,
                    kmeans_iterations=3, seed=0) if inverted_file else None
    index, shared = _tied_index(ivf, rng)
    assert (index._centroids is not None and index._n_extra > 0) == inverted_file
    for k in range(12):
        query = rng.integers(-3, 15, size=(max(int(rng.integers(1, 14)), k % 4), 12))
        query[: k % 4] = shared[: k % 4]  # nodes many groups hold
        sim, owner = index._similarities(query)
        packed = index._similarities(query, packed=True)
        if inverted_file:  # the same matrix, bit for bit
            assert np.array_equal(packed[0], sim) and np.array_equal(packed[1], owner)
        for neighbours in (1, 5, 60, 10_000):
            want = _best_votes(*_top_votes(sim, owner, neighbours))
            got = _best_of(*_positive_votes(*packed, neighbours))
            assert all(np.array_equal(a, b) for a, b in zip(got, want))
            index.fast = True
            fast = index.candidates(query, 5, neighbours)
            index.fast = False
            assert fast == index.candidates(query, 5, neighbours)


def test_probes_read_ahead_are_the_probes_made_when_the_query_comes_whatever_was_written_between():
    """``NodeIndex.read_ahead``: a batch's inverted-file probes read list by list give each query
    the similarities it would have computed itself, to the bit, and so the same votes, also after
    writes in between changed some lists' trained rows (merged sectors), removed a group or added
    rows to some lists."""
    rng = np.random.default_rng(33)
    ivf = IVFParams(min_nodes=300, lists_per_sqrt=2.0, probes=4, train_sample=4096,
                    kmeans_iterations=3, seed=0)
    index, shared = _tied_index(ivf, rng)
    index.fast = True
    queries = [rng.integers(-3, 15, size=(int(rng.integers(1, 12)), 12)).astype(np.int16) for _ in range(10)]
    queries[3][:2] = shared[:2]
    index.read_ahead(queries)
    assert index.inverted_file and len(index._ahead) == len(queries)
    served, moved_any, kept = 0, 0, 0
    for k, query in enumerate(queries):
        if k % 3 == 1:  # a merge rewrites some trained rows; a fusion removes a group
            index.set_group(2 * k, np.concatenate([shared[k: k + 3], shared[:1]]), changed=np.arange(2))
            index.remove_group(2 * k + 1)
        ahead = index._ahead.get(_query_key(query))
        served += ahead is not None
        moved = bool((index._added_writes[ahead.near] != ahead.added_writes).any())
        packed = index._similarities(query, packed=True)
        assert _query_key(query) not in index._ahead  # used once
        index.fast = False
        sim, owner = index._similarities(query)
        index.fast = True
        for neighbours in (1, 5, 60):  # the votes to the bit (moved rows' columns come last)
            got = _best_of(*_positive_votes(*packed, neighbours))
            assert all(np.array_equal(a, b) for a, b in zip(got, _best_votes(*_top_votes(sim, owner, neighbours))))
        if moved:
            moved_any += 1
        else:  # nothing added since: the very matrix
            kept += 1
            assert np.array_equal(packed[0], sim) and np.array_equal(packed[1], owner)
    assert moved_any and kept
    assert served == len(queries)


def test_a_group_reindexed_by_its_changed_nodes_is_described_as_anew():
    rng = np.random.default_rng(4)
    sectors = rng.integers(-3, 15, size=(12, 12))
    grown = np.concatenate([sectors, rng.integers(-3, 15, size=(5, 12))])
    changed = np.array([1, 6, 7])
    grown[changed, :4] = 3
    index, fresh = NodeIndex(128), NodeIndex(128)
    index.set_group(7, sectors)
    index.set_group(7, grown, changed)
    fresh.set_group(7, grown)
    assert np.array_equal(index._desc[index._rows[7]], fresh._desc[fresh._rows[7]])


def test_ransac_is_skipped_only_where_no_pose_could_accept(params):
    """``fit_pose(skip_hopeless=True)``: every match the thresholds accept is found as before
    (score, pose, inliers, support), across walks of one home and of other homes."""
    rng = np.random.default_rng(8)
    homes = [synthetic_scene(rng, f"home{i}") for i in range(6)]
    walks = [synthetic_trajectory(homes[i % 6], rng, f"w{i}") for i in range(36)]
    skipped = accepted = 0
    for strict in (params, replace(params, mutual_k=2, min_inliers=3)):
        for a in walks[:18]:
            for b in walks[18:]:
                sim = sector_similarity_all(a.sectors, b.sectors)
                S, pairs = node_pairs(sim, strict)
                want = fit_pose(a, b, sim, S, pairs, strict, np.random.default_rng(0))
                got = fit_pose(a, b, sim, S, pairs, strict, np.random.default_rng(0),
                               edge_sets=(edge_set(a.edges), edge_set(b.edges)), skip_hopeless=True)
                assert got.accepted == want.accepted
                if want.accepted:
                    assert (got.score, got.transform, got.edge_support) == (want.score, want.transform, want.edge_support)
                    assert np.array_equal(got.inliers, want.inliers)
                skipped += want.transform is not None and got.transform is None
                accepted += want.accepted
    assert skipped > 20 and accepted > 20  # RANSAC skipped, and matches of one home found


def test_fold_nodes_folds_nodes_landing_on_one_summary_node_in_node_order():
    rng = np.random.default_rng(2)
    summary = Summary(0, rng.uniform(0, 5, (6, 2)), rng.integers(-3, 9, (6, 12)).astype(np.int16),
                      rng.integers(1, 4, 6).astype(np.int32), {(0, 1)}, 0.0, 1, [], [])
    node_map = np.array([2, -1, 2, 4, 2, -1, 4])
    moved, rotated = rng.uniform(0, 5, (7, 2)), rng.integers(-3, 9, (7, 12)).astype(np.int16)
    counts = rng.integers(1, 3, 7).astype(np.int32)
    want = Summary(0, summary.node_xy.copy(), summary.sectors.copy(), summary.node_count.copy(),
                   set(summary.edges), 0.0, 1, [], [])
    for i in (0, 2, 3, 4, 6):  # one node at a time, in node order
        j, c = node_map[i], want.node_count[node_map[i]]
        want.node_xy[j] = (want.node_xy[j] * c + moved[i] * counts[i]) / (c + counts[i])
        want.node_count[j] = c + counts[i]
        unknown = want.sectors[j] == UNKNOWN
        want.sectors[j, unknown] = rotated[i, unknown]
    assert fold_nodes(summary, node_map.copy(), moved, rotated, counts, [(0, 1), (1, 2)]) == 2
    assert np.array_equal(summary.node_xy[:6], want.node_xy) and np.array_equal(summary.sectors[:6], want.sectors)
    assert np.array_equal(summary.node_count[:6], want.node_count) and summary.n_nodes == 8
