"""Perception + semantic mapping for one episode, shared by the navigator and the collectors.

``MapBuilder`` turns each observation into the semantic map M_t (oracle semantics by default)
and keeps the pose history; at the end it converts the episode into its topo-polar trajectory
(Eq. 5). ``RecordingAgent`` wraps any agent (the oracle, say) with a ``MapBuilder`` so its
episodes can be exported too: that is how corpus collectors record privileged walks.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from trajrag.mapping.semantic_map import MappingConfig, SemanticMap, SemanticMapper
from trajrag.perception.base import ObjectSegmenter
from trajrag.perception.config import PerceptionConfig
from trajrag.perception.factory import make_segmenter
from trajrag.perception.oracle import OracleSegmenter
from trajrag.topo.candidates import map_place
from trajrag.topo.trajectory import TopoConfig, TopoPolarTrajectory, build_topo_polar, topo_graph
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.interface import Action, CameraIntrinsics, Observations
from trajrag.world.scene import Scene

log = logging.getLogger(__name__)


class MapBuilder:
    """Observations -> semantic map + pose history for one episode at a time.

    vocabulary: the agent's category names (open vocabulary: any list; scene categories are
    matched by name). A frame with a non-finite pose or no depth return is skipped with a warning:
    one bad frame never ends an episode or a batch.
    """

    def __init__(self, vocabulary: Sequence[str], intrinsics: CameraIntrinsics, mapping_cfg: MappingConfig,
                 perception_cfg: PerceptionConfig, topo_cfg: TopoConfig) -> None:
        self.vocabulary = tuple(vocabulary)
        self.mapper = SemanticMapper(mapping_cfg, intrinsics, self.vocabulary)
        self.perception_cfg = perception_cfg
        self.topo_cfg = topo_cfg
        self.segmenter: ObjectSegmenter | None = None
        self.poses: list[tuple[float, float, float]] = []
        self.skipped_frames = 0
        self.episode: ObjectNavEpisode | None = None

    @property
    def map(self) -> SemanticMap:
        return self.mapper.map

    def reset(self, episode: ObjectNavEpisode, scene: Scene, seed: int) -> None:
        """Start an episode: an empty map centred on the start, a fresh noise stream (the oracle
        segmenter is rebuilt for the scene's categories; a learned one is only reset)."""
        self.episode = episode
        if self.segmenter is None or isinstance(self.segmenter, OracleSegmenter):
            self.segmenter = make_segmenter(self.vocabulary, scene.categories, self.perception_cfg, seed)
        else:  # a learned detector: its weights load once per builder, not per episode
            self.segmenter.reset(seed)
        self.mapper.reset(episode.start_pose())
        self.poses = []
        self.skipped_frames = 0

    def observe(self, obs: Observations) -> bool:
        """Fuse one frame; False if it was skipped (bad pose or depth), with a warning."""
        try:
            masks, scores = self.segmenter.segment_with_scores(obs)
            updated = self.mapper.update(obs.depth, masks, obs.pose, scores)
        except ValueError as exc:
            self.skipped_frames += 1
            log.warning("episode %s: frame skipped: %s", self.episode.episode_id if self.episode else "?", exc)
            return False
        self.poses.append((obs.pose.x, obs.pose.y, obs.pose.yaw))
        return updated

    def topo_trajectory(self, success: bool, with_place: bool = False) -> TopoPolarTrajectory:
        """The episode as a topo-polar trajectory (reference heading: the start heading).

        with_place: attach the whole map as ``trajectory.place`` (a ``MapPlace`` whose nodes
        ``trajectory.node_ids`` index), for memories whose summaries are maps
        (``memory.summary_geometry``)."""
        episode = self.episode
        poses = np.asarray(self.poses, dtype=np.float64)
        graph = topo_graph(self.map, self.topo_cfg, anchor_xy=poses[-1, :2], with_edges=True) if with_place else None
        traj = build_topo_polar(
            self.map, poses, episode.object_category, self.topo_cfg,
            reference_yaw=episode.start_pose().yaw, success=success,
            episode_id=str(episode.episode_id), scene_id=episode.scene_key, graph=graph,
        )
        if graph is not None and len(graph):
            traj.place = map_place(self.map, graph, traj, self.topo_cfg)
        return traj


class RecordingAgent:
    """Any agent plus a ``MapBuilder`` that maps what it sees, so its episode can be exported."""

    def __init__(self, agent, builder: MapBuilder, seed: int = 0) -> None:
        self.agent = agent
        self.builder = builder
        self.seed = seed

    def reset(self, episode: ObjectNavEpisode, scene: Scene) -> None:
        self.builder.reset(episode, scene, self.seed)
        self.agent.reset(episode, scene)

    def act(self, observations: Observations) -> Action:
        self.builder.observe(observations)
        return self.agent.act(observations)

    def topo_trajectory(self, success: bool, with_place: bool = False) -> TopoPolarTrajectory:
        return self.builder.topo_trajectory(success, with_place)
