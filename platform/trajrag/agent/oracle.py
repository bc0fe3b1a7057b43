"""The privileged oracle: walks the shortest action path to the goal region, then STOPs.

It reads the scene (the upper bound every ObjectNav agent is compared with, like habitat-lab's
``ShortestPathFollower``) and uses only the discrete actions (MOVE_FORWARD ``sim.forward_step``,
TURN by ``sim.turn_angle_deg``).

Why a planner over the actions and not a pure-pursuit follower of the grid path: SPL charges every
metre walked, and with 0.25 m steps on 30-degree headings a follower aiming at a lookahead point
zig-zags, overshoots thin goal regions (it can circle across one for ever) and gets stuck in
front of moves its heading makes it collide with (the first such follower failed most Gibson
episodes; docs/notes/2026-12-code-history.md). The oracle therefore plans with
``geodesic.shortest_action_path``: A* over the positions the simulator can actually reach (forward
steps along the current yaw + k * turn angle, each checked with the simulator's collision rule),
guided by the geodesic field to the goal region, goal test "the position's cell is in the goal
region". The walk ends with the first step into the region and the oracle STOPs there. Turns are
inserted before each forward step (the shorter way round).

The plan is replayed action by action. If the agent is not where the plan expected it (a
collision, a different simulator) or the plan was partial (``episodes.action_path_max_expansions``
hit), it plans again from where it stands, at most ``max_replans`` times per episode.

Its SPL stays below 1 (SR 1.0) by the action set, not by the planner: walks are whole 0.25 m
steps (``spl_bound`` below) on 12 headings fixed by the start yaw (figures: docs/results.md, "The
oracle and the action lattice").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from trajrag.agent.episode_runner import run_episode
from trajrag.config import ConfigError, Settings
from trajrag.world.datasets import load_scenes
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.episode_gen import EpisodeConfig, generate_episodes, plan_action_path, scene_goal_field
from trajrag.world.frames import Pose2D
from trajrag.world.geodesic import ActionPath, GoalField, Motion
from trajrag.world.interface import Action, Observations
from trajrag.world.metrics import summarize
from trajrag.world.scene import Scene
from trajrag.world.sim import GridSimulator, SimConfig


@dataclass
class OracleConfig:
    """Oracle settings (values and sources: ``configs/oracle.yaml``; the planner's own settings
    are the ``episodes.action_path_*`` keys, shared with episode generation).

    max_replans: plans per episode before the oracle gives up with STOP.
    benchmark_sim_overrides: ``sim.*`` overrides for ``oracle_benchmark`` (it needs no images).
    """

    max_replans: int
    benchmark_sim_overrides: list[str]


class OracleAgent:
    """Privileged shortest-walk agent (module doc): ``reset(episode, scene)``, then ``act(obs)``.

    cfg: the ``oracle`` section; sim_cfg: the ``sim`` section, for its step, turn and collision
    sampling; episode_cfg: the ``episodes`` section (episode definition and planner settings).
    """

    def __init__(self, cfg: OracleConfig, sim_cfg: SimConfig, episode_cfg: EpisodeConfig) -> None:
        self.cfg = cfg
        if self.cfg.max_replans < 1:
            raise ConfigError(f"oracle.max_replans must be >= 1, got {self.cfg.max_replans}")
        self.motion = Motion.from_sim_config(sim_cfg)
        self.episode_cfg = episode_cfg
        self.scene: Optional[Scene] = None
        self.goal: Optional[GoalField] = None
        self.plans = 0
        self._actions: list[Action] = []
        self._expected: list[np.ndarray] = []

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
        return float(np.linalg.norm(pose.xy - self._expected[0])) <= self.scene.cell_size / 2.0

    def _replan(self, pose: Pose2D) -> bool:
        self.plans += 1
        path = plan_action_path(self.scene, self.goal, pose, self.motion, self.episode_cfg)
        if path is None or not path.headings:
            return False
        self._actions, self._expected = path_to_actions(path, pose, self.motion.n_headings)
        return True


def path_to_actions(path: ActionPath, start: Pose2D, n_headings: int) -> tuple[list[Action], list[np.ndarray]]:
    """Actions for an action path (turns the shorter way, then MOVE_FORWARD), each with the
    position (m) the agent should stand at before taking it."""
    actions: list[Action] = []
    expected: list[np.ndarray] = []
    current, where = 0, start.xy
    for k, position in zip(path.headings, path.positions):
        delta = (k - current + n_headings // 2) % n_headings - n_headings // 2
        turn = Action.TURN_LEFT if delta > 0 else Action.TURN_RIGHT
        for _ in range(abs(delta)):
            actions.append(turn)
            expected.append(where)
        actions.append(Action.MOVE_FORWARD)
        expected.append(where)
        current, where = k, position
    return actions, expected


def oracle_benchmark(scene_spec: str, episodes_per_scene: int, seed: int, settings: Settings) -> dict:
    """Oracle SR / SPL on generated episodes of ``scene_spec`` (``procedural:val:20``, a Gibson
    ``*_info.pbz2`` path, ...), with ``oracle.benchmark_sim_overrides`` beneath the settings'
    own overrides: ``summarize`` keys (``sr``, ``spl``, ``dtg_m``, ``episodes``,
    ``per_category``, ...) plus ``outcomes``, ``scenes`` and ``spl_bound``: the mean of
    ``l / (step * ceil(l / step))``, the SPL of walks no longer than the geodesic rounded up to
    whole forward steps. No agent of 0.25 m steps beats it (up to the geodesic's small
    overestimate, ``world/geodesic.py``); the 30-degree headings cost another 2-3 %."""
    import math

    oracle_cfg, episode_cfg = settings.oracle, settings.episodes
    sim_cfg = settings.with_overrides([f"sim.{o}" for o in oracle_cfg.benchmark_sim_overrides], beneath=True).sim
    scenes = load_scenes(scene_spec, settings)
    by_name = {s.name: s for s in scenes}
    episodes = generate_episodes(scenes, episodes_per_scene, episode_cfg, seed, Motion.from_sim_config(sim_cfg))
    sim = GridSimulator(sim_cfg)
    agent = OracleAgent(oracle_cfg, sim_cfg, episode_cfg)
    results = [run_episode(sim, agent, e, by_name[e.scene_key], cfg=episode_cfg) for e in episodes]
    summary = summarize([r.metrics for r in results])
    summary["outcomes"] = {k: sum(r.outcome == k for r in results) for k in sorted({r.outcome for r in results})}
    summary["scenes"] = len(scenes)
    step = sim_cfg.forward_step
    bounds = [m.geodesic_distance / (step * max(1, math.ceil(m.geodesic_distance / step)))
              for m in (r.metrics for r in results)]
    summary["spl_bound"] = float(np.mean(bounds)) if bounds else float("nan")
    return summary
