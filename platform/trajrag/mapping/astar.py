"""Shortest grid paths for the local policy (the paper's A* step).

The search is skimage's Cython minimum-cost-path (``MCP_Geometric``: Dijkstra over the
8-connected grid with diagonal moves costing sqrt(2)), stopped as soon as the goal is settled. It
returns the same shortest paths as A* with an octile heuristic. Measured on a 400 x 400 grid of
random boxes: 12 ms against 10 ms for a heapq A* in Python when the goal is reachable, 17 ms
against 130 ms when it is not (both then flood the reachable area), so the Cython search wins
where it matters. Dijkstra settles every cell cheaper than the goal, so the cost grows with the
path length: callers bound it with a window (the explored bounding box + a margin). Typical
numbers (one core): 13 ms for a 12 m path in a procedural home, ~30-45 ms for a 20 m path across
a 20 m x 20 m explored map.
"""

from __future__ import annotations

import math

import numpy as np
from skimage.graph import MCP_Geometric

Cell = tuple[int, int]


def astar(
    grid: np.ndarray,
    start: Cell,
    goal: Cell,
    window: tuple[int, int, int, int] | None = None,
) -> list[Cell] | None:
    """Shortest 8-connected path from ``start`` to ``goal`` (both ``(row, col)``), or None.

    grid: bool (H, W) ``True`` = blocked, or float (H, W) per-cell traversal costs (> 0; ``inf``
        blocked); a move costs the mean of its two cells' costs times its length (1 or sqrt 2).
    window: ``(r0, r1, c0, c1)`` end-exclusive: search only inside it (it is grown to contain
        start and goal).
    Returns the cells from start to goal inclusive. The start cell is always enterable (the agent
    stands there); a blocked or out-of-bounds goal gives None.
    """
    h, w = grid.shape
    if not (0 <= goal[0] < h and 0 <= goal[1] < w) or not (0 <= start[0] < h and 0 <= start[1] < w):
        return None
    r0, r1, c0, c1 = _window(window, start, goal, (h, w))
    costs = _costs(grid[r0:r1, c0:c1])
    s = (start[0] - r0, start[1] - c0)
    g = (goal[0] - r0, goal[1] - c0)
    if not math.isfinite(costs[g]):
        return None
    costs[s] = 1.0 if not math.isfinite(costs[s]) else costs[s]
    if s == g:
        return [tuple(start)]
    mcp = MCP_Geometric(costs, fully_connected=True)
    cumulative, _ = mcp.find_costs([s], [g], find_all_ends=True)
    if not math.isfinite(cumulative[g]):
        return None
    return [(int(r) + r0, int(c) + c0) for r, c in mcp.traceback(g)]


def _window(
    window: tuple[int, int, int, int] | None, start: Cell, goal: Cell, shape: tuple[int, int]
) -> tuple[int, int, int, int]:
    if window is None:
        return 0, shape[0], 0, shape[1]
    r0, r1, c0, c1 = window
    r0 = max(min(r0, start[0], goal[0]), 0)
    r1 = min(max(r1, start[0] + 1, goal[0] + 1), shape[0])
    c0 = max(min(c0, start[1], goal[1]), 0)
    c1 = min(max(c1, start[1] + 1, goal[1] + 1), shape[1])
    return r0, r1, c0, c1


def _costs(grid: np.ndarray) -> np.ndarray:
    """float64 costs: 1 per free cell and ``inf`` for blocked ones (bool), or the given costs."""
    if grid.dtype == np.bool_:
        return np.where(grid, np.inf, 1.0)
    costs = np.array(grid, dtype=np.float64)
    if np.any(costs <= 0):
        raise ValueError("astar: costs must be > 0 (use inf for blocked cells)")
    return costs


def path_length(path: list[Cell], cell_size: float) -> float:
    """Length in metres of a cell path (axial steps 1 cell, diagonal sqrt 2)."""
    if len(path) < 2:
        return 0.0
    steps = np.abs(np.diff(np.asarray(path), axis=0))
    return float(np.sum(np.where(steps.sum(axis=1) == 2, math.sqrt(2.0), 1.0)) * cell_size)
