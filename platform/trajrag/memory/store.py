"""The TrajRAG memory in LanceDB: chunks, summaries (coarse index), a decision log, a label vocabulary.

The store is addressed by a URI string and opened with ``lancedb.connect``: a local folder by
default, an object store (``s3://bucket/prefix``, ``gs://...``) for multi-node use; nothing here
assumes a local path.

Tables (one row each):

* ``chunks``: one topo-polar trajectory (a *chunk*), keyed by ``trajectory_id``. Nodes are kept
  in the trajectory's own frame (``node_xy``, flattened ``[x0, y0, x1, y1, ...]`` float32 metres),
  with ``group_transform`` (theta, tx, ty) into the group frame and ``summary_nodes``, the summary
  node each trajectory node was fused into. ``sectors`` is flattened (K * 12) int8 in the store's
  label vocabulary. ``embedding`` stays null until the trajectory encoder exists.
* ``summaries``: the topo-polar summary of each group, in the group frame: fused node positions,
  per-node descriptors (the sector vectors, from which the prefilter's rotation-invariant node
  descriptors are derived, and node embeddings, null until the node encoder exists), edges,
  per-node observation counts, member count, scene hints and goals seen. The table is
  append-only: a changed summary is a new row with a higher ``revision`` (the commit's journal
  seq), and a group fused into another gets a tombstone row (``fused_into`` set). The current
  summaries are the newest row of each group that is not a tombstone (``read_summaries``);
  ``compact`` rewrites the table to just those. Appending keeps a commit to plain ``add`` calls
  (an upsert costs 3-4 appends).
* ``decisions``: what each insert did (``new``, ``merge``, ``redundant``, ``rejected``, and ``fuse``
  when a trajectory joined two groups into one), with group, score, transform and a reason.
  ``duplicate`` inserts (an id already stored) write nothing.
* ``vocab``: label id -> category name. Sector labels are store-wide ids (>= 0 objects, and the
  negative ``topo.labels`` codes), so trajectories with different category lists match.
* ``commits``: a journal, one row per completed batch with every table's version after it.

Concurrency: **one writer** per store (the collectors of the platform issue funnel their
trajectories to a single inserter); any number of readers. LanceDB commits every append as a new
table version atomically, so a reader sees either all of a batch or none of it. Idempotency
by ``trajectory_id`` is checked by the writer against the ids it loaded at open (plus the ones it
has written since), which is exact under the single-writer assumption.

A batch spans several tables, and LanceDB commits each table on its own, so batches are made
atomic with the ``commits`` journal. A batch makes exactly one new version of each table it
touches (appends with ``add``; upserts and deletions in one ``merge_insert``), so its versions
are known in advance and one journal row records them, written concurrently with the data. The
store's *snapshot* is the newest journal row whose versions all exist. If a commit fails
part-way the tables are restored to the previous snapshot at once; if the process died
part-way, the next writer that opens the store finds tables out of step with the journal and
restores them (``recover``). A re-insert after a crash therefore sees either the whole batch or
none of it, and never duplicates a chunk. A reader of one table never sees half a batch;
readers that need one consistent view across tables ``checkout(snapshot())``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

CHUNKS = "chunks"
SUMMARIES = "summaries"
DECISIONS = "decisions"
VOCAB = "vocab"
COMMITS = "commits"
TABLES = (VOCAB, SUMMARIES, DECISIONS, CHUNKS)  # data tables, in commit order

TIMESTAMP = pa.timestamp("ms", tz="UTC")
ACTIONS = ("new", "merge", "fuse", "redundant", "rejected", "duplicate")


class StoreError(RuntimeError):
    """The store cannot be opened, read or written; the message names the URI, table and version."""


def chunk_schema(embedding_dim: int) -> pa.Schema:
    """Schema of the chunks table; ``embedding_dim`` fixes the (nullable) embedding vector size."""
    return pa.schema(
        [
            pa.field("trajectory_id", pa.string(), nullable=False),
            pa.field("group_id", pa.int64(), nullable=False),
            pa.field("scene_hint", pa.string()),
            pa.field("goal", pa.string()),
            pa.field("n_nodes", pa.int32()),
            pa.field("node_xy", pa.list_(pa.float32())),
            pa.field("sectors", pa.list_(pa.int8())),
            pa.field("edges", pa.list_(pa.int32())),
            pa.field("summary_nodes", pa.list_(pa.int32())),
            pa.field("group_transform", pa.list_(pa.float32(), 3)),
            pa.field("reference_yaw", pa.float32()),
            pa.field("description", pa.string()),
            pa.field("embedding", pa.list_(pa.float32(), embedding_dim), nullable=True),
            pa.field("encoder_version", pa.string(), nullable=True),
            pa.field("episode_id", pa.string()),
            pa.field("policy", pa.string()),
            pa.field("success", pa.bool_()),
            pa.field("created_at", TIMESTAMP),
        ],
        metadata={b"trajrag.embedding_dim": str(embedding_dim).encode()},
    )


def summary_schema() -> pa.Schema:
    """Schema of the summaries table."""
    return pa.schema(
        [
            pa.field("group_id", pa.int64(), nullable=False),
            pa.field("revision", pa.int64(), nullable=False),
            pa.field("fused_into", pa.int64(), nullable=True),
            pa.field("n_nodes", pa.int32()),
            pa.field("node_xy", pa.list_(pa.float32())),
            pa.field("sectors", pa.list_(pa.int8())),
            pa.field("node_count", pa.list_(pa.int32())),
            pa.field("edges", pa.list_(pa.int32())),
            pa.field("reference_yaw", pa.float32()),
            pa.field("n_members", pa.int32()),
            pa.field("scene_hints", pa.list_(pa.string())),
            pa.field("goals", pa.list_(pa.string())),
            # Per-node embeddings from the node encoder (flattened); null until it exists.
            pa.field("node_embeddings", pa.list_(pa.float32()), nullable=True),
            pa.field("updated_at", TIMESTAMP),
        ]
    )


DECISION_SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("trajectory_id", pa.string(), nullable=False),
        pa.field("action", pa.string(), nullable=False),
        pa.field("group_id", pa.int64(), nullable=True),
        pa.field("score", pa.float32()),
        pa.field("transform", pa.list_(pa.float32(), 3), nullable=True),
        pa.field("other_id", pa.string(), nullable=True),
        pa.field("reason", pa.string()),
        pa.field("created_at", TIMESTAMP),
    ]
)

VOCAB_SCHEMA = pa.schema(
    [pa.field("label", pa.int16(), nullable=False), pa.field("name", pa.string(), nullable=False)]
)

COMMIT_SCHEMA = pa.schema(
    [pa.field("seq", pa.int64(), nullable=False), pa.field("kind", pa.string(), nullable=False)]
    + [pa.field(f"{name}_version", pa.int64(), nullable=False) for name in TABLES]
    + [pa.field("created_at", TIMESTAMP)]
)


@dataclass
class Batch:
    """Rows to commit together. ``summaries`` are new revisions (the store sets ``revision``);
    ``fused_groups`` maps a group fused away to the group it went into; ``chunk_updates`` replace
    chunks by ``trajectory_id`` and ``delete_chunk_ids`` remove them."""

    chunks: list[dict] = field(default_factory=list)
    summaries: list[dict] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    vocab: list[dict] = field(default_factory=list)
    chunk_updates: list[dict] = field(default_factory=list)
    delete_chunk_ids: list[str] = field(default_factory=list)
    fused_groups: dict[int, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.chunks or self.summaries or self.decisions or self.vocab
                     or self.chunk_updates or self.delete_chunk_ids or self.fused_groups)


def sql_str(value: str) -> str:
    """A SQL string literal (single quotes doubled)."""
    return "'" + str(value).replace("'", "''") + "'"


def _dim(schema: pa.Schema, column: str) -> int:
    return schema.field(column).type.list_size


class MemoryStore:
    """LanceDB tables of one TrajRAG memory at ``uri`` (open-or-create).

    ``embedding_dim`` is needed only to create a new store; an existing store keeps its own (a
    mismatch raises ``StoreError``). ``read_only`` never creates tables and
    never repairs. A writer (the default) finishes or undoes a batch a crash left half-written.
    Reads always see the latest version of each table (strong read consistency), so a reader in
    another thread or process follows the writer.
    """

    def __init__(self, uri: str, *, embedding_dim: int | None = None,
                 read_only: bool = False) -> None:
        import lancedb  # the one module where LanceDB is the point

        self.uri = str(uri)
        self.read_only = read_only
        try:
            self._db = lancedb.connect(self.uri, read_consistency_interval=timedelta(0))
            existing = set(self._db.list_tables().tables)
        except Exception as exc:  # noqa: BLE001 - any backend error becomes one clear line
            raise StoreError(f"memory store {self.uri}: cannot connect: {exc}") from exc
        missing = [name for name in (*TABLES, COMMITS) if name not in existing]
        if missing and read_only:
            raise StoreError(f"memory store {self.uri}: no store there (tables {missing} missing)")
        if missing:
            # A crash while creating a store can leave some tables: the writer completes them.
            if embedding_dim is None:
                raise StoreError(f"memory store {self.uri}: tables {missing} do not exist; creating "
                                 "them needs embedding_dim")
            schemas = {CHUNKS: chunk_schema(embedding_dim), SUMMARIES: summary_schema(),
                       DECISIONS: DECISION_SCHEMA, VOCAB: VOCAB_SCHEMA, COMMITS: COMMIT_SCHEMA}
            for name in missing:
                self._db.create_table(name, schema=schemas[name], exist_ok=True)
        self._tables = {name: self._open(name) for name in TABLES}
        self._journal = self._open(COMMITS)
        self.embedding_dim = _dim(self._tables[CHUNKS].schema, "embedding")
        self._check_schemas()
        if embedding_dim is not None and embedding_dim != self.embedding_dim:
            raise StoreError(f"memory store {self.uri}: embedding_dim is {self.embedding_dim} in "
                             f"the store, {embedding_dim} was asked for")
        # Concurrent writes of one batch: one thread per table plus the journal.
        self._pool = ThreadPoolExecutor(max_workers=len(TABLES) + 1,
                                        thread_name_prefix="trajrag-store")
        self._load_journal()
        if self._snapshot is None and not read_only:
            self._log("create")
        elif not read_only:
            self.recover()

    # -- opening and checking ------------------------------------------------------------------

    def _open(self, name: str):
        try:
            return self._db.open_table(name)
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"memory store {self.uri}: table {name!r} cannot be opened: {exc}") from exc

    def _check_schemas(self) -> None:
        expected = {CHUNKS: chunk_schema(self.embedding_dim),
                    SUMMARIES: summary_schema(),
                    DECISIONS: DECISION_SCHEMA, VOCAB: VOCAB_SCHEMA}
        tables = dict(self._tables, **{COMMITS: self._journal})
        expected[COMMITS] = COMMIT_SCHEMA
        for name, schema in expected.items():
            have = tables[name].schema
            for fld in schema:
                if fld.name not in have.names or not have.field(fld.name).type.equals(fld.type):
                    got = have.field(fld.name).type if fld.name in have.names else "missing"
                    raise StoreError(f"memory store {self.uri}: table {name!r} column {fld.name!r} "
                                     f"is {got}, expected {fld.type}")

    def verify(self) -> None:
        """Read every table completely; raise ``StoreError`` naming the table, its version and the
        earlier versions when data is unreadable (e.g. a missing or corrupted data file)."""
        for name in TABLES:
            table = self._tables[name]
            try:
                table.to_arrow()
            except Exception as exc:  # noqa: BLE001
                try:
                    earlier = [v["version"] for v in table.list_versions()][:-1]
                except Exception:  # noqa: BLE001
                    earlier = []
                raise StoreError(
                    f"memory store {self.uri}: table {name!r} version {table.version} is unreadable "
                    f"({exc}); earlier versions {earlier[-5:]} can be read with checkout() or "
                    "brought back with rollback()") from exc

    # -- versions and the journal --------------------------------------------------------------

    def _journal_rows(self) -> list[dict]:
        rows = self._journal.search().limit(None).to_arrow().to_pylist()
        return sorted(rows, key=lambda r: r["seq"], reverse=True)

    def _load_journal(self) -> None:
        """The snapshot is the newest journal row whose versions all exist (<= the tables' own):
        a row written for a batch that then failed part-way claims versions that never came."""
        rows = self._journal_rows()
        current = self.versions()
        self._seq = int(rows[0]["seq"]) + 1 if rows else 0
        self._snapshot: dict[str, int] | None = None
        for row in rows:
            versions = {name: int(row[f"{name}_version"]) for name in TABLES}
            if all(versions[name] <= current[name] for name in TABLES):
                self._snapshot = versions
                return

    def _journal_row(self, kind: str, versions: dict[str, int]) -> pa.Table:
        row = {"seq": self._seq, "kind": kind, "created_at": _now()}
        row.update({f"{name}_version": int(v) for name, v in versions.items()})
        self._seq += 1
        return pa.Table.from_pylist([row], schema=COMMIT_SCHEMA)

    def _log(self, kind: str) -> None:
        versions = self.versions()
        self._journal.add(self._journal_row(kind, versions))
        self._snapshot = versions

    def versions(self) -> dict[str, int]:
        """The current version of each data table."""
        return {name: int(self._tables[name].version) for name in TABLES}

    def snapshot(self) -> dict[str, int]:
        """Versions after the last complete batch: a consistent view across tables."""
        if self.read_only:
            self._load_journal()
        if self._snapshot is None:
            return self.versions()
        return dict(self._snapshot)

    def recover(self) -> bool:
        """Undo a batch that a crash left half-written (tables ahead of the journal).

        Returns True when something was undone. Called by a writer at open.
        """
        snap = self.snapshot()
        if self.versions() == snap:
            return False
        self.rollback(snap)
        return True

    def rollback(self, versions: dict[str, int]) -> None:
        """Make ``versions`` the latest again (new versions with the old data; history is kept)."""
        for name in TABLES:
            table = self._tables[name]
            if name in versions and int(table.version) != int(versions[name]):
                try:
                    table.restore(int(versions[name]))
                except Exception as exc:  # noqa: BLE001
                    raise StoreError(f"memory store {self.uri}: cannot restore table {name!r} to "
                                     f"version {versions[name]}: {exc}") from exc
        self._log("rollback")

    def checkout(self, versions: dict[str, int]) -> None:
        """Read-only time travel to ``versions``; ``checkout_latest`` returns to the head."""
        for name, version in versions.items():
            self._tables[name].checkout(int(version))

    def checkout_latest(self) -> None:
        for table in self._tables.values():
            table.checkout_latest()

    # -- writing -------------------------------------------------------------------------------

    def commit(self, batch: Batch) -> dict[str, int]:
        """Write one batch atomically (see the module docstring) and return the new snapshot.

        Every table gets at most one new version per batch, so the versions after the batch are
        known beforehand and the journal row is written *together with* the data (all writes run
        concurrently: a commit costs about one write, not five). On any failure the tables are
        restored to the snapshot before the batch and ``StoreError`` is raised.
        """
        if self.read_only:
            raise StoreError(f"memory store {self.uri}: opened read-only")
        before = self.snapshot()
        writes = self._writes(batch)
        if not writes:
            return before
        expected = dict(before, **{name: before[name] + 1 for name in writes})
        journal = self._journal_row("batch", expected)  # the seq _writes stamped on summaries
        futures = {name: self._pool.submit(fn) for name, fn in writes.items()}
        futures[COMMITS] = self._pool.submit(self._journal.add, journal)
        errors, actual = [], dict(before)
        for name, future in futures.items():
            try:
                result = future.result()
                if name != COMMITS:
                    actual[name] = int(result.version)
            except Exception as exc:  # noqa: BLE001 - collected, then rolled back
                errors.append(f"{name}: {exc}")
        if errors:
            try:
                self.rollback(before)
            except StoreError as inner:
                raise StoreError(f"{inner}; the failed batch ({'; '.join(errors)}) is partly "
                                 "written, the next writer to open the store will undo it") from None
            raise StoreError(f"memory store {self.uri}: batch not written, store rolled back to "
                             f"{before}: {'; '.join(errors)}")
        self._snapshot = actual
        if actual != expected:  # e.g. a retried commit took two versions: record what is true
            self._log("batch")
        return dict(self._snapshot)

    def _writes(self, batch: Batch) -> dict[str, Any]:
        """One callable per table to write (each makes exactly one new version)."""
        t, writes = self._tables, {}
        if batch.vocab:
            vocab = pa.Table.from_pylist(batch.vocab, schema=VOCAB_SCHEMA)
            writes[VOCAB] = partial(t[VOCAB].add, vocab)
        if batch.summaries or batch.fused_groups:
            tombstones = [{"group_id": int(g), "fused_into": int(into)}
                          for g, into in batch.fused_groups.items()]
            rows = [dict(r, revision=self._seq) for r in [*batch.summaries, *tombstones]]
            writes[SUMMARIES] = partial(t[SUMMARIES].add,
                                        pa.Table.from_pylist(rows, schema=summary_schema()))
        if batch.decisions:
            decisions = pa.Table.from_pylist(batch.decisions, schema=DECISION_SCHEMA)
            writes[DECISIONS] = partial(t[DECISIONS].add, decisions)
        schema = chunk_schema(self.embedding_dim)
        if batch.chunk_updates or batch.delete_chunk_ids:
            chunks = pa.Table.from_pylist(batch.chunks + batch.chunk_updates, schema=schema)
            dropped = ", ".join(sql_str(i) for i in batch.delete_chunk_ids)
            writes[CHUNKS] = partial(self._upsert, t[CHUNKS], "trajectory_id", chunks,
                                     f"trajectory_id IN ({dropped})" if dropped else None)
        elif batch.chunks:
            writes[CHUNKS] = partial(t[CHUNKS].add, pa.Table.from_pylist(batch.chunks, schema=schema))
        return writes

    @staticmethod
    def _upsert(table: Any, key: str, rows: pa.Table, delete_where: str | None) -> Any:
        """Insert or replace ``rows`` by ``key`` and delete rows matching ``delete_where``, as one
        version (a reader never sees the deletion without the insertion)."""
        builder = table.merge_insert(key).when_matched_update_all().when_not_matched_insert_all()
        if delete_where:
            builder = builder.when_not_matched_by_source_delete(delete_where)
        # LanceDB's merge path counts a null vector as a wrong-sized one; "null" keeps it null.
        return builder.execute(rows, on_bad_vectors="null")

    def compact(self, cleanup_older_than: timedelta | None = None) -> None:
        """Rewrite the summaries to their current rows, merge small fragments (one per single
        insert) and prune versions older than ``cleanup_older_than`` (LanceDB default: 7 days, so
        rollback history is kept). One journal row records the result."""
        if self.read_only:
            raise StoreError(f"memory store {self.uri}: opened read-only")
        current = self.read_summaries()
        if current.num_rows < self.count(SUMMARIES):
            # One version: the current rows come back under this compaction's revision and every
            # older row goes (an overwrite would let LanceDB re-infer the schema).
            seq = self._seq
            current = current.set_column(current.schema.get_field_index("revision"), "revision",
                                         pa.array(np.full(current.num_rows, seq), pa.int64()))
            (self._tables[SUMMARIES].merge_insert(["group_id", "revision"])
             .when_matched_update_all().when_not_matched_insert_all()
             .when_not_matched_by_source_delete(f"revision < {seq}").execute(current))
        for table in (*self._tables.values(), self._journal):
            table.optimize(cleanup_older_than=cleanup_older_than)
        self._log("compact")

    def close(self) -> None:
        """Stop the writer threads (also done at interpreter exit)."""
        self._pool.shutdown(wait=True)

    # -- reading -------------------------------------------------------------------------------

    def count(self, table: str, where: str | None = None) -> int:
        return int(self._tables[table].count_rows(where))

    def read(self, table: str, columns: Iterable[str] | None = None,
             where: str | None = None) -> pa.Table:
        """Rows of one table as Arrow (all rows, or those matching the SQL ``where``)."""
        try:
            query = self._tables[table].search()
            if where:
                query = query.where(where)
            if columns is not None:
                query = query.select(list(columns))
            return query.limit(None).to_arrow()
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"memory store {self.uri}: cannot read table {table!r} "
                             f"(version {self._tables[table].version}): {exc}") from exc

    def get_chunk(self, trajectory_id: str) -> dict | None:
        """One chunk as a dict, or None."""
        rows = self.read(CHUNKS, where=f"trajectory_id = {sql_str(trajectory_id)}").to_pylist()
        return rows[0] if rows else None

    def get_chunks(self, trajectory_ids: Iterable[str]) -> list[dict]:
        ids = list(trajectory_ids)
        if not ids:
            return []
        where = "trajectory_id IN (" + ", ".join(sql_str(i) for i in ids) + ")"
        return self.read(CHUNKS, where=where).to_pylist()

    def read_summaries(self, columns: Iterable[str] | None = None,
                       where: str | None = None) -> pa.Table:
        """The current summary of each group (newest revision, tombstones dropped), by group_id."""
        cols = None if columns is None else list(dict.fromkeys(
            ["group_id", "revision", "fused_into", *columns]))
        rows = self.read(SUMMARIES, cols, where)
        if rows.num_rows == 0:
            return rows if columns is None else rows.select(list(columns))
        order = pc.sort_indices(rows, [("group_id", "ascending"), ("revision", "descending")])
        rows = rows.take(order)
        gid = rows.column("group_id").to_numpy()
        first = np.ones(len(gid), dtype=bool)
        first[1:] = gid[1:] != gid[:-1]
        rows = rows.filter(pa.array(first))
        rows = rows.filter(pc.is_null(rows.column("fused_into")))
        return rows if columns is None else rows.select(list(columns))

    def get_summary(self, group_id: int) -> dict | None:
        rows = self.read_summaries(where=f"group_id = {int(group_id)}").to_pylist()
        return rows[0] if rows else None

    def list_groups(self) -> list[dict]:
        """Every group: group_id, n_nodes, n_members, scene_hints, goals (sorted by group_id)."""
        cols = ["group_id", "n_nodes", "n_members", "scene_hints", "goals"]
        return self.read_summaries(cols).to_pylist()

    def count_groups(self) -> int:
        return self.read_summaries(["group_id"]).num_rows

    def vocabulary(self) -> dict[str, int]:
        """Category name -> store-wide label id."""
        return {r["name"]: int(r["label"]) for r in self.read(VOCAB).to_pylist()}

    def table_bytes(self) -> dict[str, int]:
        """Bytes of each data table's files at its current version (LanceDB ``stats``)."""
        return {name: int(self._tables[name].stats()["total_bytes"]) for name in TABLES}

    def bytes_per_chunk(self) -> float:
        """Chunks table bytes / rows (embedding column included; it is null until encoded)."""
        n = self.count(CHUNKS)
        return self.table_bytes()[CHUNKS] / n if n else 0.0

    def table(self, name: str) -> Any:
        """The underlying LanceDB table (for callers that need its full API)."""
        return self._journal if name == COMMITS else self._tables[name]


def _now() -> datetime:
    return datetime.now(timezone.utc)
