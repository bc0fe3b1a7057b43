"""Re-group a stored memory under other matching settings (``trajrag corpus regroup``).

Grouping is the one stage of corpus building that depends on the ``memory.*`` thresholds, and
collecting is the expensive one (about 1 s of both cores per episode here). ``regroup`` replays
every chunk of a source store, in the order it was first inserted, through a fresh
``TrajectoryMemory`` with the given configuration, so a threshold study costs seconds per
thousand chunks instead of a new collection. The source is only read.

Each chunk comes back with the map it was walked in (the chunks' ``map_*`` columns), so a replay
with ``memory.summary_geometry: map`` groups by maps as the original build did.

What a replay cannot bring back: trajectories the source dropped as redundant or rejected (only
chunks keep their nodes), the maps of a store made before chunks kept them (a replay with
``summary_geometry: map`` then groups by walks, and says so), and chunk embeddings (they are
written by ``trajrag encoder eval``; run it on the new store before retrieving from it).
"""

from __future__ import annotations

import logging
import sys
from typing import Iterator

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from trajrag.memory.grouping import MemoryConfig, TrajectoryMemory
from trajrag.memory.matching import N_SECTORS
from trajrag.memory.prepare import GEOMETRY_MAP
from trajrag.memory.schema import CHUNKS, DECISIONS, MAP_COLUMNS, label_categories
from trajrag.memory.shards import ShardedMemory, open_memory
from trajrag.memory.store import MemoryStore, StoreError
from trajrag.topo.candidates import MapPlace
from trajrag.topo.trajectory import TopoPolarTrajectory

log = logging.getLogger(__name__)

_CHUNK_COLUMNS = ["trajectory_id", "node_xy", "sectors", "goal", "reference_yaw", "success",
                  "episode_id", "scene_hint", "description", "policy"]


def insertion_order(source: MemoryStore, chunk_ids: list[str]) -> list[str]:
    """``chunk_ids`` (the source's chunks) in the order their first decision was logged."""
    stored = set(chunk_ids)
    log = source.read(DECISIONS, ["seq", "trajectory_id"]).to_pylist()
    order: list[str] = []
    seen: set[str] = set()
    for row in sorted(log, key=lambda r: r["seq"]):
        tid = row["trajectory_id"]
        if tid in stored and tid not in seen:
            order.append(tid)
            seen.add(tid)
    return order + sorted(stored - seen)  # chunks without a logged decision: none expected


def _ordered_table(source: MemoryStore) -> pa.Table:
    """The source's chunks table (the columns a replay needs), read once, in insertion order."""
    table = source.read(CHUNKS, _CHUNK_COLUMNS + (list(MAP_COLUMNS) if source.keeps_maps else []))
    ids = table.column("trajectory_id").to_pylist()
    position = {tid: k for k, tid in enumerate(ids)}
    return table.take([position[tid] for tid in insertion_order(source, ids)])


def _trajectories(table: pa.Table, categories: tuple[str, ...],
                  batch_rows: int = 1024) -> Iterator[tuple[dict, TopoPolarTrajectory]]:
    """Each row with its trajectory. The table stays in Arrow form and only ``batch_rows`` rows
    at a time become Python objects (a 350k-chunk store is ~1 GB in Arrow)."""
    for batch in table.to_batches(max_chunksize=batch_rows):
        for row in batch.to_pylist():
            traj = TopoPolarTrajectory(
                node_xy=np.asarray(row["node_xy"], dtype=np.float64).reshape(-1, 2),
                sectors=np.asarray(row["sectors"], dtype=np.int16).reshape(-1, N_SECTORS),
                categories=categories, goal=row["goal"], reference_yaw=row["reference_yaw"],
                success=bool(row["success"]), episode_id=row["episode_id"] or "",
                scene_id=row["scene_hint"] or "")
            if row.get("map_xy") is not None:
                # Stored in the chunk's frame and the store's label ids, as the walk.
                traj.place = MapPlace(np.asarray(row["map_xy"], dtype=np.float64),
                                      np.asarray(row["map_sectors"]).reshape(-1, N_SECTORS),
                                      row["map_edges"], categories, traj.reference_yaw)
                traj.node_ids = np.asarray(row["map_walk_nodes"], dtype=np.int64)
            yield row, traj


def replay(source_uri: str, memory: TrajectoryMemory | ShardedMemory, progress: bool = False) -> int:
    """Insert the chunks of ``source_uri`` (with their maps) into ``memory`` in the order they
    were first inserted there, ``memory.batch_size`` per commit; returns the number replayed."""
    source = MemoryStore(source_uri, read_only=True)
    if memory.cfg.summary_geometry == GEOMETRY_MAP and not source.keeps_maps:
        log.warning("regroup: %s was made before chunks kept their maps; "
                    "memory.summary_geometry=map groups these chunks by their walks", source_uri)
    table = _ordered_table(source)
    rows = _trajectories(table, label_categories(source.vocabulary()))
    bar = tqdm(rows, total=table.num_rows, desc="regroup", unit="chunk", disable=not progress,
               file=sys.stderr)
    batch = []
    for row, traj in bar:
        # Keyed, described and attributed as stored (memory.grouping reads these attributes).
        traj.trajectory_id, traj.description, traj.policy = (
            row["trajectory_id"], row["description"], row["policy"] or "")
        batch.append(traj)
        if len(batch) == memory.cfg.batch_size:
            memory.insert_many(batch)
            batch = []
    if batch:
        memory.insert_many(batch)
    return table.num_rows


def regroup(source_uri: str, target_uri: str, cfg: MemoryConfig,
            progress: bool = False, writers: int = 1) -> int:
    """Replay the chunks of ``source_uri`` into a new store at ``target_uri`` grouped with ``cfg``
    (by ``writers`` shards, ``memory.shards``).

    Returns the number of chunks replayed (the target's decisions table says what became of
    each). Refuses a target that already holds chunks: the replay would mix two groupings.
    """
    target = open_memory(target_uri, cfg, writers)
    if target.n_chunks:
        raise StoreError(f"regroup target {target_uri} already holds {target.n_chunks} chunks; "
                         "give a new path")
    return replay(source_uri, target, progress)
