"""The memory's LanceDB tables: their names and Arrow schemas (``memory.store`` reads and writes them).

* ``chunks``: one topo-polar trajectory (a *chunk*) per row, keyed by ``trajectory_id``. Nodes
  are kept in the trajectory's own frame (``node_xy``, flattened ``[x0, y0, x1, y1, ...]``
  float32 metres) with ``group_transform`` (theta, tx, ty) into the frame of the group it joined
  (``group_id``) and ``summary_nodes``, the summary node each trajectory node was fused into.
  ``sectors`` is flattened (K * 12) int8 in the store's label vocabulary, ``description`` the
  paper's L(T_tp). ``embedding`` stays null until the trajectory encoder exists. The ``map_*``
  columns keep the map the walk was made in (``topo.candidates.MapPlace``: every node of the
  episode's topo graph, in the same frame and label ids, and ``map_walk_nodes``, the map node of
  each walked node), null for a chunk inserted without one; ``corpus regroup`` replays them.
  Stores made before these columns existed open as they are and keep no maps.
* ``summaries``: the topo-polar summary of each group, in the group frame: fused node positions,
  per-node descriptors (the sector vectors, from which the prefilter's rotation-invariant node
  descriptors are derived, and node embeddings, null until the node encoder exists), edges,
  per-node observation counts, member count, scene hints and goals seen. The table is
  append-only: a changed summary is a new row with a higher ``revision`` (the commit's journal
  seq). A group fused into another gets a *tombstone* row (``fused_into``, ``fuse_transform``
  from its frame into the other's, ``node_map`` from its summary nodes to the other's); its
  chunks keep their rows and are resolved through the tombstones (``resolve_groups``), so a fusion
  rewrites no chunk. ``read_summaries`` gives the current summaries; ``compact`` drops old
  revisions (tombstones stay).
* ``decisions``: what each insert did (``new``, ``merge``, ``redundant``, ``rejected``, and ``fuse``
  when a trajectory joined two groups into one), with group, score, transform and a reason.
  ``duplicate`` inserts (an id already stored) write nothing. The first decision row of a batch
  also carries the batch's journal mark (``batch_seq``, ``batch_versions``).
* ``vocab``: label id -> category name. Sector labels are store-wide ids (>= 0 objects, and the
  negative ``topo.labels`` codes), so trajectories with different category lists match.
* ``commits``: the journal of everything else (creation, rollbacks, compactions, embeddings,
  and batches without decisions), one row each with every data table's version after it.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa

CHUNKS = "chunks"
SUMMARIES = "summaries"
DECISIONS = "decisions"
VOCAB = "vocab"
COMMITS = "commits"
TABLES = (VOCAB, SUMMARIES, DECISIONS, CHUNKS)  # the data tables

TIMESTAMP = pa.timestamp("ms", tz="UTC")
# A batch's journal mark, on its first decision row (null on the others): the batch's seq and
# the versions of TABLES (in that order) after it. Decisions tables made before marks existed
# lack these columns (and journalled every batch in ``commits``); a writer adds them.
MARK_FIELDS = (pa.field("batch_seq", pa.int64(), nullable=True),
               pa.field("batch_versions", pa.list_(pa.int64(), len(TABLES)), nullable=True))
MARK_COLUMNS = tuple(f.name for f in MARK_FIELDS)


# The map each chunk was walked in (see the module docstring); optional in older stores.
MAP_FIELDS = (
    pa.field("map_xy", pa.list_(pa.float32()), nullable=True),
    pa.field("map_sectors", pa.list_(pa.int8()), nullable=True),
    pa.field("map_edges", pa.list_(pa.int32()), nullable=True),
    pa.field("map_walk_nodes", pa.list_(pa.int32()), nullable=True),
)
MAP_COLUMNS = tuple(f.name for f in MAP_FIELDS)


def chunk_schema(embedding_dim: int, with_maps: bool = True) -> pa.Schema:
    """Schema of the chunks table; ``embedding_dim`` fixes the (nullable) embedding vector size;
    without ``with_maps``, as stores were made before chunks kept their maps."""
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
            *(MAP_FIELDS if with_maps else ()),
        ],
        metadata={b"trajrag.embedding_dim": str(embedding_dim).encode()},
    )


SUMMARY_SCHEMA = pa.schema(
    [
        pa.field("group_id", pa.int64(), nullable=False),
        pa.field("revision", pa.int64(), nullable=False),
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
        # Tombstones only: the group this one was fused into, the transform from this group's
        # frame into that one's (theta, tx, ty), and this group's node id -> that group's.
        pa.field("fused_into", pa.int64(), nullable=True),
        pa.field("fuse_transform", pa.list_(pa.float32(), 3), nullable=True),
        pa.field("node_map", pa.list_(pa.int32()), nullable=True),
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
        *MARK_FIELDS,
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


def label_categories(vocabulary: dict[str, int]) -> tuple[str, ...]:
    """The category name of each label id 0, 1, ... of a name -> label id vocabulary."""
    return tuple(name for _, name in sorted((label, name) for name, label in vocabulary.items()))


def utc_now() -> datetime:
    """The value of the ``TIMESTAMP`` columns (``created_at``, ``updated_at``) for a row written now."""
    return datetime.now(timezone.utc)
