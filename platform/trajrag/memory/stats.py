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
"""

from __future__ import annotations

from collections import Counter, defaultdict

from trajrag.memory.store import CHUNKS, DECISIONS, SUMMARIES, MemoryStore


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


def corpus_stats(store: MemoryStore | str) -> dict:
    """One JSON-able dict: chunks, groups, actions (decision counts), purity, completeness,
    scenes, bytes_per_chunk (chunks table bytes / rows, embedding null until encoded) and
    summary_bytes_per_chunk (the summaries table's bytes spread over the chunks)."""
    if not isinstance(store, MemoryStore):
        store = MemoryStore(str(store), read_only=True)
    chunks = store.read(CHUNKS, ["group_id", "scene_hint"])
    group_ids = store.resolve_groups(chunks.column("group_id").to_pylist())
    scenes = chunks.column("scene_hint").to_pylist()
    purity, completeness = purity_completeness(group_ids, scenes)
    actions = Counter(store.read(DECISIONS, ["action"]).column("action").to_pylist())
    sizes = store.table_bytes()
    n = len(group_ids)
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
    }
