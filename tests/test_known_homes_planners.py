"""The comparison planners of known homes: Embodied-RAG's semantic forest (build, beam search,
storage in the memory, the leaf as navigation target) and NavProbe's agenda (revision by
retrieved landmarks, retrieval only when the context is insufficient, backtracking), each on
hand-made decisions, with a scripted and the real local chat model, and end to end through
`trajrag eval` on a home the memory has walked and on one it has not."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from trajrag import config
from trajrag.agent.corpus import build_corpus
from trajrag.mapping.semantic_map import SemanticMap
from trajrag.memory.forest import Places, SemanticForest, beam_search, build_forest, merge_places
from trajrag.memory.forest_store import ForestTable
from trajrag.planners.base import PlannerContext
from trajrag.planners.embodied_rag import EmbodiedRAGPlanner, template_text
from trajrag.planners.llm_choice import ChoiceAsker
from trajrag.planners.navprobe import Agenda, HomeMemory, Landmark, NavProbePlanner, Subgoal
from trajrag.topo.candidates import CandidatePath
from trajrag.topo.labels import FREE
from trajrag.topo.trajectory import TopoPolarTrajectory
from trajrag.world.frames import Pose2D

from conftest import FAST_SIM

CATEGORIES = ("bed", "nightstand", "wardrobe", "toilet", "sink", "bathtub", "sofa", "chair")
# P(goal seen | category seen) for the goal bed, as a memory's co-occurrence table would say.
BED_RELATION = {"bed": 1.0, "nightstand": 0.7, "wardrobe": 0.5, "chair": 0.1, "toilet": 0.0, "sink": 0.05,
                "bathtub": 0.0, "sofa": 0.05}


def bag_of_objects(texts) -> np.ndarray:
    """A transparent text embedding: counts of the category words, L2-normalised (the MiniLM
    encoder's role, with a similarity one can check by hand)."""
    words = [c.replace("_", " ") for c in CATEGORIES]
    rows = np.zeros((len(texts), len(words)), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in re.findall(r"[a-z]+", text.lower()):
            if word in words:
                rows[i, words.index(word)] += 1
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms > 0, norms, 1)


def _cfg(**changes):
    return replace(config.load("embodied_rag"), **changes)


def _home() -> Places:
    """Three rooms of two or three places each: a bedroom around x=1, a bathroom around x=10, a
    living room around x=20 (metres)."""
    xy = [[0, 0], [1, 0], [2, 1], [10, 0], [11, 0], [20, 0], [21, 1], [20, 2]]
    objects = [{"nightstand"}, {"bed", "nightstand"}, {"wardrobe"}, {"toilet", "sink"}, {"bathtub"},
               {"sofa"}, {"chair"}, {"sofa", "chair"}]
    return Places(np.array(xy, dtype=float), [frozenset(o) for o in objects])


def _forest(cfg=None) -> SemanticForest:
    cfg = cfg or _cfg(branching=2)
    return build_forest(_home(), cfg.branching, lambda objects, n, _: template_text(cfg, objects, n), bag_of_objects)


def _query(goal: str) -> np.ndarray:
    return bag_of_objects([config.load("embodied_rag").query_template.format(goal=goal)])[0]


# -- the forest ------------------------------------------------------------------------------------------
def test_places_of_overlapping_walks_pool_per_cell_with_every_object_seen():
    places = merge_places(np.array([[0.2, 0.2], [0.6, 0.4], [3.1, 0.2]]), [{"bed"}, {"nightstand"}, set()], 1.0)
    assert len(places) == 2
    np.testing.assert_allclose(places.xy[0], [0.4, 0.3])
    assert places.objects == [frozenset({"bed", "nightstand"}), frozenset()]


def test_forest_clusters_rooms_and_parents_count_their_places_objects():
    forest = _forest()
    root = forest.root
    assert forest.parent[root] == -1 and forest.n_leaves[root] == 8 and forest.level[root] == forest.level.max()
    assert all(forest.level[leaf] == 0 for leaf in forest.leaves())
    # Every parent of places holds places of one room only (rooms 8 m apart, places 1-2 m).
    room = {i: int(forest.xy[i, 0] // 5) for i in forest.leaves()}
    for node in range(len(forest)):
        if forest.level[node] == 1:
            below = [leaf for leaf in forest.leaves() if node in forest.chain(leaf)]
            assert len({room[leaf] for leaf in below}) == 1
    assert forest.objects[root] == Counter({"nightstand": 2, "sofa": 2, "chair": 2, "bed": 1, "wardrobe": 1,
                                            "toilet": 1, "sink": 1, "bathtub": 1})
    assert "nightstand (2)" in forest.text[forest.parent[1]]


def test_beam_search_on_a_hand_made_tree_finds_the_leaf_with_the_goal_and_a_wrong_similarity_does_not():
    forest = _forest()
    for goal, place in (("bed", 1), ("toilet", 3), ("sofa", 5)):
        hits = beam_search(forest, _query(goal), beam_width=1)
        assert hits[0].leaf == place and goal in forest.objects[hits[0].leaf]
        assert hits[0].chain[-1] == forest.root and hits[0].chain[0] == place
    # Ranking by the opposite similarity walks into the rooms that do not hold the goal.
    wrong = beam_search(forest, -_query("bed"), beam_width=1)
    assert "bed" not in forest.objects[wrong[0].leaf]
    # Searched places are skipped: the next bed-like place is the nightstand beside it.
    again = beam_search(forest, _query("bed"), beam_width=1, exclude=[1])
    assert again[0].leaf in (0, 2) and again[0].leaf != 1
    assert beam_search(forest, _query("bed"), beam_width=1, exclude=forest.leaves()) == []


def test_a_wider_beam_finds_a_leaf_under_a_worse_summarised_parent():
    """root -> A (similarity 0.8) -> leaves 0.3, 0.2; root -> B (0.6) -> leaves 0.95, 0.1."""
    angles = np.arccos([0.3, 0.2, 0.95, 0.1, 0.8, 0.6, 0.0])
    forest = SemanticForest(xy=np.zeros((7, 2)), level=np.array([0, 0, 0, 0, 1, 1, 2]),
                            parent=np.array([4, 4, 5, 5, 6, 6, -1]), objects=[Counter()] * 7,
                            n_leaves=np.array([1, 1, 1, 1, 2, 2, 4]), text=[""] * 7,
                            embedding=np.stack([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32))
    query = np.array([1.0, 0.0])
    assert [h.leaf for h in beam_search(forest, query, beam_width=1)] == [0]
    assert [h.leaf for h in beam_search(forest, query, beam_width=2)] == [2, 0]


def test_forest_is_stored_beside_the_memory_and_read_back_by_its_key(tmp_path):
    forest = _forest()
    table = ForestTable(str(tmp_path / "memory"))
    assert table.load("home/0", "k1") is None
    assert table.save("home/0", "k1", forest)
    assert ForestTable(str(tmp_path / "memory")).save("home/0", "k1", forest)  # a second process's copy
    back = ForestTable(str(tmp_path / "memory")).load("home/0", "k1")
    assert back.text == forest.text and back.objects == forest.objects
    np.testing.assert_allclose(back.embedding, forest.embedding)
    np.testing.assert_array_equal(back.parent, forest.parent)
    assert [h.leaf for h in beam_search(back, _query("toilet"), 1)] == [3]
    assert table.load("home/0", "other settings") is None and table.load("home/1", "k1") is None


# -- hand-made decisions --------------------------------------------------------------------------------
def _map(explored=(), objects=()) -> SemanticMap:
    """A 40 x 40 m map (5 cm cells, x and y from -10 m) with boxes ``(x0, y0, x1, y1)`` (metres)
    explored and ``(category, box)`` objects mapped."""
    sem = SemanticMap.empty((800, 800), CATEGORIES, 0.05, (-10.0, -10.0))

    def cells(box):
        (r0, c0), (r1, c1) = sem.to_cell(np.array(box[:2])), sem.to_cell(np.array(box[2:]))
        return slice(r0, r1 + 1), slice(c0, c1 + 1)

    for box in explored:
        sem.explored[cells(box)] = True
    for category, box in objects:
        sem.objects[(CATEGORIES.index(category), *cells(box))] = True
        sem.explored[cells(box)] = True
    return sem


def _context(sem, frontiers, goal="bed", pose=(0.0, 0.0), scene="procedural/val/0000", step=40) -> PlannerContext:
    """Candidates to the frontier centroids ``frontiers`` (metres), the straight line from
    ``pose`` as their geodesic distance."""
    walked = np.array([pose], dtype=float)
    traj = TopoPolarTrajectory(walked, np.full((1, 12), FREE), CATEGORIES, goal, 0.0, scene_id=scene,
                               node_visit_steps=np.array([step]))
    front = [SimpleNamespace(centroid_xy=np.array(xy, dtype=float)) for xy in frontiers]
    distances = np.array([np.linalg.norm(np.array(xy) - walked[0]) for xy in frontiers])
    candidates = [CandidatePath(i, np.zeros(1, dtype=int), float(d), traj) for i, d in enumerate(distances)]
    return PlannerContext(goal, step, Pose2D(*pose, 0.0), sem, traj, candidates, front, distances)


class Library:
    """The planner's forest source: one forest for the scene it knows, none elsewhere."""

    def __init__(self, forest, scene="procedural/val/0000") -> None:
        self.forests, self.encoder = {scene: forest}, SimpleNamespace(query=lambda text: bag_of_objects([text])[0])

    def forest(self, scene):
        return self.forests.get(scene)


def test_embodied_rag_heads_for_the_retrieved_place_then_the_next_once_it_is_searched():
    planner = EmbodiedRAGPlanner(Library(_forest()), _cfg(beam_width=2), hysteresis_m=0.0)
    planner.reset("toilet", 0)
    # Agent in the living room (x=20); frontiers west towards the bathroom and east.
    ctx = _context(_map(), [[14.0, 0.0], [22.0, 3.0]], goal="toilet", pose=(20.0, 0.0))
    assert planner.choose(ctx) == 0  # the far frontier, towards the bathroom (x=10-11)
    assert planner.target_leaf == 3 and planner.episode_stats()["first_target_sees_goal"] is True
    assert planner.episode_stats()["fallbacks"] == 0 and planner.episode_stats()["retrievals"] == 1
    # The bathroom's toilet place explored, no toilet mapped: on to the next place retrieved.
    ctx = _context(_map(explored=[(8.0, -2.0, 12.5, 2.0)]), [[14.0, 0.0], [22.0, 3.0]], goal="toilet", pose=(20.0, 0.0))
    planner.choose(ctx)
    assert 3 in planner.searched and planner.target_leaf not in planner.searched


def test_embodied_rag_on_a_home_the_memory_never_walked_is_nearest_frontier_and_counts_it():
    planner = EmbodiedRAGPlanner(Library(_forest()), _cfg(), hysteresis_m=0.0)
    planner.reset("bed", 0)
    ctx = _context(_map(), [[-3.0, 0.0], [1.0, 1.0]], scene="procedural/val/0007")
    assert planner.choose(ctx) == 1
    stats = planner.episode_stats()
    assert stats["fallbacks"] == 1 and stats["forest_nodes"] == 0 and stats["first_target_sees_goal"] is None


class ScriptedChat:
    """Answers from a list, in order; keeps the requests."""

    def __init__(self, answers) -> None:
        self.answers, self.requests = list(answers), []

    def complete(self, messages, *, prefill, max_tokens):
        self.requests.append(messages)
        return self.answers.pop(0)


def test_llm_guided_forest_search_follows_the_models_pick_and_falls_back_on_unusable_answers():
    forest = _forest()
    chat = ScriptedChat(['{"choice": 1, "reason": "bathroom"}', '{"choice": 0}', '{"choice": 0}'] + ["no idea"] * 8)
    asker = ChoiceAsker(chat, config.load("llm").planner)
    planner = EmbodiedRAGPlanner(Library(forest), _cfg(beam_width=1), hysteresis_m=0.0, asker=asker)
    planner.reset("bed", 0)
    planner.choose(_context(_map(), [[14.0, 0.0], [22.0, 3.0]], pose=(20.0, 0.0)))
    # The model sent the search into the second most similar area (no bed there).
    assert "bed" not in forest.objects[planner.target_leaf]
    assert "a place with a bed" in chat.requests[0][1]["content"]
    stats = planner.episode_stats()["llm"]
    assert stats["asked"] >= 2 and stats["fallbacks"] == 0
    planner.reset("bed", 0)  # unusable answers: the similarity order decides
    planner.choose(_context(_map(), [[14.0, 0.0], [22.0, 3.0]], pose=(20.0, 0.0)))
    assert planner.target_leaf == 1 and planner.episode_stats()["llm"]["fallbacks"] >= 1


# -- NavProbe ------------------------------------------------------------------------------------------
def _agenda(**changes) -> Agenda:
    return Agenda(replace(config.load("navprobe"), **changes), lambda category: BED_RELATION.get(category, 0.0))


def test_agenda_revises_a_subgoal_when_retrieved_landmarks_contradict_it():
    agenda = _agenda()
    nightstand = Landmark("nightstand", np.array([5.0, 5.0]), step=3)
    assert agenda.add_landmarks([nightstand, Landmark("toilet", np.array([-5.0, 0.0]))], 0.2, decision=1) == 1
    (subgoal,) = agenda.open()
    ctx = _context(_map(), [[4.0, 4.0]])  # a frontier beside it, nothing explored: not exhausted
    assert agenda.revise(ctx, [nightstand], decision=2) == [] and subgoal.status == "open"
    # Retrieved: a toilet and a bathtub beside the nightstand. A bathroom: the subgoal goes.
    retrieved = [Landmark("toilet", np.array([5.5, 5.0])),
                 Landmark("bathtub", np.array([5.0, 5.8]))]
    assert agenda.revise(ctx, [nightstand, *retrieved], decision=3) == [subgoal]
    assert subgoal.status == "contradicted" and subgoal.evidence == ["bathtub", "nightstand", "toilet"]
    # A wardrobe there instead would have kept it (mean relation 0.4 > 0.25).
    other = _agenda()
    other.add_landmarks([nightstand], 0.2, decision=1)
    kept = [Landmark("wardrobe", np.array([5.5, 5.0])), Landmark("sink", np.array([5.0, 5.8]))]
    assert other.revise(ctx, [nightstand, *kept], decision=2) == []
    # The place is consolidated: no new subgoal opens where one was closed.
    assert agenda.add_landmarks([Landmark("wardrobe", np.array([5.2, 5.2]))], 0.2, decision=4) == 0


def test_agenda_keeps_a_remembered_goal_place_whatever_the_landmarks_around_it():
    agenda = _agenda()
    agenda.add(Subgoal("remembered", np.array([5.0, 5.0]), 1.0, "a bed was seen here", 1))
    toilets = [Landmark(c, np.array([5.0, 5.0 + i * 0.3])) for i, c in enumerate(("toilet", "sink", "bathtub"))]
    assert agenda.revise(_context(_map(), [[4.0, 4.0]]), toilets, decision=2) == []


def test_a_full_agenda_drops_its_weakest_subgoal_for_a_stronger_one_only():
    agenda = _agenda(max_subgoals=2)
    spots = {"chair": [0.0, 0.0], "wardrobe": [5.0, 0.0], "nightstand": [10.0, 0.0], "sink": [15.0, 0.0]}
    landmarks = [Landmark(c, np.array(xy)) for c, xy in spots.items()]
    assert agenda.add_landmarks(landmarks, 0.0, decision=1) == 3  # the sink (0.05) finds the agenda full
    assert sorted(s.reason.split()[0] for s in agenda.open()) == ["nightstand", "wardrobe"]


def _navprobe(places=Places(np.zeros((0, 2)), []), **changes) -> NavProbePlanner:
    memory = HomeMemory(lambda goal, category: BED_RELATION.get(category, 0.0) if goal == "bed" else 0.0,
                        lambda scene: places)
    return NavProbePlanner(memory, replace(config.load("navprobe"), **changes), hysteresis_m=0.0)


def test_navprobe_retrieves_the_remembered_goal_place_once_and_not_while_it_is_open():
    remembered = Places(np.array([[6.0, 6.0], [-6.0, 0.0]]), [frozenset({"bed", "nightstand"}), frozenset({"sofa"})])
    planner = _navprobe(remembered)
    planner.reset("bed", 0)
    frontiers = [[-2.0, 0.0], [3.0, 3.0]]
    assert planner.choose(_context(_map(), frontiers)) == 1  # towards (6, 6), not the nearest
    assert planner.agenda.active.kind == "remembered"
    for _ in range(3):
        planner.choose(_context(_map(), frontiers))
    stats = planner.episode_stats()
    assert stats["retrievals"] == 1 and stats["fallbacks"] == 0 and stats["memory_landmarks"] == 3


def test_backtracking_returns_to_the_remembered_landmark_when_the_subgoal_ahead_is_exhausted():
    planner = _navprobe()
    planner.reset("bed", 0)
    # Decision 1: a nightstand behind (x=-8) and a wardrobe ahead (x=3) on the map; frontiers
    # near both and one more ahead.
    objects = [("nightstand", (-8.2, -0.2, -7.8, 0.2)), ("wardrobe", (2.8, -0.2, 3.2, 0.2))]
    ahead = _context(_map(objects=objects), [[-8.5, 0.5], [3.5, 0.5], [1.0, 2.0]])
    # The wardrobe first: its relation is 0.2 weaker than the nightstand's, but 5 m nearer.
    assert planner.choose(ahead) == 1
    assert planner.agenda.active.reason.startswith("wardrobe")
    # Decision 2: the wardrobe's surroundings explored, no frontier left there and no bed mapped.
    explored = _map(explored=[(1.0, -2.0, 5.0, 2.0)], objects=objects)
    choice = planner.choose(_context(explored, [[-8.5, 0.5], [1.0, 2.0]]))
    assert choice == 0 and planner.agenda.active.reason.startswith("nightstand")
    stats = planner.episode_stats()
    assert stats["exhausted"] == 1 and stats["backtracks"] == 1 and stats["fallbacks"] == 0
    # Without the remembered nightstand the same decision is nearest frontier's.
    alone = _navprobe()
    alone.reset("bed", 0)
    wardrobe_only = [objects[1]]
    alone.choose(_context(_map(objects=wardrobe_only), [[-8.5, 0.5], [3.5, 0.5], [1.0, 2.0]]))
    assert alone.choose(_context(_map(explored=[(1.0, -2.0, 5.0, 2.0)], objects=wardrobe_only),
                                 [[-8.5, 0.5], [1.0, 2.0]])) == 1
    assert alone.episode_stats()["fallbacks"] == 1


def test_navprobe_executive_follows_the_models_subgoal_pick():
    chat = ScriptedChat(['{"choice": 1, "reason": "the nightstand"}'])
    planner = _navprobe()
    planner.asker = ChoiceAsker(chat, config.load("llm").planner)
    planner.reset("bed", 0)
    objects = [("nightstand", (-8.2, -0.2, -7.8, 0.2)), ("wardrobe", (2.8, -0.2, 3.2, 0.2))]
    # The rule would take the wardrobe (nearer); the model picks the nightstand, shown second.
    assert planner.choose(_context(_map(objects=objects), [[-8.5, 0.5], [3.5, 0.5]])) == 0
    assert "[1]" in chat.requests[0][1]["content"] and "nightstand" in chat.requests[0][1]["content"]
    assert planner.episode_stats()["llm"]["asked"] == 1


@pytest.mark.slow
def test_real_smollm2_guides_the_forest_search_and_the_agenda(capsys):
    """SmolLM2-135M (the packaged offline model) picks a few nodes and one subgoal; answers are
    either used or fall back, never an error (~20-40 s with the model load)."""
    from trajrag.planners.chat import make_chat

    asker = ChoiceAsker(make_chat(config.load("llm").chat), config.load("llm").planner)
    planner = EmbodiedRAGPlanner(Library(_forest()), _cfg(beam_width=1), hysteresis_m=0.0, asker=asker)
    planner.reset("bed", 0)
    planner.choose(_context(_map(), [[-3.0, 0.0], [1.0, 1.0]]))
    assert planner.target_leaf in planner.forest.leaves()
    navprobe = _navprobe()
    navprobe.asker = asker
    navprobe.reset("bed", 0)
    objects = [("nightstand", (-8.2, -0.2, -7.8, 0.2)), ("wardrobe", (2.8, -0.2, 3.2, 0.2))]
    assert navprobe.choose(_context(_map(objects=objects), [[-8.5, 0.5], [3.5, 0.5]])) in (0, 1)
    counts = asker.counts
    assert counts.asked >= 3 and counts.chat_errors == 0 and counts.answers >= counts.asked - counts.fallbacks
    with capsys.disabled():
        print(f"\nSmolLM2 forest + agenda: {counts.asked} questions, {counts.parse_failures} unusable answers, "
              f"{counts.fallbacks} fallbacks, {counts.chat_s:.1f} s")


# -- end to end ----------------------------------------------------------------------------------------
def _eval(*args) -> tuple[int, dict, str]:
    from trajrag.cli import main

    argv = ["eval", *args, *[a for o in (*FAST_SIM, "episodes.max_steps=150") for a in ("--set", o)], "--json"]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(argv)
    return code, json.loads(stdout.getvalue().strip().splitlines()[-1]) if code == 0 else {}, stderr.getvalue()


@pytest.mark.slow
def test_eval_runs_both_planners_on_a_home_the_memory_walked_and_on_one_it_did_not(tmp_path):
    """A memory of 2 walks of procedural val home 0 (other episodes than the evaluated one),
    then one episode there and one in val home 1."""
    import lancedb

    store = str(tmp_path / "memory")
    build_corpus("procedural:val:1", 2, "oracle", store, config.settings(FAST_SIM), seed=99, progress=False)
    code, known, err = _eval("--scenes", "procedural:val:1", "--episodes", "generated:1", "--planner",
                             "embodied-rag,navprobe", "--store", store, "--out", str(tmp_path / "known"))
    assert code == 0, err[-2000:]
    code, unseen, err = _eval("--scenes", "procedural:val:1-2", "--episodes", "generated:1", "--planner",
                              "embodied-rag,navprobe", "--store", store, "--out", str(tmp_path / "unseen"))
    assert code == 0, err[-2000:]
    for runs in (known["runs"], unseen["runs"]):
        assert set(runs) == {"embodied-rag", "navprobe"} and all(r["planner_calls"] > 0 for r in runs.values())

    def stats(out, planner):
        return json.loads((tmp_path / out / planner / "episodes.jsonl").read_text().splitlines()[0])["planner_stats"]

    # The known home: a forest from the memory (stored in it), a target from it at every decision.
    forest = stats("known", "embodied-rag")
    assert forest["forest_nodes"] > 0 and forest["fallbacks"] == 0 and forest["retrievals"] >= 1
    assert lancedb.connect(store).open_table("forest").count_rows() == forest["forest_nodes"]
    assert stats("known", "navprobe")["memory_landmarks"] > 0
    # The unseen home: no forest, nearest frontier at every decision, counted.
    assert stats("unseen", "embodied-rag")["forest_nodes"] == 0
    assert unseen["runs"]["embodied-rag"]["fallbacks"] == unseen["runs"]["embodied-rag"]["planner_calls"]
    assert stats("unseen", "navprobe")["memory_landmarks"] == 0
