"""NavProbe as a comparison planner (seed 003): a subgoal agenda revised as evidence arrives, a
compact index of the episode, retrieval only when the context is insufficient, backtracking.

Each decision, as NavProbe's task executive does before every action:

1. **Index** (``EpisodeIndex``): the places walked (topo nodes, the step each was reached, the
   objects around it), the transitions between them, and the landmarks: objects on the map as
   connected components of their channel, with position and the step first seen.
2. **Agenda** (``Agenda``): subgoals "search around this place for the goal", each with a
   position, a strength and its reason. Landmarks seen now whose category goes with the goal
   (``relation``: P(goal seen | category seen) at one topo node, over the memory's walks:
   ``graphrag.SceneGraph``) at least ``min_relation`` open one; so does every place where the
   memory's walks of this same home saw the goal (strength ``remembered_strength``).
3. **Revision**: a landmark subgoal is *contradicted* when the landmarks around it (the episode's
   and the memory's of this home) say otherwise: at least ``min_evidence`` categories whose mean
   relation to the goal is under ``contradict_relation`` (a nightstand seen from a doorway, then
   a toilet and a bathtub beside it: a bathroom, not a bedroom). Any subgoal is *exhausted* when
   the map around it is explored (``explored_share``) and no frontier is left near it, or after
   ``patience_decisions`` decisions pursued. Closed places are consolidated: no new subgoal opens
   within ``subgoal_radius_m`` of one.
4. **Retrieval**, only when the context is insufficient (no open subgoal of strength
   ``sufficient_strength``): the memory's walks of this home (places that saw the goal, their
   landmarks; read once per episode) and the episode's index for landmarks seen earlier that go
   with the goal at least half as much as ``min_relation`` asks. Timed per retrieval
   (``retrieval_ms``).
5. **Act**: the open subgoal of highest priority (strength minus ``w_distance_per_m`` per metre
   away; the active one kept unless another beats it by ``switch_margin``; with ``llm``, the chat
   model picks among the ``llm_subgoals`` best when a new one is needed) and the candidate whose
   frontier reaches it soonest (``target.cost_via_frontier``). Turning to a subgoal opened at an
   earlier decision after the active one closed is a *backtrack* to a remembered landmark. With
   no subgoal at all, nearest frontier (``fallbacks``).

On an unseen home the memory contributes the relations alone (other homes' co-occurrence).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
from scipy import ndimage

from trajrag.config import Settings
from trajrag.memory.forest import Places
from trajrag.memory.forest_store import home_places
from trajrag.memory.store import MemoryStore
from trajrag.planners.base import PlannerContext, RetrievalTimings, candidate_distances, hysteresis_bonus
from trajrag.planners.graphrag import SceneGraph
from trajrag.planners.chat import make_chat
from trajrag.planners.llm_choice import ChoiceAsker, ChoiceCounts
from trajrag.planners.target import cost_via_frontier, explored_share, frontier_xy
from trajrag.retrieval.retriever import RetrievalError

_EIGHT = np.ones((3, 3), dtype=bool)


@dataclass
class NavProbeConfig:
    """``configs/navprobe.yaml``: evidence thresholds, radii (metres) and priorities."""

    min_support: int
    min_relation: float
    sufficient_strength: float
    landmark_min_cells: int
    landmark_merge_m: float
    subgoal_radius_m: float
    explored_share: float
    contradict_relation: float
    min_evidence: int
    remembered_strength: float
    w_distance_per_m: float
    switch_margin: float
    patience_decisions: int
    max_subgoals: int
    place_cell_m: float
    llm: bool
    llm_subgoals: int
    executive_system: str
    executive_prompt: str

    def __post_init__(self) -> None:
        radii = (self.landmark_merge_m, self.subgoal_radius_m, self.place_cell_m)
        if min(radii) <= 0 or not 0.0 <= self.explored_share <= 1.0 or self.max_subgoals < 1:
            raise ValueError(f"navprobe: landmark_merge_m, subgoal_radius_m and place_cell_m must be > 0 m, "
                             f"explored_share in [0, 1] and max_subgoals >= 1, got {radii}, "
                             f"{self.explored_share}, {self.max_subgoals}")


# -- the episode's index -----------------------------------------------------------------------------
@dataclass(eq=False)
class Landmark:
    """An object at a place: ``category``, ``xy`` (map-frame metres) and the episode step it was
    first mapped at (-1: from the memory's walks)."""

    category: str
    xy: np.ndarray
    step: int = -1


class EpisodeIndex:
    """The compact index of one episode (module docstring, 1.)."""

    def __init__(self, goal: str, min_cells: int, merge_m: float) -> None:
        self.goal, self.min_cells, self.merge_m = goal, min_cells, merge_m
        self.places: list[tuple[np.ndarray, int, frozenset[str]]] = []  # (xy, step reached, objects)
        self.transitions: list[tuple[int, int]] = []  # (place, next place)
        self.landmarks: list[Landmark] = []

    def update(self, ctx: PlannerContext) -> list[Landmark]:
        """Read the walked trajectory and the map; returns the landmarks seen for the first time."""
        self._update_places(ctx)
        return self._update_landmarks(ctx)

    def _update_places(self, ctx: PlannerContext) -> None:
        traj = ctx.trajectory
        steps = np.asarray(traj.node_visit_steps)
        known = {tuple(np.round(p[0], 2)) for p in self.places}
        for k in range(len(traj)):
            xy = np.asarray(traj.node_xy[k], dtype=float)
            if tuple(np.round(xy, 2)) in known:
                continue
            objects = frozenset(str(traj.categories[c]) for c in np.asarray(traj.sectors[k]) if c >= 0)
            self.places.append((xy, int(steps[k]) if k < len(steps) else ctx.step, objects))
            if len(self.places) > 1:
                self.transitions.append((len(self.places) - 2, len(self.places) - 1))

    def _update_landmarks(self, ctx: PlannerContext) -> list[Landmark]:
        sem = ctx.sem_map
        bbox = sem.explored_bbox()
        if bbox is None:
            return []
        r0, r1, c0, c1 = bbox
        objects = np.asarray(sem.objects[:, r0:r1, c0:c1], dtype=bool)
        new = []
        for channel in np.flatnonzero(objects.any(axis=(1, 2))):
            category = str(sem.categories[channel])
            if category == self.goal:
                continue  # the navigator walks to a mapped goal itself
            labels, n = ndimage.label(objects[channel], structure=_EIGHT)
            sizes = np.bincount(labels.ravel(), minlength=n + 1)
            for component in np.flatnonzero(sizes[1:] >= self.min_cells) + 1:
                cells = np.argwhere(labels == component) + np.array([r0, c0])
                xy = sem.to_xy(cells).mean(axis=0)
                same = [m for m in self.landmarks if m.category == category
                        and np.linalg.norm(m.xy - xy) <= self.merge_m]
                if same:
                    same[0].xy = xy  # the object grows as more of it is mapped
                else:
                    landmark = Landmark(category, xy, ctx.step)
                    self.landmarks.append(landmark)
                    new.append(landmark)
        return new


# -- the agenda --------------------------------------------------------------------------------------
@dataclass(eq=False)
class Subgoal:
    """"Search around ``xy`` for the goal": ``kind`` ``remembered`` (the memory's walks of this
    home saw the goal here) or ``landmark`` (near an object that goes with the goal);
    ``strength`` in [0, 1]; ``status`` open, contradicted or exhausted; ``opened`` / ``closed``:
    the decision numbers it was opened and closed at; ``pursued``: decisions it was active."""

    kind: str
    xy: np.ndarray
    strength: float
    reason: str
    opened: int
    status: str = "open"
    closed: int = -1
    pursued: int = 0
    evidence: list[str] = field(default_factory=list)


class Agenda:
    """The subgoals of one episode, their revision and the choice of the active one."""

    def __init__(self, cfg: NavProbeConfig, relation: Callable[[str], float]) -> None:
        self.cfg, self.relation = cfg, relation
        self.subgoals: list[Subgoal] = []
        self.active: Optional[Subgoal] = None

    def open(self) -> list[Subgoal]:
        return [s for s in self.subgoals if s.status == "open"]

    def add(self, subgoal: Subgoal) -> bool:
        """Open ``subgoal`` unless one already covers its place (a closed one: the place was
        searched; an open one takes the new evidence when it is stronger); the weakest open one
        gives way when ``max_subgoals`` are open."""
        covering = [s for s in self.subgoals if np.linalg.norm(s.xy - subgoal.xy) <= self.cfg.subgoal_radius_m]
        if covering:
            stronger = [s for s in covering if s.status == "open" and s.strength < subgoal.strength]
            for s in stronger:
                s.kind, s.strength, s.reason = subgoal.kind, subgoal.strength, subgoal.reason
            return False
        open_now = self.open()
        if len(open_now) >= self.cfg.max_subgoals:
            weakest = min(open_now, key=lambda s: s.strength)
            if weakest.strength >= subgoal.strength:
                return False
            self.subgoals.remove(weakest)
        self.subgoals.append(subgoal)
        return True

    def add_landmarks(self, landmarks: Sequence[Landmark], min_relation: float, decision: int) -> int:
        """Open a subgoal at each landmark related to the goal at least ``min_relation``."""
        added = 0
        for landmark in landmarks:
            strength = self.relation(landmark.category)
            if strength >= min_relation:
                reason = f"{landmark.category.replace('_', ' ')} (goal seen near it in {strength:.0%} of places)"
                added += self.add(Subgoal("landmark", np.asarray(landmark.xy, dtype=float), strength, reason, decision))
        return added

    def evidence(self, subgoal: Subgoal, landmarks: Sequence[Landmark]) -> list[str]:
        """The categories of ``landmarks`` within ``subgoal_radius_m`` of the subgoal."""
        return sorted({m.category for m in landmarks if np.linalg.norm(m.xy - subgoal.xy) <= self.cfg.subgoal_radius_m})

    def revise(self, ctx: PlannerContext, landmarks: Sequence[Landmark], decision: int) -> list[Subgoal]:
        """Close the open subgoals the evidence contradicts or exhausts (module docstring, 3.);
        returns them."""
        cfg, closed = self.cfg, []
        near_frontier = frontier_xy(ctx)
        for subgoal in self.open():
            subgoal.evidence = self.evidence(subgoal, landmarks)
            if subgoal.kind == "landmark" and self.contradicted(subgoal.evidence):
                subgoal.status = "contradicted"
            elif subgoal.pursued >= cfg.patience_decisions or (
                    not (np.linalg.norm(near_frontier - subgoal.xy, axis=1) <= cfg.subgoal_radius_m).any()
                    and explored_share(ctx.sem_map, subgoal.xy, cfg.subgoal_radius_m) >= cfg.explored_share):
                subgoal.status = "exhausted"
            else:
                continue
            subgoal.closed = decision
            closed.append(subgoal)
        if self.active is not None and self.active.status != "open":
            self.active = None
        return closed

    def contradicted(self, categories: Sequence[str]) -> bool:
        """At least ``min_evidence`` categories around, going with the goal less than
        ``contradict_relation`` on average."""
        if len(categories) < self.cfg.min_evidence:
            return False
        return float(np.mean([self.relation(c) for c in categories])) < self.cfg.contradict_relation

    def priority(self, subgoal: Subgoal, xy: np.ndarray) -> float:
        return subgoal.strength - self.cfg.w_distance_per_m * float(np.linalg.norm(subgoal.xy - xy))

    def ranked(self, xy: np.ndarray) -> list[Subgoal]:
        """The open subgoals, highest priority first."""
        return sorted(self.open(), key=lambda s: -self.priority(s, xy))


# -- the planner -------------------------------------------------------------------------------------
@dataclass
class HomeMemory:
    """What the memory knows for NavProbe: ``relation(goal, category)`` over every walk and
    ``places(scene)``, the places its walks of a home saw (none for a home it never walked)."""

    relation: Callable[[str, str], float]
    places: Callable[[str], Places]


class NavProbePlanner(RetrievalTimings):
    """Agenda-driven search (module docstring)."""

    name = "navprobe"

    def __init__(self, memory: HomeMemory, cfg: NavProbeConfig, hysteresis_m: float,
                 asker: Optional[ChoiceAsker] = None) -> None:
        super().__init__()
        self.memory, self.cfg, self.hysteresis_m, self.asker = memory, cfg, hysteresis_m, asker
        self.last_scores: Optional[np.ndarray] = None
        self.last_terms: dict[str, np.ndarray] = {}  # per candidate, higher = preferred
        self.reset("", 0)

    def reset(self, goal: str, seed: int) -> None:
        super().reset(goal, seed)
        self.goal = goal
        cfg = self.cfg
        self.index = EpisodeIndex(goal, cfg.landmark_min_cells, cfg.landmark_merge_m)
        self.agenda = Agenda(cfg, lambda category: self.memory.relation(goal, category))
        self.memory_landmarks: list[Landmark] = []
        self.home_read = False  # the memory's walks of this home, read at the first retrieval
        self.scene: Optional[str] = None
        self.decision = 0
        self.counts = {"fallbacks": 0, "contradicted": 0, "exhausted": 0, "backtracks": 0}
        self._llm_before = ChoiceCounts(**asdict(self.asker.counts)) if self.asker is not None else None

    def episode_stats(self) -> dict:
        stats = {**super().episode_stats(), **self.counts, "retrievals": len(self.retrieval_ms),
                 "subgoals": len(self.agenda.subgoals), "landmarks": len(self.index.landmarks),
                 "places": len(self.index.places), "transitions": len(self.index.transitions),
                 "memory_landmarks": len(self.memory_landmarks)}
        if self.asker is not None:
            stats["llm"] = self.asker.counts.since(self._llm_before)
        return stats

    def choose(self, ctx: PlannerContext) -> int:
        self.decision += 1
        self.scene = self.scene or ctx.trajectory.scene_id
        seen_now = self.index.update(ctx)
        self.agenda.add_landmarks(seen_now, self.cfg.min_relation, self.decision)
        previous = self.agenda.active
        for subgoal in self.agenda.revise(ctx, [*self.index.landmarks, *self.memory_landmarks], self.decision):
            self.counts[subgoal.status] += 1
        if not any(s.strength >= self.cfg.sufficient_strength for s in self.agenda.open()):
            self.retrieve(ctx)  # no strong evidence of the goal: probe the memory and the index
        subgoal = self._pick(ctx)
        distance = candidate_distances(ctx)
        if subgoal is None:
            self.counts["fallbacks"] += 1
            cost, self.last_terms = distance, {"nearness": -distance}
        else:
            subgoal.pursued += 1
            if previous is not None and previous.status != "open" and subgoal.opened < self.decision:
                self.counts["backtracks"] += 1
            cost = cost_via_frontier(ctx, subgoal.xy)
            self.last_terms = {"subgoal": -(cost - distance), "nearness": -distance}
        self.last_scores = -cost + hysteresis_bonus(ctx, self.hysteresis_m, 1.0)
        return int(np.argmax(self.last_scores))

    def retrieve(self, ctx: PlannerContext) -> None:
        """Probe the memory of this home and the episode's index for subgoals (module
        docstring, 4.)."""
        start = time.perf_counter()
        if not self.home_read:
            self.home_read = True
            places = self.memory.places(self.scene)
            self.memory_landmarks = [Landmark(c, np.asarray(xy, dtype=float))
                                     for xy, names in zip(places.xy, places.objects) for c in sorted(names)]
            for xy, names in zip(places.xy, places.objects):
                if self.goal in names:
                    self.agenda.add(Subgoal("remembered", np.asarray(xy, dtype=float), self.cfg.remembered_strength,
                                            f"a {self.goal.replace('_', ' ')} was seen here on an earlier walk",
                                            self.decision))
        pool = [m for m in (*self.index.landmarks, *self.memory_landmarks) if m.category != self.goal]
        self.agenda.add_landmarks(pool, self.cfg.min_relation / 2, self.decision)
        self.add_timings((time.perf_counter() - start) * 1e3)

    def _pick(self, ctx: PlannerContext) -> Optional[Subgoal]:
        """The subgoal to pursue (module docstring, 5.)."""
        xy = np.asarray(ctx.pose.xy, dtype=float)
        ranked = self.agenda.ranked(xy)
        if not ranked:
            self.agenda.active = None
            return None
        active = self.agenda.active
        if active is not None and self.agenda.priority(ranked[0], xy) <= self.agenda.priority(active, xy) + self.cfg.switch_margin:
            return active
        choice = ranked[0]
        if self.asker is not None and len(ranked) > 1:
            choice = self._llm_pick(ranked[:self.cfg.llm_subgoals], xy) or choice
        self.agenda.active = choice
        return choice

    def _llm_pick(self, shown: list[Subgoal], xy: np.ndarray) -> Optional[Subgoal]:
        """The chat model's pick among ``shown`` (None when it gives no usable answer)."""
        lines = []
        for i, s in enumerate(shown):
            around = ", ".join(c.replace("_", " ") for c in s.evidence) or "nothing mapped yet"
            lines.append(f"[{i}] {np.linalg.norm(s.xy - xy):.1f} m away: {s.reason}; around it: {around}.")
        seen = sorted({m.category.replace("_", " ") for m in self.index.landmarks})
        question = self.cfg.executive_prompt.format(
            goal=self.goal.replace("_", " "), subgoals="\n".join(lines),
            closed=sum(s.status != "open" for s in self.agenda.subgoals), seen=", ".join(seen) or "nothing")
        choice = self.asker.choose(self.cfg.executive_system, question, len(shown))
        return None if choice is None else shown[choice]


# -- planner from the settings (agent/registry.py makes the agent) ------------------------------------------------------------------
_MEMORIES: dict[tuple, HomeMemory] = {}


def home_memory(store_uri: str, cfg: NavProbeConfig) -> HomeMemory:
    """The relations and the per-home places of the memory at ``store_uri`` (read once per
    process and settings)."""
    key = (store_uri, cfg.min_support, cfg.place_cell_m)
    if key not in _MEMORIES:
        store = MemoryStore(store_uri, read_only=True)
        graph = SceneGraph.from_store(store, cfg.min_support)
        cache: dict[str, Places] = {}

        def places(scene: str) -> Places:
            if scene not in cache:
                cache[scene] = home_places(store, scene, cfg.place_cell_m)[0]
            return cache[scene]

        _MEMORIES[key] = HomeMemory(graph.relation, places)
    return _MEMORIES[key]


def make_navprobe_planner(settings: Settings) -> "NavProbePlanner":
    """The NavProbe planner over ``retrieval.store``."""
    cfg: NavProbeConfig = settings.navprobe
    store = settings.retrieval.store
    if not store:
        raise RetrievalError("navprobe needs a memory store: pass --store PATH")
    asker = None
    if cfg.llm:
        asker = ChoiceAsker(make_chat(settings.llm.chat), settings.llm.planner)
    return NavProbePlanner(home_memory(store, cfg), cfg, settings.navigator.frontier_hysteresis_m, asker)
