"""A* and the local policy, driving a point-mass stand-in for the simulator on hand-built grids."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import dijkstra

from trajrag import config
from trajrag.mapping.astar import astar, path_length
from trajrag.mapping.local_policy import LocalPolicy, PolicyStatus
from trajrag.mapping.semantic_map import SemanticMap, dilate_disk
from trajrag.world.frames import Pose2D
from trajrag.world.interface import Action

CELL = 0.05
STEP = 0.25
TURN = math.radians(30.0)
RADIUS = 0.18


# -- A* --------------------------------------------------------------------------------------------
def _reference_length(blocked: np.ndarray, start, goal) -> float:
    """Shortest 8-connected path length (cells) by scipy's Dijkstra on an explicit graph."""
    h, w = blocked.shape
    idx = np.arange(h * w).reshape(h, w)
    rows, cols, weights = [], [], []
    for dr, dc in [(0, 1), (1, 0), (1, 1), (1, -1)]:
        a = idx[max(0, -dr) : h - max(0, dr), max(0, -dc) : w - max(0, dc)]
        b = idx[max(0, dr) : max(0, dr) + a.shape[0], max(0, dc) : max(0, dc) + a.shape[1]]
        ok = ~blocked.ravel()[a.ravel()] & ~blocked.ravel()[b.ravel()]
        rows += [a.ravel()[ok]]
        cols += [b.ravel()[ok]]
        weights += [np.full(ok.sum(), math.hypot(dr, dc))]
    graph = coo_matrix((np.concatenate(weights), (np.concatenate(rows), np.concatenate(cols))), shape=(h * w, h * w))
    dist = dijkstra(graph, directed=False, indices=idx[start])
    return float(dist[idx[goal]])


def test_astar_finds_the_shortest_path_around_an_obstacle():
    blocked = np.zeros((50, 50), dtype=bool)
    blocked[0:35, 25] = True  # a wall hanging from the top edge
    blocked[20, 5:20] = True
    start, goal = (10, 10), (10, 40)
    path = astar(blocked, start, goal)
    assert path[0] == start and path[-1] == goal
    steps = np.abs(np.diff(np.array(path), axis=0))
    assert steps.max() == 1, "consecutive cells are 8-neighbours"
    assert not any(blocked[r, c] for r, c in path)
    assert any(r >= 35 for r, _ in path), "the path goes around the wall's end"
    assert path_length(path, 1.0) == pytest.approx(_reference_length(blocked, start, goal), abs=1e-9)


def test_astar_returns_none_for_an_enclosed_or_blocked_goal():
    blocked = np.zeros((40, 40), dtype=bool)
    blocked[20:31, 20] = blocked[20:31, 30] = blocked[20, 20:31] = blocked[30, 20:31] = True
    assert astar(blocked, (5, 5), (25, 25)) is None
    assert astar(blocked, (5, 5), (20, 25)) is None, "goal on an obstacle"
    assert astar(blocked, (5, 5), (99, 5)) is None, "goal off the grid"
    assert astar(blocked, (5, 5), (5, 5)) == [(5, 5)]


def test_astar_window_and_cost_grid():
    blocked = np.zeros((200, 200), dtype=bool)
    blocked[:, 100] = True
    blocked[150, 100] = False
    full = astar(blocked, (10, 10), (10, 190))
    windowed = astar(blocked, (10, 10), (10, 190), window=(0, 160, 0, 200))
    assert windowed == full
    assert astar(blocked, (10, 10), (10, 190), window=(0, 100, 0, 200)) is None, "the door is outside the window"
    costs = np.where(blocked, np.inf, 1.0)
    assert astar(costs, (10, 10), (10, 190)) is not None


# -- a point-mass simulator on a grid ----------------------------------------------------------------
class PointMass:
    """Discrete actions applied kinematically; a forward move that would leave ``traversable``
    (the agent-centre space) is blocked and the agent stays put (no sliding)."""

    def __init__(self, traversable: np.ndarray, pose: Pose2D) -> None:
        self.traversable = traversable
        self.pose = pose
        self.collisions = 0

    def _ok(self, xy: np.ndarray) -> bool:
        r, c = int(math.floor(xy[1] / CELL)), int(math.floor(xy[0] / CELL))
        h, w = self.traversable.shape
        return 0 <= r < h and 0 <= c < w and bool(self.traversable[r, c])

    def step(self, action: Action) -> None:
        p = self.pose
        if action == Action.TURN_LEFT:
            self.pose = Pose2D(p.x, p.y, p.yaw + TURN)
        elif action == Action.TURN_RIGHT:
            self.pose = Pose2D(p.x, p.y, p.yaw - TURN)
        elif action == Action.MOVE_FORWARD:
            d = np.array([math.cos(p.yaw), math.sin(p.yaw)])
            if all(self._ok(p.xy + t * d) for t in np.linspace(0.0, STEP, 26)):
                self.pose = Pose2D(*(p.xy + STEP * d), p.yaw)
            else:
                self.collisions += 1


