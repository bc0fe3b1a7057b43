"""Coarse-to-fine retrieval, the retrieval-scoring and GraphRAG planners, and `trajrag eval`."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import FAST_SIM
from trajrag import config
from trajrag.config import load
from trajrag.planners.frontier import NearestFrontierPlanner
from trajrag.planners.graphrag import SceneGraph
from trajrag.planners.scoring import ScoringConfig, ScoringPlanner, goal_context
from trajrag.retrieval.types import DecisionRetrieval, Experience
from trajrag.topo.labels import FREE, OBSTACLE, UNKNOWN
from trajrag.topo.representation import represent


def _retriever(store, model_dir, *overrides):
    from trajrag.retrieval.retriever import load_retriever

    return load_retriever(config.settings([f"retrieval.store={store}", f"retrieval.model_dir={model_dir}", *overrides]))


def _stored(store, k=0):
    """The k-th longest stored trajectory (long enough for the geometric match's minimum)."""
    from trajrag import config
    from trajrag.memory.grouping import TrajectoryMemory
    from trajrag.memory.store import MemoryStore

    memory = TrajectoryMemory(MemoryStore(store, read_only=True), config.load("memory"))
    trajs = {tid: memory.load_trajectory(tid) for tid in sorted(memory._chunk_ids)}
    tid = sorted(trajs, key=lambda t: -len(trajs[t]))[k]
    return tid, trajs[tid]


def _stored_success(store):
    """The longest stored trajectory that found its goal (projected goals come only from those)."""
    from trajrag.memory.store import CHUNKS, MemoryStore

    rows = MemoryStore(store, read_only=True).read(CHUNKS, ["trajectory_id", "success"]).to_pylist()
    succeeded = {r["trajectory_id"] for r in rows if r["success"]}
    return next(traj for tid, traj in (_stored(store, k) for k in range(len(rows))) if tid in succeeded)


# -- retriever ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_stored_trajectory_retrieves_itself_first_from_its_own_group(nav_memory):
    store, model_dir = nav_memory
    retriever = _retriever(store, model_dir)
    tid, traj = _stored(store)
    result = retriever.retrieve([traj, traj], traj.goal)
    assert len(result.experiences) == 2 and result.coarse_ms >= 0 and result.fine_ms > 0
    best = result.experiences[0][0]
    assert best.trajectory_id == tid
    assert best.similarity == pytest.approx(1.0, abs=1e-3)
    assert best.coarse_score > 0.5  # its own group matched geometrically
    assert len(result.experiences[0]) <= retriever.cfg.top_k
    sims = [e.similarity for e in result.experiences[0]]
    assert sims == sorted(sims, reverse=True)


def _prefix(traj, nodes):
    """The first ``nodes`` nodes of a trajectory (a walk as it was earlier)."""
    return replace(traj, node_xy=traj.node_xy[:nodes], sectors=traj.sectors[:nodes],
                   node_visit_steps=traj.node_visit_steps[:nodes], node_ids=traj.node_ids[:nodes])


@pytest.mark.slow
def test_the_caches_retrieve_what_each_decision_computed_afresh_retrieves_and_report_the_split(nav_memory):
    store, model_dir = nav_memory
    reference = _retriever(store, model_dir, "retrieval.query_cache=0")
    cached = _retriever(store, model_dir)
    (_, walk), (_, other) = _stored(store, 0), _stored(store, 1)
    # A walk growing by a node per decision: each decision repeats most of the previous one's
    # candidates, as a navigator's re-decisions do, and the walks share their first nodes.
    decisions = [[_prefix(walk, n), _prefix(walk, n + 1), _prefix(other, min(n, len(other)))]
                 for n in range(3, min(len(walk), 8))]
    for candidates in decisions:
        want = reference.retrieve(candidates, walk.goal)
        got = cached.retrieve(candidates, walk.goal)
        for wanted, found in zip(want.experiences, got.experiences, strict=True):
            assert [(e.trajectory_id, e.group_id, e.coarse_score) for e in found] == \
                [(e.trajectory_id, e.group_id, e.coarse_score) for e in wanted]
            # z of a cached candidate came from another batch: float32 rounding, nothing more.
            assert [e.similarity for e in found] == pytest.approx([e.similarity for e in wanted], abs=1e-6)
        assert 0 < got.encode_ms <= got.fine_ms and got.coarse_ms > 0
    assert cached.cache_hits >= len(decisions) - 1 and reference.cache_hits == 0
    # Repeated outright, a decision is answered from the cache alone and costs no encoding.
    again = cached.retrieve(decisions[-1], walk.goal)
    assert again.encode_ms < got.encode_ms


@pytest.mark.slow
def test_the_fast_path_votes_keeps_and_retrieves_to_the_bit_what_the_reference_path_does(nav_memory):
    """``retrieval.fast_path`` (one vote product per decision, one similarity product per
    candidate, the lean GPT-2 forward, one BLAS thread) against the path before it: the same
    node votes, the same kept groups and accepted matches, the same chunks with the same scores,
    the same goal points, with and without the goal filter and the recognised map."""
    from trajrag.memory.synthetic import perturb
    from trajrag.topo.candidates import MapPlace

    store, model_dir = nav_memory
    walk = _stored_success(store)
    (_, other) = _stored(store, 1)
    moved, _, _ = perturb(walk, np.random.default_rng(6), theta=np.radians(30.0))
    place = MapPlace(moved.node_xy, moved.sectors, moved.edges, moved.categories, moved.reference_yaw)
    decisions = [[_prefix(moved, n), _prefix(moved, n + 1), _prefix(other, min(n, len(other)))]
                 for n in range(1, min(len(moved), 8))]
    for extra in ([], ["retrieval.goal_filter=true", "retrieval.project_goal=true"]):
        reference = _retriever(store, model_dir, "retrieval.query_cache=0", "retrieval.fast_path=false",
                               "retrieval.blas_threads=0", *extra)
        fast = _retriever(store, model_dir, "retrieval.query_cache=0", *extra)
        assert fast.cfg.fast_path and fast.cfg.blas_threads == 1
        placed = 0  # decisions given goal points: the recognised map's path was taken
        for candidates in decisions:
            want, got = (r.retrieve(candidates, walk.goal, place) for r in (reference, fast))
            assert [[(e.trajectory_id, e.group_id, e.coarse_score, e.similarity) for e in found]
                    for found in got.experiences] == \
                [[(e.trajectory_id, e.group_id, e.coarse_score, e.similarity) for e in found]
                 for found in want.experiences]
            if want.goal_points is not None:
                assert np.array_equal(got.goal_points, want.goal_points)
                placed += len(got.goal_points) > 0
            for candidate in candidates:
                q = fast._to_store_labels(candidate)
                votes = [dict(zip(g.tolist(), w.tolist())) for g, w in fast._node_votes(q.sectors)]
                assert votes == reference._node_votes(q.sectors)
                goal = walk.goal if fast.cfg.goal_filter else None
                (kept, accepted), (kept_ref, accepted_ref) = fast._coarse(q, goal), reference._coarse(q, goal)
                assert list(kept.items()) == list(kept_ref.items()) and accepted == accepted_ref
        assert placed > 0 or not extra


@pytest.mark.slow
def test_project_goal_finds_where_a_recognised_place_was_left_in_the_agents_frame(nav_memory):
    from trajrag.memory.synthetic import perturb

    store, model_dir = nav_memory
    traj = _stored_success(store)
    # The agent's map frame is not the one the walk was stored in.
    moved, _, _ = perturb(traj, np.random.default_rng(4), theta=np.radians(75.0))
    result = _retriever(store, model_dir, "retrieval.project_goal=true").retrieve([moved], traj.goal)
    assert result.goal_points is not None and len(result.goal_points)
    gaps = np.linalg.norm(result.goal_points - moved.node_xy[-1], axis=1)
    assert gaps.min() < 0.15  # metres: the walk's own end, carried through both transforms
    assert _retriever(store, model_dir).retrieve([moved], traj.goal).goal_points is None  # off by default


@pytest.mark.slow
def test_the_whole_map_recognises_a_place_that_the_walked_part_is_too_short_for(nav_memory):
    from trajrag.memory.synthetic import perturb
    from trajrag.topo.candidates import MapPlace

    store, model_dir = nav_memory
    traj = _stored_success(store)
    moved, _, _ = perturb(traj, np.random.default_rng(5), theta=np.radians(-40.0))
    # Two walked nodes: under the matcher's minimum of inliers, so the candidate alone is not
    # recognised; the map the agent has seen holds the whole place.
    short = replace(moved, node_xy=moved.node_xy[:2], sectors=moved.sectors[:2],
                    node_visit_steps=moved.node_visit_steps[:2], node_ids=moved.node_ids[:2])
    seen = MapPlace(moved.node_xy, moved.sectors, moved.edges, moved.categories, moved.reference_yaw)
    retriever = _retriever(store, model_dir, "retrieval.project_goal=true")
    assert retriever.uses_place and not _retriever(store, model_dir).uses_place
    assert len(retriever.retrieve([short], traj.goal).goal_points) == 0
    result = retriever.retrieve([short], traj.goal, seen)
    assert len(result.experiences) == 1  # still one list of experiences per candidate
    gaps = np.linalg.norm(result.goal_points - moved.node_xy[-1], axis=1)
    assert gaps.min() < 0.15  # metres: where the stored walk found the goal, in this map's frame


def _wire_request(place=None, frontier_distances=(1.0,)):
    """A JSON decision request (one straight candidate per frontier at x = 0, 1, ... m)."""
    from trajrag.distributed.serve_planner import decision_request
    from trajrag.planners.base import PlannerContext
    from trajrag.topo.candidates import CandidatePath
    from trajrag.topo.trajectory import TopoPolarTrajectory

    walked = TopoPolarTrajectory(node_xy=[[0.0, 0.0], [1.0, 0.0]], sectors=np.full((2, 12), FREE),
                                 categories=("toilet",), goal="toilet", reference_yaw=0.3)
    n = len(frontier_distances)
    ctx = PlannerContext("toilet", 7, None, None, walked, [CandidatePath(i, np.arange(2), 1.0, walked) for i in range(n)],
                         [SimpleNamespace(centroid_xy=np.array([float(i), 0.0])) for i in range(n)],
                         np.asarray(frontier_distances, dtype=float), place=place)
    return json.loads(json.dumps(decision_request(ctx)))


def test_the_map_place_travels_with_a_decision_request_and_a_malformed_one_is_named():
    from trajrag.distributed.serve_planner import PlannerRequestError, context_from_request
    from trajrag.topo.candidates import MapPlace

    place = MapPlace([[0.0, 0.0], [1.0, 0.0], [1.0, 1.5]], np.full((3, 12), OBSTACLE), [[0, 1], [1, 2]],
                     ("toilet",), 0.3)
    request = _wire_request(place)
    back, _ = context_from_request(request)
    np.testing.assert_allclose(back.place.node_xy, place.node_xy)
    np.testing.assert_array_equal(back.place.sectors, place.sectors)
    np.testing.assert_array_equal(back.place.edges, place.edges)
    assert back.place.reference_yaw == pytest.approx(0.3)
    assert context_from_request({**request, "place": None})[0].place is None
    with pytest.raises(PlannerRequestError, match="place"):
        context_from_request({**request, "place": {"node_xy": [[0.0, 0.0]]}})
    with pytest.raises(PlannerRequestError, match="place"):
        context_from_request({**request, "place": {**request["place"], "edges": [[0, 9]]}})


def test_the_planner_app_keeps_no_episode_state_its_client_sends_the_goal_points_back():
    import asyncio

    from trajrag.distributed.serve_planner import PlannerDeployment, retrieval_to_dict

    class _Handle:  # the Retriever deployment: projects the goal at x = 5 m once, then never
        def __init__(self):
            self.points = [[[5.0, 0.0]], []]
            self.retrieve = SimpleNamespace(remote=self._retrieve)

        async def _retrieve(self, request):
            return retrieval_to_dict(DecisionRetrieval([[], []], {}, goal_points=np.array(self.points.pop(0)).reshape(-1, 2)))

    app = PlannerDeployment(_Handle(), config.settings())
    request = _wire_request(frontier_distances=(2.0, 2.5))  # frontier 0 nearer, the goal beyond 1
    first = asyncio.run(app.decide(request))
    assert first["choice"] == 1 and first["goal_points"] == [[5.0, 0.0]]
    assert asyncio.run(app.decide({**request, "goal_points": first["goal_points"]}))["choice"] == 1
    app.retriever = _Handle()
    asyncio.run(app.decide(request))
    assert asyncio.run(app.decide(request))["choice"] == 0  # nothing sent back: nothing kept


@pytest.mark.slow
def test_a_planner_replica_that_retrieves_itself_decides_as_the_two_deployments_do(nav_memory):
    import asyncio

    from trajrag.distributed.serve_planner import (PlannerDeployment, PlannerRequestError, RetrieverDeployment,
                                                  decision_request)
    from trajrag.planners.base import PlannerContext
    from trajrag.topo.candidates import CandidatePath

    store, model_dir = nav_memory
    settings = config.settings([f"retrieval.store={store}", f"retrieval.model_dir={model_dir}"])
    _, walk = _stored(store)
    candidates = [CandidatePath(i, np.arange(2), 1.0, _prefix(walk, n)) for i, n in enumerate((3, len(walk)))]
    ctx = PlannerContext(walk.goal, 9, None, None, walk, candidates,
                         [SimpleNamespace(centroid_xy=np.array([float(i), 0.0])) for i in range(2)],
                         np.array([2.0, 2.0]))
    request = json.loads(json.dumps(decision_request(ctx)))
    retriever = RetrieverDeployment(settings)

    async def remote(payload):  # the Retriever deployment's handle, without Ray
        return retriever.retrieve(payload)

    async def remote_home(payload):
        return retriever.home_goal_points(payload)

    handle = SimpleNamespace(retrieve=SimpleNamespace(remote=remote),
                             home_goal_points=SimpleNamespace(remote=remote_home))
    # the second retrieves itself (serve.retriever_in_planner)
    two_app, alone_app = PlannerDeployment(handle, settings), PlannerDeployment(None, settings)
    two, alone = asyncio.run(two_app.decide(request)), asyncio.run(alone_app.decide(request))
    assert alone["choice"] == two["choice"] and alone["scores"] == pytest.approx(two["scores"], abs=1e-12)
    assert alone["coarse_ms"] > 0 and alone["encode_ms"] > 0 and alone["retrieval_ms"] <= alone["planner_ms"]
    # In a home the memory walked, an evaluator asks where its walks saw the goal, and sends them back
    lookup = {"scene": walk.scene_id, "goal": walk.goal}
    places = asyncio.run(alone_app.home_goal_points(lookup))
    assert places and asyncio.run(two_app.home_goal_points(lookup)) == places
    assert places == retriever.retriever.home_goal_points(walk.scene_id, walk.goal).tolist()
    home_two, home_alone = (asyncio.run(app.decide({**request, "home_points": places})) for app in (two_app, alone_app))
    assert home_alone["scores"] == pytest.approx(home_two["scores"], abs=1e-12) != alone["scores"]  # the places priced
    assert home_alone["goal_points"] == alone["goal_points"]  # what the client keeps: its own places stay its own
    with pytest.raises(PlannerRequestError, match="'scene' and 'goal'"):
        asyncio.run(alone_app.home_goal_points({"goal": walk.goal}))


@pytest.mark.slow
def test_without_coarse_stage_any_group_is_searched_and_text_fine_stage_works(nav_memory):
    store, model_dir = nav_memory
    tid, traj = _stored(store, 1)
    for overrides in (["retrieval.coarse=false"], ["retrieval.fine=text"],
                      ["retrieval.coarse=false", "retrieval.fine=text", "retrieval.top_k=50"]):
        result = _retriever(store, model_dir, *overrides).retrieve([traj], traj.goal)
        assert result.experiences[0], overrides
        assert all(e.coarse_score == 0.0 for e in result.experiences[0]) == ("retrieval.coarse=false" in overrides)
    unfiltered = _retriever(store, model_dir, "retrieval.coarse=false", "retrieval.top_k=1000")
    assert len(unfiltered.retrieve([traj], traj.goal).experiences[0]) == len(unfiltered.ids)
    same_goal = _retriever(store, model_dir, "retrieval.coarse=false", "retrieval.top_k=1000",
                           "retrieval.goal_filter=true")
    found = same_goal.retrieve([traj], traj.goal).experiences[0]
    assert {e.goal for e in found} == {traj.goal}
    assert len(found) == sum(g == traj.goal for g in same_goal.goals)
    coarse = _retriever(store, model_dir, "retrieval.goal_filter=true").retrieve([traj], traj.goal)
    assert coarse.experiences[0][0].trajectory_id == tid and {e.goal for e in coarse.experiences[0]} == {traj.goal}


@pytest.mark.slow
def test_unknown_categories_and_goals_do_not_break_retrieval(nav_memory):
    store, model_dir = nav_memory
    _, traj = _stored(store)
    traj.categories = tuple(traj.categories[:-1]) + ("spaceship",)
    result = _retriever(store, model_dir).retrieve([traj], "spaceship")
    assert result.experiences[0]
    assert all(e.goal != "spaceship" for e in result.experiences[0])  # nothing to find, no crash


@pytest.mark.slow
def test_empty_store_and_other_encoder_version_give_clear_errors(nav_memory, tmp_path):
    from trajrag.memory.store import MemoryStore
    from trajrag.retrieval.retriever import RetrievalError

    store, model_dir = nav_memory
    empty = str(tmp_path / "empty")
    MemoryStore(empty, embedding_dim=768).close()
    with pytest.raises(RetrievalError, match="no chunks"):
        _retriever(empty, model_dir)
    other = tmp_path / "other-model"
    shutil.copytree(model_dir, other)
    meta = json.loads((other / "encoder.json").read_text())
    meta["encoder_version"] = "0123456789abcdef"
    (other / "encoder.json").write_text(json.dumps(meta))
    with pytest.raises(RetrievalError, match="re-embed"):
        _retriever(store, str(other))
    fallback = _retriever(store, str(other), "retrieval.embed_missing=true")  # documented fallback
    _, traj = _stored(store)
    assert fallback.retrieve([traj], traj.goal).experiences[0][0].similarity == pytest.approx(1.0, abs=1e-3)


def test_representations_keep_what_the_ablation_names():
    sectors = np.array([[0, FREE, OBSTACLE, 3, UNKNOWN, 0, FREE, FREE, 1, 2, OBSTACLE, FREE]], dtype=np.int16)
    semantic = represent(sectors, "tps_s")
    assert (semantic[sectors >= 0] == sectors[sectors >= 0]).all() and (semantic[sectors < 0] == UNKNOWN).all()
    geometric = represent(sectors, "tps_g")
    assert (geometric[sectors >= 0] == OBSTACLE).all() and (geometric[sectors < 0] == sectors[sectors < 0]).all()
    bag = represent(sectors, "tna")
    assert Counter(bag[0].tolist()) == Counter(sectors[0].tolist())
    assert (represent(np.roll(sectors, 5, axis=1), "tna") == bag).all()  # order gone
    with pytest.raises(ValueError, match="unknown node representation"):
        represent(sectors, "tps_x")


# -- planners -------------------------------------------------------------------------------------
def _candidate(objects_at_end: list[int], categories=("toilet", "sink", "bed")):
    sectors = np.full((3, 12), FREE, dtype=np.int16)
    sectors[-1, : len(objects_at_end)] = objects_at_end
    return SimpleNamespace(sectors=sectors, categories=categories)


def _context(candidates, distances, goal="toilet"):
    wrapped = [SimpleNamespace(frontier_index=i, length_m=d, trajectory=c)
               for i, (c, d) in enumerate(zip(candidates, distances))]
    frontiers = [SimpleNamespace(centroid_xy=np.array([float(i), 0.0])) for i in range(len(candidates))]
    return SimpleNamespace(goal=goal, candidates=wrapped, frontiers=frontiers,
                           frontier_distances=np.asarray(distances, dtype=float), current_waypoint=None,
                           place=None)


def _experience(goal, end_labels, success=True, similarity=0.9):
    sectors = np.full((2, 12), OBSTACLE, dtype=np.int16)
    sectors[-1, : len(end_labels)] = end_labels
    return Experience("t", 0, goal, success, similarity, 0.0, "", sectors=sectors)


def _scoring(**changes) -> ScoringConfig:
    """configs/scoring.yaml's weights (w_similarity 1, w_context 2, 0.25 per metre), no value
    model or experience, no hysteresis and no kept goal points unless ``changes`` say so."""
    base = replace(load("scoring"), hysteresis_m=0.0, keep_goal_points=False, w_priors_with_goal_points=1.0,
                   value_model="", w_experience=0.0)
    assert (base.w_similarity, base.w_context, base.w_distance_per_m) == (1.0, 2.0, 0.25)  # what the tests assume
    return replace(base, **changes)


class _FixedRetriever:
    def __init__(self, experiences):
        self.experiences = experiences

    def retrieve(self, trajectories, goal, place=None):
        return DecisionRetrieval([list(self.experiences) for _ in trajectories], {0: "toilet", 1: "sink", 2: "bed"}, 1.0, 1.0)


def test_goal_context_prefers_what_surrounded_the_goal_in_experience():
    names = {0: "toilet", 1: "sink", 2: "bed"}
    past = [_experience("toilet", [0, 1, 1]), _experience("bed", [2, 2])]
    sink_ahead = goal_context(Counter({"sink": 2}), past, "toilet", names, end_nodes=2)
    bed_ahead = goal_context(Counter({"bed": 2}), past, "toilet", names, end_nodes=2)
    assert sink_ahead == pytest.approx(1.0) and bed_ahead == 0.0
    failed = [_experience("toilet", [0, 1], success=False)]
    assert goal_context(Counter({"sink": 1}), failed, "toilet", names, 2) == 0.0


def test_scoring_planner_follows_experience_and_reduces_to_nearest_frontier():
    candidates = [_candidate([2, 2]), _candidate([1, 1])]  # bed ahead (near), sink ahead (far)
    ctx = _context(candidates, [2.0, 4.0])
    retriever = _FixedRetriever([_experience("toilet", [0, 1, 1])])
    cfg = _scoring(hysteresis_m=1.0, keep_goal_points=True)
    planner = ScoringPlanner(retriever, cfg)
    assert planner.choose(ctx) == 1  # the sink side, worth a 2 m detour
    assert planner.last_retrieval is not None and len(planner.episode_stats()["retrieval_ms"]) == 1
    blind = ScoringPlanner(retriever, _scoring(w_similarity=0.0, w_context=0.0, keep_goal_points=True))
    assert blind.choose(ctx) == NearestFrontierPlanner(0.0).choose(ctx) == 0


def test_with_a_value_model_the_value_prices_distance_and_the_nearest_frontier_prior_stays_out():
    candidates = [_candidate([2, 2]), _candidate([2, 2])]  # the same ends: retrieval prefers neither
    ctx = _context(candidates, [2.0, 6.0])
    value = SimpleNamespace(score=lambda features: features[:, 0], per_metre=0.0)  # the far one is 0.5 better
    features = np.array([[0.0], [0.5]])
    retrieval = _FixedRetriever([]).retrieve([c.trajectory for c in ctx.candidates], "toilet")
    priced_by_value = ScoringPlanner(None, _scoring(), value).score(ctx, retrieval, features)
    assert int(np.argmax(priced_by_value)) == 1
    # 0.25 per metre on top of the value's own price (the prior, counted twice): 4 m cost 1.0 > 0.5
    twice = ScoringPlanner(None, _scoring(w_distance_per_m_with_value=0.25), value).score(ctx, retrieval, features)
    assert int(np.argmax(twice)) == 0


def test_scoring_planner_walks_towards_a_projected_goal_only_when_there_is_one():
    candidates = [_candidate([2, 2]), _candidate([2, 2])]  # frontiers at x = 0 m and x = 1 m
    ctx = _context(candidates, [2.0, 2.5])
    cfg = _scoring()

    class _Projecting(_FixedRetriever):
        def __init__(self, points):
            super().__init__([])
            self.points = points

        def retrieve(self, trajectories, goal, place=None):
            return replace(super().retrieve(trajectories, goal), goal_points=self.points)

    # 2.5 m + 4 m on to the goal beats 2 m + 5 m; without points the nearer frontier wins.
    planner = ScoringPlanner(_Projecting(np.array([[5.0, 0.0]])), cfg)
    assert planner.choose(ctx) == 1
    assert planner.last_terms["goal_projection"].tolist() == [-5.0, -4.0]
    assert ScoringPlanner(_Projecting(np.zeros((0, 2))), cfg).choose(ctx) == 0
    assert ScoringPlanner(_Projecting(None), cfg).choose(ctx) == 0

    # A place recognised once keeps guiding the episode when later matches fail (keep_goal_points),
    # and the next episode starts without it.
    retriever = _Projecting(np.array([[5.0, 0.0]]))
    for keep, later_choice in ((True, 1), (False, 0)):
        planner = ScoringPlanner(retriever, replace(cfg, keep_goal_points=keep))
        retriever.points = np.array([[5.0, 0.0]])
        assert planner.choose(ctx) == 1
        retriever.points = np.zeros((0, 2))
        assert planner.choose(ctx) == later_choice
        planner.reset("toilet", 0)
        assert planner.choose(ctx) == 0


def test_a_projected_goal_point_can_outrank_the_retrieved_priors():
    # The sink side (x = 0 m) is what toilets were near in past walks; a goal point projected
    # from a recognised place lies beyond the bed side (x = 1 m).
    candidates = [_candidate([1, 1]), _candidate([2, 2])]
    ctx = _context(candidates, [2.0, 2.5])
    experiences = [_experience("toilet", [0, 1, 1])]

    class _Projecting(_FixedRetriever):
        def retrieve(self, trajectories, goal, place=None):
            return replace(super().retrieve(trajectories, goal), goal_points=np.array([[5.0, 0.0]]))

    cfg = _scoring()
    assert ScoringPlanner(_Projecting(experiences), cfg).choose(ctx) == 0  # the priors win
    trusting = replace(cfg, w_priors_with_goal_points=0.0)
    assert ScoringPlanner(_Projecting(experiences), trusting).choose(ctx) == 1  # the way to the goal
    assert ScoringPlanner(_FixedRetriever(experiences), trusting).choose(ctx) == 0  # no point: priors


def test_scene_graph_relations_count_objects_seen_together():
    graph = SceneGraph([{"toilet", "sink"}, {"sink"}, {"bed", "chair"}, {"toilet", "sink"}], min_support=1)
    assert graph.relation("toilet", "sink") == pytest.approx(2 / 3)
    assert graph.relation("toilet", "bed") == 0.0
    assert graph.neighbours("toilet", 3) == [("sink", pytest.approx(2 / 3))]
    assert SceneGraph([{"toilet", "sink"}], min_support=2).relation("toilet", "sink") == 0.0


# -- trajrag eval ---------------------------------------------------------------------------------
def _eval(*args) -> SimpleNamespace:
    """``trajrag eval`` on 2 episodes of one val home, in this process (the models load once per
    test session): ``returncode``, ``stdout``, ``stderr``."""
    from trajrag.cli import main

    argv = ["eval", "--scenes", "procedural:val:1", "--episodes", "generated:2", *args,
            *[a for o in (*FAST_SIM, "episodes.max_steps=200") for a in ("--set", o)], "--json"]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code
    return SimpleNamespace(returncode=code, stdout=stdout.getvalue(), stderr=stderr.getvalue())


@pytest.mark.slow
def test_eval_writes_records_summary_and_table_and_resumes(nav_memory, tmp_path):
    store, model_dir = nav_memory
    out = tmp_path / "eval"
    run = _eval("--planner", "trajrag,frontier,graphrag", "--store", store, "--model", model_dir, "--out", str(out),
                "--audit-decisions")
    assert run.returncode == 0, run.stderr[-2000:]
    runs = json.loads(run.stdout.strip().splitlines()[-1])["runs"]
    assert set(runs) == {"trajrag", "frontier", "graphrag"}
    for name, summary in runs.items():
        assert summary["episodes"] == 2 and 0.0 <= summary["sr"] <= 1.0 and 0.0 <= summary["spl"] <= 1.0
        assert summary["planner_calls"] > 0 and summary["fallbacks"] == 0
        # every planner's decisions audited, with its own scores
        assert summary["decisions_audited"] == summary["planner_calls"]
        assert 0.0 <= summary["decision_best_rate"] <= 1.0 and summary["decision_score_rho_n"] > 0
    # terms that varied across candidates (the small memory's context often does not)
    assert {"similarity", "nearness"} <= set(runs["trajrag"]["decision_term_rho"]) <= {"similarity", "context", "nearness"}
    assert runs["trajrag"]["retrieval_ms_p50"] > 0 and runs["frontier"]["retrieval_ms_p50"] is None
    # where the retrieval time went: coarse stage, embedding the candidates, the search
    assert runs["trajrag"]["coarse_ms_p50"] > 0 and runs["trajrag"]["encode_ms_p50"] >= 0
    assert runs["trajrag"]["search_ms_p50"] > 0 and runs["frontier"]["coarse_ms_p50"] is None
    records = (out / "trajrag" / "episodes.jsonl").read_text().splitlines()
    assert len(records) == 2 and "retrieval_ms" in json.loads(records[0])["planner_stats"]
    table = (out / "results.md").read_text()
    assert all(f"| {name} |" in table for name in runs) and "retrieval_ms_p50" in table
    assert "decision_best_rate" in table  # audited runs add their columns
    again = _eval("--planner", "trajrag", "--variant", "no_coarse", "--store", store, "--model", model_dir,
                  "--out", str(out))
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["label"] == "trajrag-no_coarse"
    assert len((out / "trajrag" / "episodes.jsonl").read_text().splitlines()) == 2  # untouched
    assert "| trajrag-no_coarse |" in (out / "results.md").read_text()  # the table spans both calls


def test_decision_audit_refuses_the_ray_job_with_a_clear_error(tmp_path, capsys):
    from trajrag.cli import main

    argv = ["eval", "--scenes", "procedural:val:1", "--episodes", "generated:1", "--planner", "frontier",
            "--out", str(tmp_path), "--audit-decisions", "--workers", "2"]
    assert main(argv) == 2
    assert "--audit-decisions" in capsys.readouterr().err


@pytest.mark.slow
def test_lifelong_eval_inserts_episodes_and_records_the_curve(nav_memory, tmp_path):
    from trajrag.memory.store import MemoryStore, claim_store

    source, model_dir = nav_memory
    store = str(tmp_path / "memory")
    shutil.copytree(source, store)
    before = MemoryStore(store, read_only=True).count("chunks")
    out = tmp_path / "lifelong"
    run = _eval("--planner", "trajrag", "--store", store, "--model", model_dir, "--out", str(out), "--lifelong")
    assert run.returncode == 0, run.stderr[-2000:]
    rows = (out / "trajrag" / "lifelong.csv").read_text().splitlines()
    assert rows[0] == "episodes_seen,sr,spl,chunks,last_action" and len(rows) == 3
    after = MemoryStore(store, read_only=True)
    inserted = after.count("chunks", "trajectory_id LIKE 'lifelong/%'")
    assert after.count("chunks") == before + inserted
    assert after.count("chunks", "trajectory_id LIKE 'lifelong/%' AND embedding IS NULL") == 0
    settings = json.loads((out / "trajrag" / "run.json").read_text())
    assert settings["lifelong"] and "chunks" not in settings["inputs"]["memory"]  # it grows by design
    again = _eval("--planner", "trajrag", "--store", store, "--model", model_dir, "--out", str(out), "--lifelong")
    assert again.returncode == 0 and (out / "trajrag" / "lifelong.csv").read_text().splitlines() == rows
    assert MemoryStore(store, read_only=True).count("chunks") == before + inserted  # nothing walked twice
    with claim_store(store, "corpus build in another shell"):  # a lifelong run writes the store too
        busy = _eval("--planner", "trajrag", "--store", store, "--model", model_dir, "--out",
                     str(tmp_path / "busy"), "--lifelong")
    assert busy.returncode == 2 and "corpus build in another shell" in busy.stderr, busy.stderr[-2000:]


@pytest.mark.slow
def test_a_run_does_not_resume_on_a_memory_that_changed_under_its_path(nav_memory, tmp_path):
    source, model_dir = nav_memory
    store = str(tmp_path / "memory")
    shutil.copytree(source, store)
    out = tmp_path / "eval"
    args = ("--planner", "trajrag", "--store", store, "--model", model_dir, "--out", str(out))
    first = _eval(*args)
    assert first.returncode == 0, first.stderr[-2000:]
    memory = json.loads((out / "trajrag" / "run.json").read_text())["inputs"]["memory"]
    assert memory["chunks"] > 0 and memory["groups"] > 0 and len(memory["encoder_versions"]) == 1
    records = (out / "trajrag" / "episodes.jsonl").read_text()
    # another run in lifelong mode grows the same memory
    assert _eval(*args[:-1], str(tmp_path / "lifelong"), "--lifelong").returncode == 0
    grown = _eval(*args)
    assert grown.returncode == 2 and "Traceback" not in grown.stderr
    assert f"inputs.memory.chunks: {memory['chunks']} -> " in grown.stderr
    assert (out / "trajrag" / "episodes.jsonl").read_text() == records


@pytest.mark.slow
def test_eval_errors_are_one_line(nav_memory, tmp_path):
    run = _eval("--planner", "trajrag", "--out", str(tmp_path / "x"))
    assert run.returncode == 2 and "--store" in run.stderr and "Traceback" not in run.stderr
    run = _eval("--planner", "frontier", "--out", str(tmp_path / "x"), "--set",
                "navigator.vocabulary=[lamp]")
    assert run.returncode == 2 and "not in the agent vocabulary" in run.stderr and "Traceback" not in run.stderr
    run = _eval("--planner", "teleport", "--out", str(tmp_path / "x"))
    assert run.returncode == 2 and "unknown planner" in run.stderr
    run = _eval("--planner", "trajrag", "--store", str(tmp_path / "nothing"), "--model", nav_memory[1],
                "--out", str(tmp_path / "x"))
    assert run.returncode == 2 and "no memory there" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "nothing").exists()


