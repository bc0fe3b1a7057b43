"""ObjectNav metrics as habitat-lab defines them (``habitat/tasks/nav/nav.py``).

* ``distance_to_goal`` (DTG): geodesic distance (m) from the agent to the nearest success
  position. Habitat's ObjectNav measures it to the goals' view points, the navigable points
  within the success distance of the object; here the goal region (``geodesic.goal_region``)
  plays that part, so DTG is 0 inside it.
* ``success``: the agent called STOP, within the step budget (500 actions, TrajRAG paper; the STOP
  itself is one of them, as in habitat's ``Env.step``), while its distance to goal is under the
  success tolerance (0.1 m, habitat's ``success_distance`` to the view points): in the goal region
  (= within 1.0 m of a goal object) or a cell or two outside it.
* ``spl``: ``success * l / max(l, p)`` with ``l`` the episode's ``info["geodesic_distance"]`` and
  ``p`` the length of the path actually travelled (sum of the displacements between consecutive
  poses; turns and blocked moves add nothing), as habitat-lab's SPL measure.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import numpy as np

from trajrag.world.geodesic import GoalField


@dataclass
class EpisodeMetrics:
    """One finished episode. Distances in metres; ``steps`` counts actions including STOP."""

    episode_id: str
    scene_key: str
    category: str
    success: bool
    spl: float
    distance_to_goal: float
    path_length: float
    geodesic_distance: float
    steps: int
    collisions: int
    called_stop: bool

    def to_dict(self) -> dict:
        return asdict(self)


def is_success(called_stop: bool, in_goal_region: bool, distance_to_goal: float, tolerance_m: float,
               steps: int, max_steps: int) -> bool:
    """habitat-lab Success: STOP called within ``max_steps`` actions, in the goal region or less
    than ``tolerance_m`` (geodesic metres) from it."""
    near = in_goal_region or distance_to_goal < tolerance_m
    return bool(called_stop and near and steps <= max_steps)


def spl(success: bool, shortest_m: float, path_length_m: float) -> float:
    """habitat-lab SPL: ``success * l / max(l, p)`` (1.0 for a successful episode with l = p = 0)."""
    if not success:
        return 0.0
    denominator = max(shortest_m, path_length_m)
    return 1.0 if denominator <= 0.0 else float(shortest_m / denominator)


def path_length(xys: Sequence[Sequence[float]] | np.ndarray) -> float:
    """Sum of the Euclidean displacements (m) between consecutive map-frame positions."""
    xy = np.asarray(xys, dtype=np.float64).reshape(-1, 2)
    if len(xy) < 2:
        return 0.0
    return float(np.linalg.norm(np.diff(xy, axis=0), axis=1).sum())


def episode_metrics(*, episode_id: str, scene_key: str, category: str, goal: GoalField,
                    final_cell: Sequence[int], geodesic_distance: float, travelled_m: float,
                    steps: int, collisions: int, called_stop: bool, max_steps: int,
                    success_tolerance_m: float) -> EpisodeMetrics:
    """Metrics of one episode from its outcome.

    goal: the (scene, category) goal field. final_cell: ``(row, col)`` where the agent ended.
    geodesic_distance: the episode's ``info["geodesic_distance"]`` (m). travelled_m: path length
    actually travelled (m). success_tolerance_m: geodesic metres outside the goal region that
    still count as success (``configs/episodes.yaml``).
    """
    dtg = goal.cell_distance(final_cell)
    r, c = int(final_cell[0]), int(final_cell[1])
    h, w = goal.region.shape
    inside = bool(0 <= r < h and 0 <= c < w and goal.region[r, c])
    ok = is_success(called_stop, inside, dtg, success_tolerance_m, steps, max_steps)
    return EpisodeMetrics(
        episode_id=episode_id,
        scene_key=scene_key,
        category=category,
        success=ok,
        spl=spl(ok, geodesic_distance, travelled_m),
        distance_to_goal=dtg,
        path_length=float(travelled_m),
        geodesic_distance=float(geodesic_distance),
        steps=int(steps),
        collisions=int(collisions),
        called_stop=bool(called_stop),
    )


def _means(items: Iterable[EpisodeMetrics]) -> dict:
    items = list(items)
    dtg = [m.distance_to_goal for m in items if math.isfinite(m.distance_to_goal)]
    return {
        "episodes": len(items),
        "sr": float(np.mean([m.success for m in items])) if items else float("nan"),
        "spl": float(np.mean([m.spl for m in items])) if items else float("nan"),
        "dtg_m": float(np.mean(dtg)) if dtg else float("nan"),
    }


def summarize(metrics: Sequence[EpisodeMetrics]) -> dict:
    """Means over episodes: ``episodes``, ``sr``, ``spl``, ``dtg_m`` (over finite DTGs), also
    ``path_length_m``, ``steps``, ``collisions``, ``dtg_unreachable`` (episodes ending where no
    goal can be reached) and the same four main keys per category in ``per_category``."""
    out = _means(metrics)
    out["path_length_m"] = float(np.mean([m.path_length for m in metrics])) if metrics else float("nan")
    out["steps"] = float(np.mean([m.steps for m in metrics])) if metrics else float("nan")
    out["collisions"] = float(np.mean([m.collisions for m in metrics])) if metrics else float("nan")
    out["dtg_unreachable"] = sum(not math.isfinite(m.distance_to_goal) for m in metrics)
    groups: dict[str, list[EpisodeMetrics]] = defaultdict(list)
    for m in metrics:
        groups[m.category].append(m)
    out["per_category"] = {name: _means(group) for name, group in sorted(groups.items())}
    return out
