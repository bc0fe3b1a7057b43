"""Incremental TrajRAG construction: prefilter, match, merge / drop as redundant / new group.

``TrajectoryMemory(store, cfg).insert(traj)`` follows the paper's "During navigation, TrajRAG is
incrementally constructed":

1. **Prefilter** (ours, for scale; ``prefilter.NodeIndex``): every summary node has a
   rotation-invariant descriptor (hashed counts of label pairs at each angular offset, in an
   in-memory float32 matrix); each node of the new trajectory votes for the groups of its most
   similar summary nodes, and only the ``candidates`` best-voted groups are matched exactly. The
   exact matching, the expensive part, therefore does not grow with the number of groups; the
   vote searches all summary nodes exactly up to ``ivf_min_nodes`` and an inverted file
   (O(sqrt(nodes)) per query) beyond.
2. **Match** each candidate (``matching.match``: Eq. 8 + mutual KNN, Eq. 9 RANSAC SE(2) with the
   heading check). The accepted candidate with the highest inlier ratio is the group.
3. **Redundancy** (paper): the new nodes are mapped to summary nodes (inlier pairs first, then the
   nearest summary node within ``merge_radius_m`` after the transform, else a new node). Against
   members of the group with the same goal: if the new node list is an ordered subsequence of a
   member's, the new trajectory is dropped (``redundant``); every member whose list is an ordered
   subsequence of the new one is dropped instead (its chunk is deleted and a ``redundant``
   decision names the trajectory that contains it).
4. **Merge** (paper): the new nodes, transformed into the group frame, that are not within
   ``merge_radius_m`` of a summary node are added with their edges; a matched summary node keeps
   a running mean of its positions and fills its ``UNKNOWN`` sectors from the new observation
   (rotated into the group's sector frame). Otherwise a **new group** starts with the trajectory
   as its summary (group frame = the trajectory's frame).
5. **Fuse** (ours, ``fuse_groups``): when the trajectory is accepted by further candidate groups,
   each is fused into the chosen one (summary transformed by ``T_best o T_other^-1``; the
   other group's chunks follow through a tombstone, ``MemoryStore.group_aliases``), so a home
   first seen through non-overlapping trajectories ends in one group. With ``fuse_check`` the
   two summaries must also match each other at the pose the trajectory implies, else the
   fusion is refused (``fuse_refused``): one chance accept then cannot chain two homes.

With ``summary_geometry: map`` (ours), steps 1-5 run on the map each trajectory was walked in
(``traj.place``, every node of the episode's topo graph, which collectors attach) instead of on
its walked nodes: two walks through one home then match where they saw the same rooms, not only
where they stepped; the chunk stays the walk, its summary nodes index the fused map. The chunk
row keeps the map either way (its ``map_*`` columns), so a replay can group by maps.

With ``verifier.enabled`` (ours), step 2 accepts a candidate by a learned logistic score of the
evidence at its pose (``matching.pose_evidence``; fitted by ``memory.verifier``) instead of by
the inlier thresholds.

With ``fast_path`` (issue 51) an insert decides the same to the bit for less work: the
prefilter finds only the votes above zero (``NodeIndex(fast=True)``), a candidate that no pose
could make accepted is rejected without its RANSAC (``matching.could_be_accepted``), and only
the summary nodes a merge changed are described again for the prefilter; ``fast_path: false`` is
the path before (``trajrag bench store`` times both in turn). ``blas_threads`` limits numpy's BLAS
during a decision.

Every decision (``new``, ``merge``, ``fuse``, ``fuse_refused``, ``redundant``, ``rejected``) is
written to the decisions table; ``duplicate`` (an id already stored) is a no-op that writes
nothing. ``insert_many`` commits ``batch_size`` trajectories per LanceDB commit; the in-memory
state follows each decision, so later trajectories of a batch see the earlier ones. Several
writers, each the groups of a share of the scenes (``MemoryShard``), over one store:
``memory.shards``. ``TrajectoryMemory.seconds`` times the phases of an insert (``PHASES``).

Where the parts live: what an insert accepts and the chunk row it becomes, ``memory.prepare``;
the prefilter's vote (step 1), ``memory.prefilter``; the match (step 2), ``memory.matching``
and its SE(2) estimation ``memory.se2``; a summary and the node folding of steps 4 and 5,
``memory.summary``; the tables, ``memory.schema`` and ``memory.store``. This module keeps the
writer's state (summaries, members, known ids) and its decisions.
"""

