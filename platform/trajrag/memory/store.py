"""The TrajRAG memory in LanceDB: chunks, summaries (coarse index), a decision log, a label vocabulary.

The store is addressed by a URI string and opened with ``lancedb.connect``: a local folder by
default, an object store (``s3://bucket/prefix``, ``gs://...``) for multi-node use; nothing here
assumes a local path.

The tables and their schemas are described in ``memory.schema``: ``chunks`` (one topo-polar
trajectory per row), ``summaries`` (each group's summary, append-only revisions and the
tombstones of fused groups), ``decisions`` (what each insert did), ``vocab`` (label id ->
category) and ``commits`` (the journal). Tables kept beside them: ``memory.side_table``.

Concurrency: **one writer** per store (the collectors of the platform issue funnel their
trajectories to a single inserter); any number of readers, in other threads or processes, which
are never blocked. Idempotency by ``trajectory_id`` is checked by the writer against the ids it
loaded at open plus the ones it has written since, which is exact under the single-writer
assumption.

A batch spans several tables and LanceDB commits each table on its own, so batches are made
atomic with a journal. Every write is an append, except that dropping redundant chunks adds a
delete, so the versions a batch will produce are known beforehand and its journal mark (those
versions) is written with the batch's decision rows, concurrently with the other tables (a
commit costs about one append, and appends no journal row of its own). The store's *snapshot*
is the newest journal row or batch mark whose versions all exist. If a commit fails part-way, the
tables are restored to the previous snapshot at once; if the process died part-way, the next
writer to open the store finds the tables out of step with the journal and restores them
(``recover``). A re-insert after a crash therefore sees the whole batch or none of it and never
duplicates a chunk. Readers that need one consistent view across tables (or exactly the rows of
whole batches) ``checkout(snapshot())``; plain reads see each table's newest version. History is
pruned at compaction to the newest ``keep_versions`` versions: a reader pinned to an older one
takes a new snapshot.
"""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajrag.file_locks import claim
from trajrag.memory.schema import (
    CHUNKS,
    COMMIT_SCHEMA,
    COMMITS,
    DECISION_SCHEMA,
    DECISIONS,
    MAP_COLUMNS,
    MARK_COLUMNS,
    MARK_FIELDS,
    SUMMARIES,
    SUMMARY_SCHEMA,
    TABLES,
    VOCAB,
    VOCAB_SCHEMA,
    chunk_schema,
    utc_now,
)
from trajrag.memory.se2 import Transform2D

log = logging.getLogger(__name__)

# Slack when pruning history by age (see MemoryStore._history_age).
_PRUNE_MARGIN = timedelta(milliseconds=50)
# Journal rows read to find the snapshot: more than the rows one failed commit can leave.
_JOURNAL_TAIL = 16


class StoreError(RuntimeError):
    """The store cannot be opened, read or written; the message names the URI, table and version."""


class StoreClaimedError(StoreError):
    """Another job is writing the store (``claim_store``)."""


# The lock file a writing job holds inside a local store's folder (``claim_store``).
WRITER_LOCK = "writer.lock"


@contextlib.contextmanager
def claim_store(uri: str, job: str) -> Iterator[None]:
    """Hold the memory at ``uri`` as the one job writing it while the block runs; a second job
    (``job`` names this one in its error) gets ``StoreClaimedError`` at once, before it has
    collected anything. Two builds into one store each commit batches the other has not read: with
    two ``make run`` in one folder LanceDB refused one writer's commit as incompatible with the
    other's, and that build failed after its retries. The claim is a lock file in the store's
    folder, dropped when the process ends however it ends. An object-store URI is not claimed:
    LanceDB's refused commits, rolled back, remain the guard there."""
    if "://" in uri:
        yield
        return
    folder = Path(uri)
    folder.mkdir(parents=True, exist_ok=True)
    with claim(folder / WRITER_LOCK, job, lambda other: StoreClaimedError(
            f"memory store {uri} is being written by another job ({other}): "
            f"wait for it to finish, or give another --store")):
        yield