def _world(floor: np.ndarray) -> tuple[SemanticMap, np.ndarray]:
    """A fully known map of ``floor`` (walls elsewhere) and the sim's agent-centre space."""
    sem = SemanticMap.empty(floor.shape, ("chair",), CELL, (0.0, 0.0))
    sem.obstacle[:] = ~floor
    sem.explored[:] = True
    traversable = ~dilate_disk(~floor, RADIUS / CELL)
    return sem, traversable


def _drive(policy: LocalPolicy, sem: SemanticMap, sim: PointMass, waypoint, max_steps: int = 200):
    statuses = []
    for _ in range(max_steps):
        result = policy.act(sem, sim.pose, np.asarray(waypoint))
        statuses.append(result.status)
        if result.action is None:
            return result, statuses
        assert result.action != Action.STOP
        sim.step(result.action)
    raise AssertionError(f"policy did not finish in {max_steps} steps; last statuses {statuses[-5:]}")


@pytest.fixture()
def policy() -> LocalPolicy:
    return LocalPolicy(config.load("policy"), forward_step_m=STEP, turn_angle_rad=TURN)


def test_policy_drives_around_a_corner_to_a_waypoint(policy):
    # An L-shaped corridor 1 m wide: east along y in [0.5, 1.5], then north along x in [2.5, 3.5].
    floor = np.zeros((100, 100), dtype=bool)
    floor[10:30, 10:70] = True
    floor[10:80, 50:70] = True
    sem, traversable = _world(floor)
    sim = PointMass(traversable, Pose2D(1.0, 1.0, 0.0))
    waypoint = np.array([3.0, 3.5])
    assert np.linalg.norm(waypoint - sim.pose.xy) > 3.0
    result, statuses = _drive(policy, sem, sim, waypoint)
    assert result.status == PolicyStatus.REACHED
    assert np.linalg.norm(sim.pose.xy - waypoint) <= policy.cfg.waypoint_radius_m
    assert sim.collisions == 0, "the inflated plan keeps the agent off the walls"
    assert len(statuses) < 60, "about (2 + 2.5) m / 0.25 m forward steps plus a few turns"


def test_policy_recovers_from_an_unmapped_obstacle(policy):
    floor = np.zeros((100, 100), dtype=bool)
    floor[5:95, 5:95] = True
    sem, traversable = _world(floor)
    # A box the map does not show, across the straight line from start to waypoint.
    hidden = np.zeros_like(floor)
    hidden[35:65, 40:48] = True
    traversable &= ~dilate_disk(hidden, RADIUS / CELL)
    sim = PointMass(traversable, Pose2D(1.0, 2.5, 0.0))
    waypoint = np.array([4.0, 2.5])
    result, statuses = _drive(policy, sem, sim, waypoint)
    assert result.status == PolicyStatus.REACHED
    assert sim.collisions >= 1 and PolicyStatus.RECOVERING in statuses
    assert policy.collision.any(), "the bumped obstacle is remembered in the collision layer"
    next_episode = SemanticMap.empty(sem.shape, sem.categories, CELL, (1.0, 1.0))
    policy.act(next_episode, Pose2D(3.0, 3.0, 0.0), np.array([4.0, 3.0]))
    assert not policy.collision.any(), "a new episode's map starts with a clean collision layer"


def test_policy_gives_up_when_every_move_collides(policy):
    floor = np.zeros((100, 100), dtype=bool)
    floor[5:95, 5:95] = True
    sem, traversable = _world(floor)
    sim = PointMass(np.zeros_like(traversable), Pose2D(2.5, 2.5, 0.0))
    result, statuses = _drive(policy, sem, sim, np.array([4.0, 4.0]), max_steps=400)
    assert result.status == PolicyStatus.UNREACHABLE and result.action is None
    # Either the recovery budget runs out or the collision marks wall the agent in: both give up.
    assert 1 <= statuses.count(PolicyStatus.RECOVERING) <= policy.cfg.max_recoveries
    assert len(statuses) < 100


def test_policy_reports_an_enclosed_waypoint_unreachable(policy):
    floor = np.zeros((100, 100), dtype=bool)
    floor[5:95, 5:95] = True
    floor[50:90, 50] = floor[50:90, 90] = floor[50, 50:91] = floor[90, 50:91] = False
    sem, _ = _world(floor)
    result = policy.act(sem, Pose2D(1.0, 1.0, 0.0), np.array([3.5, 3.5]))
    assert result.status == PolicyStatus.UNREACHABLE and result.action is None


def test_unknown_space_is_traversable_only_when_configured():
    sem = SemanticMap.empty((100, 100), ("chair",), CELL, (0.0, 0.0))
    sem.explored[10:30, 10:30] = True
    pose, waypoint = Pose2D(1.0, 1.0, 0.0), np.array([4.0, 1.0])
    cfg = config.load("policy")
    optimistic = LocalPolicy(cfg, STEP, TURN).act(sem, pose, waypoint)
    assert optimistic.status == PolicyStatus.FOLLOWING and optimistic.action == Action.MOVE_FORWARD
    assert len(optimistic.path_xy) > 0
    cautious = LocalPolicy(config.load("policy", ["policy.unknown_traversable=false"]), STEP, TURN)
    assert cautious.act(sem, pose, waypoint).status == PolicyStatus.UNREACHABLE


