"""Run one ObjectNav episode of any agent in any ``Simulator`` and score it like habitat-lab.

The loop is habitat's: reset the simulator at the episode start, then ask the agent for one
action per observation until it calls STOP or ``max_steps`` actions have been taken (STOP counts
as an action; it is not sent to the simulator, which would only render). The result keeps the
metrics (``world/metrics.py``) and the raw trajectory, as plain data (``to_dict`` is JSON-able).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional, Protocol

from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.episode_gen import EpisodeConfig, scene_goal_field
from trajrag.world.interface import Action, Observations, Simulator
from trajrag.world.metrics import EpisodeMetrics, episode_metrics
from trajrag.world.scene import Scene

SUCCESS = "success"
STOPPED_OUTSIDE_GOAL = "stopped_outside_goal"
STEP_BUDGET_EXHAUSTED = "step_budget_exhausted"


class Agent(Protocol):
    """What ``run_episode`` needs from an agent."""

    def reset(self, episode: ObjectNavEpisode, scene: Scene) -> None: ...

    def act(self, observations: Observations) -> Action: ...


@dataclass
class EpisodeResult:
    """One episode's metrics and raw trajectory.

    poses: map-frame ``(x, y, yaw)`` (metres, radians) at the start and after each simulated
    action (len = actions without the final STOP + 1). actions: the agent's actions as habitat
    ids (``Action``), STOP included. collided: per simulated action, whether a MOVE_FORWARD was
    blocked. outcome: ``success``, ``stopped_outside_goal`` or ``step_budget_exhausted``.
    """

    metrics: EpisodeMetrics
    episode_id: str
    scene_key: str
    category: str
    outcome: str
    poses: list[tuple[float, float, float]] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    collided: list[bool] = field(default_factory=list)

    def to_dict(self) -> dict:
        """Plain JSON-able dict (tuples become lists; an unreachable DTG is ``inf``)."""
        out = asdict(self)
        out["poses"] = [list(p) for p in self.poses]
        return out


def run_episode(sim: Simulator, agent: Agent, episode: ObjectNavEpisode, scene: Scene, cfg: EpisodeConfig,
                max_steps: Optional[int] = None) -> EpisodeResult:
    """Run ``agent`` on ``episode`` in ``scene`` through ``sim``; return metrics + trajectory.

    cfg: the ``episodes`` section (success distance, geodesic neighbourhood, step budget).
    max_steps: action budget (``None``: ``cfg.max_steps``, 500). Raises ``ValueError`` naming the
    episode if it does not belong to ``scene`` or cannot start.
    """
    max_steps = cfg.max_steps if max_steps is None else int(max_steps)
    if episode.scene_key and episode.scene_key != scene.name:
        raise ValueError(f"episode {episode.episode_id}: belongs to scene {episode.scene_key!r}, "
                         f"not {scene.name!r}")
    try:
        goal = scene_goal_field(scene, episode.object_category, cfg)
    except KeyError as exc:
        raise ValueError(f"episode {episode.episode_id}: {exc.args[0]}") from None
    try:
        observations = sim.reset(scene, episode.start_pose())
    except ValueError as exc:
        raise ValueError(f"episode {episode.episode_id}: {exc}") from None
    agent.reset(episode, scene)

    pose = observations.pose
    poses = [(pose.x, pose.y, pose.yaw)]
    actions: list[int] = []
    collided: list[bool] = []
    travelled = 0.0
    called_stop = False
    while len(actions) < max_steps:
        action = Action(agent.act(observations))
        actions.append(int(action))
        if action == Action.STOP:
            called_stop = True
            break
        observations = sim.step(action)
        new = observations.pose
        travelled += math.hypot(new.x - pose.x, new.y - pose.y)
        pose = new
        poses.append((pose.x, pose.y, pose.yaw))
        collided.append(bool(observations.collided))

    geodesic = float(episode.info.get("geodesic_distance", goal.cell_distance(scene.to_cell(episode.start_pose().xy))))
    metrics = episode_metrics(
        episode_id=str(episode.episode_id), scene_key=scene.name, category=episode.object_category,
        goal=goal, final_cell=scene.to_cell(pose.xy), geodesic_distance=geodesic,
        travelled_m=travelled, steps=len(actions), collisions=sum(collided),
        called_stop=called_stop, max_steps=max_steps, success_tolerance_m=cfg.success_tolerance_m)
    if metrics.success:
        outcome = SUCCESS
    elif called_stop:
        outcome = STOPPED_OUTSIDE_GOAL
    else:
        outcome = STEP_BUDGET_EXHAUSTED
    return EpisodeResult(metrics=metrics, episode_id=str(episode.episode_id), scene_key=scene.name,
                         category=episode.object_category, outcome=outcome, poses=poses,
                         actions=actions, collided=collided)