@dataclass
class Batch:
    """Rows to commit together. ``summaries`` are new summary revisions and ``tombstones`` the
    rows of groups fused away (the store sets ``revision``); ``delete_chunk_ids`` are chunks
    dropped as redundant."""

    chunks: list[dict] = field(default_factory=list)
    summaries: list[dict] = field(default_factory=list)
    tombstones: list[dict] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    vocab: list[dict] = field(default_factory=list)
    delete_chunk_ids: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.chunks or self.summaries or self.tombstones or self.decisions
                    or self.vocab or self.delete_chunk_ids)


@dataclass(frozen=True)
class GroupAlias:
    """Where a fused group lives now: ``group_id``, the transform (theta, tx, ty) from the old
    group frame into it, and ``node_map`` (old summary node id -> current one)."""

    group_id: int
    transform: tuple[float, float, float]
    node_map: np.ndarray


def open_committed(db: Any, names: Iterable[str] | None = None) -> dict[str, Any]:
    """The tables of the LanceDB database ``db`` (those of ``names`` only, when given) that hold a
    committed version, by name. A table whose folder holds files but no version, what a process
    killed while creating it leaves (LanceDB still lists it, and cannot open it), is left out with
    a warning: nothing was stored in it, so it can be created anew. Other errors propagate."""
    listed = db.list_tables().tables
    opened = {}
    for name in listed if names is None else [n for n in names if n in listed]:
        try:
            opened[name] = db.open_table(name)
        except ValueError as exc:  # LanceDB's "Table '...' was not found": no committed version
            if "was not found" not in str(exc):
                raise
            log.warning("table %r has files but no committed version (its creation was interrupted, "
                        "nothing was stored in it): treated as absent", name)
    return opened


def sql_str(value: str) -> str:
    """A SQL string literal (single quotes doubled)."""
    return "'" + str(value).replace("'", "''") + "'"



def compose_se2(outer: Iterable[float], inner: Iterable[float]) -> tuple[float, float, float]:
    """``outer o inner`` for SE(2) transforms given as (theta, tx, ty)."""
    composed = Transform2D(*(float(v) for v in outer)).compose(Transform2D(*(float(v) for v in inner)))
    return composed.theta, composed.tx, composed.ty


