"""GraphRAG-style baseline (paper Tab. 3): scene-graph retrieval and frontier scoring.

The memory's chunks are read as scene graphs: objects are nodes, and two objects seen around
the same topo node (in one sector vector) are "next to" each other. Retrieval for a goal returns
the goal's neighbourhood in that graph, ``relation(goal, o)`` = the share of topo nodes showing
``o`` that also show the goal. A frontier is scored by the relations of the objects around the
candidate's end, minus its distance, exactly like ``scoring.ScoringPlanner`` scores experience:

    score = w_relation * mean_o relation(goal, o) - w_distance_per_m * distance

The paper finds this weaker than TrajRAG: a scene graph carries generic co-occurrence and no
trajectory continuity.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from trajrag.memory.store import CHUNKS, MemoryStore
from trajrag.planners.base import PlannerContext, RetrievalTimings, candidate_distances, hysteresis_bonus
from trajrag.planners.scoring import end_objects
from trajrag.retrieval.retriever import RetrievalError


@dataclass
class GraphRAGConfig:
    """``configs/graphrag.yaml``: score weights (units in the names) and the relation floor."""

    w_relation: float
    w_distance_per_m: float
    hysteresis_m: float
    end_nodes: int
    min_support: int


class SceneGraph:
    """Object co-occurrence ("next to") counts over every topo node of a memory store."""

    def __init__(self, node_objects: Sequence[set[str]], min_support: int) -> None:
        self.seen: Counter = Counter()
        self.together: Counter = Counter()
        for objects in node_objects:
            for a in objects:
                self.seen[a] += 1
                for b in objects:
                    if a != b:
                        self.together[(a, b)] += 1
        self.min_support = min_support

    @classmethod
    def from_store(cls, store: Any, min_support: int) -> "SceneGraph":
        """The scene graph of every chunk of a ``MemoryStore`` (or URI)."""
        if not isinstance(store, MemoryStore):
            store = MemoryStore(str(store), read_only=True)
        names = {label: name for name, label in store.vocabulary().items()}
        table = store.read(CHUNKS, ["sectors"])
        if table.num_rows == 0:
            raise RetrievalError(f"memory store {store.uri} has no chunks: nothing to build a scene graph from")
        nodes = []
        for flat in table.column("sectors").to_pylist():
            for row in np.asarray(flat, dtype=np.int16).reshape(-1, 12):
                nodes.append({names[int(c)] for c in row if c >= 0 and int(c) in names})
        return cls(nodes, min_support)

    def relation(self, goal: str, obj: str) -> float:
        """P(goal seen | obj seen) at one topo node; 0 below ``min_support`` sightings of ``obj``."""
        n = self.seen.get(obj, 0)
        return self.together.get((obj, goal), 0) / n if n >= self.min_support else 0.0

    def neighbours(self, goal: str, k: int) -> list[tuple[str, float]]:
        """The goal's ``k`` strongest "next to" relations (the retrieved subgraph)."""
        scored = [(o, self.relation(goal, o)) for o in self.seen if o != goal]
        return sorted((s for s in scored if s[1] > 0), key=lambda s: -s[1])[:k]


class GraphRAGPlanner(RetrievalTimings):
    """Frontier scoring by scene-graph relations (see the module docstring)."""

    name = "graphrag"

    def __init__(self, graph: SceneGraph, cfg: GraphRAGConfig) -> None:
        super().__init__()
        self.graph, self.cfg = graph, cfg
        self.last_scores: np.ndarray | None = None
        self.last_terms: dict[str, np.ndarray] = {}  # per candidate, higher = preferred

    def choose(self, ctx: PlannerContext) -> int:
        start = time.perf_counter()
        relation = []
        for c in ctx.candidates:
            objects = [o for o in end_objects(c.trajectory, self.cfg.end_nodes) if o != ctx.goal]
            relation.append(np.mean([self.graph.relation(ctx.goal, o) for o in objects]) if objects else 0.0)
        self.retrieval_ms.append((time.perf_counter() - start) * 1e3)
        cfg, relation, distance = self.cfg, np.asarray(relation), candidate_distances(ctx)
        self.last_scores = (cfg.w_relation * relation - cfg.w_distance_per_m * distance
                            + hysteresis_bonus(ctx, cfg.hysteresis_m, cfg.w_distance_per_m))
        self.last_terms = {"relation": relation, "nearness": -distance}
        return int(np.argmax(self.last_scores))


_GRAPHS: dict[tuple[str, int], SceneGraph] = {}


def shared_scene_graph(store: str, min_support: int) -> SceneGraph:
    """One scene graph per process, store and ``graphrag.min_support`` (every agent of an
    evaluation shares it); ``RetrievalError`` without a store."""
    if not store:
        raise RetrievalError("graphrag needs a memory store: pass --store PATH")
    key = (store, min_support)
    if key not in _GRAPHS:
        _GRAPHS[key] = SceneGraph.from_store(store, min_support)
    return _GRAPHS[key]
