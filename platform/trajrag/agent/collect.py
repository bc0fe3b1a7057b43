"""Corpus collectors: run episodes with a privileged or an exploring agent, map what it sees,
and yield each finished episode as a topo-polar trajectory ready for the memory.

Policies (the paper collects trajectories on the train splits; the mix decides what the memory
learns from): ``oracle`` walks the geodesic shortest path (clean goal-directed experience),
``explore`` is the nearest-frontier navigator (realistic exploration, successes and failures),
``mix`` alternates them per episode by ``oracle_fraction``. One process here; the platform job
runs the same generator inside Ray collector actors.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Iterator, Sequence

from trajrag import config
from trajrag.agent.episode_runner import EpisodeResult, run_episode
from trajrag.agent.map_builder import MapBuilder, RecordingAgent
from trajrag.agent.registry import make_frontier_agent, make_oracle
from trajrag.agent.value_data import ValueDecisionRecorder
from trajrag.config import Settings
from trajrag.memory.prepare import chunk_description
from trajrag.planners.frontier_value import decisions_to_bytes
from trajrag.topo.trajectory import TopoPolarTrajectory
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.interface import Action, Observations
from trajrag.world.scene import Scene
from trajrag.world.sim import GridSimulator, intrinsics_of

POLICIES = ("oracle", "explore", "mix")


@dataclass
class CorpusConfig:
    """``configs/corpus.yaml``: collection policy mix and the collectors' sensor settings."""

    oracle_fraction: float
    collector_overrides: list[str]
    seed: int
    keep_value_decisions: bool
    oracle_look_around_turns: int
    oracle_look_around_at_goal_turns: int


@dataclass
class CollectedEpisode:
    """One finished episode: its memory key, the collecting policy, the topo-polar trajectory
    and the raw result (metrics, poses, actions)."""

    trajectory_id: str
    policy: str
    trajectory: TopoPolarTrajectory
    result: EpisodeResult
    value_decisions: bytes | None = None  # an exploration walk's decisions (agent.value_data), .npz bytes


