"""The prefilter: which groups a new trajectory is matched against (the coarse candidate search).

Every summary node has a rotation-invariant descriptor (hashed counts of label pairs at each
angular offset, ``node_descriptors``) in an in-memory float32 matrix (``NodeIndex``); each node
of a new trajectory votes for the groups of its most similar summary nodes, and only the
best-voted groups are matched exactly (``matching.match``). The exact matching, the expensive
part, therefore does not grow with the number of groups. The retriever's coarse stage votes the
same way (``NodeIndex.node_votes``, ``rank_votes``; on its fast path as arrays, to the bit:
``node_vote_arrays``, ``rank_vote_arrays``). The writer's fast path (``NodeIndex(fast=True)``,
``memory.fast_path``) finds the same candidates with less work: see ``NodeIndex.candidates``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from trajrag.memory.matching import N_SECTORS
from trajrag.topo.labels import UNKNOWN

# Sector labels are int8 in the store: codes from UNKNOWN (-3) to 127 shift to 0..130.
_LABEL_SPAN = 131
_OFFSETS = np.arange(1, N_SECTORS // 2 + 1)  # every distinct angular offset on the 12-cycle
# Nodes added since the inverted lists were laid out are gathered row by row at search time;
# beyond this share of all rows the lists are laid out contiguously again (a copy of the index,
# ~0.1 s at 100k nodes; rare, since the share is of a growing index).
_MAX_EXTRA_SHARE = 0.1


def node_descriptors(sectors: np.ndarray, dim: int) -> np.ndarray:
    """Rotation-invariant node descriptors (K, dim) float32, unit L2 norm (zero if no evidence).

    Each node contributes the words (label at sector i, label at sector i + d, d) for every
    sector i and offset d = 1..6: which labels it sees and at what angle from one another.
    A cyclic shift of the sectors maps the multiset of words onto itself, so no heading
    alignment is needed. Words with an UNKNOWN side carry no evidence. Words are hashed into
    ``dim`` bins; counts are square-rooted (damping the ubiquitous free/obstacle words) and
    normalised, so the dot product of two descriptors approximates Eq. 8's similarity cheaply.
    """
    a = np.asarray(sectors, dtype=np.int64)
    k = len(a)
    if k == 0:
        return np.zeros((0, dim), dtype=np.float32)
    idx = (np.arange(N_SECTORS)[:, None] + _OFFSETS[None, :]) % N_SECTORS  # (12, 6)
    first = np.broadcast_to(a[:, :, None], (k, N_SECTORS, len(_OFFSETS)))
    second = a[:, idx]
    valid = (first != UNKNOWN) & (second != UNKNOWN)
    word = ((first - UNKNOWN) * _LABEL_SPAN + (second - UNKNOWN)) * len(_OFFSETS) + _OFFSETS - 1
    # Multiplicative hashing spreads the structured word ids over all bins.
    bins = (word * 2654435761) % (2**32) % dim
    rows = np.broadcast_to(np.arange(k)[:, None, None], bins.shape)
    flat = np.bincount((rows * dim + bins)[valid], minlength=k * dim)
    desc = np.sqrt(flat.reshape(k, dim).astype(np.float32))
    norm = np.linalg.norm(desc, axis=1, keepdims=True)
    return desc / np.where(norm > 0, norm, 1.0)


@dataclass(frozen=True)
class IVFParams:
    """Inverted-file search over node descriptors (see ``NodeIndex``); configs/memory.yaml."""

    min_nodes: int  # below this many nodes, exact search
    lists_per_sqrt: float  # lists = lists_per_sqrt * sqrt(nodes at training)
    probes: int  # lists searched per query node
    train_sample: int  # nodes the k-means sees
    kmeans_iterations: int
    seed: int


class NodeIndex:
    """In-memory index of every summary node's descriptor, for picking candidate groups.

    ``candidates(sectors, n, neighbours)``: each node of the query retrieves its ``neighbours``
    most similar summary nodes (dot product of ``node_descriptors``) and votes for their groups;
    the ``n`` best-voted groups are returned. Node-level votes keep partial trajectories
    findable: a group-level bag of labels is dominated by the labels every home has.

    Search is exact over all N nodes (one (K x D) @ (D x N) product) until N reaches
    ``ivf.min_nodes``; then an inverted file takes over: spherical k-means splits the nodes into
    ~``lists_per_sqrt * sqrt(N)`` lists, and each query node searches only the ``probes`` lists
    whose centroids are closest, so a query costs O(sqrt(N)) instead of O(N). The lists are
    retrained whenever the index has doubled since the last training (amortised O(1) per
    insert); nodes added in between join their nearest list.

    At training the descriptors are reordered so that each list is one contiguous block of
    rows: a probe is then a slice (no gather of scattered rows, which cost more than the dot
    products). Nodes added since sit at the end, listed per inverted list in ``_extra``.
    """

    def __init__(self, dim: int, ivf: IVFParams | None = None, fast: bool = False) -> None:
        self.dim = dim
        self.ivf = ivf
        self.fast = fast
        self._desc = np.zeros((1024, dim), dtype=np.float32)
        self._owner = np.full(1024, -1, dtype=np.int64)
        self._rows: dict[int, np.ndarray] = {}
        self._used = 0
        self._dead = 0
        self._centroids: np.ndarray | None = None
        # Trained rows of list l: [_bounds[l], _bounds[l + 1]); rows that joined it since: _extra[l]
        # (a numpy copy of each in _extra_rows, refreshed when the list grew).
        self._bounds: list[int] = [0]
        self._extra: list[list[int]] = []
        self._extra_rows: list[np.ndarray] = []
        # The fast path's view of each probed list (``_list_layout``), dropped when one of the
        # rows added to it changes.
        self._layouts: dict[int, tuple[int, int, np.ndarray, np.ndarray | None]] = {}
        self._list_of = np.full(1024, -1, dtype=np.int64)  # inverted list of each row (-1: none)
        self._trained_at = 0
        # Writes since the lists were laid out, per list: to its trained block, to its added rows
        # (``read_ahead`` checks them), and the probes read ahead per query (``_query_key``).
        self._trained_writes = np.zeros(0, dtype=np.int64)
        self._added_writes = np.zeros(0, dtype=np.int64)
        self._ahead: dict[bytes, _ReadAhead] = {}
        self.read_ahead_used = 0  # searches served from a read-ahead

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def inverted_file(self) -> bool:
        """Whether searches go through the inverted file (else exact over every node)."""
        return self._centroids is not None

    @property
    def n_nodes(self) -> int:
        return self._used - self._dead

    @property
    def _n_extra(self) -> int:
        """Rows added since the lists were laid out: all of them sit after the blocks."""
        return self._used - self._bounds[-1]

    def set_group(self, group_id: int, sectors: np.ndarray, changed: np.ndarray | None = None) -> None:
        """Index (or re-index) all nodes of a group. ``changed``: when the group is indexed
        already and only grew, its nodes whose sectors changed since (node indices); only those
        and the new nodes are described again (a node's descriptor is its own sectors')."""
        rows = self._rows.get(group_id)
        if changed is not None and rows is not None and len(rows) <= len(sectors):
            redo = np.concatenate([np.asarray(changed, dtype=np.int64), np.arange(len(rows), len(sectors))])
            desc = node_descriptors(np.asarray(sectors)[redo], self.dim)
            extra = self._alloc(len(sectors) - len(rows))
            rows = np.concatenate([rows, extra])
            written = rows[redo]
        else:
            desc = node_descriptors(sectors, self.dim)
            if rows is not None and len(rows) <= len(desc):
                extra = self._alloc(len(desc) - len(rows))
                rows = np.concatenate([rows, extra])
            else:
                if rows is not None:
                    self.remove_group(group_id)
                extra = rows = self._alloc(len(desc))
            written = rows
        self._desc[written] = desc
        self._owner[rows] = group_id
        self._rows[group_id] = rows
        self._forget_layouts(written)
        if self._centroids is not None and len(extra):
            # Rows already indexed keep their list: filling UNKNOWN sectors moves them little.
            lists = (desc[-len(extra):] @ self._centroids.T).argmax(1)
            self._list_of[extra] = lists
            for row, lst in zip(extra.tolist(), lists.tolist()):
                self._extra[lst].append(row)
            np.add.at(self._added_writes, lists, 1)
            if self._n_extra > self._used * _MAX_EXTRA_SHARE:
                self._repack()  # lays the lists out contiguously again
        self._maybe_train()

    def remove_group(self, group_id: int) -> None:
        rows = self._rows.pop(group_id, None)
        if rows is None:
            return
        self._desc[rows] = 0.0
        self._owner[rows] = -1
        self._forget_layouts(rows)
        self._dead += len(rows)
        if self._dead > max(1024, self._used // 4):
            self._repack()

    def _forget_layouts(self, rows: np.ndarray) -> None:
        """Drop the fast path's views of the lists that ``rows`` (changed) were added to, and
        count the writes to each list's trained block and added rows (``read_ahead``)."""
        if self._centroids is None:
            return
        trained = rows < self._bounds[-1]
        np.add.at(self._trained_writes, self._list_of[rows[trained]], 1)
        added = np.unique(self._list_of[rows[~trained]])
        added = added[added >= 0]  # rows allocated just now join their lists after this
        np.add.at(self._added_writes, added, 1)
        for lst in added.tolist():
            self._layouts.pop(lst, None)

    def _alloc(self, n: int) -> np.ndarray:
        if self._used + n > len(self._desc):
            grow = max(n, len(self._desc))
            self._desc = np.concatenate([self._desc, np.zeros((grow, self.dim), np.float32)])
            self._owner = np.concatenate([self._owner, np.full(grow, -1, np.int64)])
            self._list_of = np.concatenate([self._list_of, np.full(grow, -1, np.int64)])
        rows = np.arange(self._used, self._used + n)
        self._used += n
        return rows

    def _repack(self) -> None:
        """Drop removed rows; with an inverted file, lay the lists out contiguously again."""
        live = np.where(self._owner[: self._used] >= 0)[0]
        self._layout(live, self._list_of[live] if self._centroids is not None else None)

    def _layout(self, live: np.ndarray, lists: np.ndarray | None) -> None:
        """Keep only rows ``live``, ordered by inverted list ``lists`` (stable) when given."""
        order = np.argsort(lists, kind="stable") if lists is not None else np.arange(len(live))
        keep = live[order]
        remap = np.full(self._used, -1, dtype=np.int64)
        remap[keep] = np.arange(len(keep))
        n = len(keep)
        self._desc[:n], self._owner[:n] = self._desc[keep], self._owner[keep]
        self._list_of[:n] = self._list_of[keep] if lists is None else lists[order]
        self._desc[n: self._used] = 0.0
        self._owner[n: self._used] = -1
        self._list_of[n: self._used] = -1
        self._rows = {g: remap[r] for g, r in self._rows.items()}
        if lists is not None:
            n_lists = len(self._centroids)
            self._bounds = np.searchsorted(self._list_of[:n], np.arange(n_lists + 1)).tolist()
            self._extra = [[] for _ in range(n_lists)]
            self._extra_rows = [np.zeros(0, np.int64) for _ in range(n_lists)]
            self._trained_writes = np.zeros(n_lists, dtype=np.int64)
            self._added_writes = np.zeros(n_lists, dtype=np.int64)
        self._layouts = {}
        self._ahead = {}
        self._used, self._dead = n, 0

    def _maybe_train(self) -> None:
        ivf = self.ivf
        if ivf is None or self.n_nodes < ivf.min_nodes or self.n_nodes < 2 * self._trained_at:
            return
        live = np.where(self._owner[: self._used] >= 0)[0]
        rng = np.random.default_rng(ivf.seed)
        sample = self._desc[rng.choice(live, min(len(live), ivf.train_sample), replace=False)]
        n_lists = min(len(sample), int(math.ceil(ivf.lists_per_sqrt * math.sqrt(len(live)))))
        centroids = sample[rng.choice(len(sample), n_lists, replace=False)]
        for _ in range(ivf.kmeans_iterations):  # spherical k-means: unit centroids, dot products
            nearest = (sample @ centroids.T).argmax(axis=1)
            sums = np.zeros_like(centroids)
            np.add.at(sums, nearest, sample)
            norms = np.linalg.norm(sums, axis=1, keepdims=True)
            centroids = np.where(norms > 0, sums / np.maximum(norms, 1e-12), centroids)
        self._centroids = centroids.astype(np.float32)
        assign = np.concatenate([(self._desc[chunk] @ self._centroids.T).argmax(axis=1)
                                 for chunk in np.array_split(live, max(1, len(live) // 8192))])
        self._layout(live, assign)
        self._trained_at = len(live)

    def _probed(self, query_node: np.ndarray, lists: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Similarities of one query node to the rows of ``lists``, and those rows' groups
        (-1: a removed row)."""
        sims, owners = [], []
        for lst in lists:
            lo, hi = self._bounds[lst], self._bounds[lst + 1]
            sims.append(self._desc[lo:hi] @ query_node)
            owners.append(self._owner[lo:hi])
            if self._extra[lst]:
                if len(self._extra_rows[lst]) != len(self._extra[lst]):
                    self._extra_rows[lst] = np.asarray(self._extra[lst], dtype=np.int64)
                rows = self._extra_rows[lst]
                sims.append(self._desc[rows] @ query_node)
                owners.append(self._owner[rows])
        return np.concatenate(sims), np.concatenate(owners)

    def candidates(self, sectors: np.ndarray, n: int, neighbours: int) -> list[int]:
        """Group ids of the ``n`` best-voted groups for a query's sector vectors, best first.

        Each query node retrieves its ``neighbours`` most similar summary nodes; a retrieved
        node votes for its group with sqrt(similarity - the query node's next-best similarity),
        so a node that looks like many others (a plain corridor) casts almost no vote while a
        distinctive one counts; a group takes its best vote from each query node.

        With ``fast`` the same groups, to the bit, for less work: the inverted file's probes
        are written into one matrix (the same matrix-vector products, no lists to join), and
        only the votes above zero are found (``_positive_votes``), without ordering the
        neighbours.
        """
        if not self._rows or len(sectors) == 0:
            return []
        if self.fast:
            rows, groups, weights = _positive_votes(*self._similarities(sectors, packed=True), neighbours)
            return _top_summed(*_best_of(rows, groups, weights)[1:], n)
        return _ranked(*_top_votes(*self._similarities(sectors), neighbours), n)

    def node_votes(self, sectors: np.ndarray, neighbours: int) -> list[dict[int, float]]:
        """Per query node, its vote for each group (see ``candidates``); callers that see the
        same nodes again (a navigator re-deciding along one trajectory) can cache them."""
        if not self._rows or len(sectors) == 0:
            return [{} for _ in range(len(sectors))]
        return _votes(*self._similarities(sectors), neighbours)

    def node_vote_arrays(self, sectors: np.ndarray, neighbours: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """``node_votes`` as arrays, to the bit: per query node, the groups it votes for (int64,
        ascending) and its vote for each (float64), as ``rank_vote_arrays`` reads them: no dict
        per node, and numpy ranks them (~0.25 ms of a ~6 ms decision at 100k chunks)."""
        if not self._rows or len(sectors) == 0:
            return [(np.zeros(0, np.int64), np.zeros(0)) for _ in range(len(sectors))]
        rows, groups, weights = _best_votes(*_top_votes(*self._similarities(sectors), neighbours))
        bounds = np.searchsorted(rows, np.arange(len(sectors) + 1))
        return [(groups[a:b], weights[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]

    def _similarities(self, sectors: np.ndarray, packed: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Query nodes x searched nodes: descriptor similarities (-inf: padding) and the searched
        nodes' groups (-1: none), per column (exact search) or per entry (inverted file).
        ``packed``: the inverted file's probes written straight into the matrix (the same
        products, the same matrix); taken from what was read ahead for this query, if it was."""
        ahead = self._ahead.pop(_query_key(sectors), None) if packed and self._ahead else None
        if ahead is not None:
            self.read_ahead_used += 1
            return self._probed_ahead(ahead)
        query = node_descriptors(sectors, self.dim)
        if self._centroids is None:
            # One matrix product, the index on the left: OpenBLAS streams it ~3x faster than
            # ``query @ index.T`` (which packs the whole index into panels first): the same bits with
            # its kernels without FMA (Nehalem, Sandybridge), within float32 rounding with FMA (Haswell).
            # One query node goes through another kernel (gemv) that rounds differently: padded,
            # a node's similarities are the same bits whichever nodes it is searched with (the
            # retriever searches a decision's new nodes at once).
            padded = np.concatenate([query, np.zeros_like(query)]) if len(query) == 1 else query
            sim = np.ascontiguousarray((self._desc[: self._used] @ padded.T).T[: len(query)])
            return sim, self._owner[: self._used]
        near = self._probe_lists(query)
        if packed:
            return self._probed_matrix(query, near.tolist())
        probed = [self._probed(q, lists) for q, lists in zip(query, near.tolist())]
        # One (query nodes x longest) matrix: padding has no similarity and no group.
        width = max(len(sims) for sims, _ in probed)
        sim = np.full((len(probed), width), -np.inf, dtype=np.float32)
        owner = np.full((len(probed), width), -1, dtype=np.int64)
        for k, (sims, owners) in enumerate(probed):
            sim[k, : len(sims)], owner[k, : len(owners)] = sims, owners
        return sim, owner

    def _probe_lists(self, query: np.ndarray) -> np.ndarray:
        """int (K, probes): the inverted lists each query node searches (centroids nearest)."""
        probes = min(self.ivf.probes, len(self._centroids))
        return np.argpartition(-(query @ self._centroids.T), probes - 1, axis=1)[:, :probes]

    def read_ahead(self, queries: Sequence[np.ndarray]) -> None:
        """Search the inverted file now for the next ``queries`` (sector arrays as ``candidates``
        gets them), each probed list read once for all of them: its products with every query
        node that probes it are one stacked ``np.matmul`` (each item the matrix-vector product
        ``_probed_matrix``'s ``np.dot`` makes: the same bits), laid out as ``_probed_matrix``
        lays them out. ``candidates`` of one of these queries then takes its matrix from here,
        computing again only the probes of lists written since (``_probed_ahead``): a probe is
        bound by reading its list from memory, and a batch's queries probe many lists alike.
        Replaces what was read ahead before; a no-op on exact search."""
        self._ahead = {}
        queries = [sectors for sectors in queries if len(sectors)]
        if self._centroids is None or not queries:
            return
        descs = [node_descriptors(sectors, self.dim) for sectors in queries]
        nears = [self._probe_lists(query) for query in descs]
        probed = np.concatenate(nears).ravel()  # probes in (query, node, probe) order
        lists, pair = np.unique(probed, return_inverse=True)
        pair = pair.ravel()
        layouts = [self._list_layout(lst) for lst in lists.tolist()]
        sizes = np.array([len(rows) for _, _, rows, _ in layouts], dtype=np.int64)
        values, segment = self._read_lists(layouts, sizes, np.concatenate(descs), pair, nears[0].shape[1])
        trained = np.array([hi - lo for lo, hi, _, _ in layouts], dtype=np.int64)[pair]
        size = sizes[pair]
        at = 0
        for sectors, query, near in zip(queries, descs, nears):
            probes = slice(at, at + near.size)
            self._ahead[_query_key(sectors)] = self._laid_out(
                query, near, values, *(a[probes].reshape(near.shape) for a in (segment, size, trained)),
                [layouts[i][2] for i in pair[probes].tolist()])
            at += near.size

    def _read_lists(self, layouts: list[tuple], sizes: np.ndarray, nodes: np.ndarray, pair: np.ndarray,
                    per_node: int) -> tuple[np.ndarray, np.ndarray]:
        """Every probe's products (its list's trained block, then added rows) in one buffer, list
        by list (``pair``: each probe's index in ``layouts``; ``sizes``: each list's rows): the
        buffer and each probe's start."""
        by_list = np.argsort(pair, kind="stable")
        counts = np.bincount(pair, minlength=len(layouts))
        bounds = np.concatenate([[0], np.cumsum(np.repeat(sizes, counts))])
        segment = np.empty(len(pair), dtype=np.int64)
        segment[by_list] = bounds[:-1]
        values = np.empty(int(bounds[-1]), dtype=np.float32)
        matmul, desc, first = np.matmul, self._desc, 0
        for (lo, hi, rows, added), count in zip(layouts, counts.tolist()):
            last = first + count
            block = values[bounds[first]: bounds[last]].reshape(count, len(rows))
            probing = nodes[by_list[first:last] // per_node][:, :, None]
            matmul(desc[lo:hi], probing, out=block[:, : hi - lo, None])
            if added is not None:
                matmul(added, probing, out=block[:, hi - lo:, None])
            first = last
        return values, segment

    def _laid_out(self, query: np.ndarray, near: np.ndarray, values: np.ndarray, segment: np.ndarray,
                  size: np.ndarray, trained: np.ndarray, rows_of: list[np.ndarray]) -> "_ReadAhead":
        """One query's probes read ahead (per probe: its start in ``values``, its size, its trained
        rows, its list's index rows), as ``_probed_matrix`` lays them out: each node's row holds
        its probes side by side, each a list's trained block then its added rows."""
        n_nodes, per_node = near.shape
        row_len = size.sum(axis=1)
        sim = np.full((n_nodes, int(row_len.max())), -np.inf, dtype=np.float32)
        rows = np.full(sim.shape, -1, dtype=np.int32)
        starts, sizes = segment.tolist(), size.tolist()
        for k, n in enumerate(row_len.tolist()):
            sim[k, :n] = np.concatenate([values[a: a + b] for a, b in zip(starts[k], sizes[k])])
            rows[k, :n] = np.concatenate(rows_of[k * per_node: (k + 1) * per_node])
        return _ReadAhead(query, near, sim, rows, np.cumsum(size, axis=1) - size, trained, size - trained,
                          self._trained_writes[near], self._added_writes[near])

    def _probed_ahead(self, ahead: "_ReadAhead") -> tuple[np.ndarray, np.ndarray]:
        """``_probed_matrix`` of a query read ahead: its matrix, with the probes of lists written
        since computed again (a trained block: in place; added rows: blanked, and their products
        now in columns after the others, where the votes read them alike) and every row's group
        as it is now."""
        sim, rows, near, query = ahead.sim, ahead.rows, ahead.near, ahead.query
        for k, j in zip(*np.nonzero(self._trained_writes[near] != ahead.trained_writes)):
            lo, hi, at = self._bounds[near[k, j]], self._bounds[near[k, j] + 1], ahead.column[k, j]
            np.dot(self._desc[lo:hi], query[k], out=sim[k, at: at + hi - lo])
        moved = np.nonzero(self._added_writes[near] != ahead.added_writes)
        if len(moved[0]):
            fresh: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(len(near))]
            for k, j in zip(*moved):
                at = ahead.column[k, j] + ahead.trained[k, j]
                sim[k, at: at + ahead.added[k, j]] = -np.inf
                rows[k, at: at + ahead.added[k, j]] = -1
                lo, hi, list_rows, added = self._list_layout(near[k, j])
                if added is not None:
                    fresh[k].append((np.dot(added, query[k]), list_rows[hi - lo:]))
            width = max(sum(len(r) for _, r in node) for node in fresh)
            more_sim = np.full((len(near), width), -np.inf, dtype=np.float32)
            more_rows = np.full((len(near), width), -1, dtype=np.int32)
            for k, node in enumerate(fresh):
                if node:
                    n = sum(len(r) for _, r in node)
                    more_sim[k, :n] = np.concatenate([s for s, _ in node])
                    more_rows[k, :n] = np.concatenate([r for _, r in node])
            sim, rows = np.concatenate([sim, more_sim], axis=1), np.concatenate([rows, more_rows], axis=1)
        owner = self._owner[rows]
        owner[rows < 0] = -1
        return sim, owner

    def _probed_matrix(self, query: np.ndarray, near: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """``_probed`` of every query node, laid out as ``_similarities`` pads them: each list's
        matrix-vector products (its trained block's, then its added rows') written into their
        place (``out=``: the same products as ``_probed``'s), and each node's groups gathered
        once. What is left is mostly the products' reading of every probed descriptor."""
        layout = {lst: self._list_layout(lst) for lst in {lst for lists in near for lst in lists}}
        width = max(sum(len(layout[lst][2]) for lst in lists) for lists in near)
        sim = np.full((len(near), width), -np.inf, dtype=np.float32)
        owner = np.full((len(near), width), -1, dtype=np.int64)
        desc, dot = self._desc, np.dot
        for q, lists, sim_row, owner_row in zip(query, near, sim, owner):
            at = 0
            for lst in lists:
                lo, hi, rows, added = layout[lst]
                dot(desc[lo:hi], q, out=sim_row[at: at + hi - lo])
                if added is not None:
                    dot(added, q, out=sim_row[at + hi - lo: at + len(rows)])
                at += len(rows)
            owner_row[:at] = self._owner[np.concatenate([layout[lst][2] for lst in lists])]
        return sim, owner

    def _list_layout(self, lst: int) -> tuple[int, int, np.ndarray, np.ndarray | None]:
        """List ``lst`` as ``_probed`` reads it: its trained block [lo, hi), its rows (the block's,
        then those added since) and the added rows' descriptors gathered as ``_probed`` gathers
        them (None: none added); kept until the list or one of its added rows changes."""
        added = self._extra[lst] if self._extra else []
        layout = self._layouts.get(lst)
        if layout is None or len(layout[2]) != layout[1] - layout[0] + len(added):
            lo, hi = self._bounds[lst], self._bounds[lst + 1]
            extra = np.asarray(added, dtype=np.int64)
            layout = self._layouts[lst] = (lo, hi, np.concatenate([np.arange(lo, hi), extra]),
                                           self._desc[extra] if len(extra) else None)
        return layout


@dataclass
class _ReadAhead:
    """A query's probes read ahead (``NodeIndex.read_ahead``): its node descriptors (K, D) and
    probed lists (K, P); its similarity matrix and each entry's index row (-1: none) as
    ``_probed_matrix`` lays them out; per probe its first column, trained-block and added-row
    counts; and its lists' write counts then."""

    query: np.ndarray
    near: np.ndarray
    sim: np.ndarray
    rows: np.ndarray
    column: np.ndarray
    trained: np.ndarray
    added: np.ndarray
    trained_writes: np.ndarray
    added_writes: np.ndarray


def _query_key(sectors: np.ndarray) -> bytes:
    """What identifies a query read ahead: its sector labels, with their shape."""
    sectors = np.asarray(sectors, dtype=np.int16)
    return len(sectors).to_bytes(4, "little") + sectors.tobytes()


def _votes(sim: np.ndarray, owner: np.ndarray, neighbours: int) -> list[dict[int, float]]:
    """Per row of ``sim`` (query nodes x indexed nodes; -inf: no node there): the best vote for
    each group among the row's ``neighbours`` most similar nodes (see ``NodeIndex.candidates``).
    ``owner`` holds the indexed nodes' groups (-1: none), per column or per entry."""
    groups, weights = _top_votes(sim, owner, neighbours)
    votes = []
    for q_owners, q_weights in zip(groups.tolist(), weights.tolist()):
        best: dict[int, float] = {}
        for g, w in zip(q_owners, q_weights):
            if g >= 0 and w > best.get(g, 0.0):
                best[g] = w
        votes.append(best)
    return votes


def _ranked(groups: np.ndarray, weights: np.ndarray, n: int) -> list[int]:
    """``rank_votes(_votes(...), n)`` from ``_top_votes``' arrays without a dict per query node,
    to the bit: each group's votes (its best per query node) are summed in float64 in query
    node order, as ``rank_votes`` adds them."""
    _, groups, weights = _best_votes(groups, weights)
    return _top_summed(groups, weights, n)


def _best_votes(groups: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_top_votes``' arrays as flat (query node, group, vote) triples, ordered by node then
    group: each group's best vote from each node (float64), as ``_votes`` keeps them."""
    return _best_of(*_cast_votes(groups, weights))


def _cast_votes(groups: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_top_votes``' arrays as flat (query node, group, vote float64) triples, node by node,
    without the neighbours that cast none (no group, or a vote of 0)."""
    rows = np.broadcast_to(np.arange(len(groups))[:, None], groups.shape).ravel()
    groups, weights = groups.ravel(), weights.ravel().astype(np.float64)
    keep = (groups >= 0) & (weights > 0)
    return rows[keep], groups[keep], weights[keep]


def _best_of(rows: np.ndarray, groups: np.ndarray,
             weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of (query node, group, vote) triples, each (node, group)'s best vote, ordered by node then
    group (the triples' order does not matter: equal keys give equal values)."""
    # The best vote of each (query node, group): sorted by node, group, vote descending.
    order = np.lexsort((-weights, groups, rows))
    rows, groups, weights = rows[order], groups[order], weights[order]
    first = np.ones(len(rows), dtype=bool)
    first[1:] = (rows[1:] != rows[:-1]) | (groups[1:] != groups[:-1])
    return rows[first], groups[first], weights[first]


def _positive_votes(sim: np.ndarray, owner: np.ndarray,
                    neighbours: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_cast_votes(*_top_votes(...))`` up to the triples' order, to the bit, without finding
    the neighbours.

    A neighbour's vote is sqrt(s - max(s_next, 0)), s_next the row's (neighbours + 1)-th largest
    similarity, which is a value whichever tied nodes hold it. A vote is above zero exactly
    when s > max(s_next, 0), and at most ``neighbours`` nodes are above s_next: so the voters
    are the nodes above that floor, whichever of several tied nodes ``_top_votes``' partial
    sort would have ranked first. The floor is found on a strided sample first (its
    (neighbours + 1)-th largest bounds it from below), then among the nodes above that bound.
    """
    total = sim.shape[1]
    m = min(neighbours, total)
    if m == total:  # every node is a neighbour: nothing to find
        return _cast_votes(*_top_votes(sim, owner, neighbours))
    # A sample of 1 in sqrt(total / (m + 1)) balances the two partitions' sizes.
    stride = int(math.sqrt(total / (m + 1)))
    if stride < 2:
        floors = np.partition(sim, total - m - 1, axis=1)[:, total - m - 1]
        base = np.maximum(floors, 0.0)
        rows, cols = np.nonzero(sim > base[:, None])
    else:
        sample = sim[:, ::stride]
        lows = np.partition(sample, sample.shape[1] - m - 1, axis=1)[:, sample.shape[1] - m - 1]
        base = np.empty(len(sim), dtype=sim.dtype)
        voters = []
        for k, (row, low) in enumerate(zip(sim, lows)):
            near = np.flatnonzero(row >= low)  # holds the row's m + 1 largest, ties included
            values = row[near]
            base[k] = max(np.partition(values, len(near) - m - 1)[len(near) - m - 1], 0.0)
            voters.append(near[values > base[k]])
        rows = np.repeat(np.arange(len(sim)), [len(v) for v in voters])
        cols = np.concatenate(voters)
    sims = sim[rows, cols]
    weights = np.sqrt(np.maximum(sims - base[rows], 0.0)).astype(np.float64)
    groups = owner[cols] if owner.ndim == 1 else owner[rows, cols]
    keep = groups >= 0
    return rows[keep], groups[keep], weights[keep]


def _top_summed(groups: np.ndarray, weights: np.ndarray, n: int) -> list[int]:
    """The ``n`` groups with the largest sums of their ``weights``, best first (ties: lower id).
    ``np.bincount`` adds each group's weights in float64 in the order given, as ``rank_votes``
    does node by node."""
    ids, dense = np.unique(groups, return_inverse=True)
    scores = np.bincount(dense, weights=weights, minlength=len(ids))
    return ids[np.lexsort((ids, -scores))[:n]].tolist()


def _top_votes(sim: np.ndarray, owner: np.ndarray, neighbours: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``sim``: the groups of its ``neighbours`` most similar nodes and their votes
    (sqrt of the margin over the next node), (rows, m) each; see ``_votes``."""
    total = sim.shape[1]
    if total == 0:
        return np.zeros((len(sim), 0), np.int64), np.zeros((len(sim), 0), np.float32)
    m = min(neighbours, total)
    if m < total:
        # The m + 1 largest per row (partitioning ``sim`` itself: no negated copy).
        top = np.argpartition(sim, total - m - 1, axis=1)[:, total - m - 1:]
        sims = np.take_along_axis(sim, top, axis=1)
        order = np.argsort(-sims, axis=1)
        top, sims = np.take_along_axis(top, order, 1), np.take_along_axis(sims, order, 1)
        # Similarities are >= 0: a row with no (m + 1)-th node measures its margin from 0.
        weights = np.sqrt(np.maximum(sims[:, :m] - np.maximum(sims[:, m:], 0.0), 0.0))
        top = top[:, :m]
    else:
        top = np.broadcast_to(np.arange(total), sim.shape)
        weights = np.sqrt(np.maximum(sim, 0.0))
    groups = owner[top] if owner.ndim == 1 else np.take_along_axis(owner, top, axis=1)
    return groups, weights


def rank_votes(votes: Iterable[dict[int, float]], n: int) -> list[int]:
    """The ``n`` groups with the largest summed node votes, best first (ties: lower id)."""
    scores: dict[int, float] = {}
    for best in votes:
        for g, w in best.items():
            scores[g] = scores.get(g, 0.0) + w
    ranked = sorted(scores.items(), key=lambda gw: (-gw[1], gw[0]))
    return [g for g, _ in ranked[:n]]


def rank_vote_arrays(votes: Sequence[tuple[np.ndarray, np.ndarray]], n: int) -> list[int]:
    """``rank_votes`` of ``NodeIndex.node_vote_arrays``' votes, to the bit."""
    if not votes:
        return []
    return _top_summed(np.concatenate([g for g, _ in votes]), np.concatenate([w for _, w in votes]), n)
