"""Experience for the frontier value: decisions in homes whose goals are known afterwards.

A nearest-frontier navigator walks episodes in the memory's homes (train scenes). At each of its
decisions, every candidate's features (``planners.frontier_value.candidate_features``, from the
agent's own map) are recorded with the candidate's true cost to the goal through its frontier
(the decision audit's privileged geodesic field, ``agent.decisions.FrontierGoalDistance``). In
those homes the cost is hindsight, like the oracle walks of the corpus; the fitted model never
sees the simulator at evaluation time. The corpus's exploration walks are such walks: their
collectors record the same decisions (``ValueDecisionRecorder``) and the memory keeps them
(``memory.value_log``), so a value can be fitted from a memory without walking again.
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional, Sequence

from tqdm import tqdm

from trajrag.agent.decisions import AuditConfig, FrontierGoalDistance
from trajrag.agent.episode_runner import run_episode
from trajrag.agent.registry import make_frontier_agent, make_value_agent
from trajrag.agent.rollouts import RolloutStats, rollout_decisions
from trajrag.config import Settings
from trajrag.planners.frontier_value import ValueConfig, ValueDecision, candidate_features
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.episode_gen import EpisodeConfig, scene_goal_field
from trajrag.world.scene import Scene
from trajrag.world.sim import GridSimulator


# on_scene(scene name, its decisions, the agent's vocabulary): a scene's walks are all done.
SceneDone = Callable[[str, list[ValueDecision], list[str]], None]


class ValueDecisionRecorder:
    """A navigator's ``decision_observer`` that records each decision as a ``ValueDecision``.

    ``start(scene, episode)`` before each episode (it fixes the goal field the costs come from
    and forgets anything an episode that raised left behind); ``take()`` after it returns the
    episode's decisions."""

    def __init__(self, goals: Sequence[str], episode_cfg: EpisodeConfig, audit: AuditConfig, cfg: ValueConfig) -> None:
        self.goals, self.episode_cfg, self.audit, self.cfg = list(goals), episode_cfg, audit, cfg
        self._scene = ""
        self._to_goal: FrontierGoalDistance | None = None
        self._decisions: list[ValueDecision] = []

    def start(self, scene: Scene, episode: ObjectNavEpisode) -> None:
        field = scene_goal_field(scene, episode.object_category, self.episode_cfg)
        self._scene, self._to_goal = scene.name, FrontierGoalDistance(scene, field, self.audit.search_radius_m)
        self._decisions = []  # nothing left over from an episode that raised

    def __call__(self, ctx, choice: int, planner) -> None:
        if self._to_goal is None:
            raise RuntimeError("ValueDecisionRecorder: call start(scene, episode) before the episode")
        self._decisions.append(ValueDecision(scene=self._scene, goal=ctx.goal,
                                             features=candidate_features(ctx, self.goals, self.cfg),
                                             cost_m=self._to_goal.cost_through(ctx)))

    def take(self) -> list[ValueDecision]:
        taken, self._decisions = self._decisions, []
        return taken


def collect_value_decisions(scenes: Sequence[Scene], episodes: Sequence[ObjectNavEpisode], settings: Settings,
                            progress: bool = True,
                            on_scene: Optional[SceneDone] = None) -> tuple[list[ValueDecision], list[str]]:
    """Walk every episode with ``value.walker`` (nearest frontier, or the value planner of
    ``scoring.value_model``) and record its decisions about ``episodes.goal_categories``;
    returns them and the agent's vocabulary (the model's object columns). With ``value.target``
    rollout, only the sampled decisions of each walk, their costs rolled out (``agent/rollouts.py``).

    Episodes are walked scene after scene, in the order of ``scenes``; ``on_scene(name,
    decisions, vocabulary)`` is called as each scene is done (``agent/value_parts.py`` keeps them)."""
    cfg, episode_cfg = settings.value, settings.episodes
    make_agent = make_frontier_agent if cfg.walker == "frontier" else make_value_agent
    agent = make_agent(settings)
    vocabulary = list(agent.builder.vocabulary)
    sim = GridSimulator(settings.sim)
    recorder = ValueDecisionRecorder(episode_cfg.goal_categories, episode_cfg, settings.audit, cfg)
    rollouts = RolloutStats()
    agent.decision_observer = recorder
    by_scene: dict[str, list[ObjectNavEpisode]] = {}
    for episode in episodes:
        by_scene.setdefault(episode.scene_key, []).append(episode)
    decisions: list[ValueDecision] = []
    with tqdm(total=len(episodes), desc=f"value decisions ({cfg.target})", unit="ep", disable=not progress) as bar:
        for scene in (scene for scene in scenes if scene.name in by_scene):
            found: list[ValueDecision] = []
            for episode in by_scene[scene.name]:
                if cfg.target == "rollout":
                    found += rollout_decisions(agent, sim, scene, episode, episode_cfg, recorder,
                                               cfg.rollout_decisions_per_episode, rollouts)
                else:
                    recorder.start(scene, episode)
                    run_episode(sim, agent, episode, scene, cfg=episode_cfg)
                    found += recorder.take()
                bar.update(1)
            if on_scene is not None:
                on_scene(scene.name, found, vocabulary)
            decisions += found
    if rollouts.replay_mismatches:
        warnings.warn(f"{rollouts.replay_mismatches} rolled-out decisions dropped: replaying the walker's own "
                      f"choice did not repeat its walk (is the walker deterministic?): {rollouts.mismatched[:5]}")
    return decisions, vocabulary
