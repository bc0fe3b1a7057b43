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
from trajrag.memory.prepare import chunk_description
from trajrag.topo.trajectory import TopoPolarTrajectory
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.interface import Action, Observations
from trajrag.world.scene import Scene

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


def collection_settings(overrides: Sequence[str], scenes: Sequence[Scene]) -> dict:
    """The world and sensor settings a collector walks with (``corpus.collector_overrides``
    applied, as ``Collector`` applies them): ``{"sim", "perception", "episodes", "datasets"}``,
    what a memory records of its walks (``memory.build_settings``)."""
    collector_overrides = list(config.load("corpus", overrides).collector_overrides) + list(overrides)
    settings: dict = {}
    for section in ("sim", "perception", "episodes"):
        values = config.to_dict(config.load(section, collector_overrides))
        settings[section] = {k: v for k, v in values.items() if k not in _BOOKKEEPING.get(section, ())}
    settings["datasets"] = sorted({scene.name.split("/")[0] for scene in scenes})
    return settings


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
    """Holds one simulator and one agent per policy; ``collect`` runs episodes one by one."""

    def __init__(self, overrides: Sequence[str] = (), seed: int = 0) -> None:
        from trajrag.agent.navigator import make_frontier_agent
        from trajrag.agent.oracle import OracleAgent
        from trajrag.world.sim import GridSimulator, intrinsics_of

        self.cfg: CorpusConfig = config.load("corpus", overrides)
        overrides = list(self.cfg.collector_overrides) + list(overrides)
        sim_cfg = config.load("sim", overrides)
        self.sim = GridSimulator(sim_cfg)
        nav = config.load("navigator", overrides)
        builder = MapBuilder(nav.vocabulary, intrinsics_of(sim_cfg), config.load("mapping", overrides),
                             config.load("perception", overrides), config.load("topo", overrides))
        oracle = OracleAgent(config.load("oracle", overrides), sim_cfg, config.load("episodes", overrides))
        if self.cfg.oracle_look_around_turns or self.cfg.oracle_look_around_at_goal_turns:
            oracle = LookAround(oracle, self.cfg.oracle_look_around_turns, self.cfg.oracle_look_around_at_goal_turns)
        self.agents = {
            "oracle": RecordingAgent(oracle, builder, seed),
            "explore": make_frontier_agent(sim_cfg, overrides, seed),
        }
        self.seed = seed
        self.recorder = None
        if self.cfg.keep_value_decisions:  # the exploration walks' decisions, for the frontier value
            from trajrag.agent.value_data import ValueDecisionRecorder

            episode_cfg = config.load("episodes", overrides)
            self.recorder = ValueDecisionRecorder(episode_cfg.goal_categories, episode_cfg,
                                                  config.load("audit", overrides), config.load("value", overrides))
            self.agents["explore"].decision_observer = self.recorder

    def collect_one(self, episode: ObjectNavEpisode, scene: Scene, policy: str) -> CollectedEpisode:
        """Run one episode with ``policy`` (``oracle`` / ``explore`` / ``mix``) and convert it."""
        chosen = episode_policy(episode, policy, self.cfg.oracle_fraction, self.cfg.seed)
        agent = self.agents[chosen]
        recording = self.recorder is not None and chosen == "explore"
        if recording:
            self.recorder.start(scene, episode)
        result = run_episode(self.sim, agent, episode, scene)
        trajectory = agent.topo_trajectory(success=result.metrics.success, with_place=True)
        # The chunk text is made here, not by the memory's single writer (memory.grouping).
        trajectory.description = chunk_description(trajectory)
        decisions = None
        if recording:
            from trajrag.planners.frontier_value import decisions_to_bytes

            decisions = decisions_to_bytes(self.recorder.take(), agent.builder.vocabulary, self.recorder.goals)
        return CollectedEpisode(trajectory_id(episode, chosen), chosen, trajectory, result, decisions)

    def collect(self, episodes: Sequence[ObjectNavEpisode], scenes: Sequence[Scene],
                policy: str) -> Iterator[CollectedEpisode]:
        by_name = {scene.name: scene for scene in scenes}
        for episode in episodes:
            yield self.collect_one(episode, by_name[episode.scene_key], policy)
