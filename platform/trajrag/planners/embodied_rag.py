"""Embodied-RAG as a comparison planner (seed 002): a semantic forest of the home from memory,
searched top-down for the goal; the retrieved place becomes the navigation target.

1. **Memory**: the forest of the episode's home (``memory.forest``), built from the memory's
   walks of that home (``memory.forest_store.home_places``) the first time the home is met and
   kept in the memory's ``forest`` table for every later episode and process. Node texts are a
   template of object names and counts (``template_text``); with ``embodied_rag.llm`` the chat
   model (``configs/llm.yaml`` ``chat``) abstracts each parent from its children's texts with the
   paper's abstraction prompt (leaves keep the template, the paper's captions).
2. **Retrieval**: the query (``query_template`` with the goal) embedded by the frozen MiniLM
   text encoder, then top-down beam search by cosine similarity to node texts
   (``forest.beam_search``); with ``embodied_rag.llm`` the chat model picks at every level among
   the ``llm_choices`` most similar nodes (the paper's selection prompt).
3. **Navigation**: the best retrieved leaf not yet searched is the target; the planner picks the
   candidate whose frontier reaches it soonest (``target.cost_via_frontier``). A leaf counts as
   searched once the agent came within ``visit_radius_m`` or the map around it is explored
   (``explored_share``) and the goal was not found there (the navigator would have walked to it).
   When every retrieved leaf is searched the forest is searched again without them.

On a home the memory has never walked (the unseen homes of every other benchmark here) there is
no forest: every decision is nearest frontier's, counted in ``fallbacks``. Retrieval runs when a
target is needed (the episode's first decision and after its targets are searched); its time is
recorded per retrieval in ``retrieval_ms``, the forest's load or build in ``forest_ms``.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

import numpy as np

from trajrag.config import Settings
from trajrag.memory.forest import ForestHit, SemanticForest, beam_search, build_forest, object_list
from trajrag.memory.forest_store import ForestTable, build_key, home_places
from trajrag.memory.store import MemoryStore
from trajrag.planners.base import PlannerContext, RetrievalTimings, candidate_distances, hysteresis_bonus
from trajrag.planners.chat import make_chat
from trajrag.planners.llm_choice import ChoiceAsker, ChoiceCounts
from trajrag.planners.target import cost_via_frontier, explored_share, target_gaps
from trajrag.retrieval.retriever import RetrievalError


@dataclass
class EmbodiedRAGConfig:
    """``configs/embodied_rag.yaml``: the forest, its texts, the search and the target rules
    (metres and counts as named; templates are Python format strings)."""

    leaf_cell_m: float
    branching: int
    beam_width: int
    summary_objects: int
    leaf_template: str
    area_template: str
    empty_text: str
    query_template: str
    visit_radius_m: float
    explored_share: float
    llm: bool
    llm_choices: int
    summary_max_tokens: int
    summary_system: str
    summary_prompt: str
    selection_system: str
    selection_prompt: str

    def __post_init__(self) -> None:
        if self.branching < 2 or self.beam_width < 1 or self.leaf_cell_m <= 0:
            raise ValueError(f"embodied_rag: branching must be >= 2, beam_width >= 1 and leaf_cell_m > 0, got "
                             f"{self.branching}, {self.beam_width}, {self.leaf_cell_m}")


def forest_settings(cfg: EmbodiedRAGConfig) -> dict:
    """The settings a forest is built with (its ``build_key``; the search settings are not)."""
    names = ["leaf_cell_m", "branching", "summary_objects", "leaf_template", "area_template", "empty_text"]
    if cfg.llm:
        names += ["summary_system", "summary_prompt", "summary_max_tokens"]
    return {name: getattr(cfg, name) for name in names}


def template_text(cfg: EmbodiedRAGConfig, objects: Counter, n_leaves: int) -> str:
    """A node's template summary: ``leaf_template`` with the objects a place sees, or
    ``area_template`` with the objects of an area counted in places; ``empty_text`` when none."""
    if not objects:
        return cfg.empty_text
    if n_leaves == 1:
        return cfg.leaf_template.format(objects=object_list(objects, cfg.summary_objects, counted=False))
    return cfg.area_template.format(places=n_leaves, objects=object_list(objects, cfg.summary_objects, counted=True))


class TextEncoder:
    """The frozen MiniLM text encoder (``encoder.node``) as the forest's ``embed``; queries cached."""

    def __init__(self, node_encoder: Any, max_length: int) -> None:
        self.node_encoder, self.max_length = node_encoder, max_length
        self.version = node_encoder.version
        self._queries: dict[str, np.ndarray] = {}

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        return self.node_encoder.encode_texts(list(texts), max_length=self.max_length)

    def query(self, text: str) -> np.ndarray:
        if text not in self._queries:
            self._queries[text] = self([text])[0]
        return self._queries[text]


