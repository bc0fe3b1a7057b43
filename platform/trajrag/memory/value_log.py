"""The decisions of the memory's exploration walks, kept beside its chunks.

A corpus's exploration walks are nearest-frontier walks in train homes: at every decision their
collector records each candidate's features and its hindsight cost to the goal
(``agent.value_data.ValueDecisionRecorder``), which is what ``trajrag value fit`` learns from.
The memory keeps them in the table ``value_decisions`` of its LanceDB database: one row per walk,
``trajectory_id`` and ``decisions`` (the walk's decisions as the plain-array ``.npz`` bytes of
``planners.frontier_value.decisions_to_bytes``, read back without pickle).

Exactly once, like the chunks: the single writer appends a batch's rows *before* inserting its
trajectories, skipping ids it already holds, so a batch sent again after a crash adds no row
twice, and a walk whose chunk was stored always has its decisions. The table is outside the
chunk journal (``memory.store``): a row whose chunk insert then failed is harmless (a rerun
collects that walk again and its row is skipped by id). ``MemoryStore.compact`` merges its
one-append-per-batch fragments and prunes its history with the memory's own tables.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import pyarrow as pa

from trajrag.memory.side_table import SideTable

TABLE = "value_decisions"
SCHEMA = pa.schema([pa.field("trajectory_id", pa.string(), nullable=False),
                    pa.field("decisions", pa.large_binary(), nullable=False)])


class ValueLog:
    """The ``value_decisions`` table of the memory at ``uri`` (created on the first append)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._side = SideTable(uri, TABLE, "the exploration walks' decisions")
        ids = self._side.read(["trajectory_id"])
        self.ids: set[str] = set() if ids is None else set(ids.column("trajectory_id").to_pylist())

    @property
    def table(self):
        """The LanceDB table, None until the first append."""
        return self._side.table

    def append(self, rows: Iterable[tuple[str, bytes]]) -> int:
        """Add ``(trajectory_id, decisions)`` rows whose ids are not stored yet (one LanceDB
        commit); returns how many were added."""
        fresh: dict[str, bytes] = {}
        for tid, blob in rows:
            if tid not in self.ids and tid not in fresh:
                fresh[tid] = blob
        if not fresh:
            return 0
        batch = pa.table({"trajectory_id": list(fresh), "decisions": pa.array(list(fresh.values()), pa.large_binary())},
                         schema=SCHEMA)
        self._side.append(batch)
        self.ids.update(fresh)
        return len(fresh)

    def __len__(self) -> int:
        return len(self.ids)

    def rows(self) -> Iterator[tuple[str, bytes]]:
        """``(trajectory_id, decisions)`` of every stored walk."""
        table = self._side.read(["trajectory_id", "decisions"])
        if table is None:
            return
        for batch in table.to_batches():
            yield from zip(batch.column("trajectory_id").to_pylist(), batch.column("decisions").to_pylist())
