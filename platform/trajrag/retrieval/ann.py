"""The fine stage on LanceDB: a ``ChunkSearch`` over the chunks table's ``embedding`` column.

For stores too large to hold every embedding in memory (``retriever.ExactChunkSearch``): the
vectors stay in LanceDB, searched through an IVF_PQ index (cosine), and the coarse stage's
restriction (the chunks of the kept groups) becomes a ``where`` prefilter on ``group_id``
answered by a BTREE scalar index.

**How rows are identified.** ``ChunkSearch`` speaks in *rows*, the retriever's own numbering of
the chunks it loaded. ``LanceChunkSearch`` is built with that numbering: ``trajectory_ids[row]``
is the chunk of row ``row`` (the retriever's ``ids`` list). At construction it reads the table's
``trajectory_id`` and *stored* ``group_id`` columns once (strings and ints, ~10 MB at 350k
chunks), so it knows each row's stored group; results come back from LanceDB by
``trajectory_id`` and are mapped to rows. Stored group ids are the ones the chunk joined, not
the current group after a fusion: the retriever passes rows (of current groups) and they are
turned into the stored ids of those rows, so fused groups need no special case. Physical LanceDB
row ids are never used: compaction renumbers them.

The table is opened on its own connection and pinned to the version current at construction
(or ``version``), so the rows LanceDB can return are exactly the ones the mapping knows, even
while a writer appends. After the store changed, build a new ``LanceChunkSearch`` with the new
row list (the retriever's ``refresh``).

**Exact results for a restriction.** ``where group_id IN (...)`` may select more rows than
allowed (rows of the same stored group that the caller left out): the query then asks for
``k`` plus that excess, and rows outside ``allowed`` are dropped afterwards, so the result is
the top ``k`` of the allowed rows. A restriction that selects at most ``flat_max_rows`` rows
(the usual case: the chunks of a few groups, ~40 each) is searched exactly (``bypass_vector_index``;
the BTREE index finds the rows, only their vectors are read): an IVF probe of a few partitions
would miss most of so few rows. Larger restrictions and unrestricted queries use the IVF_PQ
index with ``nprobes`` and ``refine_factor`` (exact re-ranking of ``refine_factor * limit``
candidates). Queries of one call that share a restriction go to LanceDB as one multi-vector
query.

``build_indexes`` creates both indexes (the IVF_PQ one needs the embeddings written first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

CHUNKS_TABLE = "chunks"  # trajrag.memory.store.CHUNKS (not imported: that pulls in the store)
EMBEDDING = "embedding"
GROUP = "group_id"
KEY = "trajectory_id"
# PQ codes of 8 bits (256 centroids per sub-vector): LanceDB's default.
_PQ_BITS = 8


@dataclass
class AnnConfig:
    """The LanceDB fine-stage backend (values and sources: ``configs/scale_bench.yaml``, ``ann``).

    num_partitions: IVF partitions; 0 = round(sqrt(rows)) (the rule LanceDB's IvfPq documents).
    num_sub_vectors: PQ sub-vectors; 0 = dim / 8 (8 dimensions per sub-vector).
    nprobes: partitions searched per query. refine_factor: candidates re-ranked exactly per
    result (``refine_factor * limit``). flat_max_rows: restrictions selecting at most this many
    rows are searched exactly instead of through the index.
    """

    num_partitions: int
    num_sub_vectors: int
    nprobes: int
    refine_factor: int
    flat_max_rows: int


class AnnError(RuntimeError):
    """The chunks table cannot be indexed or searched; the message names the store and column."""


def _chunks_table(store: Any, version: int | None = None) -> Any:
    """The chunks table of ``store`` (a ``MemoryStore`` or a URI) on a connection of its own
    (pinning it never disturbs the store's handle), at ``version`` (default: the current one)."""
    import lancedb

    uri = str(getattr(store, "uri", store))
    try:
        table = lancedb.connect(uri).open_table(CHUNKS_TABLE)
        table.checkout(int(version) if version is not None else table.version)
    except Exception as exc:  # noqa: BLE001 - any backend error becomes one clear line
        raise AnnError(f"memory store {uri}: cannot open table {CHUNKS_TABLE!r}"
                       f"{'' if version is None else f' at version {version}'}: {exc}") from exc
    return table


def resolve_partitions(cfg: AnnConfig, rows: int) -> int:
    """IVF partitions for ``rows`` vectors: ``cfg.num_partitions`` or round(sqrt(rows)), at least 1."""
    return int(cfg.num_partitions) if cfg.num_partitions > 0 else max(1, round(math.sqrt(rows)))


def resolve_sub_vectors(cfg: AnnConfig, dim: int) -> int:
    """PQ sub-vectors for ``dim``-wide vectors; must divide ``dim``."""
    n = int(cfg.num_sub_vectors) if cfg.num_sub_vectors > 0 else max(1, dim // 8)
    if dim % n:
        raise AnnError(f"ann.num_sub_vectors={n} does not divide the embedding width {dim}")
    return n


def build_indexes(table: Any, cfg: AnnConfig) -> dict:
    """IVF_PQ (cosine) on ``embedding`` (replacing an existing one) and BTREE on ``group_id``
    (unless there is one: ``MemoryStore.compact`` makes it) of a LanceDB chunks table.

    Returns {"num_partitions", "num_sub_vectors", "ivf_pq_s", "btree_s"} (seconds). Build it
    once the embeddings are written: chunks without one are not in the IVF_PQ index.
    """
    import time

    from lancedb.index import BTree, IvfPq

    rows = int(table.count_rows())
    dim = int(table.schema.field(EMBEDDING).type.list_size)
    partitions = resolve_partitions(cfg, rows)
    sub_vectors = resolve_sub_vectors(cfg, dim)
    start = time.perf_counter()
    try:
        table.create_index(EMBEDDING, config=IvfPq(distance_type="cosine", num_partitions=partitions,
                                                   num_sub_vectors=sub_vectors, num_bits=_PQ_BITS),
                           replace=True)
    except Exception as exc:  # noqa: BLE001
        raise AnnError(f"IVF_PQ index on {EMBEDDING!r} ({rows} rows, {partitions} partitions, "
                       f"{sub_vectors} sub-vectors) failed: {exc}") from exc
    mid = time.perf_counter()
    if (GROUP,) not in {tuple(ix.columns) for ix in table.list_indices()}:
        table.create_index(GROUP, config=BTree())
    return {"num_partitions": partitions, "num_sub_vectors": sub_vectors,
            "ivf_pq_s": mid - start, "btree_s": time.perf_counter() - mid}


class LanceChunkSearch:
    """``ChunkSearch`` over a LanceDB chunks table (see the module docstring for the row mapping).

    ``store``: a ``MemoryStore`` or its URI.
    ``trajectory_ids``: row -> trajectory id, the caller's numbering (the retriever's ``ids``).
    ``version``: the chunks table version to search (default: current at construction).
    Chunks in the table but not in ``trajectory_ids`` are never returned.
    """

    def __init__(self, store: Any, trajectory_ids: Sequence[str], cfg: AnnConfig, *,
                 version: int | None = None) -> None:
        self.cfg = cfg
        self.table = _chunks_table(store, version)
        keys = self.table.search().select([KEY, GROUP]).limit(None).to_arrow()
        stored_group = dict(zip(keys.column(KEY).to_pylist(), keys.column(GROUP).to_pylist()))
        self.trajectory_ids = [str(t) for t in trajectory_ids]
        self._row_of = {tid: row for row, tid in enumerate(self.trajectory_ids)}
        missing = [t for t in self.trajectory_ids if t not in stored_group]
        if missing:
            raise AnnError(f"chunks table (version {self.table.version}) lacks {len(missing)} of the "
                           f"{len(self.trajectory_ids)} rows asked for, e.g. {missing[0]!r}")
        # Each row's stored group, and how many table rows each stored group holds (the size of
        # what ``group_id IN (...)`` selects).
        self.row_group = np.asarray([stored_group[t] for t in self.trajectory_ids], dtype=np.int64)
        groups, sizes = np.unique(keys.column(GROUP).to_numpy(), return_counts=True)
        self._group_size = dict(zip(groups.tolist(), sizes.tolist()))
        self._unknown_rows = keys.num_rows - len(self.trajectory_ids)

    def search(self, queries: np.ndarray, allowed: Sequence[np.ndarray | None],
               k: int) -> list[list[tuple[int, float]]]:
        """Per query the top ``k`` ``(row, cosine)`` among its allowed rows (None: all), best first."""
        queries = np.asarray(queries, dtype=np.float32)
        if len(queries) != len(allowed):
            raise ValueError(f"{len(queries)} queries but {len(allowed)} allowed-row sets")
        out: list[list[tuple[int, float]]] = [[] for _ in range(len(queries))]
        plans: dict[tuple, list[int]] = {}
        restrictions: dict[tuple, np.ndarray | None] = {}
        for i, rows in enumerate(allowed):
            plan, rows = self._plan(rows, k)
            if plan is None:
                continue  # nothing allowed
            plans.setdefault(plan, []).append(i)
            restrictions[plan] = rows
        for plan, members in plans.items():
            found = self._query(queries[members], plan)
            for j, i in enumerate(members):
                out[i] = self._keep(found.get(j, []), restrictions[plan], k)
        return out

    # -- internals --------------------------------------------------------------------------------
    def _plan(self, rows: np.ndarray | None, k: int) -> tuple[tuple | None, np.ndarray | None]:
        """(where, limit, exact) for one restriction, and its rows sorted (None: unrestricted)."""
        if rows is None:
            # Unknown rows (in the table, not in the mapping) may take places: ask for them too.
            return (None, k + self._unknown_rows, False), None
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        if len(rows) == 0:
            return None, rows
        if rows[0] < 0 or rows[-1] >= len(self.row_group):
            raise ValueError(f"allowed rows must be in [0, {len(self.row_group)}), got "
                             f"{rows[0]}..{rows[-1]}")
        groups = np.unique(self.row_group[rows]).tolist()
        selected = sum(self._group_size.get(g, 0) for g in groups)
        where = f"{GROUP} IN ({', '.join(str(int(g)) for g in groups)})"
        return (where, k + selected - len(rows), selected <= self.cfg.flat_max_rows), rows

    def _query(self, vectors: np.ndarray, plan: tuple) -> dict[int, list[tuple[str, float]]]:
        """query index -> [(trajectory_id, cosine)] from one (multi-vector) LanceDB query."""
        where, limit, exact = plan
        query = (self.table.search(vectors if len(vectors) > 1 else vectors[0],
                                   vector_column_name=EMBEDDING)
                 .distance_type("cosine").select([KEY, "_distance"]).limit(int(limit)))
        if where is not None:
            query = query.where(where, prefilter=True)
        if exact:
            query = query.bypass_vector_index()
        else:
            query = query.nprobes(self.cfg.nprobes).refine_factor(self.cfg.refine_factor)
        result = query.to_arrow()
        index = (result.column("query_index").to_numpy() if "query_index" in result.column_names
                 else np.zeros(result.num_rows, dtype=np.int64))
        cosine = 1.0 - result.column("_distance").to_numpy().astype(np.float64)
        found: dict[int, list[tuple[str, float]]] = {}
        for q, tid, sim in zip(index.tolist(), result.column(KEY).to_pylist(), cosine.tolist()):
            if math.isfinite(sim):  # a null or zero vector has no direction
                found.setdefault(int(q), []).append((tid, sim))
        return found

    def _keep(self, hits: list[tuple[str, float]], rows: np.ndarray | None,
              k: int) -> list[tuple[int, float]]:
        """Hits mapped to rows, those outside the restriction dropped, best ``k`` first."""
        mapped = [(self._row_of[tid], sim) for tid, sim in hits if tid in self._row_of]
        if rows is not None:
            ok = np.isin([r for r, _ in mapped], rows)
            mapped = [m for m, keep in zip(mapped, ok) if keep]
        mapped.sort(key=lambda pair: -pair[1])
        return mapped[:k]