class ForestLibrary:
    """The forests of one memory, one per home (module docstring, 1.): from this process's cache,
    the memory's ``forest`` table, or built and stored."""

    def __init__(self, store_uri: str, cfg: EmbodiedRAGConfig, encoder: TextEncoder,
                 asker: Optional[ChoiceAsker] = None, model_name: str = "") -> None:
        self.store_uri, self.cfg, self.encoder, self.asker = store_uri, cfg, encoder, asker
        self.summarizer = f"llm:{model_name}" if asker is not None else "template"
        self._forests: dict[str, Optional[SemanticForest]] = {}

    def forest(self, scene: str) -> Optional[SemanticForest]:
        """The forest of ``scene``; None when the memory holds no walk of it."""
        if scene not in self._forests:
            self._forests[scene] = self._load_or_build(scene)
        return self._forests[scene]

    def _load_or_build(self, scene: str) -> Optional[SemanticForest]:
        store = MemoryStore(self.store_uri, read_only=True)
        try:
            places, chunk_ids = home_places(store, scene, self.cfg.leaf_cell_m)
        finally:
            store.close()
        if not len(places):
            return None
        settings = {"forest": forest_settings(self.cfg), "encoder": self.encoder.version, "summarizer": self.summarizer}
        key = build_key(chunk_ids, settings)
        table = ForestTable(self.store_uri)
        forest = table.load(scene, key)
        if forest is None:
            forest = build_forest(places, self.cfg.branching, self.summarize, self.encoder)
            table.save(scene, key, forest)
        return forest

    def summarize(self, objects: Counter, n_leaves: int, child_texts: Sequence[str]) -> str:
        """Template text, or for a parent with ``llm`` the chat model's abstraction of its
        children's texts (the template when it gives none)."""
        template = template_text(self.cfg, objects, n_leaves)
        if self.asker is None or not child_texts:
            return template
        request = self.cfg.summary_prompt.format(descriptions="; ".join(child_texts))
        return self.asker.write(self.cfg.summary_system, request, self.cfg.summary_max_tokens) or template


