"""Corpus statistics of a TrajRAG memory (``trajrag corpus stats``).

Group quality against the scene each chunk came from (``scene_hint``; chunks without one are
left out of both measures):

* **purity** = sum over groups of (chunks of the group's most common scene) / chunks. 1.0 means
  no group mixes scenes; it is the size-weighted mean of each group's majority share.
* **completeness** = sum over scenes of (chunks of the scene in its largest group) / chunks. 1.0
  means every scene lies in one group; it is the size-weighted mean of each scene's share in
  its largest group.

Purity falls when layouts of different homes are merged; completeness falls when one home is
split into several groups (trajectories that do not overlap enough to be matched).

* **completeness_ceiling**: the completeness a perfect matcher would reach under the same
  acceptance rule. Chunks of one scene are grouped by their *true* overlap (node positions are
  in the scene's frame for our collectors): two groups join whenever at least ``min_shared``
  nodes of one lie within ``radius_m`` of the other's (``memory.min_inliers`` and
  ``memory.merge_radius_m``), until nothing joins. The gap between it and ``completeness`` is
  the matcher's; the gap between it and 1.0 is the corpus's (walks that share too few places).
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from trajrag.memory.schema import CHUNKS, DECISIONS, SUMMARIES
from trajrag.memory.store import MemoryStore


def purity_completeness(group_ids: list[int], scenes: list[str | None]) -> tuple[float | None, float | None]:
    """(purity, completeness) of a grouping against scene labels; None when no chunk has a scene."""
    by_group: dict[int, Counter] = defaultdict(Counter)
    by_scene: dict[str, Counter] = defaultdict(Counter)
    n = 0
    for gid, scene in zip(group_ids, scenes):
        if not scene:
            continue
        by_group[gid][scene] += 1
        by_scene[scene][gid] += 1
        n += 1
    if n == 0:
        return None, None
    purity = sum(max(c.values()) for c in by_group.values()) / n
    completeness = sum(max(c.values()) for c in by_scene.values()) / n
    return purity, completeness


def completeness_ceiling(node_xy: list[np.ndarray], scenes: list[str | None], min_shared: int,
                         radius_m: float) -> float | None:
    """Completeness of grouping each scene's chunks by true overlap (module doc); ``node_xy``:
    per chunk (K, 2) metres in its scene's frame. None when no chunk has a scene."""
    by_scene: dict[str, list[np.ndarray]] = defaultdict(list)
    for xy, scene in zip(node_xy, scenes):
        if scene:
            by_scene[scene].append(np.asarray(xy, dtype=np.float64).reshape(-1, 2))
    total = sum(len(v) for v in by_scene.values())
    if total == 0:
        return None
    largest = 0
    for chunks in by_scene.values():
        groups = [(_distinct_places(xy, radius_m), 1) for xy in chunks]
        joined = True
        while joined:
            joined = False
            groups.sort(key=lambda g: -len(g[0]))
            for a in range(len(groups)):
                for b in range(a + 1, len(groups)):
                    if _shared_places(groups[b][0], groups[a][0], radius_m) >= min_shared:
                        places = _distinct_places(np.vstack([groups[a][0], groups[b][0]]), radius_m)
                        groups[a] = (places, groups[a][1] + groups[b][1])
                        del groups[b]
                        joined = True
                        break
                if joined:
                    break
        largest += max(n for _, n in groups)
    return largest / total


def _distinct_places(xy: np.ndarray, radius_m: float) -> np.ndarray:
    """Greedy thinning: keep a point only if no kept point lies within ``radius_m`` (as a summary
    merges a node into an existing one within the merge radius)."""
    kept: list[np.ndarray] = []
    for p in xy:
        if not kept or np.min(np.linalg.norm(np.asarray(kept) - p, axis=1)) > radius_m:
            kept.append(p)
    return np.asarray(kept).reshape(-1, 2)


def _shared_places(a: np.ndarray, b: np.ndarray, radius_m: float) -> int:
    """Points of ``a`` within ``radius_m`` of some point of ``b``."""
    if len(a) == 0 or len(b) == 0:
        return 0
    d = np.linalg.norm(a[:, None, :] - b[None, :, :], axis=2)
    return int((d.min(axis=1) <= radius_m).sum())


def decision_counts(store: MemoryStore) -> Counter:
    """Decisions by action, a rejected trajectory counted once: builds before rejected ids were
    known to the memory walked and rejected them again on every re-run."""
    decisions = store.read(DECISIONS, ["action", "trajectory_id"])
    seen: set[str] = set()
    counts: Counter = Counter()
    for action, tid in zip(decisions.column("action").to_pylist(), decisions.column("trajectory_id").to_pylist()):
        if action == "rejected" and tid:
            if tid in seen:
                continue
            seen.add(tid)
        counts[action] += 1
    return counts


def corpus_stats(store: MemoryStore | str, ceiling: tuple[int, float] | None = None) -> dict:
    """One JSON-able dict: chunks, groups, actions (decision counts), purity, completeness,
    scenes, bytes_per_chunk (chunks table bytes / rows, embedding null until encoded) and
    summary_bytes_per_chunk (the summaries table's bytes spread over the chunks); with
    ``ceiling = (min_shared, radius_m)`` also ``completeness_ceiling`` (module doc), and for a
    store whose chunks keep their maps ``completeness_ceiling_maps`` (the same over the maps)."""
    if not isinstance(store, MemoryStore):
        store = MemoryStore(str(store), read_only=True)
    chunks = store.read(CHUNKS, ["group_id", "scene_hint"])
    group_ids = store.resolve_groups(chunks.column("group_id").to_pylist())
    scenes = chunks.column("scene_hint").to_pylist()
    purity, completeness = purity_completeness(group_ids, scenes)
    actions = decision_counts(store)
    sizes = store.table_bytes()
    n = len(group_ids)
    extra = {}
    if ceiling is not None:
        columns = ["node_xy", "map_xy"] if store.keeps_maps else ["node_xy"]
        table = store.read(CHUNKS, columns)
        walks = [np.asarray(r).reshape(-1, 2) for r in table.column("node_xy").to_pylist()]
        bound = completeness_ceiling(walks, scenes, *ceiling)
        extra["completeness_ceiling"] = None if bound is None else round(bound, 4)
        if store.keeps_maps:
            # The same with each chunk's map (memory.summary_geometry: map); the walk stands in
            # for a chunk stored without one.
            maps = [w if m is None else np.asarray(m).reshape(-1, 2)
                    for m, w in zip(table.column("map_xy").to_pylist(), walks)]
            bound = completeness_ceiling(maps, scenes, *ceiling)
            extra["completeness_ceiling_maps"] = None if bound is None else round(bound, 4)
    return {
        "uri": store.uri,
        "chunks": n,
        "groups": store.count_groups(),
        "actions": dict(sorted(actions.items())),
        "purity": None if purity is None else round(purity, 4),
        "completeness": None if completeness is None else round(completeness, 4),
        "scenes": len({s for s in scenes if s}),
        "bytes_per_chunk": sizes[CHUNKS] / n if n else 0.0,
        "summary_bytes_per_chunk": sizes[SUMMARIES] / n if n else 0.0,
        **extra,
    }