def test_policy_turns_toward_a_waypoint_behind_it(policy):
    floor = np.zeros((100, 100), dtype=bool)
    floor[5:95, 5:95] = True
    sem, _ = _world(floor)
    left = policy.act(sem, Pose2D(2.5, 2.5, 0.0), np.array([2.5, 4.0]))  # +y is to the left at yaw 0
    assert left.action == Action.TURN_LEFT
    policy.reset()
    right = policy.act(sem, Pose2D(2.5, 2.5, 0.0), np.array([2.5, 1.0]))
    assert right.action == Action.TURN_RIGHT


def test_bad_pose_or_waypoint_is_a_clear_error(policy):
    sem, _ = _world(np.ones((20, 20), dtype=bool))
    with pytest.raises(ValueError, match="non-finite"):
        policy.act(sem, SimpleNamespace(x=float("nan"), y=0.0, yaw=0.0), np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="waypoint"):
        policy.act(sem, Pose2D(0.5, 0.5, 0.0), np.array([np.nan, 0.5]))


def test_the_walked_trail_stays_plannable_when_later_obstacles_close_a_doorway(policy):
    # Two rooms joined by a 0.6 m doorway: wide enough for the 0.36 m agent.
    floor = np.zeros((100, 100), dtype=bool)
    floor[5:95, 5:45] = floor[5:95, 55:95] = True
    floor[44:56, 45:55] = True
    sem, traversable = _world(floor)
    sim = PointMass(traversable, Pose2D(1.0, 2.5, 0.0))
    result, _ = _drive(policy, sem, sim, np.array([4.0, 2.5]))
    assert result.status == PolicyStatus.REACHED
    # Seen from the other side, the door frame maps 15 cm thicker on each side: inflated by the
    # agent radius, the doorway is closed on the map although the agent just walked through it.
    sem.obstacle[44:47, 45:55] = sem.obstacle[53:56, 45:55] = True
    back = np.array([[1.0, 2.5]])
    fresh = LocalPolicy(config.load("policy"), forward_step_m=STEP, turn_angle_rad=TURN)
    assert not fresh.reachable(sem, sim.pose.xy, back).any(), "the map alone has no way back"
    assert policy.reachable(sem, sim.pose.xy, back).all(), "the walked trail is a way back"
    result, _ = _drive(policy, sem, sim, back[0])
    assert result.status == PolicyStatus.REACHED
    assert sim.collisions == 0


def test_a_waypoint_whose_nearest_free_cell_is_a_sealed_pocket_is_approached_from_outside(policy):
    # A 2 m block (a bed, a counter) with a small hollow inside: the free cell nearest the
    # waypoint is in the hollow, which no path reaches; a free cell outside is within the snap
    # radius. Before, the plan snapped into the hollow, A* failed and the goal was unreachable.
    floor = np.zeros((100, 100), dtype=bool)
    floor[5:95, 5:95] = True
    floor[30:70, 30:70] = False
    floor[45:56, 55:66] = True  # the hollow: a few free cells once inflated by the agent radius
    sem, traversable = _world(floor)
    waypoint = np.array([64 * CELL, 50 * CELL])
    sim = PointMass(traversable, Pose2D(1.0, 2.5, 0.0))
    result, _ = _drive(policy, sem, sim, waypoint, max_steps=300)
    assert result.status == PolicyStatus.REACHED
    assert np.linalg.norm(sim.pose.xy - waypoint) <= policy.cfg.goal_snap_radius_m
    assert policy.reachable(sem, np.array([1.0, 2.5]), waypoint[None]).all(), "reachable() agrees with act()"


def test_the_cheapest_reachable_target_is_the_one_with_the_shortest_way(policy):
    # A room (rows 0-59, y < 3 m) seen whole, its far wall at row 60, unknown space beyond; a
    # partition at x = 3 m from the bottom wall up to y = 2.5 m. The agent stands at (2, 1).
    sem = SemanticMap.empty((100, 100), ("chair",), CELL, (0.0, 0.0))
    sem.explored[:60] = True
    sem.obstacle[60] = True
    sem.obstacle[:50, 60] = True
    xy = np.array([2.0, 1.0])
    targets = np.zeros(sem.shape, dtype=bool)
    # Straddling the far wall (an object against it): only the room's side can be reached.
    targets[50:75, 30:50] = True
    best = policy.cheapest_reachable(sem, xy, [targets])
    assert best is not None and best[1] < 3.0 - RADIUS, best
    targets[:] = False
    targets[66:75, 30:50] = True  # beyond the wall only
    assert policy.cheapest_reachable(sem, xy, [targets]) is None
    # Two patches 1.25 m away in a straight line: behind the partition (a 6 m walk round its
    # end) and in the open; the open one is cheaper.
    targets[:] = False
    targets[15:25, 65:70] = True
    targets[15:25, 10:15] = True
    best = policy.cheapest_reachable(sem, xy, [targets])
    assert best is not None and best[0] < 1.0, best