@pytest.mark.slow
def test_a_run_resumes_only_with_the_settings_it_was_made_with(tmp_path):
    """Records carry no settings: a resume with other --set values must not mix them in silently."""
    out = tmp_path / "eval"
    first = _eval("--planner", "frontier", "--out", str(out), "--set", "navigator.frontier_hysteresis_m=0.5")
    assert first.returncode == 0, first.stderr[-2000:]
    records = (out / "frontier" / "episodes.jsonl").read_text()
    settings = json.loads((out / "frontier" / "run.json").read_text())
    assert settings["planner"] == "frontier" and settings["overrides"]["navigator.frontier_hysteresis_m"] == "0.5"

    # the same settings (and another job size) resume: nothing run twice
    same = _eval("--planner", "frontier", "--out", str(out), "--set", "navigator.frontier_hysteresis_m=0.5",
                 "--set", "eval_job.evaluators=3")
    assert same.returncode == 0 and (out / "frontier" / "episodes.jsonl").read_text() == records

    other = _eval("--planner", "frontier", "--out", str(out), "--set", "navigator.frontier_hysteresis_m=2")
    assert other.returncode == 2 and "Traceback" not in other.stderr
    assert "navigator.frontier_hysteresis_m: 0.5 -> 2" in other.stderr and "--label" in other.stderr
    assert (out / "frontier" / "episodes.jsonl").read_text() == records  # nothing lost, nothing added
    unset = _eval("--planner", "frontier", "--out", str(out))
    assert unset.returncode == 2 and "0.5 -> (default)" in unset.stderr

    # a run.json from before runs recorded their inputs resumes, and records them from then on
    (out / "frontier" / "run.json").write_text(json.dumps({k: v for k, v in settings.items() if k != "inputs"}))
    adopted = _eval("--planner", "frontier", "--out", str(out), "--set", "navigator.frontier_hysteresis_m=0.5")
    assert adopted.returncode == 0 and (out / "frontier" / "episodes.jsonl").read_text() == records
    assert json.loads((out / "frontier" / "run.json").read_text()) == settings

    # records scored by an older trajrag (run.json format /1: success only inside the goal region)
    # do not take records scored with habitat's 0.1 m tolerance
    older = {**settings, "format": "trajrag-eval-run/1"}
    (out / "frontier" / "run.json").write_text(json.dumps(older))
    scored_otherwise = _eval("--planner", "frontier", "--out", str(out), "--set", "navigator.frontier_hysteresis_m=0.5")
    assert scored_otherwise.returncode == 2 and "format: trajrag-eval-run/1 -> trajrag-eval-run/2" in scored_otherwise.stderr
    assert (out / "frontier" / "episodes.jsonl").read_text() == records

    # a damaged run.json is named, and neither it nor the records are touched
    (out / "frontier" / "run.json").write_text("{not json")
    damaged = _eval("--planner", "frontier", "--out", str(out))
    assert damaged.returncode == 2 and "not a run settings file" in damaged.stderr and "Traceback" not in damaged.stderr
    assert (out / "frontier" / "run.json").read_text() == "{not json"
    assert (out / "frontier" / "episodes.jsonl").read_text() == records

    # records from before run.json (scored inside the region only) are refused too, untouched
    (out / "frontier" / "run.json").unlink()
    legacy = _eval("--planner", "frontier", "--out", str(out))
    assert legacy.returncode == 2 and "no run.json" in legacy.stderr and "--out" in legacy.stderr
    assert not (out / "frontier" / "run.json").exists()
    assert (out / "frontier" / "episodes.jsonl").read_text() == records