class MemoryStore:
    """LanceDB tables of one TrajRAG memory at ``uri`` (open-or-create).

    ``embedding_dim`` is needed only to create a new store; an existing store keeps its own (a
    mismatch raises ``StoreError``; without it, a local ``uri`` that is no folder is a
    ``StoreError`` and nothing is created). ``read_only`` never creates tables and never repairs. A
    writer (the default) undoes a batch that a crash left half-written. A reader's reads see the
    newest version of each table (strong read consistency), so it follows the writer; the
    writer sees its own writes and, being the only writer, nothing else.
    """

    def __init__(self, uri: str, *, embedding_dim: int | None = None,
                 read_only: bool = False) -> None:
        import lancedb  # the one module where LanceDB is the point

        self.uri = str(uri)
        self.read_only = read_only
        if (read_only or embedding_dim is None) and "://" not in self.uri and not Path(self.uri).is_dir():
            # Only a store that exists can be opened here (creating one needs embedding_dim), and
            # lancedb.connect makes the folder: a mistyped path would be left behind, empty.
            raise StoreError(f"memory store {self.uri}: no such folder")
        try:
            # A reader checks for a newer version before every read, so it follows the writer.
            # The writer skips that check (~1 ms per table write): it is the only one writing,
            # and its own writes advance its tables.
            self._db = lancedb.connect(
                self.uri, read_consistency_interval=timedelta(0) if read_only else None)
            existing = open_committed(self._db, (*TABLES, COMMITS))
        except Exception as exc:  # noqa: BLE001 - any backend error becomes one clear line
            raise StoreError(f"memory store {self.uri}: cannot connect or open its tables: {exc}") from exc
        missing = [name for name in (*TABLES, COMMITS) if name not in existing]
        if missing and read_only:
            raise StoreError(f"memory store {self.uri}: no store there (tables {missing} missing)")
        if missing:
            # A crash while creating a store can leave some tables, and one table's files without
            # a version (``open_committed``): the writer creates what is missing.
            if embedding_dim is None:
                raise StoreError(f"memory store {self.uri}: tables {missing} do not exist; creating "
                                 "them needs embedding_dim")
            schemas = {CHUNKS: chunk_schema(embedding_dim), SUMMARIES: SUMMARY_SCHEMA,
                       DECISIONS: DECISION_SCHEMA, VOCAB: VOCAB_SCHEMA, COMMITS: COMMIT_SCHEMA}
            for name in missing:
                existing[name] = self._db.create_table(name, schema=schemas[name], exist_ok=True)
        self._tables = {name: existing[name] for name in (*TABLES, COMMITS)}
        self.embedding_dim = self._tables[CHUNKS].schema.field("embedding").type.list_size
        self._check_schemas()
        if embedding_dim is not None and embedding_dim != self.embedding_dim:
            raise StoreError(f"memory store {self.uri}: embedding_dim is {self.embedding_dim} in "
                             f"the store, {embedding_dim} was asked for")
        # The writes of one batch run concurrently: one thread per table plus the journal.
        self._pool = ThreadPoolExecutor(max_workers=len(TABLES) + 1,
                                        thread_name_prefix="trajrag-store")
        self._load_journal()
        if not read_only:
            if self._snapshot is None:
                self._log("create")
            else:
                self.recover()
            if not self.marks_batches:
                self._mark_batches()

    # -- opening and checking ------------------------------------------------------------------

    def _check_schemas(self) -> None:
        expected = {CHUNKS: chunk_schema(self.embedding_dim), SUMMARIES: SUMMARY_SCHEMA,
                    DECISIONS: DECISION_SCHEMA, VOCAB: VOCAB_SCHEMA, COMMITS: COMMIT_SCHEMA}
        self.keeps_maps = all(c in self._tables[CHUNKS].schema.names for c in MAP_COLUMNS)
        self.marks_batches = all(c in self._tables[DECISIONS].schema.names for c in MARK_COLUMNS)
        for name, schema in expected.items():
            have = self._tables[name].schema
            for fld in schema:
                if name == CHUNKS and fld.name in MAP_COLUMNS and not self.keeps_maps:
                    continue  # a store made before chunks kept their maps
                if name == DECISIONS and fld.name in MARK_COLUMNS and not self.marks_batches:
                    continue  # a store made before batches were marked in their decisions
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

    def _load_journal(self) -> None:
        """The snapshot is the newest journal row or batch mark whose versions all exist (<= the
        tables' own): the mark of a batch that failed part-way claims versions that never came."""
        seqs = self.read(COMMITS, ["seq"]).column("seq").to_numpy()
        # Rows are written in seq order, so the newest few hold the snapshot (failed batches
        # leave at most one row each).
        floor = int(np.sort(seqs)[-_JOURNAL_TAIL:][0]) if len(seqs) else 0
        marks = []
        if self.marks_batches:
            marks = [{"seq": m["batch_seq"], "versions": dict(zip(TABLES, m["batch_versions"]))}
                     for m in self.read(DECISIONS, list(MARK_COLUMNS),
                                        where=f"batch_seq >= {floor}").to_pylist()]
        rows = [{"seq": r["seq"], "versions": {name: r[f"{name}_version"] for name in TABLES}}
                for r in self.read(COMMITS, where=f"seq >= {floor}").to_pylist()] if len(seqs) else []
        rows = sorted([*rows, *marks], key=lambda r: r["seq"], reverse=True)
        self._seq = int(rows[0]["seq"]) + 1 if rows else 0
        self._snapshot: dict[str, int] | None = None
        current = self.versions()
        for row in rows:
            versions = {name: int(v) for name, v in row["versions"].items()}
            if all(versions[name] <= current[name] for name in TABLES):
                self._snapshot = versions
                return
        if rows:
            raise StoreError(f"memory store {self.uri}: no journal row matches the tables' "
                             f"versions {current}; the store was changed by another writer")

    def _mark_batches(self) -> None:
        """Give a decisions table made before batch marks their (null) columns: a schema-only
        change in Lance, with a journal row of its own."""
        try:
            self._tables[DECISIONS].add_columns(list(MARK_FIELDS))
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"memory store {self.uri}: cannot add the batch mark columns to "
                             f"table {DECISIONS!r}: {exc}") from exc
        self._check_schemas()
        self._log("mark_batches")

    def _take_seq(self) -> int:
        seq, self._seq = self._seq, self._seq + 1
        return seq

    def _journal_row(self, kind: str, versions: dict[str, int], seq: int | None = None) -> pa.Table:
        row = {"seq": self._take_seq() if seq is None else seq, "kind": kind, "created_at": utc_now()}
        row.update({f"{name}_version": int(v) for name, v in versions.items()})
        return pa.Table.from_pylist([row], schema=COMMIT_SCHEMA)

    def _log(self, kind: str) -> None:
        versions = self.versions()
        self._tables[COMMITS].add(self._journal_row(kind, versions))
        self._snapshot = versions

    def versions(self) -> dict[str, int]:
        """The current version of each data table."""
        return {name: int(self._tables[name].version) for name in TABLES}

    def snapshot(self) -> dict[str, int]:
        """Versions after the last complete batch: a consistent view across tables."""
        if self.read_only:
            self._load_journal()
        return self.versions() if self._snapshot is None else dict(self._snapshot)

    def recover(self) -> bool:
        """Undo a batch that a crash left half-written (tables out of step with the journal).
        Returns True when something was undone; a writer calls it at open."""
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
        for name in TABLES:
            self._tables[name].checkout_latest()

    # -- writing -------------------------------------------------------------------------------

    def commit(self, batch: Batch) -> dict[str, int]:
        """Write one batch atomically (see the module docstring); returns the new snapshot.

        On any failure the tables are restored to the snapshot before the batch and
        ``StoreError`` is raised.
        """
        if self.read_only:
            raise StoreError(f"memory store {self.uri}: opened read-only")
        before = self.snapshot()
        counts = self._version_counts(batch)
        if not counts:
            return before
        expected = {name: before[name] + counts.get(name, 0) for name in TABLES}
        seq = self._take_seq()
        writes = self._writes(batch, seq, expected)
        futures = {name: self._pool.submit(fn) for name, fn in writes.items()}
        if not batch.decisions:  # else the journal mark rides on the decisions' own append
            futures[COMMITS] = self._pool.submit(self._tables[COMMITS].add,
                                                 self._journal_row("batch", expected, seq))
        errors, actual = [], dict(before)
        for name, future in futures.items():
            try:
                version = future.result()
            except Exception as exc:  # noqa: BLE001 - collected, then rolled back
                errors.append(f"{name}: {exc}")
                continue
            if name in actual:
                actual[name] = int(version)
        if errors:
            try:
                self.rollback(before)
            except StoreError as inner:
                raise StoreError(f"{inner}; the failed batch ({'; '.join(errors)}) is partly "
                                 "written, the next writer to open the store will undo it") from None
            raise StoreError(f"memory store {self.uri}: batch not written, store rolled back to "
                             f"{before}: {'; '.join(errors)}")
        self._snapshot = expected
        # Each write returns the version it made, so no table is polled after the batch.
        if actual != expected:  # e.g. a retried commit took two versions: record what is true
            self._log("batch")
        return dict(self._snapshot)

    @staticmethod
    def _version_counts(batch: Batch) -> dict[str, int]:
        """How many versions of each table a batch makes (tables it does not touch: none)."""
        counts = {VOCAB: int(bool(batch.vocab)),
                  SUMMARIES: int(bool(batch.summaries or batch.tombstones)),
                  DECISIONS: int(bool(batch.decisions)),
                  CHUNKS: int(bool(batch.chunks)) + int(bool(batch.delete_chunk_ids))}
        return {name: n for name, n in counts.items() if n}

    def _writes(self, batch: Batch, seq: int,
                after: dict[str, int]) -> dict[str, Callable[[], int]]:
        """Per table: a callable that writes its rows and returns the table's new version.
        Summary rows get revision ``seq``; the first decision row carries the journal mark:
        ``seq`` and the versions ``after`` the batch."""
        t, writes = self._tables, {}
        if batch.vocab:
            vocab = pa.Table.from_pylist(batch.vocab, schema=VOCAB_SCHEMA)
            writes[VOCAB] = lambda: t[VOCAB].add(vocab).version
        if batch.summaries or batch.tombstones:
            rows = [dict(r, revision=seq) for r in [*batch.summaries, *batch.tombstones]]
            summaries = pa.Table.from_pylist(rows, schema=SUMMARY_SCHEMA)
            writes[SUMMARIES] = lambda: t[SUMMARIES].add(summaries).version
        if batch.decisions:
            first, *rest = batch.decisions
            marked = dict(first, batch_seq=seq, batch_versions=[after[n] for n in TABLES])
            decisions = pa.Table.from_pylist([marked, *rest], schema=DECISION_SCHEMA)
            writes[DECISIONS] = lambda: t[DECISIONS].add(decisions).version
        if batch.chunks or batch.delete_chunk_ids:
            chunks = pa.Table.from_pylist(batch.chunks, schema=chunk_schema(self.embedding_dim, self.keeps_maps))
            dropped = ", ".join(sql_str(i) for i in batch.delete_chunk_ids)

            def write_chunks() -> int:
                # The new chunks first: a reader between the two versions sees a dropped chunk
                # a moment longer, never a trajectory missing.
                if chunks.num_rows:
                    version = t[CHUNKS].add(chunks).version
                if dropped:
                    version = t[CHUNKS].delete(f"trajectory_id IN ({dropped})").version
                return version

            writes[CHUNKS] = write_chunks
        return writes

    def update_embeddings(self, trajectory_ids: Iterable[str], embeddings: np.ndarray,
                          encoder_version: str) -> int:
        """Set the ``embedding`` and ``encoder_version`` of stored chunks (ids not stored are
        skipped); one chunks version and one journal row. Returns the number of rows updated.

        It is a write: not while a ``TrajectoryMemory`` is inserting into the same store.
        """
        if self.read_only:
            raise StoreError(f"memory store {self.uri}: opened read-only")
        ids = [str(i) for i in trajectory_ids]
        z = np.asarray(embeddings, dtype=np.float32)
        if z.ndim != 2 or z.shape != (len(ids), self.embedding_dim) or not np.isfinite(z).all():
            raise StoreError(f"memory store {self.uri}: embeddings must be finite "
                             f"({len(ids)}, {self.embedding_dim}), got {z.shape}")
        full = chunk_schema(self.embedding_dim)
        schema = pa.schema([full.field(c) for c in ("trajectory_id", "embedding", "encoder_version")])
        rows = pa.table({"trajectory_id": pa.array(ids, pa.string()),
                         "embedding": pa.FixedSizeListArray.from_arrays(
                             pa.array(z.ravel(), pa.float32()), self.embedding_dim),
                         "encoder_version": pa.array([encoder_version] * len(ids), pa.string())},
                        schema=schema)
        before = self.snapshot()
        try:
            result = (self._tables[CHUNKS].merge_insert("trajectory_id")
                      .when_matched_update_all().execute(rows))
            self._log("embeddings")
        except Exception as exc:  # noqa: BLE001
            self.rollback(before)
            raise StoreError(f"memory store {self.uri}: embeddings not written: {exc}") from exc
        return int(getattr(result, "num_updated_rows", len(ids)))

    def compact(self, keep_versions: int | None = None) -> None:
        """Drop superseded summary revisions, merge small fragments (one per single insert),
        index the chunk keys, and prune each table's history to its ``keep_versions`` newest
        versions (None: LanceDB's default, versions younger than 7 days). Tables other modules
        keep in the same database (the exploration walks' ``value_decisions``, one append per
        writer batch) are merged and pruned alike. One journal row records the result.

        Pruning matters for speed, not only space: finding a table's newest version lists its
        version files, so every commit slows down as history grows (an append takes ~3 ms at
        100 versions, ~8-15 ms at 4000). Rollback reaches back ``keep_versions`` commits.
        """
        if self.read_only:
            raise StoreError(f"memory store {self.uri}: opened read-only")
        summaries = self._tables[SUMMARIES]
        newest = self._newest_revisions(self.read(SUMMARIES))
        if newest.num_rows < summaries.count_rows():
            # One version: the newest rows come back under this revision and all older go (an
            # overwrite would let LanceDB re-infer the schema).
            seq = self._seq
            newest = newest.set_column(newest.schema.get_field_index("revision"), "revision",
                                       pa.array(np.full(newest.num_rows, seq), pa.int64()))
            (summaries.merge_insert(["group_id", "revision"]).when_matched_update_all()
             .when_not_matched_insert_all().when_not_matched_by_source_delete(f"revision < {seq}")
             .execute(newest))
        self._index_keys()
        side = [table for name, table in open_committed(self._db).items() if name not in (*TABLES, COMMITS)]
        for table in (*(self._tables[name] for name in (*TABLES, COMMITS)), *side):
            table.optimize(cleanup_older_than=self._history_age(table, keep_versions))
        self._log("compact")

    @staticmethod
    def _history_age(table: Any, keep_versions: int | None) -> timedelta | None:
        """The age that keeps a table's ``keep_versions`` newest versions (plus a margin)."""
        if keep_versions is None:
            return None
        stamps = sorted((v["timestamp"] for v in table.list_versions()), reverse=True)
        if len(stamps) <= keep_versions:
            return None
        oldest_kept = stamps[keep_versions - 1]
        now = datetime.now(oldest_kept.tzinfo)
        # LanceDB measures the age from its own "now", a moment later: the margin keeps a
        # version or two more rather than lose the oldest wanted one.
        return max(now - oldest_kept, timedelta(0)) + _PRUNE_MARGIN

    def _index_keys(self) -> None:
        """BTREE indexes on the chunk keys (deletes and per-group reads without a full scan);
        ``optimize`` then keeps them up to date."""
        from lancedb.index import BTree

        chunks = self._tables[CHUNKS]
        have = {tuple(ix.columns) for ix in chunks.list_indices()}
        for column in ("trajectory_id", "group_id"):
            if (column,) not in have and chunks.count_rows():
                chunks.create_index(column, config=BTree())

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

    @staticmethod
    def _newest_revisions(rows: pa.Table) -> pa.Table:
        """The newest row of each group_id (tombstones included)."""
        if rows.num_rows == 0:
            return rows
        rows = rows.take(pc.sort_indices(rows, [("group_id", "ascending"),
                                                ("revision", "descending")]))
        gid = rows.column("group_id").to_numpy()
        first = np.ones(len(gid), dtype=bool)
        first[1:] = gid[1:] != gid[:-1]
        return rows.filter(pa.array(first))

    def read_summaries(self, columns: Iterable[str] | None = None,
                       where: str | None = None) -> pa.Table:
        """The current summary of each group (newest revision, no tombstones), by group_id."""
        cols = None if columns is None else list(dict.fromkeys(
            ["group_id", "revision", "fused_into", *columns]))
        rows = self._newest_revisions(self.read(SUMMARIES, cols, where))
        rows = rows.filter(pc.is_null(rows.column("fused_into")))
        return rows if columns is None else rows.select(list(columns))

    def group_aliases(self) -> dict[int, GroupAlias]:
        """Every fused group -> where it lives now (chains of fusions followed to the end)."""
        rows = self._newest_revisions(self.read(
            SUMMARIES, ["group_id", "revision", "fused_into", "fuse_transform", "node_map"]))
        rows = rows.filter(pc.is_valid(rows.column("fused_into"))).to_pylist()
        step = {int(r["group_id"]): r for r in rows}
        aliases: dict[int, GroupAlias] = {}

        def resolve(gid: int) -> GroupAlias:
            if gid in aliases:
                return aliases[gid]
            row = step[gid]
            into = int(row["fused_into"])
            alias = GroupAlias(into, tuple(float(v) for v in row["fuse_transform"]),
                               np.asarray(row["node_map"], dtype=np.int64))
            if into in step:
                outer = resolve(into)
                alias = GroupAlias(outer.group_id, compose_se2(outer.transform, alias.transform),
                                   outer.node_map[alias.node_map])
            aliases[gid] = alias
            return alias

        for gid in step:
            resolve(gid)
        return aliases

    def resolve_chunks(self, rows: pa.Table | list[dict],
                       aliases: dict[int, GroupAlias] | None = None) -> list[dict]:
        """Chunk rows with ``group_id``, ``summary_nodes`` and ``group_transform`` made current
        (through fusions); rows of groups never fused are returned as they are."""
        aliases = self.group_aliases() if aliases is None else aliases
        out = rows.to_pylist() if isinstance(rows, pa.Table) else [dict(r) for r in rows]
        for row in out:
            alias = aliases.get(int(row["group_id"]))
            if alias is None:
                continue
            row["group_id"] = alias.group_id
            if row.get("summary_nodes") is not None:
                row["summary_nodes"] = alias.node_map[np.asarray(row["summary_nodes"])].tolist()
            if row.get("group_transform") is not None:
                row["group_transform"] = list(compose_se2(alias.transform, row["group_transform"]))
        return out

    def resolve_groups(self, group_ids: Iterable[int],
                       aliases: dict[int, GroupAlias] | None = None) -> list[int]:
        """Current group of each stored chunk ``group_id``."""
        aliases = self.group_aliases() if aliases is None else aliases
        return [aliases[g].group_id if g in aliases else int(g) for g in group_ids]

    def get_chunk(self, trajectory_id: str) -> dict | None:
        """One chunk as a dict (group fields made current), or None."""
        rows = self.read(CHUNKS, where=f"trajectory_id = {sql_str(trajectory_id)}")
        return self.resolve_chunks(rows)[0] if rows.num_rows else None

    def get_group_chunks(self, group_id: int) -> list[dict]:
        """The chunks of a current group, including those of groups fused into it."""
        aliases = self.group_aliases()
        ids = [int(group_id)] + [g for g, a in aliases.items() if a.group_id == int(group_id)]
        rows = self.read(CHUNKS, where="group_id IN (" + ", ".join(map(str, ids)) + ")")
        return self.resolve_chunks(rows, aliases)

    def get_summary(self, group_id: int) -> dict | None:
        rows = self.read_summaries(where=f"group_id = {int(group_id)}").to_pylist()
        return rows[0] if rows else None

    def list_groups(self) -> list[dict]:
        """Every current group: group_id, n_nodes, n_members, scene_hints, goals (by group_id)."""
        return self.read_summaries(["group_id", "n_nodes", "n_members", "scene_hints",
                                    "goals"]).to_pylist()

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
        return self._tables[name]
