"""Coarse-to-fine retrieval of past trajectories for the candidate paths of one decision.

Paper (seed 000, "navigation with TrajRAG"): each candidate path gives a hypothetical
trajectory (walked part + path + frontier node). The **coarse** stage matches it against the
topo-polar summaries of the groups (the memory's semantic + geometric matching: the node
prefilter votes, then Eq. 8 + mutual KNN + RANSAC SE(2) on the best-voted groups) and keeps the
top groups; the **fine** stage encodes it with the goal (f_E, Eq. 6) and returns the top-K chunks
inside those groups by cosine similarity. All candidates of a decision are encoded in one batch.

Variants (``configs/retrieval.yaml``, the paper's ablations): ``coarse: false`` searches every
chunk (no coarse stage); ``fine: text`` embeds the candidate's description L(T_tp) and the chunks'
descriptions with the frozen MiniLM instead of f_E (TE; with ``coarse: false`` this is
TrajTextRAG); the node representation (TPS-G+S, TPS-S, TPS-G, TNA) comes with the encoder
model folder (``encoder.node.representation`` at training) and is applied to the matching too.

With ``project_goal`` the coarse stage's geometry is used as well: when a candidate matches a
group (an accepted match: the same place), the end of each successful walk towards the goal in
that group, carried through the chunk's group transform and the inverse of the match's, is where
the goal was found, in the agent's map frame (``DecisionRetrieval.goal_points``). Only a home
the memory has seen gives such points; in an unseen home the matcher accepts almost nothing.
The whole current map (``topo.candidates.MapPlace``: every node of its topo graph, walked or
only seen) is matched too when the caller passes it: early in an episode the walked part of a
candidate holds too few nodes to be recognised.

The retriever holds the chunks it searches in memory (ids, groups, goals, sectors, embeddings):
at 100k chunks that is ~350 MB with 768-wide float32 embeddings; ``bench scale`` measures an ANN
backend for larger stores (any ``ChunkSearch``).

**Caches** (``query_cache``; per retriever, emptied by ``refresh``). A navigator's candidates
repeat: all of a decision's candidates share the walked part, and about half of a decision's
candidates are candidates of an earlier one (the agent re-decides before reaching a frontier).
Each candidate's coarse result (kept groups, accepted matches) is a pure function of its nodes in
store labels and the goal, so it is kept by that content; so is its f_E embedding, and the node
embeddings h_k by sector row (the node encoder's own cache is keyed by the row's words, which
cost more to build than the embedding to look up). A cached embedding was computed in another
batch than the reference path would compute it in, which moves cosines by float32 rounding
(~1e-7) and nothing else: the same chunks come back in the same order (tested).

**Fast path** (``fast_path``; issue 49 item 6). A decision's time on CPU went to many small
products and their per-call overhead, not to arithmetic: the node votes of all the candidates'
new nodes are one product over the node index (``_coarse_stages``), each candidate's sector
similarities to all its voted groups one product (``_match_groups``), the votes stay arrays
(``NodeIndex.node_vote_arrays``), and f_E runs GPT-2 without transformers' per-call machinery
(``encoder.model.gpt2_hidden``); numpy's BLAS runs on ``blas_threads`` threads during a decision
(OpenBLAS's default threads spin on busy cores). Every piece gives the same bits as the path
before (``fast_path: false``, the benches' reference; tested piece by piece and whole).
"""

from __future__ import annotations

import contextlib
import logging
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from threadpoolctl import ThreadpoolController

from trajrag.config import Settings
from trajrag.encoder import EncoderError
from trajrag.memory.forest import Places
from trajrag.memory.forest_store import home_places
from trajrag.memory.grouping import TrajectoryMemory
from trajrag.memory.matching import N_SECTORS, match, match_similarity, sector_similarity_batch
from trajrag.memory.prefilter import rank_vote_arrays, rank_votes
from trajrag.memory.schema import CHUNKS
from trajrag.memory.se2 import Transform2D
from trajrag.memory.store import MemoryStore
from trajrag.retrieval.types import ChunkSearch, DecisionRetrieval, Experience
from trajrag.topo.describe import describe
from trajrag.topo.representation import TPS_GS, represent

