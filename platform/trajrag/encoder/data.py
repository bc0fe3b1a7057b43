"""Training and evaluation data for the trajectory encoder: store chunks, scene split, pairs.

* ``read_records``: the chunks of a memory store (id, group, scene, goal, sector vectors in the
  store's label ids, description) and the store's label vocabulary.
* ``split_scenes``: held-out scenes for evaluation, chosen by a seeded hash of the scene name
  (stable when the store grows); a chunk without a scene hint counts its group as its scene.
* ``encode_records``: the frozen node encoder applied once to every distinct node (cached), so
  training only gathers rows of a (U, D) matrix: ``EncodedSet``.
* ``sample_pairs`` / ``worker_batches``: each anchor gets a positive from its group, else one with
  the same goal (paper: "positive pairs are sampled from trajectories within the same
  topological group or sharing the same navigation goal"); every worker gets the same number
  of pairs, so the gathered batches line up.
* ``synthetic_store``: a small store of synthetic homes for development and tests (the
  generators of ``trajrag.memory.synthetic`` inserted through ``TrajectoryMemory``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from trajrag.encoder import EncoderError
from trajrag.memory.grouping import TrajectoryMemory, decision_counts
from trajrag.memory.store import CHUNKS, MemoryStore
from trajrag.memory.synthetic import synthetic_scene, synthetic_trajectory

if TYPE_CHECKING:  # the memory (LanceDB) is imported where a store is written
    from trajrag.memory.grouping import MemoryConfig

N_SECTORS = 12


@dataclass
class ChunkRecord:
    """One stored chunk as the encoder sees it. sectors: int16 (K, 12) store label ids."""

    trajectory_id: str
    group_id: int
    scene: str
    goal: str
    sectors: np.ndarray
    description: str = ""
    node_xy: np.ndarray | None = None
    reference_yaw: float = 0.0


def scene_key(scene_hint: str | None, group_id: int) -> str:
    """The scene a chunk belongs to: its scene hint, else its group (a group is one place)."""
    return str(scene_hint) if scene_hint else f"group-{int(group_id)}"


def read_records(store: Any) -> tuple[list[ChunkRecord], dict[int, str]]:
    """Every chunk of ``store`` (a ``MemoryStore`` or a URI, opened read-only) with its current
    group (fusions resolved) and the label vocabulary (label id -> category name)."""
    if not isinstance(store, MemoryStore):
        store = MemoryStore(str(store), read_only=True)
    table = store.read(CHUNKS, ["trajectory_id", "group_id", "scene_hint", "goal", "n_nodes",
                                "sectors", "description", "node_xy", "reference_yaw"])
    names = {label: name for name, label in store.vocabulary().items()}
    rows = table.to_pylist()
    # A chunk keeps the group it joined; groups fused since live on under another id.
    groups = store.resolve_groups([int(r["group_id"]) for r in rows])
    records = []
    for row, group_id in zip(rows, groups):
        row["group_id"] = group_id
        sectors = np.asarray(row["sectors"], dtype=np.int16)
        if sectors.size == 0 or sectors.size % N_SECTORS:
            raise EncoderError(f"memory store {store.uri}: chunk {row['trajectory_id']!r} has "
                               f"{sectors.size} sector labels, not a multiple of {N_SECTORS}")
        records.append(ChunkRecord(
            trajectory_id=row["trajectory_id"], group_id=int(row["group_id"]),
            scene=scene_key(row["scene_hint"], row["group_id"]), goal=str(row["goal"]),
            sectors=sectors.reshape(-1, N_SECTORS), description=row["description"] or "",
            node_xy=np.asarray(row["node_xy"] or [], dtype=np.float64).reshape(-1, 2),
            reference_yaw=float(row["reference_yaw"] or 0.0)))
    return records, names


def split_scenes(scenes: Sequence[str], fraction: float, min_held_out: int,
                 seed: int, fold: tuple[int, int] | None = None) -> tuple[list[str], list[str]]:
    """(training scenes, held-out scenes): the ``max(min_held_out, round(fraction * n))`` scenes
    first in the order of a seeded hash; at least one scene stays for training.

    ``fold=(i, k)`` instead holds out every k-th scene of that order from the i-th: the k folds
    of one seed partition the scenes, so each scene is held out exactly once (``encoder cv``)."""
    unique = sorted(set(scenes))
    if len(unique) < 2:
        raise EncoderError(f"the store holds {len(unique)} scene(s); training with held-out "
                           "scenes needs at least 2")
    order = sorted(unique, key=lambda s: hashlib.sha256(f"{seed}:{s}".encode()).hexdigest())
    if fold is not None:
        index, folds = fold
        if folds > len(unique):
            raise EncoderError(f"{folds} folds need at least {folds} scenes; the store holds {len(unique)}")
        held = order[index::folds]
        return sorted(set(unique) - set(held)), sorted(held)
    n_out = min(max(min_held_out, int(round(fraction * len(unique)))), len(unique) - 1)
    return sorted(order[n_out:]), sorted(order[:n_out])


@dataclass
class EncodedSet:
    """Chunks with their frozen node embeddings, ready for the trajectory model.

    node_emb: float32 (U, D) distinct node embeddings; node_idx/offsets: chunk i's nodes are
    ``node_emb[node_idx[offsets[i]:offsets[i + 1]]]``; goal_emb: float32 (G, D) with goal_code
    (N,) indexing it; group: int64 (N,) group ids.
    """

    ids: list[str]
    group: np.ndarray
    goal_code: np.ndarray
    node_emb: np.ndarray
    node_idx: np.ndarray
    offsets: np.ndarray
    goal_emb: np.ndarray
    goals: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def dim(self) -> int:
        return int(self.node_emb.shape[1])

    def sequences(self, index: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """Node-embedding sequences (K_i, D) of the chunks at ``index``."""
        return [self.node_emb[self.node_idx[self.offsets[i]:self.offsets[i + 1]]] for i in index]

    def goal_vectors(self, index: Sequence[int] | np.ndarray) -> np.ndarray:
        return self.goal_emb[self.goal_code[np.asarray(index, dtype=np.int64)]]


def encode_records(records: Sequence[ChunkRecord], names: Mapping[int, str],
                   node_encoder: Any) -> EncodedSet:
    """Apply the frozen node encoder to every distinct node and goal of ``records`` (once)."""
    texts = [node_encoder.node_text(row, names) for r in records for row in r.sectors]
    distinct = list(dict.fromkeys(texts))
    where = {t: k for k, t in enumerate(distinct)}
    goals = sorted({r.goal for r in records})
    lengths = np.array([len(r.sectors) for r in records], dtype=np.int64)
    return EncodedSet(
        ids=[r.trajectory_id for r in records],
        group=np.array([r.group_id for r in records], dtype=np.int64),
        goal_code=np.array([goals.index(r.goal) for r in records], dtype=np.int64),
        node_emb=node_encoder.encode_cached(distinct).astype(np.float32),
        node_idx=np.array([where[t] for t in texts], dtype=np.int64),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        goal_emb=node_encoder.encode_goals(goals).astype(np.float32)
        if goals else np.zeros((0, node_encoder.dim), np.float32),
        goals=goals)


def sample_pairs(group: np.ndarray, goal: np.ndarray, rng: np.random.Generator,
                 fallback: str = "goal") -> tuple[np.ndarray, np.ndarray]:
    """(anchors, positives), shuffled: for each chunk a random other member of its group, else
    (``fallback="goal"``) a random other chunk with its goal, chunks with neither left out, or
    (``"crop"``) the chunk itself, to be cropped (``crop_sequence``) by the training step, or
    (``"goal_or_crop"``) either, with even odds per chunk and epoch."""
    by_group: dict[int, np.ndarray] = {}
    by_goal: dict[int, np.ndarray] = {}
    for table, values in ((by_group, group), (by_goal, goal)):
        order = np.argsort(values, kind="stable")
        bounds = np.flatnonzero(np.diff(values[order])) + 1
        for part in np.split(order, bounds):
            if len(part):
                table[int(values[part[0]])] = part
    anchors, positives = [], []
    for i in rng.permutation(len(group)):
        pool = by_group[int(group[i])]
        crop = fallback == "crop" or (fallback == "goal_or_crop" and rng.random() < 0.5)
        if len(pool) < 2 and crop:
            anchors.append(int(i))
            positives.append(int(i))
            continue
        if len(pool) < 2:
            pool = by_goal[int(goal[i])]
        if len(pool) < 2:
            continue
        j = i
        while j == i:
            j = int(pool[rng.integers(len(pool))])
        anchors.append(int(i))
        positives.append(j)
    return np.asarray(anchors, dtype=np.int64), np.asarray(positives, dtype=np.int64)


def pairable_chunks(group: np.ndarray, goal: np.ndarray, fallback: str = "goal") -> int:
    """How many chunks ``sample_pairs`` makes anchors in every epoch, whatever its draws: those
    with a group-mate, and the rest that ``fallback`` always pairs (a goal-mate under ``goal`` and
    ``goal_or_crop``; every chunk under ``crop``). An epoch has at least this many pairs."""
    if fallback == "crop":
        return len(group)
    _, group_of, group_size = np.unique(group, return_inverse=True, return_counts=True)
    _, goal_of, goal_size = np.unique(goal, return_inverse=True, return_counts=True)
    return int(np.sum((group_size[group_of] > 1) | (goal_size[goal_of] > 1)))


def crop_sequence(seq: np.ndarray, rng: np.random.Generator, min_fraction: float) -> np.ndarray:
    """A random contiguous run of ``seq``'s rows: at least ``min_fraction`` of them and at least
    2 (or all, for shorter sequences). Walks through one place share such runs."""
    k = len(seq)
    shortest = min(k, max(2, int(np.ceil(min_fraction * k))))
    length = int(rng.integers(shortest, k + 1))
    start = int(rng.integers(0, k - length + 1))
    return seq[start:start + length]


def worker_batches(anchors: np.ndarray, positives: np.ndarray, batch_size: int, rank: int,
                   world: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """This worker's share of the pairs in batches; every worker gets the same batch sizes (the
    pairs beyond a multiple of ``world`` are dropped for this epoch)."""
    per_worker = len(anchors) // world
    if per_worker == 0:
        raise EncoderError(f"{len(anchors)} training pairs cannot feed {world} workers")
    mine = slice(rank * per_worker, (rank + 1) * per_worker)
    a, p = anchors[mine], positives[mine]
    return [(a[s:s + batch_size], p[s:s + batch_size]) for s in range(0, per_worker, batch_size)]


# -- synthetic stores (development, tests, benchmarks) ----------------------------------------------
def synthetic_store(uri: str, n_scenes: int, per_scene: int, seed: int, memory_cfg: MemoryConfig, *,
                    length: tuple[int, int] = (5, 20)) -> dict:
    """Insert ``per_scene`` synthetic trajectories of each of ``n_scenes`` synthetic homes into the
    store at ``uri`` (created if needed) through the real memory (``memory_cfg``: the ``memory``
    section: matching, grouping, redundancy); returns the decision counts."""
    rng = np.random.default_rng(seed)
    memory = TrajectoryMemory(uri, memory_cfg)
    trajs = []
    for s in range(n_scenes):
        scene = synthetic_scene(rng, f"synthetic-{seed}-{s:03d}")
        trajs += [synthetic_trajectory(scene, rng, f"{scene.name}/ep{k:03d}", length=length)
                  for k in range(per_scene)]
    counts = decision_counts(memory.insert_many(trajs))
    memory.store.close()
    return counts
