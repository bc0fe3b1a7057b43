"""The semantic forest of one home (Embodied-RAG, seed 002): places clustered by space, each
parent with a text summary of its children, searched top-down by text similarity.

* **Places** (the leaves) are the topo nodes of every walk the memory holds in the home, with the
  objects their sector rays hit (within ``topo.sector_radius_m``). Walks of one home overlap, so
  the nodes are pooled per grid cell of ``leaf_cell_m`` (``merge_places``): one leaf per cell, its
  position the mean of its nodes, its objects all they saw.
* **Levels**: the nodes of a level are clustered by position (Ward's agglomerative clustering)
  into ``ceil(n / branching)`` parents, until at most ``branching`` nodes are left under the
  root; a parent's position is the mean of its leaves' positions and its objects are counted in
  leaves (``bed: 4`` = four of its places see a bed). Every leaf sits at the same depth.
* **Text**: each node's text comes from a ``summarize`` callable (a template of object names and
  counts offline, the chat model's abstraction of the children's texts when one is configured:
  ``planners.embodied_rag``), embedded by an ``embed`` callable (the frozen MiniLM text encoder).
* **Search** (``beam_search``): from the root, the ``beam_width`` children most similar to the
  query (cosine of the embeddings) are kept at each level, optionally reordered by a ``select``
  callable (the chat model's pick), down to the leaves: the leaves of the last beam, best first.

Positions are map-frame metres of the home (the frame every walk of one scene shares:
``mapping.semantic_map`` maps in the simulator's frame).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage

# summarize(objects, n_leaves, child_texts) -> text; child_texts is empty for a leaf.
Summarize = Callable[[Counter, int, Sequence[str]], str]
# embed(texts) -> float32 (N, D), L2-normalised rows.
Embed = Callable[[Sequence[str]], np.ndarray]
# select(nodes best first) -> the same nodes, reordered (the first is the pick).
Select = Callable[[list[int]], list[int]]


@dataclass
class Places:
    """The leaf places of one home: ``xy`` float (N, 2) map-frame metres; ``objects`` the object
    category names seen around each place."""

    xy: np.ndarray
    objects: list[frozenset[str]]

    def __len__(self) -> int:
        return len(self.xy)


def merge_places(xy: np.ndarray, objects: Sequence[Sequence[str]], cell_m: float) -> Places:
    """One place per grid cell of ``cell_m`` metres holding any of the positions ``xy`` (N, 2):
    the mean position of its members and every object they saw. Places come out in cell order,
    so the same walks give the same places whatever their order."""
    xy = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
    if not len(xy):
        return Places(np.zeros((0, 2)), [])
    cells = np.floor(xy / cell_m).astype(np.int64)
    keys, inverse = np.unique(cells, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    counts = np.bincount(inverse, minlength=len(keys))
    centre = np.stack([np.bincount(inverse, weights=xy[:, d], minlength=len(keys)) for d in (0, 1)], axis=1)
    seen: list[set[str]] = [set() for _ in keys]
    for i, names in zip(inverse, objects):
        seen[i].update(names)
    return Places(centre / counts[:, None], [frozenset(s) for s in seen])


@dataclass
class SemanticForest:
    """One home's forest, nodes in build order (leaves first, the root last).

    xy: float (M, 2) metres. level: int (M,), 0 for leaves. parent: int (M,), -1 for the root.
    objects: per node, category name -> leaves under it that see it. n_leaves: int (M,).
    text: per node, its summary. embedding: float32 (M, D) of the texts, L2-normalised.
    """

    xy: np.ndarray
    level: np.ndarray
    parent: np.ndarray
    objects: list[Counter]
    n_leaves: np.ndarray
    text: list[str]
    embedding: np.ndarray

    def __len__(self) -> int:
        return len(self.xy)

    @property
    def root(self) -> int:
        return len(self.xy) - 1

    def children(self, node: int) -> np.ndarray:
        return np.flatnonzero(self.parent == node)

    def leaves(self) -> np.ndarray:
        return np.flatnonzero(self.level == 0)

    def chain(self, node: int) -> list[int]:
        """``node`` and its ancestors up to the root."""
        out = [int(node)]
        while self.parent[out[-1]] >= 0:
            out.append(int(self.parent[out[-1]]))
        return out


def build_forest(places: Places, branching: int, summarize: Summarize, embed: Embed) -> Optional[SemanticForest]:
    """The forest over ``places`` (module docstring); None when there are none."""
    if branching < 2:
        raise ValueError(f"a forest needs branching >= 2, got {branching}")
    if not len(places):
        return None
    xy = [np.asarray(p, dtype=np.float64) for p in places.xy]
    objects = [Counter({name: 1 for name in names}) for names in places.objects]
    n_leaves = [1] * len(places)
    level = [0] * len(places)
    texts = [summarize(objects[i], 1, []) for i in range(len(places))]
    parent: list[int] = [-1] * len(places)

    def add_parent(children: Sequence[int], depth: int) -> int:
        weights = np.array([n_leaves[c] for c in children], dtype=float)
        node = len(xy)
        xy.append(np.average(np.array([xy[c] for c in children]), axis=0, weights=weights))
        objects.append(sum((objects[c] for c in children), Counter()))
        n_leaves.append(int(weights.sum()))
        level.append(depth)
        parent.append(-1)
        for c in children:
            parent[c] = node
        texts.append(summarize(objects[node], n_leaves[node], [texts[c] for c in children]))
        return node

    current, depth = list(range(len(places))), 0
    while len(current) > branching:
        depth += 1
        groups = spatial_clusters(np.array([xy[c] for c in current]), math.ceil(len(current) / branching))
        current = [add_parent([current[i] for i in np.flatnonzero(groups == g)], depth) for g in np.unique(groups)]
    add_parent(current, depth + 1)
    embedding = np.asarray(embed(texts), dtype=np.float32)
    return SemanticForest(np.array(xy), np.array(level), np.array(parent), objects, np.array(n_leaves), texts, embedding)


def spatial_clusters(xy: np.ndarray, k: int) -> np.ndarray:
    """Cluster labels (N,) of positions ``xy`` (N, 2): Ward's agglomerative clustering cut at
    ``k`` clusters (fewer where positions coincide)."""
    if len(xy) <= 1 or k <= 1:
        return np.zeros(len(xy), dtype=np.int64)
    return fcluster(linkage(xy, method="ward"), t=k, criterion="maxclust").astype(np.int64)


@dataclass
class ForestHit:
    """A retrieved leaf: its node id, its similarity to the query and its chain up to the root."""

    leaf: int
    similarity: float
    chain: list[int]


def beam_search(forest: SemanticForest, query: np.ndarray, beam_width: int,
                exclude: Sequence[int] = (), select: Optional[Select] = None) -> list[ForestHit]:
    """Top-down beam search for the leaves best matching ``query`` (an embedding, (D,)): at
    each level the children of the beam ranked by cosine similarity, reordered by ``select``
    when given, cut to ``beam_width``. Leaves in ``exclude`` (already searched) and subtrees
    holding only such leaves are skipped; [] when nothing is left."""
    similarity = forest.embedding @ np.asarray(query, dtype=np.float32)
    alive = np.ones(len(forest), dtype=bool)
    alive[list(exclude)] = False
    for node in range(len(forest)):  # children come before their parent
        if forest.level[node] > 0:
            alive[node] = alive[forest.children(node)].any()
    if not alive[forest.root]:
        return []
    beam = [forest.root]
    while forest.level[beam[0]] > 0:
        below = [int(c) for node in beam for c in forest.children(node) if alive[c]]
        ranked = sorted(below, key=lambda c: (-similarity[c], c))
        if select is not None and len(ranked) > 1:
            ranked = select(ranked)
        beam = ranked[:beam_width]
    return [ForestHit(leaf, float(similarity[leaf]), forest.chain(leaf)) for leaf in beam]


def object_list(objects: Counter, limit: int, counted: bool) -> str:
    """``bed (4), nightstand (3) and chair (1)``: the ``limit`` most seen objects, most first
    (ties by name), names with spaces for underscores; without counts when not ``counted``."""
    ranked = sorted(objects.items(), key=lambda item: (-item[1], item[0]))[:limit]
    if not ranked:
        return ""
    words = [name.replace("_", " ").replace("-", " ") + (f" ({n})" if counted else "") for name, n in ranked]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