log = logging.getLogger(__name__)

FINE_ENCODER, FINE_TEXT = "encoder", "text"
_NO_ROWS = np.zeros(0, dtype=np.int64)


class RetrievalError(RuntimeError):
    """The store or the model cannot serve retrieval (empty store, wrong encoder version...)."""


@dataclass
class RetrievalConfig:
    """``configs/retrieval.yaml``: where the memory is and how the two stages run."""

    store: str
    model_dir: str
    coarse: bool
    prefilter_groups: int
    coarse_groups: int
    top_k: int
    goal_filter: bool
    goal_search_groups: int
    fine: str
    embed_missing: bool
    torch_threads: int
    seed: int
    project_goal: bool
    place_groups: int
    home_goals: bool
    home_cell_m: float
    query_cache: int
    fast_path: bool
    blas_threads: int


class ExactChunkSearch:
    """Exact cosine search over an in-memory float32 matrix of unit rows (the default backend)."""

    def __init__(self, embeddings: np.ndarray) -> None:
        self.embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)

    def search(self, queries: np.ndarray, allowed: Sequence[np.ndarray | None],
               k: int) -> list[list[tuple[int, float]]]:
        out = []
        for q, rows in zip(np.asarray(queries, dtype=np.float32), allowed):
            if rows is None:
                sims = self.embeddings @ q
                rows = np.arange(len(sims))
            else:
                sims = self.embeddings[rows] @ q
            if len(sims) == 0:
                out.append([])
                continue
            top = np.argpartition(-sims, min(k, len(sims)) - 1)[:k] if len(sims) > k else np.arange(len(sims))
            top = top[np.argsort(-sims[top], kind="stable")]
            out.append([(int(rows[i]), float(sims[i])) for i in top])
        return out


@dataclass
class _Query:
    """A candidate's hypothetical trajectory in store label ids (what the matcher reads)."""

    node_xy: np.ndarray
    sectors: np.ndarray
    edges: np.ndarray
    reference_yaw: float

    def key(self, goal: str, by_goal: bool) -> tuple:
        """Everything the coarse stage and f_E read of this query, hashable."""
        return (self.node_xy.tobytes(), self.sectors.tobytes(), self.edges.tobytes(),
                self.reference_yaw, goal, by_goal)


@dataclass
class _Known:
    """A candidate's cached retrieval inputs: coarse scores of the kept groups, accepted matches
    (score, group, transform), the rows the fine stage may search, and z (None until encoded)."""

    coarse: dict[int, float]
    accepted: list[tuple[float, int, Any]]
    allowed: np.ndarray | None
    z: np.ndarray | None = None


