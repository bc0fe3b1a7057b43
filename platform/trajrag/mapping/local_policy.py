"""The local policy: shortest path to the planner's waypoint, followed with discrete actions.

Each ``act`` call (paper Sec. 3.3, "local policy"):

1. **Collisions.** A MOVE_FORWARD that displaced the agent by less than
   ``collision_move_fraction`` of a step hit something the map does not show (too low, too thin,
   or not yet seen). That heading is forbidden from that cell for the episode, and a small disk
   ``collision_mark_ahead_m`` in front of the pose is stamped into a collision layer in
   agent-centre space (not inflated, so a grazing contact does not close a doorway); the path is
   replanned. No displacement over ``stuck_window_steps`` steps is handled the same way. After
   ``max_recoveries`` such recoveries for one waypoint it is reported unreachable.
2. **Planning** on obstacles + the collision layer, inflated by ``inflation_radius_m`` (the agent
   radius), cells within ``clearance_margin_m`` more costing extra, with unknown cells free
   (optimistic, the usual choice for exploration) or blocked. The inflated ring around the
   agent's own position is cleared (a noisy wall hit must not trap it), and a waypoint inside
   the inflation moves to the nearest plannable cell within ``goal_snap_radius_m``. Replans when
   the waypoint moves, every ``replan_every_steps`` steps, when a newly mapped obstacle blocks
   the remaining path, or when the agent is more than ``off_path_m`` from it. The agent's own
   trail (every centre position it has occupied this episode, and the straight steps between
   them) is plannable: it was walked, so it is free, even where obstacles mapped later (chair
   legs, a table edge seen from the other side) inflate over the gap the agent came through;
   only a collision mark overrides it. Without it an agent that squeezed into a pocket can find
   every way out closed (the agent loop then retraces its exact moves, ``agent.navigator``).
3. **Following** on the action lattice: of the headings one or more turns away, take the one
   whose forward step lands lowest on the plan's cost-to-go field while staying clear of the
   inflated obstacles along the whole step; turn toward it, or MOVE_FORWARD once facing it. With
   12 headings and 0.25 m steps, aiming at a lookahead point cannot thread a doorway that is
   only a few cells wider than the agent: this can. Where no step makes progress, fall back to
   aiming at the path point ``lookahead_m`` ahead.

The policy never returns STOP: when the waypoint is reached or unreachable it returns no action
and says so; whether to STOP (goal found) or ask the planner again is the agent loop's call.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Sequence

import numpy as np

from skimage.graph import MCP_Geometric

from trajrag.mapping.astar import astar
from trajrag.mapping.semantic_map import SemanticMap, pose_values, dilate_disk
from trajrag.world.frames import Pose2D, wrap_angle
from trajrag.world.interface import Action


@dataclass
class PolicyConfig:
    """Local-policy parameters; units in the names (metres, steps)."""

    inflation_radius_m: float
    clearance_margin_m: float
    clearance_cost: float
    unknown_traversable: bool
    lookahead_m: float
    waypoint_radius_m: float
    goal_snap_radius_m: float
    replan_every_steps: int
    off_path_m: float
    window_margin_m: float
    field_margin_m: float
    collision_move_fraction: float
    collision_mark_ahead_m: float
    collision_mark_radius_m: float
    stuck_window_steps: int
    stuck_min_displacement_m: float
    max_recoveries: int


class PolicyStatus(str, Enum):
    """What the policy is doing (the agent loop reacts to REACHED and UNREACHABLE)."""

    FOLLOWING = "following"
    RECOVERING = "recovering"
    REACHED = "waypoint_reached"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class PolicyResult:
    """One decision.

    action: the action to send, or None when status is REACHED or UNREACHABLE.
    status: see ``PolicyStatus``.
    path_xy: float (K, 2) map-frame metres of the current plan from the agent on (empty if none).
    """

    action: Action | None
    status: PolicyStatus
    path_xy: np.ndarray


def validate_config(cfg: PolicyConfig) -> None:
    """``ValueError`` naming the key if a policy parameter is out of range."""
    for key in (
        "inflation_radius_m",
        "clearance_margin_m",
        "clearance_cost",
        "goal_snap_radius_m",
        "window_margin_m",
        "field_margin_m",
        "collision_mark_radius_m",
    ):
        if getattr(cfg, key) < 0:
            raise ValueError(f"policy.{key} must be >= 0, got {getattr(cfg, key)}")
    for key in ("lookahead_m", "waypoint_radius_m", "off_path_m", "collision_mark_ahead_m"):
        if getattr(cfg, key) <= 0:
            raise ValueError(f"policy.{key} must be > 0, got {getattr(cfg, key)}")
    for key in ("replan_every_steps", "stuck_window_steps", "max_recoveries"):
        if getattr(cfg, key) < 1:
            raise ValueError(f"policy.{key} must be >= 1, got {getattr(cfg, key)}")
    if not 0.0 < cfg.collision_move_fraction <= 1.0:
        raise ValueError(f"policy.collision_move_fraction must be in (0, 1], got {cfg.collision_move_fraction}")


class LocalPolicy:
    """Drives the agent to a map-frame waypoint with STOP-free discrete actions.

    forward_step_m / turn_angle_rad: the simulator's MOVE_FORWARD length (m) and TURN angle (rad)
    (habitat-lab objectnav: 0.25 m, 30 deg), taken from the simulator config by the caller.
    """

    def __init__(self, cfg: PolicyConfig, forward_step_m: float, turn_angle_rad: float) -> None:
        validate_config(cfg)
        if forward_step_m <= 0 or not 0 < turn_angle_rad < math.pi:
            raise ValueError(
                f"LocalPolicy: forward step {forward_step_m} m must be > 0 and turn angle "
                f"{turn_angle_rad} rad in (0, pi)"
            )
        self.cfg = cfg
        self.forward_step_m = forward_step_m
        self.turn_angle_rad = turn_angle_rad
        self.reset()

    def reset(self) -> None:
        """Forget the plan, the collision layer, the trail and the motion history (new episode),
        and plan with the configured inflation again."""
        self.inflation_m = self.cfg.inflation_radius_m
        self.collision: np.ndarray | None = None
        self.trail: np.ndarray | None = None  # cells the agent's centre has occupied
        self._trail_xy: np.ndarray | None = None
        self._map_frame: tuple | None = None
        self.forget_collisions()

    def narrow_inflation(self, inflation_m: float) -> None:
        """Plan with obstacles inflated by ``inflation_m`` (metres, below the configured radius)
        until the next ``reset``; the current plan is dropped."""
        if not 0 <= inflation_m < self.cfg.inflation_radius_m:
            raise ValueError(f"narrowed inflation {inflation_m} m must be in [0, "
                             f"{self.cfg.inflation_radius_m}) m (policy.inflation_radius_m)")
        self.inflation_m = inflation_m
        self._path = None

    def forget_collisions(self) -> None:
        """Forget the plan, the collision marks and blocked moves, keeping the trail: the agent
        loop's last resort when every waypoint failed (the marks may be what walls it in)."""
        if self.collision is not None:
            self.collision[:] = False
        self._path: np.ndarray | None = None  # (K, 2) cells
        self._field = np.zeros((0, 0))  # cost-to-go to the planned goal around the path (_field_box)
        self._blocked_moves: dict[tuple[int, int], set[float]] = {}  # cell -> headings that collided
        self._escape: float | None = None  # heading (rad) being turned to, to back out of a pocket
        self._escaped_from: set[tuple[int, int]] = set()  # cells backed out of (dead ends)
        self._field_origin = np.zeros(2, dtype=np.int64)
        self._waypoint: np.ndarray | None = None
        self._progress = 0
        self._since_plan = 0
        self._recoveries = 0
        self._last_xy: np.ndarray | None = None
        self._last_yaw = 0.0
        self._last_action: Action | None = None
        self._history: deque[np.ndarray] = deque(maxlen=self.cfg.stuck_window_steps + 1)

    # -- main entry -----------------------------------------------------------------------------
    def act(self, sem_map: SemanticMap, pose: Pose2D, waypoint_xy: np.ndarray) -> PolicyResult:
        """Next action toward ``waypoint_xy`` (map-frame metres) from ``pose`` on ``sem_map``."""
        x, y, yaw = pose_values(pose)
        xy = np.array([x, y])
        waypoint = np.asarray(waypoint_xy, dtype=np.float64).reshape(-1)
        if waypoint.shape != (2,) or not np.all(np.isfinite(waypoint)):
            raise ValueError(f"waypoint must be two finite metres (x, y), got {waypoint_xy!r}")
        self._ensure_layers(sem_map)
        self._extend_trail(sem_map, xy)
        new_waypoint = self._waypoint is None or np.linalg.norm(waypoint - self._waypoint) > sem_map.cell_size
        if new_waypoint:
            self._waypoint = waypoint
            self._recoveries = 0
            self._path = None
        recovering = self._detect_collision(sem_map, xy)
        self._history.append(xy)
        if recovering:
            self._recoveries += 1
            self._path = None
            if self._recoveries > self.cfg.max_recoveries:
                return self._finish(PolicyStatus.UNREACHABLE, sem_map)
        blocked, raw, window = self._grids(sem_map, xy, waypoint)
        if self._path is not None and np.linalg.norm(xy - sem_map.to_xy(self._path[-1])) <= self.cfg.waypoint_radius_m:
            return self._finish(PolicyStatus.REACHED, sem_map)
        if np.linalg.norm(xy - waypoint) <= self.cfg.waypoint_radius_m:
            return self._finish(PolicyStatus.REACHED, sem_map)
        if self._needs_replan(sem_map, xy, blocked):
            if not self._plan(sem_map, xy, waypoint, blocked, raw, window):
                return self._finish(PolicyStatus.UNREACHABLE, sem_map)
            if np.linalg.norm(xy - sem_map.to_xy(self._path[-1])) <= self.cfg.waypoint_radius_m:
                return self._finish(PolicyStatus.REACHED, sem_map)
        action = self._follow(sem_map, xy, yaw)
        if action is None:
            return self._finish(PolicyStatus.UNREACHABLE, sem_map)
        self._since_plan += 1
        self._last_xy, self._last_yaw, self._last_action = xy, yaw, action
        status = PolicyStatus.RECOVERING if recovering else PolicyStatus.FOLLOWING
        return self._result(action, status, sem_map)

    # -- collisions -----------------------------------------------------------------------------
    def _ensure_layers(self, sem_map: SemanticMap) -> None:
        """Start over on a new map (a new episode's map has a new origin): as ``reset()``."""
        frame = (sem_map.shape, sem_map.origin, sem_map.cell_size)
        if self.collision is None or frame != self._map_frame:
            self.reset()
            self.collision = np.zeros(sem_map.shape, dtype=bool)
            self.trail = np.zeros(sem_map.shape, dtype=bool)
            self._map_frame = frame

    def _extend_trail(self, sem_map: SemanticMap, xy: np.ndarray) -> None:
        """Mark the cells of the straight move from the last position to ``xy`` (m) as walked.

        Sampled every half cell like the follower's step check, and a cell wide on each side, so
        that stepping back along the trail on the 30 deg lattice stays on it."""
        last = self._trail_xy if self._trail_xy is not None else xy
        if np.linalg.norm(xy - last) > 2.0 * self.forward_step_m:  # not one move: no segment
            last = xy
        samples = int(math.ceil(np.linalg.norm(xy - last) / (0.5 * sem_map.cell_size))) + 1
        t = np.linspace(0.0, 1.0, samples)[:, None]
        cells = sem_map.to_cell(last + t * (xy - last)).reshape(-1, 2)
        h, w = sem_map.shape
        for dr in (-1, 0, 1):
            for dc in (-1, 0, 1):
                rows, cols = cells[:, 0] + dr, cells[:, 1] + dc
                ok = (rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)
                self.trail[rows[ok], cols[ok]] = True
        self._trail_xy = xy

    def _detect_collision(self, sem_map: SemanticMap, xy: np.ndarray) -> bool:
        """Stamp the collision layer after a blocked forward move or a stuck spell; True if so."""
        cfg = self.cfg
        if self._last_xy is None:
            return False
        if self._last_action == Action.MOVE_FORWARD:
            moved = float(np.linalg.norm(xy - self._last_xy))
            if moved < cfg.collision_move_fraction * self.forward_step_m:
                # The follower will not repeat this move from this cell, and the planner avoids
                # the stamped spot (agent-centre space, not inflated: see _grids).
                self._blocked_moves.setdefault(self._cell_key(sem_map, self._last_xy), set()).add(
                    _heading_key(self._last_yaw))
                self._stamp_ahead(sem_map, self._last_xy, self._last_yaw)
                self._history.clear()
                return True
        if len(self._history) == self._history.maxlen:
            spread = max(float(np.linalg.norm(p - xy)) for p in self._history)
            if spread < cfg.stuck_min_displacement_m:
                self._stamp_ahead(sem_map, self._last_xy, self._last_yaw)
                self._history.clear()
                return True
        return False

    @staticmethod
    def _cell_key(sem_map: SemanticMap, xy: np.ndarray) -> tuple[int, int]:
        r, c = sem_map.to_cell(xy)
        return int(r), int(c)

    def _stamp_ahead(self, sem_map: SemanticMap, xy: np.ndarray, yaw: float) -> None:
        """Mark a disk ``collision_mark_ahead_m`` in front of ``xy`` (m) as blocked."""
        centre = xy + self.cfg.collision_mark_ahead_m * np.array([math.cos(yaw), math.sin(yaw)])
        r, c = sem_map.to_cell(centre)
        rad = max(int(round(self.cfg.collision_mark_radius_m / sem_map.cell_size)), 0)
        h, w = sem_map.shape
        rr, cc = np.mgrid[-rad : rad + 1, -rad : rad + 1]
        inside = rr**2 + cc**2 <= rad**2
        rows, cols = rr[inside] + r, cc[inside] + c
        ok = (rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)
        self.collision[rows[ok], cols[ok]] = True

    # -- planning -------------------------------------------------------------------------------
    def _grids(
        self, sem_map: SemanticMap, xy: np.ndarray, waypoint: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int, int]]:
        """The inflated blocked grid (full-map shape, False outside the search window), the raw
        obstacles inside the window, and the window ``(r0, r1, c0, c1)``."""
        cfg = self.cfg
        margin = int(math.ceil(cfg.window_margin_m / sem_map.cell_size))
        points = [sem_map.to_cell(xy), sem_map.to_cell(waypoint)]
        bbox = sem_map.explored_bbox()
        if bbox is not None:
            points += [np.array([bbox[0], bbox[2]]), np.array([bbox[1] - 1, bbox[3] - 1])]
        pts = np.array(points)
        h, w = sem_map.shape
        r0, c0 = np.maximum(pts.min(axis=0) - margin, 0)
        r1, c1 = np.minimum(pts.max(axis=0) + margin + 1, (h, w))
        window = (int(r0), int(r1), int(c0), int(c1))
        raw = sem_map.obstacle[r0:r1, c0:c1]
        if not cfg.unknown_traversable:
            raw = raw | ~sem_map.explored[r0:r1, c0:c1]
        inflated = dilate_disk(raw, self.inflation_m / sem_map.cell_size)
        self._clear_around(inflated, raw, sem_map, xy, (r0, c0))
        # Walked, so free (module doc, 2); but a collision mark is newer evidence than the trail:
        # a gap walked once may not let the agent back through from another lattice offset.
        inflated &= ~self.trail[r0:r1, c0:c1]
        # Collision marks say where the agent's centre could not go: they are already in
        # agent-centre space, so they are not inflated (inflating them closes narrow doorways).
        collision = self.collision[r0:r1, c0:c1]
        inflated |= collision
        raw = raw | collision
        blocked = np.zeros(sem_map.shape, dtype=bool)
        blocked[r0:r1, c0:c1] = inflated
        return blocked, raw, window

    def _clear_around(
        self, inflated: np.ndarray, raw: np.ndarray, sem_map: SemanticMap, xy: np.ndarray, offset: tuple[int, int]
    ) -> None:
        """Un-block inflation (not raw obstacles) within the inflation radius of the agent."""
        rad = int(math.ceil(self.inflation_m / sem_map.cell_size))
        r, c = sem_map.to_cell(xy) - np.array(offset)
        h, w = inflated.shape
        r0, r1, c0, c1 = max(r - rad, 0), min(r + rad + 1, h), max(c - rad, 0), min(c + rad + 1, w)
        if r0 >= r1 or c0 >= c1:
            return
        rr, cc = np.mgrid[r0:r1, c0:c1]
        near = (rr - r) ** 2 + (cc - c) ** 2 <= rad**2
        inflated[r0:r1, c0:c1] &= ~near | raw[r0:r1, c0:c1]

    def reachable(self, sem_map: SemanticMap, xy: np.ndarray, targets_xy: np.ndarray) -> np.ndarray:
        """bool (T,): could ``act`` plan from ``xy`` to each target (m), on the same grid (the
        inflated obstacles, collision marks and trail, each target snapped to the nearest cell
        within ``goal_snap_radius_m`` that the agent can reach, as a waypoint is)?"""
        self._ensure_layers(sem_map)
        targets = np.asarray(targets_xy, dtype=np.float64).reshape(-1, 2)
        if len(targets) == 0:
            return np.zeros(0, dtype=bool)
        blocked, _, window = self._grids(sem_map, xy, targets[0])
        here = self._component_of(blocked, tuple(int(v) for v in sem_map.to_cell(xy)), window)
        out = np.zeros(len(targets), dtype=bool)
        if not here.any():
            return out
        unreachable = blocked | ~here  # act snaps into the agent's component when it must
        for i, target in enumerate(targets):
            out[i] = self._snap_goal(sem_map, target, unreachable) is not None
        return out

    def cheapest_reachable(self, sem_map: SemanticMap, xy: np.ndarray,
                           tiers: Sequence[np.ndarray]) -> np.ndarray | None:
        """Map-frame metres of the cell that the agent at ``xy`` reaches at the lowest path cost on
        ``act``'s planning grid (unknown cells as ``act`` treats them), among the cells of the first
        of ``tiers`` (bool masks, the map's shape, in order of preference) that holds a reachable
        cell the agent may stand on; ``None`` if none does. One cost-to-go field serves every tier."""
        self._ensure_layers(sem_map)
        blocked, raw, window = self._grids(sem_map, xy, xy)
        r0, r1, c0, c1 = window
        start = sem_map.to_cell(xy) - np.array([r0, c0])
        if not (0 <= start[0] < r1 - r0 and 0 <= start[1] < c1 - c0):
            return None
        free = ~blocked[r0:r1, c0:c1]
        wanted = [targets[r0:r1, c0:c1] & free for targets in tiers]
        if not any(w.any() for w in wanted):
            return None
        costs = self._step_costs(sem_map, blocked, raw, window)
        costs[start[0], start[1]] = 1.0  # the agent's cell is always enterable
        to_go, _ = MCP_Geometric(costs, fully_connected=True).find_costs([tuple(start)])
        for cells in wanted:
            tier = np.where(cells, to_go, np.inf)
            best = np.unravel_index(int(np.argmin(tier)), tier.shape)
            if np.isfinite(tier[best]):
                return sem_map.to_xy(np.array([[best[0] + r0, best[1] + c0]]))[0]
        return None

    def _needs_replan(self, sem_map: SemanticMap, xy: np.ndarray, blocked: np.ndarray) -> bool:
        if self._path is None or self._since_plan >= self.cfg.replan_every_steps:
            return True
        ahead = self._path[self._progress + 1 :]
        if ahead.size and blocked[ahead[:, 0], ahead[:, 1]].any():
            return True
        nearest = np.min(np.linalg.norm(sem_map.to_xy(self._path[self._progress :]) - xy, axis=1))
        return bool(nearest > self.cfg.off_path_m)

    def _plan(
        self,
        sem_map: SemanticMap,
        xy: np.ndarray,
        waypoint: np.ndarray,
        blocked: np.ndarray,
        raw: np.ndarray,
        window: tuple[int, int, int, int],
    ) -> bool:
        """A* from the agent to the (snapped) waypoint over ``_step_costs``; False if there is no path."""
        start = tuple(int(v) for v in sem_map.to_cell(xy))
        goal = self._snap_goal(sem_map, waypoint, blocked)
        self._since_plan = 0
        self._progress = 0
        if goal is None or not sem_map.in_bounds(np.array(start)):
            self._path = None
            return False
        r0, r1, c0, c1 = window
        costs = self._step_costs(sem_map, blocked, raw, window)
        path = astar(costs, (start[0] - r0, start[1] - c0), (goal[0] - r0, goal[1] - c0))
        if path is None:  # the nearest free cell may be a pocket cut off from the agent: snap again
            goal = self._snap_goal(sem_map, waypoint, blocked | ~self._component_of(blocked, start, window))
            if goal is not None:
                path = astar(costs, (start[0] - r0, start[1] - c0), (goal[0] - r0, goal[1] - c0))
        self._path = None if path is None else np.array(path, dtype=np.int64) + np.array([r0, c0])
        if self._path is not None:
            costs[start[0] - r0, start[1] - c0] = 1.0  # the agent's cell is always enterable
            b0, b1, d0, d1 = self._field_box(self._path - np.array([r0, c0]), costs.shape, sem_map.cell_size)
            self._field, _ = MCP_Geometric(costs[b0:b1, d0:d1], fully_connected=True).find_costs(
                [(goal[0] - r0 - b0, goal[1] - c0 - d0)])
            self._field_origin = np.array([r0 + b0, c0 + d0])
        return self._path is not None

    def _step_costs(self, sem_map: SemanticMap, blocked: np.ndarray, raw: np.ndarray,
                    window: tuple[int, int, int, int]) -> np.ndarray:
        """Per-cell step cost in the search window: ``inf`` where blocked, ``1 + clearance_cost``
        within ``clearance_margin_m`` beyond the inflation, so paths keep off walls where there is
        room (discrete 30 deg headings wander off a path), else 1."""
        r0, r1, c0, c1 = window
        reach = (self.inflation_m + self.cfg.clearance_margin_m) / sem_map.cell_size
        near = dilate_disk(raw, reach)
        return np.where(blocked[r0:r1, c0:c1], np.inf, 1.0 + self.cfg.clearance_cost * near)

    @staticmethod
    def _component_of(blocked: np.ndarray, cell: tuple[int, int], window: tuple[int, int, int, int]) -> np.ndarray:
        """bool, ``blocked``'s shape: the unblocked cells of the search window 8-connected to ``cell``
        (A*'s connectivity); all False when ``cell`` is outside the window or blocked."""
        from scipy import ndimage

        r0, r1, c0, c1 = window
        out = np.zeros(blocked.shape, dtype=bool)
        labels, _ = ndimage.label(~blocked[r0:r1, c0:c1], structure=np.ones((3, 3)))
        r, c = cell[0] - r0, cell[1] - c0
        if 0 <= r < r1 - r0 and 0 <= c < c1 - c0 and labels[r, c] > 0:
            out[r0:r1, c0:c1] = labels == labels[r, c]
        return out

    def _field_box(self, path: np.ndarray, shape: tuple[int, int], cell_size: float) -> tuple[int, int, int, int]:
        """The follower's field window ``(r0, r1, c0, c1)`` inside ``shape``: the path's cells
        (window coordinates) + ``field_margin_m``."""
        margin = int(math.ceil(self.cfg.field_margin_m / cell_size))
        lo = np.maximum(path.min(axis=0) - margin, 0)
        hi = np.minimum(path.max(axis=0) + margin + 1, shape)
        return int(lo[0]), int(hi[0]), int(lo[1]), int(hi[1])

    def _snap_goal(self, sem_map: SemanticMap, waypoint: np.ndarray, blocked: np.ndarray) -> tuple[int, int] | None:
        """The waypoint's cell, or the nearest unblocked cell within ``goal_snap_radius_m``."""
        r, c = (int(v) for v in sem_map.to_cell(waypoint))
        h, w = sem_map.shape
        rad = int(math.ceil(self.cfg.goal_snap_radius_m / sem_map.cell_size))
        r0, r1, c0, c1 = max(r - rad, 0), min(r + rad + 1, h), max(c - rad, 0), min(c + rad + 1, w)
        if r0 >= r1 or c0 >= c1:
            return None
        rr, cc = np.nonzero(~blocked[r0:r1, c0:c1])
        if rr.size == 0:
            return None
        d2 = (rr + r0 - r) ** 2 + (cc + c0 - c) ** 2
        i = int(np.argmin(d2))
        if d2[i] > rad**2:
            return None
        return int(rr[i] + r0), int(cc[i] + c0)

    # -- following ------------------------------------------------------------------------------
    def _follow(self, sem_map: SemanticMap, xy: np.ndarray, yaw: float) -> Action | None:
        """The lattice step toward the waypoint, else turn toward the lookahead point or step
        forward when roughly facing it; None when the agent would back out of the same pocket a
        second time (the waypoint is then unreachable from this side).

        A pocket is a cell whose every progress move collided: the agent backs out (the escape),
        but the field still leads through the pocket, so the next lattice step walks it straight
        back in. Without this check that loop (a step, an about-turn, a step back, an about-turn)
        ate 270-375 of the 500 steps of Gibson episodes (Leonardo, `generated:10:0` ids 3 and 6)."""
        if self._escape is not None:  # finish turning to the escape heading, then step out
            error = wrap_angle(self._escape - yaw)
            if abs(error) > self.turn_angle_rad / 2.0:
                return Action.TURN_LEFT if error > 0 else Action.TURN_RIGHT
            self._escape = None
            return Action.MOVE_FORWARD
        action = self._lattice_step(sem_map, xy, yaw, require_progress=True)
        if action is not None:
            return action
        action = self._pursuit_action(sem_map, xy, yaw)
        cell = self._cell_key(sem_map, xy)
        if action == Action.MOVE_FORWARD and _heading_key(yaw) in self._blocked_moves.get(cell, ()):
            # That move already failed from here (a pocket, a corner): commit to the best clear
            # heading even if it makes no progress (backing out), or pursuit would turn back.
            if cell in self._escaped_from:
                return None
            self._escaped_from.add(cell)
            self._escape = self._best_clear_heading(sem_map, xy, yaw)
            if self._escape is None:
                return Action.TURN_LEFT
            return self._follow(sem_map, xy, yaw)
        return action

    def _pursuit_action(self, sem_map: SemanticMap, xy: np.ndarray, yaw: float) -> Action:
        """Turn toward the lookahead point, or step forward when roughly facing it."""
        path_xy = sem_map.to_xy(self._path)
        rest = path_xy[self._progress :]
        self._progress += int(np.argmin(np.linalg.norm(rest - xy, axis=1)))
        target = self._lookahead(path_xy, xy)
        error = wrap_angle(math.atan2(target[1] - xy[1], target[0] - xy[0]) - yaw)
        if abs(error) > self.turn_angle_rad / 2.0:
            return Action.TURN_LEFT if error > 0 else Action.TURN_RIGHT
        return Action.MOVE_FORWARD

    def _best_clear_heading(self, sem_map: SemanticMap, xy: np.ndarray, yaw: float) -> float | None:
        """The heading (radians) of the clear step landing lowest on the field, progress or not."""
        k = self._lattice_choice(sem_map, xy, yaw, require_progress=False)
        return None if k is None else yaw + k * self.turn_angle_rad

    def _lattice_step(self, sem_map: SemanticMap, xy: np.ndarray, yaw: float,
                      require_progress: bool) -> Action | None:
        """The action toward ``_lattice_choice``'s heading: MOVE_FORWARD when it is the current one."""
        k = self._lattice_choice(sem_map, xy, yaw, require_progress)
        if k is None:
            return None
        if k == 0:
            return Action.MOVE_FORWARD
        return Action.TURN_LEFT if k <= self._n_headings // 2 else Action.TURN_RIGHT

    @property
    def _n_headings(self) -> int:
        return max(1, int(round(2.0 * math.pi / self.turn_angle_rad)))

    def _lattice_choice(self, sem_map: SemanticMap, xy: np.ndarray, yaw: float,
                        require_progress: bool) -> int | None:
        """Descend the cost-to-go field over the headings the agent can turn to (module doc, 3):
        the number of left turns to the best heading, or None when no clear step makes progress
        (or, without ``require_progress``, when no step is clear at all)."""
        field, origin = self._field, self._field_origin
        n = self._n_headings
        yaws = yaw + self.turn_angle_rad * np.arange(n)
        ends = xy + self.forward_step_m * np.stack([np.cos(yaws), np.sin(yaws)], axis=1)
        samples = int(math.ceil(self.forward_step_m / (0.5 * sem_map.cell_size))) + 1
        t = np.linspace(0.0, 1.0, samples)[:, None, None]
        cells = sem_map.to_cell(xy + t * (ends - xy)) - origin  # (samples, n, 2) in the field window
        h, w = field.shape
        inside = ((cells[..., 0] >= 0) & (cells[..., 0] < h) & (cells[..., 1] >= 0) & (cells[..., 1] < w)).all(axis=0)
        rows, cols = np.clip(cells[..., 0], 0, h - 1), np.clip(cells[..., 1], 0, w - 1)
        clear = inside & np.isfinite(field[rows, cols]).all(axis=0)
        blocked = self._blocked_moves.get(self._cell_key(sem_map, xy), ())
        if blocked:
            clear &= np.array([_heading_key(a) not in blocked for a in yaws])
        value = np.where(clear, field[rows[-1], cols[-1]], np.inf)
        here = sem_map.to_cell(xy) - origin
        current = field[here[0], here[1]] if 0 <= here[0] < h and 0 <= here[1] < w else np.inf
        turns = np.minimum(np.arange(n), n - np.arange(n))
        best = int(np.argmin(value + 1e-3 * turns))  # equal progress: the fewest turns
        if not np.isfinite(value[best]) or (require_progress and value[best] >= current - 1.0):
            return None  # no clear step, or under one cell of progress
        return best

    def _lookahead(self, path_xy: np.ndarray, xy: np.ndarray) -> np.ndarray:
        """The first path point at least ``lookahead_m`` along the path from the nearest one."""
        ahead = path_xy[self._progress :]
        if len(ahead) == 1:
            return ahead[0]
        along = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(ahead, axis=0), axis=1))])
        i = int(np.searchsorted(along, self.cfg.lookahead_m))
        target = ahead[min(i, len(ahead) - 1)]
        if np.linalg.norm(target - xy) < 1e-6:  # standing on the last point: aim past it is impossible
            return ahead[-1]
        return target

    # -- results --------------------------------------------------------------------------------
    def _finish(self, status: PolicyStatus, sem_map: SemanticMap) -> PolicyResult:
        result = self._result(None, status, sem_map)
        self._path = None
        self.interrupt()
        return result

    def interrupt(self) -> None:
        """The agent loop takes over (a hand-back, or an action of its own such as a look-around
        turn): forget the last action and the motion history, so the next ``act`` reads neither
        a blocked move nor a stuck spell into actions it did not choose."""
        self._last_action = None
        self._history.clear()

    def _result(self, action: Action | None, status: PolicyStatus, sem_map: SemanticMap) -> PolicyResult:
        if self._path is None:
            path_xy = np.zeros((0, 2))
        else:
            path_xy = sem_map.to_xy(self._path[self._progress :])
        return PolicyResult(action=action, status=status, path_xy=path_xy)


def _heading_key(yaw: float) -> float:
    """A hashable heading (radians, wrapped, to 0.01 rad: the agent's headings differ by a turn)."""
    return round(wrap_angle(yaw), 2)
