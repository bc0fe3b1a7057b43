"""A home's places as the memory's walks saw them, and the side table that keeps its semantic
forest (``memory.forest``) beside the memory's own tables.

``home_places`` reads the chunks of one scene (``scene_hint``, the episode's ``scene_key``): the
whole map each walk was made in (``map_xy`` / ``map_sectors``) where the chunk kept it, else
its walked nodes, each node with the objects its sector rays hit. Walks of one scene share the
simulator's map frame, so their nodes are pooled per grid cell (``forest.merge_places``).

``ForestTable`` is the table ``forest`` of the memory's LanceDB database: one row per forest
node, keyed by ``scene`` and ``build_key`` (what the forest was built from and with: the
scene's chunk ids, the settings, the text encoder and the summarizer). A forest is built once
per home and key and read back afterwards; more walks of the home (a lifelong memory) change
the key, and the next reader builds it again. Two processes building the same forest at once
append the same rows twice: a reader keeps the first row of each node. The table is outside
the chunk journal, like the exploration walks' decisions (``memory.value_log``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from trajrag.memory.forest import Places, SemanticForest, merge_places
from trajrag.memory.schema import CHUNKS
from trajrag.memory.side_table import SideTable
from trajrag.memory.store import MemoryStore, StoreError, sql_str

log = logging.getLogger(__name__)

TABLE = "forest"
SCHEMA = pa.schema([
    pa.field("scene", pa.string(), nullable=False),
    pa.field("build_key", pa.string(), nullable=False),
    pa.field("node", pa.int32(), nullable=False),
    pa.field("level", pa.int32()),
    pa.field("parent", pa.int32()),
    pa.field("x", pa.float32()),
    pa.field("y", pa.float32()),
    pa.field("n_leaves", pa.int32()),
    pa.field("object_names", pa.list_(pa.string())),
    pa.field("object_counts", pa.list_(pa.int32())),
    pa.field("text", pa.string()),
    pa.field("embedding", pa.list_(pa.float32())),
])


def home_places(store: MemoryStore, scene: str, cell_m: float) -> tuple[Places, list[str]]:
    """The places of ``scene`` in the memory, pooled per ``cell_m`` grid cell, and the ids of
    the chunks they came from (sorted); no places for a home the memory never walked."""
    maps = ["map_xy", "map_sectors"] if store.keeps_maps else []
    rows = store.read(CHUNKS, ["trajectory_id", "node_xy", "sectors", *maps],
                      where=f"scene_hint = {sql_str(scene)}").to_pylist()
    names = {label: name for name, label in store.vocabulary().items()}
    xy, objects = [], []
    for row in rows:
        whole_map = bool(maps) and row["map_xy"] is not None
        node_xy = np.asarray(row["map_xy"] if whole_map else row["node_xy"], dtype=np.float64).reshape(-1, 2)
        sectors = np.asarray(row["map_sectors"] if whole_map else row["sectors"], dtype=np.int64)
        sectors = sectors.reshape(len(node_xy), -1)
        xy.append(node_xy)
        objects += [{names[c] for c in labels if c >= 0 and c in names} for labels in sectors.tolist()]
    places = merge_places(np.concatenate(xy) if xy else np.zeros((0, 2)), objects, cell_m)
    return places, sorted(str(r["trajectory_id"]) for r in rows)


def build_key(chunk_ids: list[str], settings: dict[str, Any]) -> str:
    """A short hash of the chunks a forest is built from and everything it is built with."""
    blob = json.dumps({"chunks": chunk_ids, **settings}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


class ForestTable:
    """The ``forest`` table of the memory at ``uri`` (created by the first ``save``)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._side = SideTable(uri, TABLE, "its semantic forests")

    def load(self, scene: str, key: str) -> Optional[SemanticForest]:
        """The forest of ``scene`` built under ``key``, or None if none was stored."""
        rows = self._side.read(SCHEMA.names, where=f"scene = {sql_str(scene)} AND build_key = {sql_str(key)}")
        if rows is None or rows.num_rows == 0:
            return None
        by_node: dict[int, dict] = {}
        for row in rows.to_pylist():
            by_node.setdefault(int(row["node"]), row)  # a second build's copy of the node
        nodes = [by_node[i] for i in sorted(by_node)]
        if sorted(by_node) != list(range(len(nodes))):
            raise StoreError(f"memory store {self.uri}: the forest of {scene} (key {key}) misses nodes; "
                             f"delete the table {TABLE!r} to rebuild it")
        return SemanticForest(
            xy=np.array([[r["x"], r["y"]] for r in nodes], dtype=np.float64),
            level=np.array([r["level"] for r in nodes], dtype=np.int64),
            parent=np.array([r["parent"] for r in nodes], dtype=np.int64),
            objects=[Counter(dict(zip(r["object_names"], r["object_counts"]))) for r in nodes],
            n_leaves=np.array([r["n_leaves"] for r in nodes], dtype=np.int64),
            text=[r["text"] for r in nodes],
            embedding=np.array([r["embedding"] for r in nodes], dtype=np.float32))

    def save(self, scene: str, key: str, forest: SemanticForest) -> bool:
        """Append the forest's rows (one LanceDB commit); False, with a warning, when the memory
        cannot be written (the forest is then rebuilt by the next process that needs it)."""
        rows = pa.table({
            "scene": [scene] * len(forest), "build_key": [key] * len(forest),
            "node": np.arange(len(forest), dtype=np.int32), "level": forest.level.astype(np.int32),
            "parent": forest.parent.astype(np.int32), "x": forest.xy[:, 0].astype(np.float32),
            "y": forest.xy[:, 1].astype(np.float32), "n_leaves": forest.n_leaves.astype(np.int32),
            "object_names": [list(c) for c in forest.objects],
            "object_counts": [[int(n) for n in c.values()] for c in forest.objects],
            "text": forest.text, "embedding": [row.tolist() for row in forest.embedding]}, schema=SCHEMA)
        try:
            self._side.append(rows)
        except Exception as exc:  # noqa: BLE001 - a read-only or raced memory only costs a rebuild
            log.warning("memory store %s: the forest of %s was not stored (%s); it is used unstored", self.uri, scene, exc)
            return False
        return True