class LruCache(OrderedDict):
    """A dict that keeps its ``size`` most recently used entries (``size`` 0: keeps nothing)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = int(size)

    def get_recent(self, key: Any) -> Any:
        """The entry (marked most recently used), or None."""
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def put(self, key: Any, value: Any) -> None:
        if self.size <= 0:
            return
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


class Retriever:
    """Coarse-to-fine retrieval over one memory store (read-only).

    ``store``: a ``MemoryStore`` or URI. ``cfg.model_dir``: the trained f_E folder (needed for
    ``fine: encoder``; its node encoder serves ``fine: text`` too), loaded with ``encoder_cfg``
    (the ``encoder`` section) unless ``encoder`` is given. ``memory_cfg``: the memory's
    matching thresholds (``configs/memory.yaml``). ``search``: the fine-stage backend (default:
    exact, in memory).
    """

    def __init__(self, store: Any, cfg: RetrievalConfig, memory_cfg: Any, *, encoder: Any = None,
                 encoder_cfg: Any = None, search: ChunkSearch | None = None) -> None:
        if not isinstance(store, MemoryStore):
            store = MemoryStore(str(store), read_only=True)
        self.store, self.cfg = store, cfg
        if cfg.fine not in (FINE_ENCODER, FINE_TEXT):
            raise RetrievalError(f"retrieval.fine must be {FINE_ENCODER!r} or {FINE_TEXT!r}, got {cfg.fine!r}")
        if cfg.torch_threads > 0:
            import torch

            torch.set_num_threads(cfg.torch_threads)
        # numpy's BLAS threads are the process's: set for each decision only (``_blas_threads``).
        self._blas = ThreadpoolController() if cfg.blas_threads > 0 else None
        self.encoder = encoder if encoder is not None else load_encoder(cfg.model_dir, encoder_cfg)
        self.representation = self.encoder.node_encoder.cfg.representation
        self._text_max_length = self.encoder.node_encoder.cfg.text_max_length  # fine: text
        # The summaries and their node prefilter, exactly as the memory's writer sees them.
        self.memory = TrajectoryMemory(store, memory_cfg)
        self._apply_representation()
        self.clear_caches()
        self._load_chunks()
        self._search = search or ExactChunkSearch(self.embeddings)

    def refresh(self) -> None:
        """Read the store again (after chunks were added: lifelong mode)."""
        self.store.checkout_latest()
        self.memory.reload()
        self._apply_representation()
        self.clear_caches()
        self._load_chunks()
        if isinstance(self._search, ExactChunkSearch):
            self._search = ExactChunkSearch(self.embeddings)

    # -- loading -------------------------------------------------------------------------------
    def clear_caches(self) -> None:
        """Forget the candidates, node embeddings (``query_cache``; see the module docstring) and
        node votes seen, and zero the hit counters."""
        self._vote_cache: dict[bytes, Any] = {}
        self._known = LruCache(self.cfg.query_cache)
        self._node_rows = LruCache(self.cfg.query_cache * 16)  # a candidate has up to max_nodes rows
        self._home_places: dict[str, Places] = {}
        self.cache_hits = self.cache_misses = 0

    def _apply_representation(self) -> None:
        if self.representation != TPS_GS:  # match like with like (paper Tab. 1 variants)
            for gid, summary in self.memory.summaries.items():
                summary.sectors = represent(summary.sectors, self.representation)
                self.memory.index.set_group(gid, summary.sectors)

    def _load_chunks(self) -> None:
        # group_transform only places the goal ends of ``project_goal``: not read otherwise.
        table = self.store.read(CHUNKS, ["trajectory_id", "group_id", "scene_hint", "goal", "success",
                                         "sectors", "node_xy", "description", "embedding", "encoder_version",
                                         *(["group_transform"] if self.cfg.project_goal else [])])
        if table.num_rows == 0:
            raise RetrievalError(f"memory store {self.store.uri} has no chunks: build one with "
                                 "`trajrag corpus build` before retrieving from it")
        cols = {name: table.column(name).to_pylist() for name in
                ("trajectory_id", "scene_hint", "goal", "success", "description", "encoder_version")}
        self.ids: list[str] = cols["trajectory_id"]
        self.goals = np.asarray(cols["goal"], dtype=object)
        self.success = np.asarray([bool(s) for s in cols["success"]])
        self.scene_hints, self.descriptions = cols["scene_hint"], cols["description"]
        aliases = self.store.group_aliases()
        self.groups = np.asarray(self.store.resolve_groups(table.column("group_id").to_pylist(), aliases),
                                 dtype=np.int64)
        self.sectors = [np.asarray(s, dtype=np.int16).reshape(-1, N_SECTORS) for s in table.column("sectors").to_pylist()]
        self.node_xy = [np.asarray(s, dtype=np.float64).reshape(-1, 2) for s in table.column("node_xy").to_pylist()]
        self.names = {label: name for name, label in self.store.vocabulary().items()}
        self._vocab = {name: label for label, name in self.names.items()}
        self._query_names: dict[int, str] = {}  # categories only queries have: ids past the store's
        self.rows_of_group = _index_rows(self.groups.tolist())
        self.rows_of_goal = _index_rows(self.goals.tolist())
        self.rows_of_group_goal = _index_rows(list(zip(self.groups.tolist(), self.goals.tolist())))
        self.embeddings = self._chunk_embeddings(table, cols["encoder_version"])
        self.end_in_group = self._ends_in_group(table, aliases) if self.cfg.project_goal else None
        self.groups_finding: dict[str, set[int]] = {}  # goal -> groups with a walk's end at it
        if self.end_in_group is not None:
            placed = self.success & np.isfinite(self.end_in_group).all(axis=1)
            for row in np.flatnonzero(placed):
                self.groups_finding.setdefault(str(self.goals[row]), set()).add(int(self.groups[row]))

    def _ends_in_group(self, table: Any, aliases: dict) -> np.ndarray:
        """float (N, 2): each chunk's last node in its (current) group's frame, metres; NaN
        where the chunk has no transform."""
        rows = self.store.resolve_chunks(table.select(["group_id", "group_transform"]), aliases)
        ends = np.full((len(rows), 2), np.nan)
        for i, (row, xy) in enumerate(zip(rows, self.node_xy)):
            if row["group_transform"] is not None and len(xy):
                ends[i] = Transform2D(*row["group_transform"]).apply(xy[-1:])[0]
        return ends

    def _chunk_embeddings(self, table: Any, versions: list[str | None]) -> np.ndarray:
        """Unit rows (N, D): stored f_E embeddings of this encoder's version, or text embeddings
        of the descriptions for ``fine: text``; chunks embedded by another encoder version are
        an error unless ``embed_missing`` (then they are embedded here, in memory)."""
        if self.cfg.fine == FINE_TEXT:
            return self._text_embeddings(self.descriptions)
        stale = [i for i, v in enumerate(versions) if v != self.encoder.version]
        if stale and not self.cfg.embed_missing:
            found = sorted({str(versions[i]) for i in stale})
            raise RetrievalError(
                f"memory store {self.store.uri}: {len(stale)} of {len(versions)} chunks are embedded "
                f"with encoder version(s) {found[:3]}, the model {self.cfg.model_dir or 'given'} is "
                f"{self.encoder.version}: re-embed with `trajrag encoder eval --store ... --model ...` "
                "or set retrieval.embed_missing=true")
        width = int(self.encoder.dim)
        z = np.zeros((len(versions), width), dtype=np.float32)
        stale_set = set(stale)
        fresh = [i for i in range(len(versions)) if i not in stale_set]
        if fresh:
            # Arrow -> numpy directly: to_pylist costs ~30 bytes a float (~9 GB at 350k chunks).
            stored = table.column("embedding").take(fresh).combine_chunks().flatten()
            z[fresh] = np.asarray(stored.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(len(fresh), width)
        if stale:
            log.warning("embedding %d chunks of %s in memory (stale or missing embeddings)",
                        len(stale), self.store.uri)
            z[stale] = self._encode([self._represented(self.sectors[i]) for i in stale],
                                    [str(self.goals[i]) for i in stale], self.names)
        return z

    def _text_embeddings(self, texts: Sequence[str]) -> np.ndarray:
        return self.encoder.node_encoder.encode_texts(list(texts), max_length=self._text_max_length)

    # -- one decision -----------------------------------------------------------------------------
    @property
    def uses_place(self) -> bool:
        """Whether ``retrieve`` reads a ``place`` (only to project the goal)."""
        return bool(self.cfg.project_goal)

    def retrieve(self, candidates: Sequence[Any], goal: str, place: Any = None) -> DecisionRetrieval:
        """The top-K experiences of each candidate (hypothetical ``TopoPolarTrajectory``s).

        place: the current map (``topo.candidates.MapPlace``), matched against the summaries
        as a whole for ``project_goal``; ignored otherwise. The result's ``coarse_ms``,
        ``encode_ms`` and ``fine_ms`` (encoding included) split the decision's time."""
        if not candidates:
            return DecisionRetrieval([], self.names)
        with self._blas_threads():
            return self._retrieve(candidates, goal, place)

    def _blas_threads(self) -> contextlib.AbstractContextManager:
        """numpy's BLAS on ``blas_threads`` threads while it lasts (0: as the process has them)."""
        if self._blas is None:
            return contextlib.nullcontext()
        return self._blas.limit(limits=self.cfg.blas_threads, user_api="blas")

    def _retrieve(self, candidates: Sequence[Any], goal: str, place: Any) -> DecisionRetrieval:
        start = time.perf_counter()
        queries = [self._to_store_labels(c) for c in candidates]
        names = {**self.names, **self._query_names}
        # Goal-conditioned: only chunks that walked towards this goal, when the store has any.
        by_goal = self.cfg.goal_filter and goal in self.rows_of_goal
        known = self._coarse_stages(queries, goal, by_goal)
        places = [p for k in known for p in k.accepted]  # (score, group, query->group transform)
        if self.cfg.project_goal and place is not None and len(place) and self.rows_of_group:
            places.extend(self._recognise_goal_places(self._to_store_labels(place), goal))
        mid = time.perf_counter()
        if self.cfg.fine == FINE_TEXT:
            z = self._text_embeddings([describe(c) for c in candidates])
        else:
            z = self._query_embeddings(queries, known, goal, names)
        encoded = time.perf_counter()
        found = self._search.search(z, [k.allowed for k in known], self.cfg.top_k)
        experiences = [[self._experience(row, sim, known[i].coarse.get(int(self.groups[row]), 0.0))
                        for row, sim in hits] for i, hits in enumerate(found)]
        goal_points = self._goal_points(places, goal) if self.cfg.project_goal else None
        end = time.perf_counter()
        return DecisionRetrieval(experiences, self.names, (mid - start) * 1e3, (end - mid) * 1e3,
                                 goal_points=goal_points, encode_ms=(encoded - mid) * 1e3)

    def home_goal_points(self, scene: str, goal: str) -> np.ndarray:
        """float (P, 2) map-frame metres: where the memory's walks of ``scene`` saw ``goal`` (the
        nodes of their maps, or of the walks where no map is kept, with a sector on it), pooled per
        ``home_cell_m`` cell (``memory.forest_store.home_places``, the semantic forest's leaves);
        empty where the memory holds no walk of the home or its walks never saw the goal (and
        without ``home_goals``).

        Every walk of one scene maps in the simulator's frame of it (``mapping.semantic_map``), so
        a robot localised in its home reads these places as they are stored, with no matching:
        ``project_goal`` is for a robot that must first recognise where it is."""
        if not self.cfg.home_goals:
            return np.zeros((0, 2))
        if scene not in self._home_places:
            self._home_places[scene] = home_places(self.store, scene, self.cfg.home_cell_m)[0]
        places = self._home_places[scene]
        return places.xy[[goal in objects for objects in places.objects]].reshape(-1, 2)

    def _coarse_stages(self, queries: Sequence[_Query], goal: str, by_goal: bool) -> list[_Known]:
        """Each candidate's ``_coarse_stage``, in order; with ``fast_path`` the node votes of all
        the candidates not cached are computed first, in one product over the node index (a
        node's votes do not depend on the nodes searched with it: ``NodeIndex._similarities``)."""
        keys = [q.key(goal, by_goal) for q in queries]
        if self.cfg.fast_path and self.cfg.coarse and self.rows_of_group:
            todo = [q.sectors for q, key in zip(queries, keys) if key not in self._known]
            if todo:
                self._node_votes(np.concatenate(todo))
        return [self._coarse_stage(q, key, goal, by_goal) for q, key in zip(queries, keys)]

    def _coarse_stage(self, q: _Query, key: tuple, goal: str, by_goal: bool) -> _Known:
        """The candidate's kept groups, accepted matches and searchable rows (all rows: None),
        from the cache when this query (``key``: ``_Query.key``) was seen with this goal before."""
        known = self._known.get_recent(key)
        if known is not None:
            self.cache_hits += 1
            return known
        self.cache_misses += 1
        allowed = self.rows_of_goal[goal] if by_goal else None
        if not (self.cfg.coarse and self.rows_of_group):
            known = _Known({}, [], allowed)
        else:
            coarse, accepted = self._coarse(q, goal if by_goal else None)
            rows = [self._group_rows(g, goal if by_goal else None) for g in coarse]
            known = _Known(coarse, accepted, np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64))
        self._known.put(key, known)
        return known

    def _query_embeddings(self, queries: Sequence[_Query], known: Sequence[_Known], goal: str,
                          names: dict[int, str]) -> np.ndarray:
        """z (Q, D) of the queries: cached ones as they were, the others encoded in one batch."""
        todo = [i for i, k in enumerate(known) if k.z is None]
        if todo:
            fresh = self._encode([queries[i].sectors for i in todo], [goal] * len(todo), names)
            for i, z in zip(todo, fresh):
                known[i].z = z
        return np.stack([k.z for k in known]).astype(np.float32, copy=False)

    def _goal_points(self, places: list[tuple[float, int, Any]], goal: str) -> np.ndarray:
        """float (P, 2) map-frame metres: where past successful walks of the best-matched place
        found ``goal`` (the ends of that group's chunks, through the inverse of the match)."""
        for _, gid, transform in sorted(places, key=lambda p: -p[0]):
            rows = self._group_rows(gid, goal)
            ends = self.end_in_group[rows[self.success[rows]]] if len(rows) else np.zeros((0, 2))
            ends = ends[np.isfinite(ends).all(axis=1)]
            if len(ends):
                return transform.inverse().apply(ends)
        return np.zeros((0, 2))

    def _coarse(self, q: _Query, goal: str | None) -> tuple[dict[int, float], list[tuple[float, int, Any]]]:
        """The kept groups -> their coarse score (inlier ratio), best first: the prefilter's
        best-voted groups re-ranked by exact matching (score, then inlier count, then vote);
        and the accepted matches as (score, group, query->group transform).
        With a ``goal``, groups are added in that order, then in vote order down to
        ``goal_search_groups``, until the kept ones hold ``top_k`` chunks towards the goal (a
        group is one place, and most places were walked towards a few goals only)."""
        votes = self._node_votes(q.sectors)
        voted = self._rank_votes(votes, self.cfg.prefilter_groups)
        scored, accepted = [], []
        for rank, (gid, result) in enumerate(self._match_groups(q, voted)):
            scored.append((-float(result.score), -result.n_inliers, rank, gid))
            if result.accepted:
                accepted.append((float(result.score), gid, result.transform))
        ranked = [(gid, -neg) for neg, _, _, gid in sorted(scored)]
        kept = dict(ranked[: self.cfg.coarse_groups])
        if goal is None:
            return kept, accepted
        more = ranked[self.cfg.coarse_groups:] + [
            (g, 0.0) for g in self._rank_votes(votes, self.cfg.goal_search_groups) if g not in voted]
        found = sum(len(self._group_rows(g, goal)) for g in kept)
        for gid, score in more:
            if found >= self.cfg.top_k:
                break
            kept[gid] = score
            found += len(self._group_rows(gid, goal))
        return kept, accepted

    def _recognise_goal_places(self, q: _Query, goal: str) -> list[tuple[float, int, Any]]:
        """The accepted matches of the map ``q`` as (score, group, query->group transform),
        among the groups where some walk found ``goal``, best voted first: a home's memory is
        many small groups, and only those that found the goal can say where it is."""
        holding = self.groups_finding.get(goal)
        if not holding:
            return []
        votes = self._votes_for(self._node_votes(q.sectors), holding)
        return [(float(r.score), gid, r.transform)
                for gid, r in self._match_groups(q, self._rank_votes(votes, self.cfg.place_groups)) if r.accepted]

    def _match_groups(self, q: _Query, groups: Sequence[int]) -> list[tuple[int, Any]]:
        """``(group, MatchResult)`` of ``q`` against each group's summary, in order; RANSAC
        seeded by the query, so a decision is reproducible. With ``fast_path`` the sector
        similarities to all the groups are one product (``sector_similarity_batch``, the same
        bits as one ``match`` per group)."""
        rng = np.random.default_rng([self.cfg.seed, zlib.crc32(q.sectors.tobytes())])
        summaries = [self.memory.summaries[gid] for gid in groups]
        params = self.memory.params
        if not self.cfg.fast_path:
            return [(gid, match(q, summary, params, rng)) for gid, summary in zip(groups, summaries)]
        sims = sector_similarity_batch(q.sectors, [summary.sectors for summary in summaries])
        return [(gid, match_similarity(q, summary, sim, params, rng))
                for gid, summary, sim in zip(groups, summaries, sims)]

    def _group_rows(self, group: int, goal: str | None) -> np.ndarray:
        """Rows of a group's chunks (towards ``goal`` only, when given)."""
        if goal is None:
            return self.rows_of_group.get(group, _NO_ROWS)
        return self.rows_of_group_goal.get((group, goal), _NO_ROWS)

    def _votes_for(self, votes: list, groups: set[int]) -> list:
        """``_node_votes``' votes for ``groups`` only."""
        if not self.cfg.fast_path:
            return [{g: w for g, w in v.items() if g in groups} for v in votes]
        held = np.fromiter(groups, dtype=np.int64)
        kept = [np.isin(g, held) for g, _ in votes]
        return [(g[k], w[k]) for (g, w), k in zip(votes, kept)]

    def _rank_votes(self, votes: list, n: int) -> list[int]:
        """The ``n`` best-voted groups of ``_node_votes``' votes."""
        return rank_vote_arrays(votes, n) if self.cfg.fast_path else rank_votes(votes, n)

    def _node_votes(self, sectors: np.ndarray) -> list:
        """The prefilter's per-node group votes, cached by sector vector: the walked part of
        every candidate, and of every later decision, repeats the same nodes. As dicts
        (``NodeIndex.node_votes``), or as arrays with ``fast_path`` (``node_vote_arrays``)."""
        keys = [row.tobytes() for row in sectors]
        missing: dict[bytes, int] = {}  # a new row -> where it first occurs
        for i, key in enumerate(keys):
            if key not in self._vote_cache:
                missing.setdefault(key, i)
        if missing:
            index = self.memory.index
            find = index.node_vote_arrays if self.cfg.fast_path else index.node_votes
            votes = find(sectors[list(missing.values())], self.memory.cfg.prefilter_neighbours)
            self._vote_cache.update(zip(missing, votes))
        return [self._vote_cache[k] for k in keys]

    def _experience(self, row: int, similarity: float, coarse_score: float) -> Experience:
        return Experience(
            trajectory_id=self.ids[row], group_id=int(self.groups[row]), goal=str(self.goals[row]),
            success=bool(self.success[row]), similarity=float(similarity), coarse_score=float(coarse_score),
            description=self.descriptions[row] or "", scene_hint=self.scene_hints[row] or "",
            sectors=self.sectors[row], node_xy=self.node_xy[row])

    # -- encoding ---------------------------------------------------------------------------------
    def _represented(self, sectors: np.ndarray) -> np.ndarray:
        return represent(sectors, self.representation) if self.representation != TPS_GS else sectors

    def _to_store_labels(self, traj: Any) -> _Query:
        """The candidate with its category ids mapped to the store's label ids; a category the
        store never saw gets a query-local id (it matches nothing, and still has a name)."""
        lut = np.zeros(max(len(traj.categories), 1), dtype=np.int16)
        for k, name in enumerate(traj.categories):
            if name not in self._vocab:
                label = max(self._vocab.values(), default=-1) + 1
                self._vocab[name] = label
                self._query_names[label] = name
            lut[k] = self._vocab[name]
        sectors = np.asarray(traj.sectors)
        mapped = np.where(sectors >= 0, lut[np.clip(sectors, 0, None)], sectors).astype(np.int16)
        return _Query(np.asarray(traj.node_xy, dtype=np.float64), self._represented(mapped),
                      np.asarray(traj.edges, dtype=np.int64).reshape(-1, 2), float(traj.reference_yaw))

    def _encode(self, sectors: Sequence[np.ndarray], goals: Sequence[str], names: dict[int, str]) -> np.ndarray:
        """z (N, D) of sector sequences in store labels (``names``: label id -> category)."""
        lean = self.cfg.fast_path
        if self._node_rows.size <= 0:
            return self.encoder.encode_sectors(list(sectors), list(goals), names, lean=lean)
        return self.encoder.encode_node_embeddings(self._node_embeddings(sectors, names), list(goals), lean=lean)

    def _node_embeddings(self, sectors: Sequence[np.ndarray], names: dict[int, str]) -> list[np.ndarray]:
        """h_k (K_i, dim) of each sequence, by sector row: a label id always names the same
        category here (the store's, or a query-local one that is never reassigned)."""
        rows = {row.tobytes(): row for seq in sectors for row in seq}
        found = {key: self._node_rows.get_recent(key) for key in rows}
        missing = [key for key, h in found.items() if h is None]
        if missing:
            embedded = self.encoder.node_encoder.encode_nodes(np.stack([rows[key] for key in missing]), names)
            for key, h in zip(missing, embedded):
                found[key] = h
                self._node_rows.put(key, h)
        return [np.stack([found[row.tobytes()] for row in seq]) for seq in sectors]


