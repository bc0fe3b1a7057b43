"""Global questions about a home, answered from its memory and scored against the scene.

Embodied-RAG's global queries ask about a whole environment; here, the two a home's inventory
answers: "which object categories are in this home" and "how many <category>s are there".

*From memory* (``memory_inventory``): every chunk's nodes (its whole map where the memory keeps
maps, else the nodes walked) with their sector labels. A sector whose ray hit a category is a
sighting of it ``sighting_distance_m`` along the ray; sightings go into their group's frame (the
memory's own alignment of the walks, ``group_transform`` through fusions); a category is present
when sighted at all; its count is the number of clusters of its sightings (single linkage at
``count_merge_radius_m``), the most found in any one group (the groups of one home's memory are
parts of it that were not matched to each other, so a sum would count their overlap twice: the
count is a lower bound when the home is split).

*Ground truth* (``scene_inventory``): the scene's object instances whose category is in the
agent's vocabulary. ``score_inventory`` gives the category inventory's precision and recall and,
for each counted category, the answer against the true count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage

from trajrag.memory.matching import Transform2D
from trajrag.memory.store import CHUNKS, MemoryStore
from trajrag.topo.sectors import sector_angles
from trajrag.world.scene import Scene


@dataclass
class Inventory:
    """A home's object inventory: category -> number of objects (every listed category present)."""

    counts: dict[str, int] = field(default_factory=dict)

    @property
    def categories(self) -> set[str]:
        return {c for c, n in self.counts.items() if n > 0}


def scene_inventory(scene: Scene, vocabulary: Iterable[str]) -> Inventory:
    """The true inventory: object instances per category of ``vocabulary`` in ``scene``."""
    wanted = set(vocabulary)
    ids, counts = np.unique(scene.instance_category[1:], return_counts=True)
    return Inventory({scene.categories[i]: int(n) for i, n in zip(ids, counts)
                      if i >= 0 and scene.categories[i] in wanted})


def memory_inventory(store: MemoryStore, sighting_distance_m: float, count_merge_radius_m: float) -> Inventory:
    """The inventory a memory's chunks hold (module doc): sightings per category, clustered in
    each group's frame; the count is the most objects found in one group."""
    names = {label: name for name, label in store.vocabulary().items()}
    columns = ["group_id", "group_transform", "reference_yaw", "node_xy", "sectors",
               *(["map_xy", "map_sectors"] if store.keeps_maps else [])]
    rows = store.resolve_chunks(store.read(CHUNKS, columns))
    sightings: dict[tuple[int, str], list[np.ndarray]] = {}
    for row in rows:
        node_xy, sectors = chunk_nodes(row)
        points, labels = sector_sightings(node_xy, sectors, float(row["reference_yaw"]), sighting_distance_m)
        if row["group_transform"] is not None and len(points):
            points = Transform2D(*row["group_transform"]).apply(points)
        for label in np.unique(labels):
            key = (int(row["group_id"]), names[int(label)])
            sightings.setdefault(key, []).append(points[labels == label])
    counts: dict[str, int] = {}
    for (_, category), parts in sightings.items():
        counts[category] = max(counts.get(category, 0), count_objects(np.vstack(parts), count_merge_radius_m))
    return Inventory(dict(sorted(counts.items())))


def chunk_nodes(row: dict) -> tuple[np.ndarray, np.ndarray]:
    """A chunk row's nodes (K, 2) and sectors (K, n_sectors): its map's where the row holds one
    (``map_xy``, ``map_sectors``), else the walk's (``node_xy``, ``sectors``)."""
    use_map = row.get("map_xy") is not None
    xy, sectors = (row["map_xy"], row["map_sectors"]) if use_map else (row["node_xy"], row["sectors"])
    xy = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
    return xy, np.asarray(sectors, dtype=np.int64).reshape(len(xy), -1)


def sector_sightings(node_xy: np.ndarray, sectors: np.ndarray, reference_yaw: float,
                     distance_m: float) -> tuple[np.ndarray, np.ndarray]:
    """``(points (N, 2), labels (N,))``: one point ``distance_m`` along the ray of each sector
    whose label is an object category (label >= 0), in the nodes' frame."""
    angles = sector_angles(reference_yaw, sectors.shape[1])
    node, sector = np.nonzero(sectors >= 0)
    offsets = distance_m * np.stack([np.cos(angles[sector]), np.sin(angles[sector])], axis=1)
    return node_xy[node] + offsets, sectors[node, sector]


def count_objects(points: np.ndarray, merge_radius_m: float) -> int:
    """Clusters of ``points`` (N, 2) joined by single linkage at ``merge_radius_m`` metres."""
    if len(points) < 2:
        return len(points)
    return int(fcluster(linkage(points, method="single"), t=merge_radius_m, criterion="distance").max())


def score_inventory(answer: Inventory, truth: Inventory, counted: Sequence[str]) -> dict:
    """The answer to both global questions against the truth: the category inventory's
    ``precision`` (None when nothing was answered) and ``recall`` (None when the home holds
    nothing), and for each of ``counted`` (e.g. "how many beds") the answer, the true count,
    whether they agree and the absolute error."""
    said, there = answer.categories, truth.categories
    hits = len(said & there)
    counts = {c: {"answer": answer.counts.get(c, 0), "truth": truth.counts.get(c, 0)} for c in counted}
    for c in counts.values():
        c["exact"] = c["answer"] == c["truth"]
        c["abs_error"] = abs(c["answer"] - c["truth"])
    return {"precision": hits / len(said) if said else None, "recall": hits / len(there) if there else None,
            "answered": sorted(said), "present": sorted(there), "missed": sorted(there - said),
            "wrong": sorted(said - there), "counts": counts}


def summarize_scores(scores: Sequence[dict]) -> dict:
    """Means over homes: precision, recall (homes where defined), count exact-match rate and
    mean absolute count error (over every counted category of every home)."""
    def mean(values: list) -> float | None:
        return float(np.mean(values)) if values else None

    counted = [c for s in scores for c in s["counts"].values()]
    return {"homes": len(scores),
            "precision": mean([s["precision"] for s in scores if s["precision"] is not None]),
            "recall": mean([s["recall"] for s in scores if s["recall"] is not None]),
            "count_exact": mean([float(c["exact"]) for c in counted]),
            "count_abs_error": mean([c["abs_error"] for c in counted])}


def answer_questions(store: MemoryStore, scene: Scene, vocabulary: Sequence[str], counted: Sequence[str],
                     sighting_distance_m: float, count_merge_radius_m: float) -> dict:
    """One home's global questions, answered from ``store`` and scored against ``scene``, with
    the questions as a user asks them."""
    answer = memory_inventory(store, sighting_distance_m, count_merge_radius_m)
    score = score_inventory(answer, scene_inventory(scene, vocabulary), counted)
    questions = ["which object categories are in this home?",
                 *(f"how many {c.replace('_', ' ')}s are in this home?" for c in counted)]
    return {"scene": scene.name, "questions": questions, **score}