from __future__ import annotations

import contextlib
import math
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
from threadpoolctl import ThreadpoolController

from trajrag.memory.matching import (
    N_SECTORS,
    SECTOR_ANGLE,
    MatchParams,
    MatchResult,
    VerifierConfig,
    edge_set,
    fit_pose,
    implied_shift,
    match,
    node_pairs,
    pose_evidence,
    rotate_sectors,
    sector_similarity_batch,
)
from trajrag.memory.prefilter import IVFParams, NodeIndex
from trajrag.memory.prepare import (
    GEOMETRY_MAP,
    GEOMETRY_WALK,
    Prepared,
    TopoPolarLike,
    chunk_row,
    prepare,
    search_sectors,
    trajectory_key,
)
from trajrag.memory.schema import CHUNKS, DECISIONS, label_categories, utc_now
from trajrag.memory.se2 import Transform2D
from trajrag.memory.store import Batch, MemoryStore, StoreError
from trajrag.memory.summary import (
    SUMMARY_COLUMNS,
    Member,
    Summary,
    collapse_repeats,
    fold_nodes,
    is_subsequence,
    map_nodes,
    summary_from_row,
    summary_row,
)
from trajrag.topo.trajectory import TopoPolarTrajectory

# Store-wide label ids are int8 in the chunks table (compact storage).
MAX_LABEL = 127
# The phases of an insert that ``TrajectoryMemory.seconds`` times: validation and label mapping,
# the chunk text L(T_tp) (within prepare), the prefilter's vote (the coarse candidate search),
# Eq. 8's rotation-invariant sector similarity against the candidates, their mutual-KNN node
# pairs, RANSAC SE(2) + edge support per candidate, the decision's summary and index updates,
# the LanceDB writes of a commit, the compaction every ``compact_every`` commits, and the
# prefilter's read-ahead of a batch's inverted-file probes (``read_ahead``, once per ``lookahead``).
PHASES = ("prepare", "describe", "candidates", "similarity", "pairs", "ransac", "update", "commit",
          "compact", "read_ahead")


@dataclass
class MemoryConfig:
    """Memory construction settings; values and their sources in configs/memory.yaml."""

    mutual_k: int
    min_node_similarity: float
    ransac_threshold_m: float
    ransac_iterations: int
    huber_delta_m: float
    refit_iterations: int
    heading_slack: float
    min_inliers: int
    min_score: float
    min_edge_support: int
    merge_radius_m: float
    candidates: int
    prefilter_neighbours: int
    ivf_min_nodes: int
    ivf_lists_per_sqrt: float
    ivf_probes: int
    ivf_train_sample: int
    ivf_kmeans_iterations: int
    fuse_groups: bool
    fuse_check: bool
    summary_geometry: str
    verifier: VerifierConfig
    descriptor_dim: int
    embedding_dim: int
    batch_size: int
    compact_every: int
    keep_versions: int
    seed: int
    fast_path: bool
    blas_threads: int
    lookahead: int

    def ivf_params(self) -> IVFParams:
        return IVFParams(min_nodes=self.ivf_min_nodes, lists_per_sqrt=self.ivf_lists_per_sqrt,
                         probes=self.ivf_probes, train_sample=self.ivf_train_sample,
                         kmeans_iterations=self.ivf_kmeans_iterations, seed=self.seed)

    def match_params(self) -> MatchParams:
        return MatchParams(
            mutual_k=self.mutual_k, min_node_similarity=self.min_node_similarity,
            ransac_threshold_m=self.ransac_threshold_m, ransac_iterations=self.ransac_iterations,
            huber_delta_m=self.huber_delta_m, refit_iterations=self.refit_iterations,
            heading_slack=self.heading_slack, min_inliers=self.min_inliers,
            min_score=self.min_score, min_edge_support=self.min_edge_support)


@dataclass(frozen=True)
class MemoryShard:
    """One of ``count`` grouping writers' part of a memory (``memory.shards``): the groups whose
    id is ``index`` modulo ``count``, since each writer numbers its new groups so. The single
    writer is shard 0 of 1."""

    index: int
    count: int

    def holds(self, group_id: int) -> bool:
        return group_id % self.count == self.index


@dataclass
class Decision:
    """What one insert did. ``transform`` maps the trajectory's frame into the group frame."""

    trajectory_id: str
    action: str  # new | merge | fuse | redundant | rejected | duplicate
    group_id: int | None = None
    score: float = 0.0
    transform: Transform2D | None = None
    other_id: str | None = None
    reason: str = ""
    superseded: list[str] = field(default_factory=list)


