"""The navigation loop (paper Sec. 3.3) with a pluggable planner.

Each step: perception + mapping (``MapBuilder``); once the goal category is on the map, walk to
it and STOP within ``stop_distance_m``; otherwise explore: at a *decision* (a new topo node
reached, the waypoint reached or unreachable, or too long on one waypoint) extract frontiers,
build the candidate paths over the current topo-polar graph (BFS) and let the planner pick one;
its frontier becomes the waypoint of the A* local policy, which emits the discrete actions.

When every frontier is unreachable from where the agent stands (it squeezed into a pocket whose
way in the map now shows closed), the agent *retraces* its own path: the exact reverse of its
forward moves, which the simulator already allowed, until a frontier is reachable again.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence

import numpy as np
from skimage.graph import MCP_Geometric

from trajrag.agent.map_builder import MapBuilder
from trajrag.config import Settings
from trajrag.agent.verification import GoalVerifier, Verdict
from trajrag.mapping.frontiers import Frontier, find_frontiers
from trajrag.mapping.local_policy import LocalPolicy, PolicyStatus
from trajrag.mapping.semantic_map import dilate_disk, stamp_disk
from trajrag.planners.base import Planner, PlannerContext
from trajrag.topo.candidates import map_place, step_candidates
from trajrag.topo.trajectory import TopoGraph
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.frames import wrap_angle
from trajrag.world.interface import Action, Observations
from trajrag.world.scene import Scene
from trajrag.world.sim import intrinsics_of


@dataclass
class NavigatorConfig:
    """``configs/navigator.yaml``: the agent vocabulary and the decision rules (units in names)."""

    vocabulary: list[str]
    initial_spin_turns: int
    stop_distance_m: float
    goal_min_cells: int
    goal_retry_distance_m: float
    node_reach_radius_m: float
    max_steps_per_waypoint: int
    blacklist_radius_m: float
    max_blacklist_resets: int
    frontier_hysteresis_m: float
    max_retrace_moves: int
    walled_in_clearance_m: float
    verify_views: int
    verify_min_share: float
    verify_radius_m: float
    verify_reject_radius_m: float

    def __post_init__(self) -> None:
        if not self.walled_in_clearance_m >= 0:
            raise ValueError(f"navigator.walled_in_clearance_m must be >= 0 m, got {self.walled_in_clearance_m}")


@dataclass
class NavigatorStats:
    """Counters for one episode (planner calls, fallbacks, timings in ms)."""

    decisions: int = 0
    planner_calls: int = 0
    no_candidate_fallbacks: int = 0
    unreachable_waypoints: int = 0
    retrace_moves: int = 0
    clearance_narrowed: bool = False  # walled in: planned with walled_in_clearance_m (Navigator._narrow_clearance)
    stop_reason: str = ""  # "goal_in_reach", "goal_reached_waypoint" or "no_frontier_left"
    goals_rejected: int = 0  # mapped goals that verification found not there (agent/verification.py)
    step_ms: list[float] = field(default_factory=list)
    decision_ms: list[float] = field(default_factory=list)


class Navigator:
    """An ObjectNav agent: ``reset(episode, scene)`` then ``act(observations) -> Action``."""

    def __init__(self, planner: Planner, builder: MapBuilder, policy: LocalPolicy, cfg: NavigatorConfig,
                 mapping_cfg, topo_cfg, seed: int = 0) -> None:
        self.planner = planner
        self.builder = builder
        self.policy = policy
        self.cfg = cfg
        self.mapping_cfg = mapping_cfg
        self.topo_cfg = topo_cfg
        self.seed = seed
        self.stats = NavigatorStats()
        intrinsics = builder.mapper.intrinsics
        self.verifier = GoalVerifier(cfg.verify_views, cfg.verify_min_share, cfg.verify_radius_m,
                                     math.atan2(intrinsics.width / 2.0, intrinsics.focal))
        # Called as observer(ctx, choice, planner) after each planner decision; evaluation hooks
        # the decision audit here (agent/decisions.py).
        self.decision_observer: Optional[Callable[[PlannerContext, int, Planner], None]] = None
        # Called as observer(episode, scene) at each reset; the privileged frontier oracle reads
        # the episode's goal field here (agent/privileged.py). Agents never see it.
        self.episode_observer: Optional[Callable[[ObjectNavEpisode, Scene], None]] = None

    # -- episode ------------------------------------------------------------------------------
    def reset(self, episode: ObjectNavEpisode, scene: Scene) -> None:
        if episode.object_category not in self.builder.vocabulary:
            raise ValueError(f"episode {episode.episode_id}: goal {episode.object_category!r} is not in the "
                             f"agent vocabulary {list(self.builder.vocabulary)} (configs/navigator.yaml)")
        episode_seed = self.seed + _stable_hash(f"{episode.scene_key}/{episode.episode_id}")
        if self.episode_observer is not None:
            self.episode_observer(episode, scene)
        self.builder.reset(episode, scene, episode_seed)
        self.planner.reset(episode.object_category, episode_seed)
        self.policy.reset()
        self.goal = episode.object_category
        self.goal_channel = self.builder.vocabulary.index(self.goal)
        self.spin_left = self.cfg.initial_spin_turns
        self.step = 0
        self.waypoint: Optional[np.ndarray] = None
        self.graph: Optional[TopoGraph] = None
        self.decision_node = -1
        self.steps_on_waypoint = 0
        self.blacklist: list[np.ndarray] = []  # waypoints found unreachable (may be retried)
        self.spent: list[np.ndarray] = []  # waypoints reached (never chosen again)
        self.blacklist_resets = 0
        self.goal_blocked_at: Optional[np.ndarray] = None  # where the goal was last found unreachable
        self.goal_target: Optional[np.ndarray] = None  # the mapped goal cell being walked to (m)
        self.goal_targets_left: set[tuple[float, float]] = set()  # the ones walked to before it
        self.retrace_path: list[np.ndarray] = []  # positions still to walk back to, last first
        self.retrace_forward = False  # the last retracing action was a MOVE_FORWARD
        self.retrace_ran_out = False  # a retrace walked its whole path back since a waypoint was reached
        self.rejected_goal: Optional[np.ndarray] = None  # bool map: goal cells verification rejected
        self.verifier.reset()
        self.stats = NavigatorStats()

    def act(self, obs: Observations) -> Action:
        start = time.perf_counter()
        action = self._act(obs)
        self.stats.step_ms.append((time.perf_counter() - start) * 1e3)
        self.step += 1
        return action

    def _act(self, obs: Observations) -> Action:
        self.builder.observe(obs)
        if self.spin_left > 0:  # a first look around, as SemExp / VLFM do, so frontiers are real
            self.spin_left -= 1
            self.policy.interrupt()
            return Action.TURN_LEFT
        sem, pose = self.builder.map, obs.pose
        goal_cells = self._mapped_goal_cells()
        if goal_cells is not None:
            goal_xy = sem.to_xy(goal_cells)
            distances = np.linalg.norm(goal_xy - pose.xy, axis=1)
            if distances.min() <= self.cfg.stop_distance_m:
                action = self._verified_stop("goal_in_reach", pose, goal_xy[int(np.argmin(distances))])
                if action is not None:
                    return action
            elif self._goal_worth_trying(pose.xy):
                target = self._stop_place(pose.xy, goal_cells)
                if target is None:
                    target = self._approach_target(goal_xy, distances)
                result = self.policy.act(sem, pose, target)
                if result.action is not None:
                    return result.action
                if result.status == PolicyStatus.REACHED:
                    action = self._verified_stop("goal_reached_waypoint", pose, goal_xy[int(np.argmin(distances))])
                    if action is not None:
                        return action
                    return self._explore(obs)
                self.goal_blocked_at = pose.xy.copy()  # unreachable from here: explore on, retry later
                self.goal_target, self.goal_targets_left = None, set()
                self.waypoint = None
        return self._explore(obs)

    def _verified_stop(self, reason: str, pose, target_xy: np.ndarray) -> Optional[Action]:
        """STOP by the goal at ``target_xy`` once verification confirms it; the next look while it
        is looking; None once it rejected the goal (its cells are then remembered and skipped)."""
        cells = self.builder.mapper.last_object_cells.get(self.goal_channel)
        detected = None if cells is None or not len(cells) else \
            self.builder.map.to_xy(np.column_stack(np.unravel_index(cells, self.builder.map.shape)))
        verdict, action = self.verifier.look(pose, target_xy, detected)
        if verdict == Verdict.CONFIRMED:
            return self._stop(reason)
        if verdict == Verdict.LOOKING:
            self.policy.interrupt()
            return action
        self._reject_goal(target_xy)
        return None

    def _reject_goal(self, target_xy: np.ndarray) -> None:
        """Remember the goal cells within ``verify_reject_radius_m`` of ``target_xy`` as not the goal."""
        sem = self.builder.map
        if self.rejected_goal is None:
            self.rejected_goal = np.zeros(sem.shape, dtype=bool)
        stamp_disk(self.rejected_goal, sem.to_cell(np.asarray(target_xy)), self.cfg.verify_reject_radius_m / sem.cell_size)
        self.stats.goals_rejected += 1
        self.goal_target, self.goal_targets_left = None, set()
        self.waypoint = None

    def _stop_place(self, xy: np.ndarray, cells: np.ndarray) -> Optional[np.ndarray]:
        """Where to walk to STOP by the mapped goal (map-frame metres): of the cells within
        ``stop_distance_m`` of a mapped goal cell (``cells``: (row, col), ``_mapped_goal_cells``),
        by a way round mapped obstacles, where the agent can stand, the one it reaches by the
        cheapest path; ``None`` if it reaches none.
        The approach walks to the nearest goal cell, that is to the free cell nearest it, and for
        an object against a wall that can be on its unseen far side: the plan then runs round
        through unknown space, and on Gibson agents chased such places for 60-320 steps until the
        budget ran out (a TV on a stand at Wainscott, plants at Allensville: 9 of nearest frontier's
        84 failures in the Gibson cross-validation had mapped the goal before step 400)."""
        sem = self.builder.map
        reach = int(math.ceil(self.cfg.stop_distance_m / sem.cell_size))
        r0, c0 = np.maximum(cells.min(axis=0) - reach, 0)
        r1, c1 = np.minimum(cells.max(axis=0) + reach + 1, sem.shape)
        # Within STOP distance by a way round the walls, not through them: a place beside the goal
        # but behind a wall is in STOP reach and outside the goal region. Mapped objects do not
        # count as walls: a TV stands on a cabinet, a plant behind a sofa.
        free = ~sem.obstacle[r0:r1, c0:c1] | sem.objects[:, r0:r1, c0:c1].any(axis=0)
        starts = [tuple(c) for c in cells - np.array([r0, c0])]
        metres, _ = MCP_Geometric(np.where(free, sem.cell_size, np.inf), fully_connected=True).find_costs(starts)
        # Arriving counts within the policy's waypoint radius of the place, so places that far
        # inside STOP reach come first; the rest of the reach when none of those can be reached.
        tiers = []
        for reach_m in (self.cfg.stop_distance_m - self.policy.cfg.waypoint_radius_m, self.cfg.stop_distance_m):
            near = np.zeros(sem.shape, dtype=bool)
            near[r0:r1, c0:c1] = metres <= reach_m
            tiers.append(near)
        return self.policy.cheapest_reachable(sem, xy, tiers)

    def _approach_target(self, goal_cells: np.ndarray, distances: np.ndarray) -> np.ndarray:
        """The mapped goal cell to walk to (metres; ``distances``: the agent's to each cell): the
        nearest, unless it is one the agent already walked to and left during this approach; it
        then keeps the current one (mapped object cells are never cleared, so that is still a goal
        cell). Nearest by straight line is not nearest by path: from three neighbouring cells
        beside Mifflinburg's toilet the nearest goal cells were approached from opposite sides, and
        re-picking the nearest sent the agent round those cells for 300-470 of its 500 steps (3
        nearest-frontier and 5 TrajRAG episodes of the Gibson cross-validation). Otherwise the
        nearest is re-picked at every step, so the approach is replanned as the object's near side
        comes into view."""
        nearest = goal_cells[int(np.argmin(distances))]
        current = self.goal_target
        if current is not None and not np.array_equal(nearest, current):
            if tuple(nearest) in self.goal_targets_left:
                return current
            self.goal_targets_left.add(tuple(current))
        self.goal_target = nearest
        return nearest

    def _goal_worth_trying(self, xy: np.ndarray) -> bool:
        """Whether to walk to the mapped goal: always, unless it was found unreachable less than
        ``goal_retry_distance_m`` from here (from elsewhere the map and the approach differ)."""
        if self.goal_blocked_at is not None and np.linalg.norm(xy - self.goal_blocked_at) >= self.cfg.goal_retry_distance_m:
            self.goal_blocked_at = None
        return self.goal_blocked_at is None

    # -- exploration ----------------------------------------------------------------------------
    def _explore(self, obs: Observations) -> Action:
        if self.retrace_path:
            action = self._retrace(obs)
            if action is not None:
                return action
        for _ in range(2):  # a decision, then at most one re-decision if its waypoint fails at once
            if self._needs_decision(obs) and not self._decide(obs):
                # After a retrace that walked its whole way back in vain, another would only pace
                # the pocket again (two positions back and forth until the steps run out): the
                # last resort comes first.
                if not (self.retrace_ran_out and self._narrow_clearance() and self._decide(obs)):
                    action = self._start_retrace(obs)
                    if action is not None:
                        return action
                    if not (self._narrow_clearance() and self._decide(obs)):
                        return self._stop("no_frontier_left")
            result = self.policy.act(self.builder.map, obs.pose, self.waypoint)
            self.steps_on_waypoint += 1
            if result.action is not None:
                return result.action
            if result.status == PolicyStatus.UNREACHABLE:
                self.stats.unreachable_waypoints += 1
                self.blacklist.append(self.waypoint)
            else:
                # A frontier that persists once reached borders space the agent cannot see
                # from there (behind furniture, say): it is spent for good, or it would be
                # chosen again and again.
                self.spent.append(self.waypoint)
                self.retrace_ran_out = False
            self.waypoint = None
        self.policy.interrupt()
        return Action.TURN_LEFT  # two failed waypoints in one step: look around and try again

    # -- retracing ------------------------------------------------------------------------------
    def _start_retrace(self, obs: Observations) -> Optional[Action]:
        """Begin walking back along the positions of the pose history (the map builder's, the
        current one last), loops cut: walking back already makes a loop, so a later retrace never
        leads into the pocket again. None if there is nothing to retrace, the budget is spent, or a
        frontier is reachable after all."""
        if self.stats.retrace_moves >= self.cfg.max_retrace_moves:
            return None
        self.retrace_path = loop_erased([np.array(p[:2]) for p in self.builder.poses])[:-1]
        if not self.retrace_path:
            return None
        self.retrace_forward = False
        return self._retrace(obs)

    def _retrace(self, obs: Observations) -> Optional[Action]:
        """The next action back toward the previous position on the path, or None (retracing over)
        once a frontier is reachable from here, the path is used up or the budget spent. Each
        reverse move is the exact reverse of a forward move the simulator made, so it is free."""
        xy = obs.pose.xy
        while self.retrace_path and np.linalg.norm(self.retrace_path[-1] - xy) <= _SAME_POSITION_M:
            self.retrace_path.pop()
        stalled = self.retrace_forward and obs.collided  # a reverse move failed: give up
        self.retrace_ran_out |= not self.retrace_path
        if (stalled or not self.retrace_path or self.stats.retrace_moves >= self.cfg.max_retrace_moves
                or self._frontier_reachable(obs)):
            self.retrace_path = []
            self.blacklist = []  # unreachable from where they were tried, not from here
            self.waypoint = None
            self.policy.interrupt()
            return None
        target = self.retrace_path[-1]
        error = wrap_angle(math.atan2(target[1] - xy[1], target[0] - xy[0]) - obs.pose.yaw)
        self.policy.interrupt()
        self.retrace_forward = abs(error) <= self.policy.turn_angle_rad / 2.0
        if not self.retrace_forward:
            return Action.TURN_LEFT if error > 0 else Action.TURN_RIGHT
        self.stats.retrace_moves += 1
        return Action.MOVE_FORWARD

    def _frontier_reachable(self, obs: Observations) -> bool:
        """Whether any frontier not yet reached is plannable from the agent's position."""
        sem = self.builder.map
        frontiers = [f for f in find_frontiers(sem, self.frontier_cfg, agent_xy=obs.pose.xy)
                     if not self._near_any(f, self.spent)]
        if not frontiers:
            return False
        targets = np.array([f.centroid_xy for f in frontiers])
        return bool(self.policy.reachable(sem, obs.pose.xy, targets).any())

    def _stop(self, reason: str) -> Action:
        self.stats.stop_reason = reason
        return Action.STOP

    def _needs_decision(self, obs: Observations) -> bool:
        if self.waypoint is None or self.steps_on_waypoint >= self.cfg.max_steps_per_waypoint:
            return True
        return self._current_node(obs.pose.xy) not in (-1, self.decision_node)

    def _current_node(self, xy: np.ndarray) -> int:
        """The graph node within ``node_reach_radius_m`` of ``xy``, or -1."""
        if self.graph is None or len(self.graph) == 0:
            return -1
        distances = np.linalg.norm(self.graph.xy - xy, axis=1)
        k = int(np.argmin(distances))
        return k if distances[k] <= self.cfg.node_reach_radius_m else -1

    def _decide(self, obs: Observations) -> bool:
        """Pick the next waypoint; False when no frontier is left."""
        start = time.perf_counter()
        self.stats.decisions += 1
        sem, pose = self.builder.map, obs.pose
        frontiers = self._open_frontiers(sem, pose.xy)
        if not frontiers:
            return False
        episode = self.builder.episode
        trajectory, candidates, self.graph = step_candidates(
            sem, np.asarray(self.builder.poses), frontiers, self.goal, self.topo_cfg,
            reference_yaw=episode.start_pose().yaw, episode_id=str(episode.episode_id), scene_id=episode.scene_key)
        if candidates:
            self.stats.planner_calls += 1
            place = (map_place(sem, self.graph, trajectory, self.topo_cfg)
                     if getattr(self.planner, "wants_place", False) else None)
            ctx = PlannerContext(self.goal, self.step, pose, sem, trajectory, candidates, frontiers,
                                 frontier_distances(sem, pose.xy, frontiers, self.policy.inflation_m,
                                                    self.policy.trail),
                                 self.waypoint, place)
            choice = self.planner.choose(ctx)
            if self.decision_observer is not None:
                self.decision_observer(ctx, choice, self.planner)
            frontier = frontiers[candidates[choice].frontier_index]
        else:  # no frontier reachable over the graph yet: the nearest one in a straight line
            self.stats.no_candidate_fallbacks += 1
            frontier = min(frontiers, key=lambda f: float(np.linalg.norm(f.centroid_xy - pose.xy)))
        self.waypoint = np.asarray(frontier.centroid_xy, dtype=np.float64)
        self.decision_node = self._current_node(pose.xy)
        self.steps_on_waypoint = 0
        self.stats.decision_ms.append((time.perf_counter() - start) * 1e3)
        return True

    def _open_frontiers(self, sem, xy: np.ndarray) -> list[Frontier]:
        """Frontiers worth a decision: reachable through mapped free space, not spent (reached)
        and not found unreachable. When none is left, a few times per episode, forget the
        failures and the reachability filter before concluding there is nothing to explore:
        "nothing left" is usually a narrow passage or a frontier seen from a bad angle. A
        narrowed clearance (``_narrow_clearance``) earns one reset more."""
        frontiers = [f for f in find_frontiers(sem, self.frontier_cfg, agent_xy=xy)
                     if not self._near_any(f, self.spent) and not self._near_any(f, self.blacklist)]
        resets = self.cfg.max_blacklist_resets + int(self.stats.clearance_narrowed)
        if frontiers or self.blacklist_resets >= resets:
            return frontiers
        self.blacklist_resets += 1
        self.blacklist, self.spent = [], []
        self.policy.forget_collisions()  # collision marks may be what walled the agent in
        return [f for f in find_frontiers(sem, self.frontier_cfg) if not self._underfoot(f, xy)]

    def _narrow_clearance(self) -> bool:
        """Plan and test reachability with obstacles inflated by ``walled_in_clearance_m`` rather
        than the agent radius, for the rest of the episode, with one more reset of the failures
        (``_open_frontiers``); False if that was done already (or would not narrow anything). A
        mapped obstacle edge lies a cell or two off the true one, and the full inflation can close a
        gap the agent fits through: at two Gibson starts in Hiteman (line-of-sight goal regions,
        nearest frontier) the one way out of the room ran between a wall end and a refrigerator, and
        the agent STOPped after 27 and 53 steps with the rest of the home unexplored. Only an agent
        about to STOP with nothing left (resets and retracing spent), or one whose retrace walked
        its whole way back without a frontier coming within reach, narrows it, so no other walk
        changes."""
        narrow = self.cfg.walled_in_clearance_m
        if self.stats.clearance_narrowed or narrow >= self.policy.inflation_m:
            return False
        self.stats.clearance_narrowed = True
        self.policy.narrow_inflation(narrow)
        return True

    @property
    def frontier_cfg(self):
        """The frontier settings; once the clearance is narrowed, reachability is tested with it."""
        cfg = self.mapping_cfg.frontier
        if not self.stats.clearance_narrowed:
            return cfg
        return replace(cfg, reachable_clearance_m=min(self.cfg.walled_in_clearance_m, cfg.reachable_clearance_m))

    def _underfoot(self, frontier: Frontier, xy: np.ndarray) -> bool:
        """Whether the local policy counts ``frontier`` as reached where the agent stands: choosing
        it moves nothing and the camera never sees the floor at its feet, so after a reset it would
        spend every reset at once (elsewhere it is still chosen: skipping it always navigated worse;
        docs/notes/2026-12-code-history.md)."""
        return float(np.linalg.norm(frontier.centroid_xy - xy)) <= self.policy.cfg.waypoint_radius_m

    def _near_any(self, frontier: Frontier, places: list[np.ndarray]) -> bool:
        return any(np.linalg.norm(frontier.centroid_xy - p) <= self.cfg.blacklist_radius_m for p in places)

    def _mapped_goal_cells(self) -> Optional[np.ndarray]:
        """Map cells (N, 2; row, col) of the mapped goal, once enough are mapped (else None)."""
        sem = self.builder.map
        bbox = sem.explored_bbox()
        if bbox is None:
            return None
        r0, r1, c0, c1 = bbox  # objects are only mapped inside the explored area
        goal = sem.objects[self.goal_channel, r0:r1, c0:c1]
        if self.rejected_goal is not None:
            goal = goal & ~self.rejected_goal[r0:r1, c0:c1]
        cells = np.argwhere(goal)
        if len(cells) < self.cfg.goal_min_cells:
            return None
        return cells + np.array([r0, c0])

    def topo_trajectory(self, success: bool, with_place: bool = False):
        """The finished episode as a topo-polar trajectory (for export and the memory; with its
        map as ``.place`` when ``with_place``, see ``MapBuilder.topo_trajectory``)."""
        return self.builder.topo_trajectory(success, with_place)


def frontier_distances(sem, xy: np.ndarray, frontiers: Sequence[Frontier], inflation_m: float,
                       trail: Optional[np.ndarray] = None) -> np.ndarray:
    """Geodesic metres from ``xy`` to each frontier's centroid over explored free space with
    obstacles inflated by ``inflation_m`` (``inf`` where none is found): what a nearest-frontier
    explorer ranks by (straight-line or graph-hop distances pick frontiers behind walls).
    ``trail``: bool map of cells the agent has walked, passable whatever the map says (as in
    the local policy)."""
    r0, r1, c0, c1 = sem.explored_bbox(margin=1)
    blocked = dilate_disk(sem.obstacle[r0:r1, c0:c1], inflation_m / sem.cell_size)
    passable = sem.explored[r0:r1, c0:c1] & ~blocked
    if trail is not None:
        passable |= trail[r0:r1, c0:c1]
    start = sem.to_cell(xy) - np.array([r0, c0])
    passable[start[0], start[1]] = True  # the agent's own cell, even if it grazes an inflated wall
    costs = np.where(passable, 1.0, np.inf)
    field, _ = MCP_Geometric(costs).find_costs([tuple(start)])
    out = np.full(len(frontiers), np.inf)
    for i, frontier in enumerate(frontiers):
        cells = frontier.cells - np.array([r0, c0])
        out[i] = float(np.min(field[cells[:, 0], cells[:, 1]])) * sem.cell_size
    return out


# Two positions this close (m) are one: the simulator's positions repeat exactly when a move is
# reversed; 1 cm absorbs float rounding, far below the 0.25 m step.
_SAME_POSITION_M = 0.01


def loop_erased(positions: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The positions with every loop cut out (a return to a place drops what lay between), so
    walking the result backwards repeats no detour. Consecutive entries stay one real move apart:
    a place revisited is the same point, reached by the same move."""
    out: list[np.ndarray] = []
    seen: dict[tuple[int, int], int] = {}
    for p in positions:
        key = (int(round(p[0] / _SAME_POSITION_M)), int(round(p[1] / _SAME_POSITION_M)))
        if key in seen:
            del out[seen[key] + 1:]
            seen = {k: i for k, i in seen.items() if i <= seen[key]}
        else:
            seen[key] = len(out)
            out.append(p)
    return out


def _stable_hash(text: str) -> int:
    """A run-to-run stable 31-bit hash (Python's ``hash`` is salted per process)."""
    import zlib

    return zlib.crc32(text.encode()) & 0x7FFFFFFF


def make_navigator(planner: Planner, settings: Settings, seed: int = 0) -> Navigator:
    """A navigator deciding with ``planner``, every part configured from ``settings`` (the
    ``navigator``, ``mapping``, ``topo``, ``perception``, ``policy`` and ``sim`` sections)."""
    sim_cfg, mapping_cfg, topo_cfg = settings.sim, settings.mapping, settings.topo
    builder = MapBuilder(settings.navigator.vocabulary, intrinsics_of(sim_cfg), mapping_cfg, settings.perception,
                         topo_cfg)
    policy = LocalPolicy(settings.policy, sim_cfg.forward_step, math.radians(sim_cfg.turn_angle_deg))
    return Navigator(planner, builder, policy, settings.navigator, mapping_cfg, topo_cfg, seed)
