"""A group's topo-polar summary and how nodes fold into it (the paper's merge, and our fusion of
two groups), with its row in the summaries table.

A summary lives in its group's frame (metres, radians, store label ids). A trajectory that
merges (``memory.grouping``) and a group fused into another both come in as nodes already moved
into that frame and sectors rotated into its sector frame; ``fold_nodes`` then averages the
nodes that land on a summary node, fills that node's ``UNKNOWN`` sectors, and appends the rest as
new nodes with their edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from trajrag.memory.matching import N_SECTORS, MatchResult, closest_pairs
from trajrag.memory.schema import utc_now
from trajrag.topo.labels import UNKNOWN

# The summaries-table columns a writer loads (``summary_from_row``).
SUMMARY_COLUMNS = ["group_id", "node_xy", "sectors", "node_count", "edges", "reference_yaw",
                   "n_members", "scene_hints", "goals"]


@dataclass
class Summary:
    """A group's topo-polar summary in the group frame (metres, radians, store label ids)."""

    group_id: int
    node_xy: np.ndarray  # (N, 2) float64
    sectors: np.ndarray  # (N, 12) int16
    node_count: np.ndarray  # (N,) int32
    edges: set[tuple[int, int]]
    reference_yaw: float
    n_members: int
    scene_hints: list[str]
    goals: list[str]

    @property
    def n_nodes(self) -> int:
        return len(self.node_xy)


@dataclass
class Member:
    """A chunk of a group: its walked nodes as summary node ids, in order and as a set."""

    trajectory_id: str
    seq: tuple[int, ...]
    nodes: frozenset[int]


def is_subsequence(short: Sequence[int], long: Sequence[int]) -> bool:
    """``short`` appears in ``long`` in the same order (not necessarily contiguous)."""
    it = iter(long)
    return all(x in it for x in short)


def collapse_repeats(seq: Iterable[int]) -> tuple[int, ...]:
    """Drop consecutive repeats (two trajectory nodes fused into one summary node)."""
    out: list[int] = []
    for x in seq:
        if not out or out[-1] != x:
            out.append(int(x))
    return tuple(out)


def map_nodes(moved: np.ndarray, summary: Summary, result: MatchResult,
              merge_radius_m: float) -> np.ndarray:
    """Summary node id for each matched node (-1: a new node). ``moved``: the matched nodes in the
    group frame (metres). Inlier pairs first (the closest pair of each node), then the nearest
    summary node within ``merge_radius_m``."""
    mapping = np.full(len(moved), -1, dtype=np.int64)
    for i, j in closest_pairs(result.pairs[result.inliers], moved, summary.node_xy).items():
        mapping[i] = j
    rest = np.where(mapping < 0)[0]
    if len(rest):
        d = np.linalg.norm(moved[rest, None, :] - summary.node_xy[None, :, :], axis=2)
        nearest = d.argmin(axis=1)
        close = d[np.arange(len(rest)), nearest] <= merge_radius_m
        mapping[rest[close]] = nearest[close]
    return mapping


def fold_nodes(summary: Summary, node_map: np.ndarray, moved: np.ndarray, rotated: np.ndarray,
               counts: np.ndarray, edges: Iterable[Sequence[int]]) -> int:
    """Fold nodes into ``summary``; returns how many became new summary nodes.

    ``node_map``: each node's summary node (-1: new), completed in place with the new nodes'
    ids. ``moved``: positions in the group frame (metres); ``rotated``: sectors in its sector
    frame; ``counts``: int32 observations each node stands for (1 for a trajectory's node, the
    node's own count for a fused summary's), the weight of its position in the running mean.
    ``edges``: node index pairs, added between their summary nodes."""
    new = np.where(node_map < 0)[0]
    node_map[new] = summary.n_nodes + np.arange(len(new))
    matched = np.where(node_map < summary.n_nodes)[0]
    # Nodes landing on one summary node fold in node order: the k-th of each in round k (the
    # arithmetic of one node at a time, a round of distinct summary nodes at once).
    targets = node_map[matched]
    order = np.argsort(targets, kind="stable")
    sorted_targets = targets[order]
    first = np.searchsorted(sorted_targets, sorted_targets)
    rank = np.empty(len(matched), dtype=np.int64)
    rank[order] = np.arange(len(matched)) - first
    for k in range(int(rank.max(initial=-1)) + 1):
        i = matched[rank == k]
        j, c, c_new = node_map[i], summary.node_count[node_map[i]], counts[i]
        summary.node_xy[j] = ((summary.node_xy[j] * c[:, None] + moved[i] * c_new[:, None])
                              / (c + c_new)[:, None])
        summary.node_count[j] = c + c_new
        unknown = summary.sectors[j] == UNKNOWN
        summary.sectors[j] = np.where(unknown, rotated[i], summary.sectors[j])
    summary.node_xy = np.concatenate([summary.node_xy, moved[new]])
    summary.sectors = np.concatenate([summary.sectors, rotated[new]])
    summary.node_count = np.concatenate([summary.node_count, counts[new]])
    for a, b in edges:
        u, v = int(node_map[a]), int(node_map[b])
        if u != v:
            summary.edges.add((min(u, v), max(u, v)))
    return len(new)


def summary_from_row(row: dict) -> Summary:
    """A summary from its ``SUMMARY_COLUMNS`` in the summaries table (members counted later)."""
    return Summary(
        group_id=int(row["group_id"]),
        node_xy=np.asarray(row["node_xy"], dtype=np.float64).reshape(-1, 2),
        sectors=np.asarray(row["sectors"], dtype=np.int16).reshape(-1, N_SECTORS),
        node_count=np.asarray(row["node_count"], dtype=np.int32),
        edges={(int(a), int(b)) for a, b in np.asarray(row["edges"], dtype=np.int64).reshape(-1, 2)},
        reference_yaw=float(row["reference_yaw"]), n_members=0,
        scene_hints=list(row["scene_hints"] or []), goals=list(row["goals"] or []))


def summary_row(s: Summary) -> dict:
    """The summaries-table row of ``s`` (the store sets its ``revision``)."""
    edges = np.asarray(sorted(s.edges), dtype=np.int32).reshape(-1, 2)
    return {
        "group_id": s.group_id, "n_nodes": s.n_nodes,
        "node_xy": s.node_xy.astype(np.float32).ravel(),
        "sectors": s.sectors.astype(np.int8).ravel(), "node_count": s.node_count,
        "edges": edges.ravel(), "reference_yaw": s.reference_yaw, "n_members": s.n_members,
        "scene_hints": s.scene_hints, "goals": s.goals,
        "node_embeddings": None,
        "updated_at": utc_now()}
