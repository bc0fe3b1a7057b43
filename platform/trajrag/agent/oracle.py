"""The privileged oracle: the shortest action path to the goal region, then STOP.

It reads the scene (the upper bound every ObjectNav agent is compared with, like habitat-lab's
``ShortestPathFollower``) and uses only the discrete actions (MOVE_FORWARD ``sim.forward_step``,
TURN by ``sim.turn_angle_deg``).

Why a lattice search and not a pure-pursuit follower: SPL charges every metre the agent walks, and
with 0.25 m steps on 30-degree headings a follower that aims at a lookahead point of the grid path
zig-zags, overshoots thin goal regions (it can even oscillate across one) and wastes 5-15 % of
the path. Instead the oracle plans over the poses the simulator can actually reach: A* over
positions reached by forward steps along the reachable headings (current yaw + k * turn angle),
each step checked with the simulator's own collision rule (``segment_is_free``), with the
geodesic field to the goal region (``world/geodesic.py``) as heuristic and "the position's cell is
in the goal region" as goal test. Cost = metres walked + ``turn_cost_m`` per turn (a tie-break
among equally long plans). Positions are merged per grid cell (first arrival kept). So the plan
is the shortest walk in the simulator's own motion model, up to that merging and the heuristic
weight; it ends with the first step into the goal region, and the oracle STOPs there.

The plan is replayed action by action; if the agent is not where the plan expected (a collision,
another simulator), it replans from where it is. A search that hits ``max_expansions`` returns the
path to the expanded position closest to the goal (anytime): the oracle walks it and plans again.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from trajrag import config as config_mod
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.episode_gen import EpisodeConfig, scene_goal_field
from trajrag.world.frames import Pose2D
from trajrag.world.geodesic import GoalField
from trajrag.world.interface import Action, Observations
from trajrag.world.scene import Scene


@dataclass
class OracleConfig:
    """Oracle planner settings (values and sources: ``configs/oracle.yaml``).

    heuristic_weight: A* weight on the geodesic heuristic (1 = shortest plan; more = faster).
    turn_cost_m: cost of one turn in metres (tie-break between plans of equal length).
    max_expansions: A* node budget per plan before it returns its best partial plan.
    max_replans: plans per episode before the oracle gives up with STOP.
    benchmark_sim_overrides: ``sim.*`` overrides for ``oracle_benchmark`` (it needs no images).
    """

    heuristic_weight: float
    turn_cost_m: float
    max_expansions: int
    max_replans: int
    benchmark_sim_overrides: list[str]


def load_config(overrides: Sequence[str] = ()) -> OracleConfig:
    """``configs/oracle.yaml`` with ``oracle.key=value`` overrides."""
    return config_mod.load("oracle", overrides)


def check_config(cfg: OracleConfig) -> None:
    if cfg.heuristic_weight < 1 or cfg.turn_cost_m < 0 or cfg.max_expansions < 1 or cfg.max_replans < 1:
        raise config_mod.ConfigError(
            f"oracle: need heuristic_weight >= 1, turn_cost_m >= 0, max_expansions >= 1 and "
            f"max_replans >= 1, got {cfg.heuristic_weight}, {cfg.turn_cost_m}, "
            f"{cfg.max_expansions}, {cfg.max_replans}")


@dataclass(frozen=True)
class Motion:
    """The simulator's motion model: step length (m), turn angle (rad), collision sample spacing
    (cells), as ``world/sim.py`` applies them."""

    forward_step: float
    turn: float
    collision_step_cells: float

    @classmethod
    def from_sim_config(cls, sim_cfg) -> "Motion":
        return cls(float(sim_cfg.forward_step), math.radians(sim_cfg.turn_angle_deg),
                   float(sim_cfg.collision_step_cells))

    @property
    def n_headings(self) -> int:
        """Distinct headings reachable by turning (12 for 30 degrees)."""
        return max(1, int(round(2.0 * math.pi / self.turn)))


# Relative slack for float noise in "segment length / sample spacing" (module-level, not a tuning
# knob): the default 0.25 m step over 0.025 m spacing is an exact integer, so the simulator's
# ceil() lands on either side of it depending on the last bit of the segment length.
_FLOAT_SLACK = 1e-9


def segments_free(scene: Scene, start: np.ndarray, ends: np.ndarray, spacing_cells: float) -> np.ndarray:
    """bool (K,): whether each segment ``start -> ends[k]`` (map frame, m) stays on traversable
    cells under the simulator's rule (``GridSimulator.segment_is_free``: ``ceil(length /
    spacing) + 1`` evenly spaced samples, both ends included). Where float noise could make the
    simulator draw one sample more or fewer, both sample sets are checked (conservative)."""
    ends = np.asarray(ends, dtype=np.float64).reshape(-1, 2)
    if not len(ends):
        return np.zeros(0, dtype=bool)
    ratio = float(np.max(np.linalg.norm(ends - start, axis=1))) / (spacing_cells * scene.cell_size)
    counts = {int(math.ceil(ratio * (1.0 - _FLOAT_SLACK))) + 1, int(math.ceil(ratio * (1.0 + _FLOAT_SLACK))) + 1}
    t = np.concatenate([np.linspace(0.0, 1.0, n) for n in sorted(counts)])[None, :, None]
    points = start[None, None, :] + t * (ends[:, None, :] - start[None, None, :])
    cells = scene.to_cell(points)
    h, w = scene.shape
    inside = (cells[..., 0] >= 0) & (cells[..., 0] < h) & (cells[..., 1] >= 0) & (cells[..., 1] < w)
    free = np.zeros(cells.shape[:2], dtype=bool)
    free[inside] = scene.traversable[cells[..., 0][inside], cells[..., 1][inside]]
    return free.all(axis=1)


@dataclass
class Plan:
    """A planned walk: the heading index (turn steps from the planning yaw) of each forward step,
    the positions (m) after each, and whether it ends in the goal region."""

    headings: list[int]
    positions: list[np.ndarray]
    complete: bool
    expansions: int


def plan_walk(scene: Scene, goal: GoalField, start: Pose2D, motion: Motion, cfg: OracleConfig) -> Optional[Plan]:
    """A* over forward steps on the reachable headings (module doc). ``None`` if no step is
    possible or the start cannot reach the goal."""
    n = motion.n_headings
    yaws = start.yaw + motion.turn * np.arange(n)
    steps = motion.forward_step * np.stack([np.cos(yaws), np.sin(yaws)], axis=1)
    field = goal.distance
    h_w = cfg.heuristic_weight

    start_cell = tuple(scene.to_cell(start.xy))
    if not np.isfinite(field[start_cell]):
        return None
    # Per visited cell: exact position, heading of arrival, parent cell, g.
    pos = {start_cell: start.xy.astype(np.float64)}
    heading = {start_cell: 0}
    parent: dict = {start_cell: None}
    g = {start_cell: 0.0}
    closed = set()
    counter = 0
    heap = [(h_w * field[start_cell], counter, start_cell)]
    best_cell, best_h = start_cell, field[start_cell]
    expansions = 0
    goal_cell = None
    while heap and expansions < cfg.max_expansions:
        _, _, cell = heapq.heappop(heap)
        if cell in closed:
            continue
        closed.add(cell)
        if goal.region[cell]:
            goal_cell = cell
            break
        expansions += 1
        if field[cell] < best_h:
            best_cell, best_h = cell, field[cell]
        here = pos[cell]
        ends = here + steps
        free = segments_free(scene, here, ends, motion.collision_step_cells)
        cells = scene.to_cell(ends)
        k0 = heading[cell]
        for k in np.nonzero(free)[0]:
            nxt = (int(cells[k, 0]), int(cells[k, 1]))
            if nxt in closed:
                continue
            turns = abs((int(k) - k0 + n // 2) % n - n // 2)
            cost = g[cell] + motion.forward_step + cfg.turn_cost_m * turns
            if cost < g.get(nxt, math.inf):
                g[nxt], pos[nxt], heading[nxt], parent[nxt] = cost, ends[k], int(k), cell
                counter += 1
                heapq.heappush(heap, (cost + h_w * field[nxt], counter, nxt))
    end = goal_cell if goal_cell is not None else best_cell
    if end == start_cell:
        return None
    headings, positions = [], []
    while parent[end] is not None:
        headings.append(heading[end])
        positions.append(pos[end])
        end = parent[end]
    return Plan(headings[::-1], positions[::-1], goal_cell is not None, expansions)


class OracleAgent:
    """Privileged shortest-walk agent (module doc).

    cfg: ``OracleConfig``; sim_cfg: the simulator's config (step, turn, collision sampling;
    ``None``: ``configs/sim.yaml``); episode_cfg: the episode definition (``None``:
    ``configs/episodes.yaml``).
    """

    def __init__(self, cfg: Optional[OracleConfig] = None, sim_cfg=None,
                 episode_cfg: Optional[EpisodeConfig] = None) -> None:
        self.cfg = cfg if cfg is not None else load_config()
        check_config(self.cfg)
        sim_cfg = sim_cfg if sim_cfg is not None else config_mod.load("sim")
        self.motion = Motion.from_sim_config(sim_cfg)
        self.episode_cfg = episode_cfg if episode_cfg is not None else config_mod.load("episodes")
        self.scene: Optional[Scene] = None
        self.goal: Optional[GoalField] = None
        self.plans = 0
        self._actions: list[Action] = []
        self._expected: list[Optional[np.ndarray]] = []

    def reset(self, episode: ObjectNavEpisode, scene: Scene) -> None:
        """Start an episode: fetch (or compute) the goal field of its category in ``scene``."""
        self.scene = scene
        self.goal = scene_goal_field(scene, episode.object_category, self.episode_cfg)
        self.plans = 0
        self._actions, self._expected = [], []

    def act(self, observations: Observations) -> Action:
        """The next action from the current pose (``observations.pose``)."""
        if self.scene is None or self.goal is None:
            raise RuntimeError("OracleAgent.act called before reset(episode, scene)")
        pose = observations.pose
        cell = self.scene.to_cell(pose.xy)
        if self.scene.in_bounds(cell) and self.goal.region[cell[0], cell[1]]:
            return Action.STOP
        if not self._actions or observations.collided or not self._on_plan(pose):
            if self.plans >= self.cfg.max_replans or not self._replan(pose):
                return Action.STOP  # unreachable from here: stopping is the cheapest failure
        self._expected.pop(0)
        return self._actions.pop(0)

    def _on_plan(self, pose: Pose2D) -> bool:
        """Whether the agent stands where the plan expected it (within half a cell)."""
        expected = self._expected[0] if self._expected else None
        return expected is None or float(np.linalg.norm(pose.xy - expected)) <= self.scene.cell_size / 2.0

    def _replan(self, pose: Pose2D) -> bool:
        self.plans += 1
        plan = plan_walk(self.scene, self.goal, pose, self.motion, self.cfg)
        if plan is None:
            return False
        self._actions, self._expected = plan_to_actions(plan, pose, self.motion.n_headings)
        return bool(self._actions)


def plan_to_actions(plan: Plan, start: Pose2D, n_headings: int) -> tuple[list[Action], list[Optional[np.ndarray]]]:
    """Actions for a plan, each with the position the agent should be at before it (``None``:
    no check, e.g. between turns)."""
    actions: list[Action] = []
    expected: list[Optional[np.ndarray]] = []
    current, where = 0, start.xy
    for k, position in zip(plan.headings, plan.positions):
        delta = (k - current + n_headings // 2) % n_headings - n_headings // 2
        turn = Action.TURN_LEFT if delta > 0 else Action.TURN_RIGHT
        for _ in range(abs(delta)):
            actions.append(turn)
            expected.append(where)
        actions.append(Action.MOVE_FORWARD)
        expected.append(where)
        current, where = k, position
    return actions, expected


def oracle_benchmark(scene_spec: str, episodes_per_scene: int, seed: int,
                     overrides: Sequence[str] = ()) -> dict:
    """Oracle SR / SPL on generated episodes of ``scene_spec`` (``procedural:val:20``, a Gibson
    ``*_info.pbz2`` path, ...): ``{"sr", "spl", "dtg_m", "episodes", "per_category", ...}``."""
    from trajrag.agent.episode_runner import run_episode
    from trajrag.world.datasets import load_scenes
    from trajrag.world.episode_gen import generate_episodes
    from trajrag.world.metrics import summarize
    from trajrag.world.sim import GridSimulator

    oracle_cfg = load_config(overrides)
    sim_overrides = [f"sim.{o}" for o in oracle_cfg.benchmark_sim_overrides] + list(overrides)
    sim_cfg = config_mod.load("sim", sim_overrides)
    episode_cfg = config_mod.load("episodes", overrides)
    scenes = load_scenes(scene_spec, overrides)
    by_name = {s.name: s for s in scenes}
    episodes = generate_episodes(scenes, episodes_per_scene, episode_cfg, seed)
    sim = GridSimulator(sim_cfg)
    agent = OracleAgent(oracle_cfg, sim_cfg, episode_cfg)
    results = [run_episode(sim, agent, e, by_name[e.scene_key], cfg=episode_cfg) for e in episodes]
    summary = summarize([r.metrics for r in results])
    summary["outcomes"] = {k: sum(r.outcome == k for r in results) for k in sorted({r.outcome for r in results})}
    summary["scenes"] = len(scenes)
    return summary