class _SeededDraws:
    """The per-trajectory RANSAC generator, seeded on its first draw: most matches have few
    enough pairs to try them all and draw nothing, and seeding costs ~0.3 ms (as much as a
    small match). Draws are those of ``np.random.default_rng(seed)``."""

    def __init__(self, seed: list[int]) -> None:
        self._seed = seed
        self._rng: np.random.Generator | None = None

    def integers(self, *args: Any, **kwargs: Any) -> np.ndarray:
        if self._rng is None:
            self._rng = np.random.default_rng(self._seed)
        return self._rng.integers(*args, **kwargs)


class TrajectoryMemory:
    """The hierarchical TrajRAG memory over a ``MemoryStore`` (single writer).

    ``store`` is a ``MemoryStore`` or a URI (opened or created with ``cfg``'s dimensions). The
    in-memory state (summaries, prefilter matrix, member node lists, known ids) is loaded from
    the store at construction and after ``rollback``.
    """

    def __init__(self, store: MemoryStore | str, cfg: MemoryConfig,
                 shard: MemoryShard = MemoryShard(0, 1)) -> None:
        if not isinstance(store, MemoryStore):
            store = MemoryStore(str(store), embedding_dim=cfg.embedding_dim)
        if cfg.summary_geometry not in (GEOMETRY_WALK, GEOMETRY_MAP):
            raise ValueError(f"memory.summary_geometry must be {GEOMETRY_WALK!r} or {GEOMETRY_MAP!r}, "
                             f"got {cfg.summary_geometry!r}")
        self.store = store
        self.cfg = cfg
        self.shard = shard
        self.params = cfg.match_params()
        # With the verifier on, or an ``on_match`` observer, inserts match down to the
        # verifier's inlier floor; whether a match is accepted is the verifier's call when it
        # is on, else the thresholds'.
        self._floor_params = replace(self.params, min_inliers=min(cfg.min_inliers, cfg.verifier.min_inliers))
        self._commits = 0
        # Seconds spent in each of PHASES since construction (``trajrag bench store`` reports them).
        self.seconds: Counter[str] = Counter()
        # Called with (prepared trajectory, group id, match) for every candidate an insert
        # matches, before it decides (``memory.verifier`` collects its training evidence so).
        self.on_match: Callable[[Prepared, int, MatchResult], None] | None = None
        # numpy's BLAS threads are the process's: limited during each decision (``_blas_threads``).
        self._blas = ThreadpoolController() if cfg.blas_threads > 0 else None
        self._reset_pending()
        self.reload()

    @contextlib.contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    # -- state -------------------------------------------------------------------------------

    def _reset_pending(self) -> None:
        self._pending = Batch()
        self._pending_groups: set[int] = set()

    def reload(self) -> None:
        """(Re)load the in-memory state from the store's latest versions (of a shard: its groups,
        and the ids of every chunk)."""
        self._reset_pending()
        self._vocab = self.store.vocabulary()
        self.summaries: dict[int, Summary] = {}
        self.index = NodeIndex(self.cfg.descriptor_dim, self.cfg.ivf_params(), fast=self.cfg.fast_path)
        for row in self.store.read_summaries(SUMMARY_COLUMNS).to_pylist():
            summary = summary_from_row(row)
            if not self.shard.holds(summary.group_id):
                continue
            self.summaries[summary.group_id] = summary
            self.index.set_group(summary.group_id, summary.sectors)
        redundant = self.store.read(DECISIONS, ["trajectory_id"], where="action = 'redundant'")
        self._redundant_ids = set(redundant.column("trajectory_id").to_pylist())
        rejected = self.store.read(DECISIONS, ["trajectory_id"], where="action = 'rejected'")
        self._rejected_ids = set(rejected.column("trajectory_id").to_pylist()) - {""}
        chunks = self.store.read(CHUNKS, ["trajectory_id", "group_id", "goal", "summary_nodes"])
        aliases = self.store.group_aliases()
        self._members: dict[int, dict[str, list[Member]]] = {}
        self._chunk_ids: set[str] = set()
        for tid, gid, goal, nodes in zip(*(chunks.column(c).to_pylist() for c in chunks.column_names)):
            gid = int(gid)
            if gid in aliases:  # a chunk of a group fused since: its current group and nodes
                nodes = aliases[gid].node_map[np.asarray(nodes, dtype=np.int64)].tolist()
                gid = aliases[gid].group_id
            self._chunk_ids.add(tid)
            if not self.shard.holds(gid):
                continue
            self._add_member(gid, goal, tid, collapse_repeats(nodes))
            if gid in self.summaries:
                self.summaries[gid].n_members += 1
        decisions = self.store.read(DECISIONS, ["seq", "group_id"])
        self._next_seq = max(decisions.column("seq").to_pylist(), default=-1) + 1
        # Fused groups leave no summary; their ids stay in the log and are never reused.
        used = [g for g in decisions.column("group_id").to_pylist() if g is not None]
        after = max([*self.summaries, *aliases, *used], default=-1) + 1
        self._next_group = after + (self.shard.index - after) % self.shard.count  # the shard's next

    def _add_member(self, gid: int, goal: str, tid: str, seq: tuple[int, ...]) -> None:
        self._members.setdefault(gid, {}).setdefault(goal, []).append(
            Member(tid, seq, frozenset(seq)))

    @property
    def n_groups(self) -> int:
        return len(self.summaries)

    @property
    def n_chunks(self) -> int:
        return len(self._chunk_ids)

    def set_fast_path(self, on: bool) -> None:
        """Decide the next inserts on the fast path (``memory.fast_path``) or the path before;
        both group to the bit, so ``trajrag bench store`` times them on one memory in turn."""
        self.cfg = replace(self.cfg, fast_path=on)
        self.index.fast = on

    def group_members(self, group_id: int) -> list[str]:
        """Trajectory ids of the chunks in a group now (fused groups' chunks included)."""
        return [m.trajectory_id for members in self._members.get(group_id, {}).values() for m in members]

    def known(self, trajectory_id: str) -> bool:
        """Decided on already: stored as a chunk, dropped as redundant or rejected (each makes a
        re-insert a no-op, so a re-run neither walks it again nor logs a second decision)."""
        return (trajectory_id in self._chunk_ids or trajectory_id in self._redundant_ids
                or trajectory_id in self._rejected_ids)

    # -- preparation (``memory.prepare``) ------------------------------------------------------

    def _label_lut(self, categories: Sequence[str]) -> np.ndarray:
        """Trajectory category id -> store label id; new names are added to the vocabulary."""
        lut = np.zeros(len(categories), dtype=np.int16)
        for k, name in enumerate(categories):
            name = str(name)
            if name not in self._vocab:
                label = len(self._vocab)
                if label > MAX_LABEL:
                    raise ValueError(f"more than {MAX_LABEL + 1} categories in one store "
                                     f"(adding {name!r})")
                self._vocab[name] = label
                self._pending.vocab.append({"label": label, "name": name})
            lut[k] = self._vocab[name]
        return lut


    def candidates(self, sectors: np.ndarray) -> list[int]:
        """The prefilter's candidate group ids, best first (``sectors`` in store label ids)."""
        return self.index.candidates(sectors, self.cfg.candidates, self.cfg.prefilter_neighbours)

    def _rng(self, tid: str) -> _SeededDraws:
        # Per-trajectory seed: a re-insert after a crash repeats the same RANSAC draws.
        return _SeededDraws([self.cfg.seed, zlib.crc32(tid.encode())])

    def match_group(self, prep: Prepared, group_id: int, sim_all: np.ndarray,
                    paired: tuple[np.ndarray, np.ndarray]) -> MatchResult:
        """Match ``prep`` against one group given their sector similarities at every shift
        (``matching.sector_similarity_batch``) and their ``matching.node_pairs`` (the floor
        params differ only in ``min_inliers``, which the pairs do not use); with
        ``memory.verifier`` on, the verifier accepts."""
        summary = self.summaries[group_id]
        verifier = self.cfg.verifier
        params = self.params if not verifier.enabled and self.on_match is None else self._floor_params
        result = fit_pose(prep.geometry, summary, sim_all, *paired, params, self._rng(prep.trajectory_id))
        if params is self.params:
            return result
        if not verifier.enabled:
            return replace(result, accepted=result.accepted and result.n_inliers >= self.cfg.min_inliers)
        verified = (result.transform is not None and result.n_inliers >= verifier.min_inliers
                    and verifier.logit(self.pose_evidence(prep, summary, result)) >= verifier.threshold)
        return replace(result, accepted=verified)

    def pose_evidence(self, prep: Prepared, summary: Summary, result: MatchResult) -> dict[str, float]:
        """``matching.pose_evidence`` of a match of ``prep`` to ``summary``."""
        return pose_evidence(prep.geometry, summary, result, self.cfg.min_node_similarity,
                             self.cfg.ransac_threshold_m)

    def _accepted_matches(self, prep: Prepared) -> list[tuple[int, MatchResult]]:
        """Accepted candidate matches, best first (inlier ratio, then inlier count)."""
        with self._timed("candidates"):
            groups = self.candidates(prep.geometry.sectors)
        with self._timed("similarity"):
            sims = sector_similarity_batch(prep.geometry.sectors, [self.summaries[g].sectors for g in groups])
        with self._timed("pairs"):
            paired = [node_pairs(sim, self.params) for sim in sims]
        with self._timed("ransac"):
            if self.cfg.fast_path and self.on_match is None and not self.cfg.verifier.enabled:
                found = self._match_fast(prep, groups, sims, paired)
            else:
                found = [(gid, self.match_group(prep, gid, sim, pair))
                         for gid, sim, pair in zip(groups, sims, paired)]
        if self.on_match is not None:
            for gid, result in found:
                self.on_match(prep, gid, result)
        found = [(gid, r) for gid, r in found if r.accepted]
        return sorted(found, key=lambda gr: (-gr[1].score, -gr[1].n_inliers, gr[0]))

    def _match_fast(self, prep: Prepared, groups: list[int], sims: list[np.ndarray],
                    paired: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple[int, MatchResult]]:
        """``match_group`` of each candidate with the thresholds (no verifier, no observer), the
        trajectory's edges made a set once, and no RANSAC for a candidate no pose could make
        accepted: the same accepted matches (a rejected one may lack its pose)."""
        traj_edges = edge_set(prep.geometry.edges)
        found = []
        for gid, sim, (S, pairs) in zip(groups, sims, paired):
            summary = self.summaries[gid]
            # Each match draws from its own generator, seeded alike (as ``match_group``).
            found.append((gid, fit_pose(prep.geometry, summary, sim, S, pairs, self.params,
                                        self._rng(prep.trajectory_id),
                                        edge_sets=(traj_edges, summary.edges), skip_hopeless=True)))
        return found

    # -- decisions -----------------------------------------------------------------------------

    def _record(self, decision: Decision) -> Decision:
        T = decision.transform
        self._pending.decisions.append({
            "seq": self._next_seq, "trajectory_id": decision.trajectory_id,
            "action": decision.action, "group_id": decision.group_id,
            "score": float(decision.score), "transform": T.as_list() if T else None,
            "other_id": decision.other_id, "reason": decision.reason, "created_at": utc_now()})
        self._next_seq += 1
        return decision

    def _new_group(self, prep: Prepared) -> Decision:
        gid = self._next_group
        self._next_group += self.shard.count
        geo = prep.geometry
        edges = {(min(a, b), max(a, b)) for a, b in geo.edges.tolist() if a != b}
        summary = Summary(gid, geo.node_xy.copy(), geo.sectors.copy(),
                          np.ones(len(geo.node_xy), dtype=np.int32), edges, prep.reference_yaw, 1,
                          [prep.scene_hint] if prep.scene_hint else [], [prep.goal])
        self.summaries[gid] = summary
        self.index.set_group(gid, summary.sectors)
        self._pending_groups.add(gid)
        nodes = prep.walk_nodes
        self._pending.chunks.append(chunk_row(prep, gid, Transform2D.identity(), nodes))
        self._chunk_ids.add(prep.trajectory_id)
        self._add_member(gid, prep.goal, prep.trajectory_id, collapse_repeats(nodes))
        return self._record(Decision(prep.trajectory_id, "new", gid, 1.0, Transform2D.identity(),
                                     reason="no summary matched"))

    def _merge(self, prep: Prepared, gid: int, result: MatchResult) -> Decision:
        summary = self.summaries[gid]
        T = result.transform
        moved = T.apply(prep.geometry.node_xy)
        mapping = map_nodes(moved, summary, result, self.cfg.merge_radius_m)
        walk = mapping[prep.walk_nodes]
        seq_known = collapse_repeats(walk) if (walk >= 0).all() else None
        members = self._members.get(gid, {}).get(prep.goal, [])
        if seq_known is not None:
            nodes = frozenset(seq_known)
            for m in members:
                if nodes <= m.nodes and is_subsequence(seq_known, m.seq):
                    self._redundant_ids.add(prep.trajectory_id)
                    return self._record(Decision(
                        prep.trajectory_id, "redundant", gid, result.score, T, other_id=m.trajectory_id,
                        reason=f"node list is an ordered subsequence of {m.trajectory_id}"))
        # Fuse into the summary: new nodes first, so that every trajectory node has an id.
        shift = implied_shift(T.theta, prep.reference_yaw, summary.reference_yaw)
        rotated = rotate_sectors(prep.geometry.sectors, shift)
        before = summary.sectors.copy()
        n_new = fold_nodes(summary, mapping, moved, rotated, np.ones(len(mapping), np.int32),
                           prep.geometry.edges.tolist())
        if prep.scene_hint and prep.scene_hint not in summary.scene_hints:
            summary.scene_hints.append(prep.scene_hint)
        if prep.goal not in summary.goals:
            summary.goals.append(prep.goal)
        # Members contained in the new trajectory are the shorter ones: drop them (paper).
        walk = mapping[prep.walk_nodes]
        seq = collapse_repeats(walk)
        nodes = frozenset(seq)
        superseded = [m for m in members if m.nodes <= nodes and is_subsequence(m.seq, seq)]
        for m in superseded:
            members.remove(m)
            self._chunk_ids.discard(m.trajectory_id)
            self._redundant_ids.add(m.trajectory_id)
            self._pending.delete_chunk_ids.append(m.trajectory_id)
            self._record(Decision(m.trajectory_id, "redundant", gid, result.score, None,
                                  other_id=prep.trajectory_id,
                                  reason=f"node list is an ordered subsequence of {prep.trajectory_id}"))
        summary.n_members += 1 - len(superseded)
        self._reindex(summary, before)
        self._pending_groups.add(gid)
        self._pending.chunks.append(chunk_row(prep, gid, T, walk))
        self._chunk_ids.add(prep.trajectory_id)
        self._add_member(gid, prep.goal, prep.trajectory_id, seq)
        return self._record(Decision(
            prep.trajectory_id, "merge", gid, result.score, T,
            reason=f"{result.n_inliers} of {len(result.pairs)} pairs consistent; {n_new} new nodes",
            superseded=[m.trajectory_id for m in superseded]))

    def _reindex(self, summary: Summary, before: np.ndarray) -> None:
        """The prefilter's index after nodes were folded into ``summary`` (``before``: its
        sectors until then): with ``fast_path`` only the nodes whose sectors changed and the
        new ones are described again."""
        if not self.cfg.fast_path:
            self.index.set_group(summary.group_id, summary.sectors)
            return
        changed = np.nonzero((summary.sectors[: len(before)] != before).any(axis=1))[0]
        self.index.set_group(summary.group_id, summary.sectors, changed)

    def _fuse(self, gid: int, other: int, T: Transform2D, tid: str, score: float) -> None:
        """Fuse group ``other`` into ``gid`` (a trajectory matched both); T: other -> gid frame.

        The other summary's nodes join ours like a trajectory's (nearest node within the merge
        radius, else a new node); its members are re-pointed in memory, and in the store through
        a tombstone (``MemoryStore.group_aliases``) rather than by rewriting their chunks.
        """
        dst, src = self.summaries[gid], self.summaries.pop(other)
        moved = T.apply(src.node_xy)
        rotated = rotate_sectors(src.sectors, implied_shift(T.theta, src.reference_yaw,
                                                           dst.reference_yaw))
        d = np.linalg.norm(moved[:, None, :] - dst.node_xy[None, :, :], axis=2)
        nearest = d.argmin(axis=1)
        close = d[np.arange(len(moved)), nearest] <= self.cfg.merge_radius_m
        node_map = np.where(close, nearest, -1)
        before = dst.sectors.copy()
        n_new = fold_nodes(dst, node_map, moved, rotated, src.node_count, src.edges)
        dst.n_members += src.n_members
        dst.scene_hints += [h for h in src.scene_hints if h not in dst.scene_hints]
        dst.goals += [g for g in src.goals if g not in dst.goals]
        self.index.remove_group(other)
        self._reindex(dst, before)
        for goal, members in self._members.pop(other, {}).items():
            for m in members:
                self._add_member(gid, goal, m.trajectory_id,
                                 collapse_repeats(node_map[list(m.seq)]))
        # The other group's chunks keep their rows: a tombstone says where they live now.
        self._pending_groups.discard(other)
        self._pending_groups.add(gid)
        self._pending.tombstones.append({
            "group_id": other, "fused_into": gid, "fuse_transform": T.as_list(),
            "node_map": node_map.astype(np.int32), "updated_at": utc_now()})
        self._record(Decision(tid, "fuse", gid, score, T, other_id=str(other),
                              reason=f"group {other} fused into {gid} ({n_new} new nodes)"))

    def _blas_threads(self) -> contextlib.AbstractContextManager:
        """numpy's BLAS on ``blas_threads`` threads while it lasts (0: as the process has them)."""
        if self._blas is None:
            return contextlib.nullcontext()
        return self._blas.limit(limits=self.cfg.blas_threads, user_api="blas")

    def _decide(self, traj: Any, trajectory_id: str | None, description: str | None,
                policy: str | None) -> Decision:
        with self._blas_threads():
            return self._decide_one(traj, trajectory_id, description, policy)

    def _decide_one(self, traj: Any, trajectory_id: str | None, description: str | None,
                    policy: str | None) -> Decision:
        try:
            tid = str(trajectory_id) if trajectory_id is not None else trajectory_key(traj, policy)
        except ValueError as exc:
            return self._record(Decision("", "rejected", reason=str(exc)))
        if self.known(tid):
            return Decision(tid, "duplicate", reason="trajectory id already in the store")
        with self._timed("prepare"):
            prep = prepare(traj, tid, description, policy, self._label_lut,
                           self.cfg.summary_geometry, self._timed)
        if isinstance(prep, str):
            self._rejected_ids.add(tid)
            return self._record(Decision(tid, "rejected", reason=prep))
        matches = self._accepted_matches(prep)
        with self._timed("update"):
            return self._apply(prep, matches)

    def _apply(self, prep: Prepared, matches: list[tuple[int, MatchResult]]) -> Decision:
        """The decision for ``prep`` given its accepted matches, best first: a new group, or a
        merge (or redundant) into the best, fusing the others into it."""
        if not matches:
            return self._new_group(prep)
        gid, result = matches[0]
        decision = self._merge(prep, gid, result)
        if decision.action == "merge" and self.cfg.fuse_groups:
            for other, other_result in matches[1:]:
                # T_other maps the trajectory into the other group; T maps it into ours.
                to_ours = result.transform.compose(other_result.transform.inverse())
                refusal = self._fusion_refusal(gid, other, to_ours, prep.trajectory_id)
                if refusal:
                    self._record(Decision(prep.trajectory_id, "fuse_refused", gid, other_result.score,
                                          to_ours, other_id=str(other), reason=refusal))
                else:
                    self._fuse(gid, other, to_ours, prep.trajectory_id, other_result.score)
        return decision

    def _fusion_refusal(self, gid: int, other: int, to_ours: Transform2D, tid: str) -> str | None:
        """With ``fuse_check``: why group ``other`` must not be fused into ``gid`` (None: fuse).

        A trajectory accepted by two groups says they are one place only if it was right both
        times; one chance accept chains two homes. The check asks the other summary to match
        ours (which now holds the trajectory) on its own, every node of both competing in the
        mutual nearest-neighbour pairs, at the pose the trajectory implies."""
        if not self.cfg.fuse_check:
            return None
        direct = match(self.summaries[other], self.summaries[gid], self.params, self._rng(tid))
        if not direct.accepted:
            return (f"summaries of groups {other} and {gid} do not match each other "
                    f"({direct.n_inliers} consistent node pairs)")
        T = direct.transform
        offset_m = math.hypot(T.tx - to_ours.tx, T.ty - to_ours.ty)
        turn = abs(math.remainder(T.theta - to_ours.theta, 2.0 * math.pi))
        if offset_m > self.params.ransac_threshold_m or turn > SECTOR_ANGLE / 2:
            return (f"groups {other} and {gid} match at another pose than the trajectory implies "
                    f"({offset_m:.2f} m, {math.degrees(turn):.0f} deg apart)")
        return None

    # -- public API ----------------------------------------------------------------------------

    def insert(self, traj: TopoPolarLike, *, trajectory_id: str | None = None,
               description: str | None = None, policy: str | None = None,
               commit: bool = True) -> Decision:
        """Insert one trajectory (see the module docstring) and commit it, or with
        ``commit=False`` leave it pending until ``flush`` (later inserts already see it)."""
        decision = self._decide(traj, trajectory_id, description, policy)
        if commit:
            self.flush()
        return decision

    def insert_many(self, trajs: Iterable[TopoPolarLike], *,
                    policy: str | None = None) -> list[Decision]:
        """Insert trajectories, committing every ``batch_size`` of them (one version per table);
        the prefilter reads ahead for each ``lookahead`` of them (``read_ahead``)."""
        decisions: list[Decision] = []
        pending: list[TopoPolarLike] = []
        for traj in trajs:
            pending.append(traj)
            if len(pending) >= self.cfg.batch_size:
                decisions.extend(self._decide_ahead(pending, policy))
                self.flush()
                pending = []
        decisions.extend(self._decide_ahead(pending, policy))
        self.flush()
        return decisions

    def read_ahead(self, trajs: Sequence[TopoPolarLike]) -> None:
        """Let the prefilter read its inverted file once for the next ``trajs`` (inserted next, in
        this order) instead of once per trajectory (``NodeIndex.read_ahead``): the same decisions
        to the bit. A no-op off the fast path, below the inverted file, and for trajectories whose
        categories are not in the vocabulary yet (they search as usual)."""
        if not self.cfg.fast_path or not self.index.inverted_file:
            return
        with self._timed("read_ahead"), self._blas_threads():
            self.index.read_ahead([sectors for sectors in (
                search_sectors(traj, self._vocab, self.cfg.summary_geometry) for traj in trajs)
                if sectors is not None])

    def _decide_ahead(self, trajs: Sequence[TopoPolarLike], policy: str | None) -> list[Decision]:
        """``_decide`` each of ``trajs`` in order, reading ahead for each ``lookahead`` of them."""
        decisions = []
        step = max(self.cfg.lookahead, 1)
        for start in range(0, len(trajs), step):
            window = trajs[start: start + step]
            if step > 1:
                self.read_ahead(window)
            decisions.extend(self._decide(traj, None, None, policy) for traj in window)
        return decisions

    def decide_many(self, trajs: Iterable[TopoPolarLike], labels: Iterable[str] = ()) -> tuple[
            list[Decision], Batch]:
        """A shard's part of a sharded insert (``memory.shards``): ``labels`` (every category
        name of the whole batch, in plan order, so that all shards number new labels alike) join
        the vocabulary, then ``trajs`` are decided; returns the decisions and the rows to commit."""
        self._label_lut(list(labels))
        decisions = self._decide_ahead(list(trajs), None)
        return decisions, self.take_batch()

    def take_batch(self) -> Batch:
        """The pending rows as one batch (``flush`` commits it; a sharded build's committer
        merges every shard's); nothing is pending after."""
        batch = self._pending
        batch.summaries = [summary_row(self.summaries[g]) for g in sorted(self._pending_groups)]
        self._reset_pending()
        return batch

    def flush(self) -> None:
        """Commit pending rows. On failure the store is rolled back and the state reloaded."""
        if not self._pending and not self._pending_groups:
            return
        with self._timed("commit"):
            try:
                self.store.commit(self.take_batch())
            except StoreError:
                self.reload()
                raise
        self._commits += 1
        if self.cfg.compact_every > 0 and self._commits % self.cfg.compact_every == 0:
            with self._timed("compact"):
                self.store.compact(self.cfg.keep_versions)

    def categories(self) -> tuple[str, ...]:
        """The store's label vocabulary: category name of each label id >= 0."""
        return label_categories(self._vocab)

    def load_trajectory(self, trajectory_id: str) -> TopoPolarTrajectory | None:
        """A stored chunk back as a trajectory in its own frame (categories = the store's)."""
        row = self.store.get_chunk(trajectory_id)
        if row is None:
            return None
        return TopoPolarTrajectory(
            node_xy=np.asarray(row["node_xy"], dtype=np.float64).reshape(-1, 2),
            sectors=np.asarray(row["sectors"], dtype=np.int16).reshape(-1, N_SECTORS),
            categories=self.categories(), goal=row["goal"], reference_yaw=row["reference_yaw"],
            success=row["success"], episode_id=row["episode_id"], scene_id=row["scene_hint"])

    def versions(self) -> dict[str, int]:
        """Store versions to roll back to (call after ``flush``)."""
        return self.store.versions()

    def rollback(self, versions: dict[str, int]) -> None:
        """Undo every batch committed after ``versions`` and reload the in-memory state."""
        self._reset_pending()
        self.store.rollback(versions)
        self.reload()


def decision_counts(decisions: Iterable[Decision]) -> dict[str, int]:
    """Action -> count."""
    return dict(Counter(d.action for d in decisions))