def test_run_settings_keep_the_last_value_of_a_key_and_leave_out_the_job():
    from trajrag.agent.run_claims import run_settings

    # (nearest frontier reads neither path, so nothing is opened to record its content)
    settings = run_settings("frontier", config.settings(["retrieval.store=s3://bucket/M", "scoring.w_value=1",
                                                         "eval_job.evaluators=4", "run.workers=0", "scoring.w_value = 2"]))
    assert settings["planner"] == "frontier" and settings["inputs"] == {}
    assert settings["overrides"] == {"retrieval.store": "s3://bucket/M", "scoring.w_value": "2"}


def test_run_settings_name_a_local_memory_the_same_from_any_folder(tmp_path, monkeypatch):
    from trajrag.agent.run_claims import run_settings

    (tmp_path / "M").mkdir()
    monkeypatch.chdir(tmp_path)
    absolute = run_settings("frontier", config.settings([f"retrieval.store={tmp_path / 'M'}"]))
    assert run_settings("frontier", config.settings(["retrieval.store=M"])) == absolute


def test_in_a_home_the_memory_has_walked_the_planner_heads_for_where_its_walks_saw_the_goal():
    candidates = [_candidate([2, 2]), _candidate([2, 2])]  # frontiers at x = 0 m and x = 1 m
    ctx = _context(candidates, [2.0, 2.5])
    ctx.trajectory = SimpleNamespace(scene_id="home", node_xy=np.array([[0.0, -3.0]]))
    explored = np.zeros((400, 400), dtype=bool)  # 5 cm cells, the map's centre at (0, 0)
    ctx.sem_map = SimpleNamespace(shape=explored.shape, cell_size=0.05, explored=explored,
                                  to_cell=lambda xy: (int(200 + xy[1] / 0.05), int(200 + xy[0] / 0.05)))

    class _Home(_FixedRetriever):
        def __init__(self):
            super().__init__([])
            self.asked = []

        def home_goal_points(self, scene, goal):
            self.asked.append((scene, goal))
            return np.array([[5.0, 0.0]]) if scene == "home" else np.zeros((0, 2))

    retriever = _Home()
    planner = ScoringPlanner(retriever, _scoring())
    # 2.5 m + 4 m on to the remembered place beats 2 m + 5 m; read once per episode
    assert planner.choose(ctx) == 1 and planner.choose(ctx) == 1
    assert retriever.asked == [("home", "toilet")]
    assert planner.last_terms["goal_projection"].tolist() == [-5.0, -4.0]
    # once the agent has come near the place, or mapped the ground around it, without finding the
    # goal, it is forgotten
    for forget in ("walked", "mapped"):
        planner.reset("toilet", 0)
        if forget == "walked":
            ctx.trajectory.node_xy = np.array([[0.0, -3.0], [4.0, 0.5]])
        else:
            explored[150:250, 250:350] = True  # 2.5 m around (5, 0)
        assert planner.choose(ctx) == 0 and len(planner.home_points) == 0
        ctx.trajectory.node_xy, explored[:] = np.array([[0.0, -3.0]]), False
    # another home's walks say nothing about this one
    planner.reset("toilet", 0)
    ctx.trajectory = SimpleNamespace(scene_id="elsewhere", node_xy=np.zeros((0, 2)))
    assert planner.choose(ctx) == 0