def _index_rows(keys: list) -> dict[Any, np.ndarray]:
    """key -> the rows holding it (int64, ascending)."""
    rows: dict[Any, list[int]] = {}
    for i, key in enumerate(keys):
        rows.setdefault(key, []).append(i)
    return {key: np.asarray(r, dtype=np.int64) for key, r in rows.items()}


def load_encoder(model_dir: str, encoder_cfg: Any) -> Any:
    """The trained f_E of ``model_dir`` for retrieval (``encoder_cfg``: the ``encoder`` section:
    batch size, node encoder settings); ``RetrievalError`` names a missing or unreadable one."""
    from trajrag.encoder.model import TrajectoryEncoder

    if not model_dir:
        raise RetrievalError("retrieval needs a trained encoder folder: pass --model MODEL_DIR "
                             "(or --set retrieval.model_dir=...); train one with `trajrag encoder train`")
    try:
        return TrajectoryEncoder(model_dir, encoder_cfg)
    except EncoderError as exc:
        raise RetrievalError(str(exc)) from exc


def load_retriever(settings: Settings, **kwargs: Any) -> Retriever:
    """A retriever of the ``retrieval`` section's store, with its ``memory`` and ``encoder``
    sections (the encoder's batch size and node encoder)."""
    cfg = settings.retrieval
    if not cfg.store:
        raise RetrievalError("retrieval needs a memory store: pass --store PATH "
                             "(or --set retrieval.store=...)")
    return Retriever(cfg.store, cfg, settings.memory, encoder_cfg=settings.encoder, **kwargs)
