"""The natural-language experience L(T_tp) of a topo-polar trajectory, for the planner's prompt.

One short sentence per node, in the agent's frame at that node: the agent faces the next node
(the last node keeps the previous direction; a single node keeps the reference heading). The
12 sectors fall into four quarters around that heading (ahead, left, right, behind; 90 degrees
each, left = counter-clockwise seen from above, as positive yaw). A quarter is named by the
objects its rays hit, else ``open`` if any of its rays is free within the ray radius (open
space, a doorway, the corridor going on), else ``wall`` if any hit an obstacle, else
``unexplored``. "Behind" is only mentioned when
it holds an object (it is where the agent came from). Then the turn taken at the node and the
distance to the next node, and at the end whether the goal was reached. Example::

    Goal: bed. Node 1: open ahead, wall on the left, chair on the right; turn left, 2.1 m.
    Node 2: wall ahead, bed on the left, open on the right. Bed reached.
"""

from __future__ import annotations

import math

import numpy as np

from trajrag.topo.labels import FREE, OBSTACLE, UNKNOWN
from trajrag.topo.trajectory import TopoPolarTrajectory

QUARTERS = ("ahead", "left", "behind", "right")  # counter-clockwise from the heading
_PHRASE = {"ahead": "{} ahead", "left": "{} on the left", "right": "{} on the right", "behind": "{} behind"}
_PLAIN = {FREE: "open", OBSTACLE: "wall", UNKNOWN: "unexplored"}
_TURNS = ("go straight", "turn left", "turn back", "turn right")  # same quarters, for a turn angle


def wrap(angle: np.ndarray | float) -> np.ndarray | float:
    """Angles wrapped to [-pi, pi)."""
    return (np.asarray(angle) + math.pi) % (2 * math.pi) - math.pi


def quarter_index(relative: np.ndarray | float) -> np.ndarray:
    """0 ahead, 1 left, 2 behind, 3 right for angles relative to the heading (radians, CCW positive).

    Quarters are half-open 90-degree intervals centred on 0, 90, 180, 270 degrees; angles are
    rounded to 1e-9 rad first so that a sector exactly on a boundary always falls the same way.
    """
    rel = np.round(np.asarray(wrap(relative), dtype=float) + math.pi / 4, 9)
    return (np.floor(rel / (math.pi / 2)).astype(int)) % 4


def node_headings(traj: TopoPolarTrajectory) -> np.ndarray:
    """Heading (radians) at each node: towards the next node; the last keeps the previous one."""
    if len(traj) < 2:
        return np.full(len(traj), traj.reference_yaw)
    legs = np.diff(traj.node_xy, axis=0)
    out = np.arctan2(legs[:, 1], legs[:, 0])
    return np.concatenate([out, out[-1:]])


def sector_angles(traj: TopoPolarTrajectory) -> np.ndarray:
    """Map-frame direction (radians) of each sector: reference + 90 deg + i * 360 / n."""
    n = traj.n_sectors
    return traj.reference_yaw + math.pi / 2 + np.arange(n) * (2 * math.pi / n)


def _quarter_phrase(labels: list[int], categories: tuple[str, ...]) -> str:
    """Objects hit in this quarter (in ray order), else open / wall / unexplored, in that priority."""
    objects = [categories[c].replace("_", " ") for c in labels if c >= 0]
    if objects:
        return " and ".join(dict.fromkeys(objects))
    for code in (FREE, OBSTACLE, UNKNOWN):  # one free ray makes a way through: "open"
        if code in labels:
            return _PLAIN[code]
    raise ValueError(f"sector labels {labels} hold no known code")


def node_surroundings(traj: TopoPolarTrajectory, k: int, heading: float) -> str:
    """"bed on the left, open ahead, ..." for node ``k`` seen facing ``heading`` (radians)."""
    quarters = quarter_index(sector_angles(traj) - heading)
    return _surroundings(np.asarray(traj.sectors[k]).tolist(), quarters.tolist(), traj.categories)


def _surroundings(labels: list[int], quarters: list[int], categories: tuple[str, ...]) -> str:
    """``node_surroundings`` of one node's sector ``labels`` given each sector's quarter."""
    in_quarter: tuple[list[int], ...] = ([], [], [], [])
    for label, at in zip(labels, quarters):
        in_quarter[at].append(label)
    parts = []
    for q in (0, 1, 3, 2):  # ahead, left, right, behind
        seen = in_quarter[q]
        if not seen:
            continue
        if QUARTERS[q] == "behind" and not any(label >= 0 for label in seen):
            continue
        parts.append(_PHRASE[QUARTERS[q]].format(_quarter_phrase(seen, categories)))
    return ", ".join(parts)


def describe(traj: TopoPolarTrajectory) -> str:
    """L(T_tp): a compact description, one sentence per node (distances in metres, one decimal).

    The quarters of every node's sectors and every turn are found in one array each (the same
    element-wise arithmetic as ``node_surroundings`` node by node, so the same text)."""
    headings = node_headings(traj)
    quarters = quarter_index(sector_angles(traj)[None, :] - headings[:, None])
    previous = np.concatenate([[traj.reference_yaw], headings[:-1]])
    turns = quarter_index(headings - previous)
    goal = traj.goal.replace("_", " ")
    sentences = [f"Goal: {goal}."]
    sectors, quarters = np.asarray(traj.sectors).tolist(), quarters.tolist()
    for k in range(len(traj)):
        text = f"Node {k + 1}: {_surroundings(sectors[k], quarters[k], traj.categories)}"
        if k + 1 < len(traj):
            dist = float(np.linalg.norm(traj.node_xy[k + 1] - traj.node_xy[k]))
            text += f"; {_TURNS[int(turns[k])]}, {dist:.1f} m"
        sentences.append(text + ".")
    sentences.append(f"{goal.capitalize()} reached." if traj.success else f"{goal.capitalize()} not reached.")
    return " ".join(sentences)
