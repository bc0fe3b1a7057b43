"""Several grouping writers over one memory: groups split by scene, one store, one committer.

The single writer's cost is the grouping (prefilter, matching, summary updates), not the
commit (``trajrag bench store``: under a millisecond per trajectory in batches of 256). So the
memory is split where grouping loses nothing measurable: **by scene**. Trajectory ``t`` goes to
shard ``shard_of(scene of t, N)``; each shard is a ``TrajectoryMemory`` holding only its groups
(``grouping.MemoryShard``: shard k numbers its new groups k, k + N, ...), so it never matches a
trajectory against another shard's homes. Cross-home groups are almost all false merges
(purity 0.98-1.0 on the procedural corpora), so a trajectory's own home is all it needs; what a
shard cannot do is merge walks of two scenes, which is what purity counts against.

The shards decide in parallel (the corpus job runs each in an actor of its own:
``distributed.corpus``) and return their rows; one committer merges them into one batch and
commits it to the one store, so the retriever, the encoder and ``corpus stats`` read one
memory as before (the coarse stage over every shard's summaries: one summaries table). Per
batch of the plan:

1. every category name of the batch joins every shard's vocabulary in plan order (the same
   label ids everywhere);
2. each shard decides its trajectories in plan order (the plan-order guarantee holds per
   shard, so one plan builds one memory for a given ``N``);
3. the committer merges the shards' rows, renumbers the decisions' ``seq`` (shard by shard)
   and commits one batch: exactly once as for the single writer. If the commit fails every
   shard reloads from the store, which then holds none of the batch.
"""

from __future__ import annotations

import zlib
from typing import Any, Iterable, Sequence

from trajrag.memory.grouping import Decision, MemoryConfig, MemoryShard, TrajectoryMemory
from trajrag.memory.prepare import first_attr
from trajrag.memory.schema import CHUNKS, DECISIONS
from trajrag.memory.store import Batch, MemoryStore, StoreError


def scene_key(traj: Any) -> str:
    """The scene a trajectory was walked in (the memory's ``scene_hint``), '' if it names none."""
    return str(first_attr(traj, ("scene_hint", "scene_key", "scene_id", "scene"), ""))


def shard_of(traj: Any, count: int) -> int:
    """The shard (0..count-1) of a trajectory: a hash of its scene, the same in every process."""
    return zlib.crc32(scene_key(traj).encode()) % count


def open_shard(uri: str, cfg: MemoryConfig, shard: MemoryShard) -> TrajectoryMemory:
    """Shard ``shard`` of the memory at ``uri``: it reads the store (read-only: the committer is
    the one writer) and never commits."""
    return TrajectoryMemory(MemoryStore(uri, read_only=True), cfg, shard)


def open_memory(uri: str, cfg: MemoryConfig, writers: int = 1) -> "TrajectoryMemory | ShardedMemory":
    """The memory at ``uri`` for a build: the single writer, or ``writers`` shards (by scene)."""
    return TrajectoryMemory(uri, cfg) if writers == 1 else ShardedMemory(uri, cfg, writers)


def merge_batches(batches: Sequence[Batch], next_seq: int) -> tuple[Batch, int]:
    """The shards' rows of one batch as one ``Batch``: decisions renumbered from ``next_seq``
    (shard by shard), vocabulary rows once (every shard numbered the same names alike). Returns
    it and the next free seq."""
    merged = Batch()
    vocab: dict[int, str] = {}
    for batch in batches:
        merged.chunks += batch.chunks
        merged.summaries += batch.summaries
        merged.tombstones += batch.tombstones
        merged.delete_chunk_ids += batch.delete_chunk_ids
        for row in batch.decisions:
            merged.decisions.append(dict(row, seq=next_seq))
            next_seq += 1
        for row in batch.vocab:
            if vocab.setdefault(row["label"], row["name"]) != row["name"]:
                raise StoreError(f"shards gave label {row['label']} two names: "
                                 f"{vocab[row['label']]!r} and {row['name']!r}")
    merged.vocab = [{"label": label, "name": name} for label, name in sorted(vocab.items())]
    return merged, next_seq


