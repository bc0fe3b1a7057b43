"""What the retriever returns and the search backend it runs the fine stage on.

Kept apart from ``retriever.py`` so planners and benchmarks can import these records without
loading LanceDB or torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np


@dataclass
class Experience:
    """One retrieved chunk (a past topo-polar trajectory) for one candidate path.

    similarity: cosine similarity of the fine stage (query z vs the chunk's z), in [-1, 1].
    coarse_score: the inlier ratio of the chunk's group in the coarse stage (0 without it).
    sectors: int (K, 12) sector labels in the store's label ids (``names`` maps them).
    node_xy: float (K, 2) node positions, metres, in the chunk's own frame.
    """

    trajectory_id: str
    group_id: int
    goal: str
    success: bool
    similarity: float
    coarse_score: float
    description: str
    scene_hint: str = ""
    sectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 12), dtype=np.int16))
    node_xy: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))


@dataclass
class DecisionRetrieval:
    """The retrieval of one decision: ``experiences[i]`` belongs to candidate ``i``, best first.

    names: store label id -> category name (for reading ``Experience.sectors``).
    coarse_ms / fine_ms: wall time of each stage for the whole decision (all candidates);
    encode_ms: the part of ``fine_ms`` spent embedding the candidates (the rest is the search).
    goal_points: float (P, 2) map-frame metres where past walks through the matched place found
    the goal (``retrieval.project_goal``); None when not computed, empty when none.
    """

    experiences: list[list[Experience]]
    names: dict[int, str]
    coarse_ms: float = 0.0
    fine_ms: float = 0.0
    goal_points: np.ndarray | None = None
    encode_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return self.coarse_ms + self.fine_ms


class ChunkSearch(Protocol):
    """The fine stage's vector search over chunk embeddings (exact in memory, or an ANN index).

    ``search`` takes unit-norm queries float32 (Q, D) and, per query, the row ids it may return
    (``None``: any row), and returns per query the top ``k`` ``(row, cosine)`` pairs, best first.
    Rows index the chunk table as the retriever loaded it.
    """

    def search(self, queries: np.ndarray, allowed: Sequence[np.ndarray | None], k: int) -> list[list[tuple[int, float]]]: ...