class EmbodiedRAGPlanner(RetrievalTimings):
    """Navigates to the forest leaf retrieved for the goal (module docstring)."""

    name = "embodied-rag"

    def __init__(self, library: ForestLibrary, cfg: EmbodiedRAGConfig, hysteresis_m: float,
                 asker: Optional[ChoiceAsker] = None) -> None:
        super().__init__()
        self.library, self.cfg, self.hysteresis_m, self.asker = library, cfg, hysteresis_m, asker
        self.last_scores: Optional[np.ndarray] = None
        self.last_terms: dict[str, np.ndarray] = {}  # per candidate, higher = preferred
        self.reset("", 0)

    def reset(self, goal: str, seed: int) -> None:
        super().reset(goal, seed)
        self.goal = goal
        self.scene: Optional[str] = None
        self.forest: Optional[SemanticForest] = None
        self.hits: list[ForestHit] = []
        self.searched: set[int] = set()
        self.forest_searched = False
        self.positions: list[np.ndarray] = []
        self.fallbacks = 0
        self.forest_ms = 0.0
        self.target_leaf = -1
        self.first_leaf = -1
        self._llm_before = ChoiceCounts(**asdict(self.asker.counts)) if self.asker is not None else None

    def episode_stats(self) -> dict:
        stats = {**super().episode_stats(), "fallbacks": self.fallbacks, "retrievals": len(self.retrieval_ms),
                 "forest_nodes": len(self.forest) if self.forest is not None else 0,
                 "forest_ms": round(self.forest_ms, 3),
                 "first_target_sees_goal": self._first_target_sees_goal()}
        if self.asker is not None:
            stats["llm"] = self.asker.counts.since(self._llm_before)
        return stats

    def choose(self, ctx: PlannerContext) -> int:
        if self.scene is None:
            self.scene = ctx.trajectory.scene_id
            start = time.perf_counter()
            self.forest = self.library.forest(self.scene)
            self.forest_ms = (time.perf_counter() - start) * 1e3
        self.positions.append(np.asarray(ctx.pose.xy, dtype=float))
        target = self._target(ctx)
        distance = candidate_distances(ctx)
        if target is None:  # an unseen home, or every place of the forest searched
            self.fallbacks += 1
            cost = distance
            self.last_terms = {"nearness": -distance}
        else:
            cost = cost_via_frontier(ctx, self.forest.xy[target])
            self.last_terms = {"target": -target_gaps(ctx, self.forest.xy[target]), "nearness": -distance}
        self.target_leaf = -1 if target is None else int(target)
        self.last_scores = -cost + hysteresis_bonus(ctx, self.hysteresis_m, 1.0)
        return int(np.argmax(self.last_scores))

    def _target(self, ctx: PlannerContext) -> Optional[int]:
        """The best retrieved leaf not yet searched, retrieving again when none is left (None
        once the whole forest is searched)."""
        if self.forest is None or self.forest_searched:
            return None
        for hit in self.hits:
            if hit.leaf not in self.searched and not self._is_searched(ctx, hit.leaf):
                return hit.leaf
            self.searched.add(hit.leaf)
        self._retrieve(ctx)
        self.forest_searched = not self.hits
        return self.hits[0].leaf if self.hits else None

    def _retrieve(self, ctx: PlannerContext) -> None:
        start = time.perf_counter()
        leaves = self.forest.leaves()
        self.searched.update(int(leaf) for leaf in leaves if self._is_searched(ctx, leaf))
        query = self.library.encoder.query(self.cfg.query_template.format(goal=self.goal.replace("_", " ")))
        select = self._llm_select if self.asker is not None else None
        self.hits = beam_search(self.forest, query, self.cfg.beam_width, sorted(self.searched), select)
        if self.first_leaf < 0 and self.hits:
            self.first_leaf = self.hits[0].leaf
        self.add_timings((time.perf_counter() - start) * 1e3)

    def _is_searched(self, ctx: PlannerContext, leaf: int) -> bool:
        """Whether the agent came within ``visit_radius_m`` of the leaf or mapped the ground
        around it (``explored_share``) without finding the goal."""
        xy = self.forest.xy[leaf]
        walked = [*self.positions, *np.asarray(ctx.trajectory.node_xy, dtype=float).reshape(-1, 2)]
        if min(float(np.linalg.norm(p - xy)) for p in walked) <= self.cfg.visit_radius_m:
            return True
        return explored_share(ctx.sem_map, xy, self.cfg.visit_radius_m) >= self.cfg.explored_share

    def _llm_select(self, ranked: list[int]) -> list[int]:
        """The chat model's pick among the ``llm_choices`` most similar nodes, moved first."""
        shown = ranked[:self.cfg.llm_choices]
        descriptions = "\n".join(f"[{i}] {self.forest.text[node]}" for i, node in enumerate(shown))
        goal = self.goal.replace("_", " ")
        question = self.cfg.selection_prompt.format(descriptions=descriptions,
                                                    query=self.cfg.query_template.format(goal=goal))
        choice = self.asker.choose(self.cfg.selection_system, question, len(shown))
        if choice is None:
            return ranked
        return [shown[choice]] + [node for node in ranked if node != shown[choice]]

    def _first_target_sees_goal(self) -> Optional[bool]:
        """Whether the episode's first retrieved place saw the goal in the memory's walks (None
        without one): retrieval's own hit rate, apart from the navigation."""
        if self.forest is None or self.first_leaf < 0:
            return None
        return self.goal in self.forest.objects[self.first_leaf]


# -- planner from the settings (agent/registry.py makes the agent) ------------------------------------------------------------------
_LIBRARIES: dict[tuple, ForestLibrary] = {}
_ENCODERS: dict[str, TextEncoder] = {}


def shared_text_encoder(node_cfg: Any, max_length: int) -> TextEncoder:
    """One MiniLM text encoder per process and configuration (loading it takes seconds)."""
    from trajrag.encoder.node_encoder import NodeEncoder

    key = repr((node_cfg, max_length))
    if key not in _ENCODERS:
        _ENCODERS[key] = TextEncoder(NodeEncoder(node_cfg), max_length)
    return _ENCODERS[key]


def make_embodied_rag_planner(settings: Settings) -> "EmbodiedRAGPlanner":
    """The Embodied-RAG planner over ``retrieval.store``; its forests (and chat model) are shared
    by every planner of the process built with the same settings."""
    cfg: EmbodiedRAGConfig = settings.embodied_rag
    store = settings.retrieval.store
    if not store:
        raise RetrievalError("embodied-rag needs a memory store: pass --store PATH")
    node_cfg = settings.encoder.node
    llm = settings.llm if cfg.llm else None
    key = (store, repr(cfg), repr(node_cfg), repr(llm))
    if key not in _LIBRARIES:
        asker, model = None, ""
        if llm is not None:
            asker = ChoiceAsker(make_chat(llm.chat), llm.planner)
            model = f"{llm.chat.backend}:" + (llm.chat.model if llm.chat.backend == "openai"
                                              else llm.chat.gguf_path or llm.chat.gguf_package)
        encoder = shared_text_encoder(node_cfg, node_cfg.text_max_length)
        _LIBRARIES[key] = ForestLibrary(store, cfg, encoder, asker, model)
    library = _LIBRARIES[key]
    return EmbodiedRAGPlanner(library, cfg, settings.navigator.frontier_hysteresis_m, library.asker)