class ShardedMemory:
    """``count`` shards of one memory and their committer, in one process (tests, and the
    single-process ``corpus build --writers N``, which groups as the Ray build but gains no
    speed); the corpus job overrides ``_make_shard`` / ``_decide`` to run the shards in actors.

    The same surface as ``TrajectoryMemory`` where the corpus build uses it: ``insert_many``,
    ``known``, ``n_chunks``, ``n_groups``, ``store``.
    """

    def __init__(self, uri: str, cfg: MemoryConfig, count: int) -> None:
        if count < 1:
            raise ValueError(f"a memory needs at least 1 writer, got {count}")
        self.cfg, self.count = cfg, count
        self.store = MemoryStore(uri, embedding_dim=cfg.embedding_dim)  # the committer's handle
        self._commits = 0
        self._load()
        self.shards = [self._make_shard(MemoryShard(k, count)) for k in range(count)]

    def _make_shard(self, shard: MemoryShard) -> Any:
        return open_shard(self.store.uri, self.cfg, shard)

    def _decide(self, labels: list[str], parts: list[list[Any]]) -> list[tuple[list[Decision], Batch]]:
        """Each shard's ``decide_many`` of its part (here one after the other)."""
        return [shard.decide_many(part, labels) for shard, part in zip(self.shards, parts)]

    def _reload_shards(self) -> None:
        for shard in self.shards:
            shard.reload()

    def _load(self) -> None:
        """The committer's state from the store: the next decision seq and the ids decided."""
        decisions = self.store.read(DECISIONS, ["seq", "trajectory_id", "action"])
        seqs = decisions.column("seq").to_pylist()
        self._next_seq = max(seqs, default=-1) + 1
        decided = [t for t, a in zip(decisions.column("trajectory_id").to_pylist(),
                                     decisions.column("action").to_pylist()) if a in ("redundant", "rejected") and t]
        self._known = set(self.store.read(CHUNKS, ["trajectory_id"]).column("trajectory_id").to_pylist())
        self._known.update(decided)
        self._groups = self.store.count_groups()

    @property
    def n_chunks(self) -> int:
        return self.store.count(CHUNKS)

    @property
    def n_groups(self) -> int:
        return self._groups

    def known(self, trajectory_id: str) -> bool:
        """Stored as a chunk, dropped as redundant or rejected (see ``TrajectoryMemory.known``)."""
        return trajectory_id in self._known

    def insert_many(self, trajs: Iterable[Any]) -> list[Decision]:
        """Insert one batch (one commit): each trajectory decided by its scene's shard, in plan
        order within the shard. Returns the decisions in the order of ``trajs``."""
        trajs = list(trajs)
        labels = [str(name) for traj in trajs for name in (getattr(traj, "categories", None) or ())]
        parts: list[list[Any]] = [[] for _ in range(self.count)]
        where = []
        for traj in trajs:
            k = shard_of(traj, self.count)
            where.append((k, len(parts[k])))
            parts[k].append(traj)
        results = self._decide(labels, parts)
        merged, next_seq = merge_batches([batch for _, batch in results], self._next_seq)
        try:
            if merged:
                self.store.commit(merged)
        except StoreError:
            self._reload_shards()  # they had moved on with the batch the store does not hold
            raise
        self._next_seq = next_seq
        self._commits += 1
        if self.cfg.compact_every > 0 and self._commits % self.cfg.compact_every == 0:
            self.store.compact(self.cfg.keep_versions)
        decisions = [results[k][0][i] for k, i in where]
        self._known.update(d.trajectory_id for d in decisions
                           if d.action in ("new", "merge", "redundant", "rejected"))
        fused = sum(row["action"] == "fuse" for row in merged.decisions)
        self._groups += sum(d.action == "new" for d in decisions) - fused
        return decisions
