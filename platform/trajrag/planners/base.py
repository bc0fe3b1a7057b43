"""The planner interface: given the candidate paths of one decision, pick one.

Every planner (nearest frontier, random frontier, the retrieval-scoring TrajRAG planner, the LLM
planner) implements ``Planner``; the navigation loop (``agent/navigator.py``) calls ``choose`` when
the agent reaches a new topo node, reaches its waypoint or finds it unreachable (paper Sec. 3.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

import numpy as np

from trajrag.mapping.frontiers import Frontier
from trajrag.mapping.semantic_map import SemanticMap
from trajrag.topo.candidates import CandidatePath
from trajrag.topo.trajectory import TopoPolarTrajectory
from trajrag.world.frames import Pose2D


@dataclass
class PlannerContext:
    """Everything a planner may read at one decision.

    goal: goal category name. step: actions taken so far. pose: map-frame pose (m, rad).
    trajectory: the topo-polar trajectory walked so far. candidates: one per valid frontier
    (non-empty). frontiers: all frontiers of the current map (``candidates[i].frontier_index``
    indexes them). frontier_distances: float (F,) geodesic metres from the agent to each
    frontier over the explored free space (``inf`` if none). current_waypoint: the map-frame
    target of the previous decision (None at the first).
    """

    goal: str
    step: int
    pose: Pose2D
    sem_map: SemanticMap
    trajectory: TopoPolarTrajectory
    candidates: Sequence[CandidatePath]
    frontiers: Sequence[Frontier]
    frontier_distances: np.ndarray
    current_waypoint: Optional[np.ndarray] = None


class Planner(Protocol):
    """Chooses a candidate path; ``choose`` returns an index into ``ctx.candidates``."""

    name: str

    def reset(self, goal: str, seed: int) -> None: ...

    def choose(self, ctx: PlannerContext) -> int: ...