@pytest.mark.slow
def test_home_goal_points_are_the_nodes_of_that_homes_walks_that_saw_the_goal(nav_memory):
    from trajrag.memory.store import CHUNKS, MemoryStore

    store, model_dir = nav_memory
    retriever = _retriever(store, model_dir, "retrieval.home_cell_m=0.01")
    memory = MemoryStore(store, read_only=True)
    maps = ["map_xy", "map_sectors"] if memory.keeps_maps else []
    rows = memory.read(CHUNKS, ["scene_hint", "goal", "node_xy", "sectors", *maps]).to_pylist()
    label = memory.vocabulary()
    scene, goal = rows[0]["scene_hint"], rows[0]["goal"]
    expected = []
    for row in rows:  # every node of the walk's map (or the walk, where no map is kept) seeing the goal
        if row["scene_hint"] == scene:
            whole = bool(maps) and row["map_xy"] is not None
            xy = np.asarray(row["map_xy"] if whole else row["node_xy"]).reshape(-1, 2)
            sectors = np.asarray(row["map_sectors"] if whole else row["sectors"]).reshape(len(xy), -1)
            expected.extend(map(tuple, xy[(sectors == label[goal]).any(axis=1)]))
    points = retriever.home_goal_points(scene, goal)
    assert len(expected) and len(points) == len(set(expected))  # 1 cm cells: every sighting node once
    assert {tuple(p) for p in np.round(points, 6)} == {tuple(p) for p in np.round(np.unique(expected, axis=0), 6)}
    assert len(retriever.home_goal_points("gibson/Elsewhere/0", goal)) == 0
    assert len(_retriever(store, model_dir, "retrieval.home_goals=false").home_goal_points(scene, goal)) == 0