def episode_policy(episode: ObjectNavEpisode, policy: str, oracle_fraction: float, seed: int) -> str:
    """``oracle`` or ``explore`` for this episode (``mix``: a stable per-episode draw)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown collection policy {policy!r}; choose one of {list(POLICIES)}")
    if policy != "mix":
        return policy
    draw = zlib.crc32(f"{seed}/{episode.scene_key}/{episode.episode_id}".encode()) / 2**32
    return "oracle" if draw < oracle_fraction else "explore"


# Keys that do not change what a walk sees or does: episode seeds (more walks of the same world),
# caches and the doctor's settings, the torch device a detector runs on.
_BOOKKEEPING = {"episodes": {"seed", "field_cache_size", "mappable_view_radius_m", "mappable_views"},
                "perception": {"device"}}


def collector_settings(settings: Settings) -> Settings:
    """The settings a collector walks with: ``corpus.collector_overrides`` beneath the run's own
    overrides (a ``--set`` of the same key wins)."""
    return settings.with_overrides(settings.corpus.collector_overrides, beneath=True)


def collection_settings(settings: Settings, scenes: Sequence[Scene]) -> dict:
    """The world and sensor settings a collector walks with (``collector_settings``, as
    ``Collector`` applies them): ``{"sim", "perception", "episodes", "datasets"}``, what a memory
    records of its walks (``memory.build_settings``)."""
    walked = collector_settings(settings)
    recorded: dict = {}
    for section in ("sim", "perception", "episodes"):
        values = config.to_dict(getattr(walked, section))
        recorded[section] = {k: v for k, v in values.items() if k not in _BOOKKEEPING.get(section, ())}
    recorded["datasets"] = sorted({scene.name.split("/")[0] for scene in scenes})
    return recorded


def trajectory_id(episode: ObjectNavEpisode, policy: str) -> str:
    """The idempotent memory key of one collected episode."""
    return f"{episode.scene_key}/{episode.episode_id}/{policy}"


class LookAround:
    """``agent`` with looks around in place: ``first`` TURN_LEFT actions at the start of each
    episode, and ``at_goal`` more when it first STOPs (``corpus.oracle_look_around_turns`` and
    ``corpus.oracle_look_around_at_goal_turns``). An oracle walk's map then shows its start room,
    and its goal room, whole, which gives the grouping more places to recognise; turns add
    steps, not path length. The wrapped agent must STOP again when asked again where it stood
    (the oracle STOPs anywhere in the goal region)."""

    def __init__(self, agent, first: int, at_goal: int = 0) -> None:
        for key, turns in (("oracle_look_around_turns", first), ("oracle_look_around_at_goal_turns", at_goal)):
            if turns < 0:
                raise config.ConfigError(f"corpus.{key} must be >= 0, got {turns}")
        self.agent = agent
        self.first = first
        self.at_goal = at_goal
        self.first_left = self.goal_left = 0

    def reset(self, episode: ObjectNavEpisode, scene: Scene) -> None:
        self.first_left, self.goal_left = self.first, self.at_goal
        self.agent.reset(episode, scene)

    def act(self, observations: Observations) -> Action:
        if self.first_left > 0:
            self.first_left -= 1
            return Action.TURN_LEFT
        action = self.agent.act(observations)
        if action == Action.STOP and self.goal_left > 0:
            self.goal_left -= 1
            return Action.TURN_LEFT
        return action


class Collector:
    """Holds one simulator and one agent per policy; ``collect`` runs episodes one by one, with
    the run's settings and ``corpus.collector_overrides`` beneath them (``collector_settings``)."""

    def __init__(self, settings: Settings, seed: int = 0) -> None:
        self.cfg: CorpusConfig = settings.corpus
        walked = collector_settings(settings)
        sim_cfg = walked.sim
        self.sim = GridSimulator(sim_cfg)
        self.episode_cfg = walked.episodes
        builder = MapBuilder(walked.navigator.vocabulary, intrinsics_of(sim_cfg), walked.mapping, walked.perception,
                             walked.topo)
        oracle = make_oracle(walked)
        if self.cfg.oracle_look_around_turns or self.cfg.oracle_look_around_at_goal_turns:
            oracle = LookAround(oracle, self.cfg.oracle_look_around_turns, self.cfg.oracle_look_around_at_goal_turns)
        self.agents = {
            "oracle": RecordingAgent(oracle, builder, seed),
            "explore": make_frontier_agent(walked, seed),
        }
        self.seed = seed
        self.recorder = None
        if self.cfg.keep_value_decisions:  # the exploration walks' decisions, for the frontier value
            episode_cfg = walked.episodes
            self.recorder = ValueDecisionRecorder(episode_cfg.goal_categories, episode_cfg, walked.audit, walked.value)
            self.agents["explore"].decision_observer = self.recorder

    def collect_one(self, episode: ObjectNavEpisode, scene: Scene, policy: str) -> CollectedEpisode:
        """Run one episode with ``policy`` (``oracle`` / ``explore`` / ``mix``) and convert it."""
        chosen = episode_policy(episode, policy, self.cfg.oracle_fraction, self.cfg.seed)
        agent = self.agents[chosen]
        recording = self.recorder is not None and chosen == "explore"
        if recording:
            self.recorder.start(scene, episode)
        result = run_episode(self.sim, agent, episode, scene, self.episode_cfg)
        trajectory = agent.topo_trajectory(success=result.metrics.success, with_place=True)
        # The chunk text is made here, not by the memory's single writer (memory.grouping).
        trajectory.description = chunk_description(trajectory)
        decisions = None
        if recording:
            decisions = decisions_to_bytes(self.recorder.take(), agent.builder.vocabulary, self.recorder.goals)
        return CollectedEpisode(trajectory_id(episode, chosen), chosen, trajectory, result, decisions)

    def collect(self, episodes: Sequence[ObjectNavEpisode], scenes: Sequence[Scene],
                policy: str) -> Iterator[CollectedEpisode]:
        by_name = {scene.name: scene for scene in scenes}
        for episode in episodes:
            yield self.collect_one(episode, by_name[episode.scene_key], policy)
