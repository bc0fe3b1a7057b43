"""ObjectNav episode generation, after habitat-lab's generator (``habitat/datasets/pointnav/
pointnav_generator.py``, whose filters habitat's ObjectNav datasets reuse).

For each scene, every goal category present in it (``EpisodeConfig.goal_categories``) gets
episodes: the categories are put in a seeded random order and cycled, so with ``per_scene`` at
least the number of present categories each one gets ``per_scene // n`` or one more. An episode:

* start: a traversable cell centre drawn uniformly among the cells whose geodesic distance to the
  goal region lies in ``[min_geodesic, max_geodesic]`` (habitat-lab: 1..30 m), i.e. in the goal
  region's connected component, on an island of radius >= ``min_island_radius`` (habitat-lab's
  ``ISLAND_RADIUS_LIMIT``; radius = farthest cell from the island's centroid); random yaw.
* straight-line filter: a start with geodesic / Euclidean distance ratio below
  ``geodesic_to_euclid_min_ratio`` is kept only with habitat-lab's probability
  ``ratio_keep_scale * (ratio - ratio_keep_offset) ** 2`` (0.008..0.144 for ratios 1..1.1). The
  Euclidean distance is to the nearest goal-region cell.
* walkable (``require_action_path``): the discrete agent (0.25 m steps on the 12 headings its
  start yaw allows, no sliding along walls) must be able to walk from the start pose into the
  goal region (``geodesic.shortest_action_path``). habitat-lab's generator likewise drops
  episodes whose ``get_action_shortest_path`` fails. Grid connectivity alone is not enough: a
  one-cell-wide sliver of traversable floor connects the grid but no 0.25 m step fits through it.
* up to ``retries_per_episode`` starts are drawn; if every draw that is walkable was rejected by
  the straight-line filter, the latest of them is kept anyway (``info["ratio_fallback"]``), so
  every present category still gets its episodes; if no draw is walkable, the episode is
  skipped (the scene gets fewer).
* ``info["geodesic_distance"]`` = the geodesic field at the start cell (m).

A category whose goal region is unreachable from any valid start (e.g. an object walled off
in the map) gets no episodes. Episodes are deterministic given (scene name, per_scene, config,
seed): each scene draws from its own generator seeded by (seed, crc32(scene name)), so a
scene's episodes do not depend on which other scenes are in the list.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from scipy import ndimage

from trajrag import config as config_mod
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.frames import Pose2D
from trajrag.world.geodesic import GOAL_REGION_RULES, ActionPath, GoalField, Motion, goal_field, shortest_action_path
from trajrag.world.scene import Scene


@dataclass
class EpisodeConfig:
    """Episode definition and generation (values and sources: ``configs/episodes.yaml``).

    goal_categories: ObjectNav goal names. success_distance: metres from a goal object within
    which STOP succeeds (the goal region). goal_region: how a region cell must see the object
    (``geodesic.GOAL_REGION_RULES``). success_tolerance_m: geodesic metres outside the region
    that still count (habitat's 0.1 m to the view points). max_steps: action budget per episode.
    min_geodesic, max_geodesic: metres. geodesic_to_euclid_min_ratio, ratio_keep_scale,
    ratio_keep_offset: straight-line filter. retries_per_episode: start draws per episode.
    min_island_radius: metres.
    geodesic_neighbourhood_radius: cells (1: 8 neighbours, 2: 16, 3: 32). field_cache_size:
    goal fields kept in memory. seed: default generation seed (``generated:K`` specs without
    one, ``world/datasets.py``). require_action_path: keep only starts from which the discrete
    agent can walk into the goal region. action_path_*: the shortest-action-path planner
    (``geodesic.shortest_action_path``: heuristic weight, metres per turn, node budget).
    start_floor_tolerance_m: metres a start's height may differ from its scene's floor_height
    (``world/datasets.py`` validation).
    mappable_view_radius_m, mappable_views: where ``episodes check`` looks at each goal instance
    from (traversable cells within that many metres, at most that many, one per bearing) to
    decide whether the mapper can map it (``agent/goal_visibility.py``).
    """

    goal_categories: list[str]
    success_distance: float
    goal_region: str
    success_tolerance_m: float
    max_steps: int
    min_geodesic: float
    max_geodesic: float
    geodesic_to_euclid_min_ratio: float
    ratio_keep_scale: float
    ratio_keep_offset: float
    retries_per_episode: int
    min_island_radius: float
    geodesic_neighbourhood_radius: int
    field_cache_size: int
    seed: int
    require_action_path: bool
    action_path_heuristic_weight: float
    action_path_turn_cost_m: float
    action_path_max_expansions: int
    start_floor_tolerance_m: float
    mappable_view_radius_m: float
    mappable_views: int


def check_config(cfg: EpisodeConfig) -> None:
    """``ConfigError`` naming the bad value."""
    if not 0 <= cfg.min_geodesic <= cfg.max_geodesic:
        raise config_mod.ConfigError(f"episodes: need 0 <= min_geodesic <= max_geodesic, got "
                          f"{cfg.min_geodesic}, {cfg.max_geodesic}")
    if cfg.success_distance < 0 or cfg.success_tolerance_m < 0 or cfg.max_steps < 1 or cfg.retries_per_episode < 1:
        raise config_mod.ConfigError(f"episodes: success_distance >= 0, success_tolerance_m >= 0, max_steps >= 1 and "
                          f"retries_per_episode >= 1 required, got {cfg.success_distance}, {cfg.success_tolerance_m}, "
                          f"{cfg.max_steps}, {cfg.retries_per_episode}")
    if cfg.goal_region not in GOAL_REGION_RULES:
        raise config_mod.ConfigError(f"episodes: goal_region must be one of {', '.join(GOAL_REGION_RULES)}, "
                                     f"got {cfg.goal_region!r}")
    if cfg.geodesic_neighbourhood_radius < 1 or cfg.field_cache_size < 1:
        raise config_mod.ConfigError("episodes: geodesic_neighbourhood_radius and field_cache_size must be >= 1")
    if cfg.action_path_heuristic_weight < 1 or cfg.action_path_turn_cost_m < 0 or cfg.action_path_max_expansions < 1:
        raise config_mod.ConfigError(f"episodes: need action_path_heuristic_weight >= 1, action_path_turn_cost_m >= 0 "
                          f"and action_path_max_expansions >= 1, got {cfg.action_path_heuristic_weight}, "
                          f"{cfg.action_path_turn_cost_m}, {cfg.action_path_max_expansions}")


def scene_goal_field(scene: Scene, category: str, cfg: EpisodeConfig) -> GoalField:
    """The cached geodesic field to the goal region of ``category`` in ``scene`` (per ``cfg``)."""
    return goal_field(scene, category, cfg.success_distance, cfg.geodesic_neighbourhood_radius,
                      cfg.field_cache_size, cfg.goal_region)


def plan_action_path(scene: Scene, goal: GoalField, pose: Pose2D, motion: Motion,
                     cfg: EpisodeConfig) -> Optional[ActionPath]:
    """The discrete agent's shortest walk from ``pose`` into the goal region (``None`` if none)."""
    return shortest_action_path(scene, goal, pose.xy, pose.yaw, motion, cfg.action_path_heuristic_weight,
                                cfg.action_path_turn_cost_m, cfg.action_path_max_expansions)


def habitat_scene_id(scene: Scene) -> tuple[str, int]:
    """``(scene_id, floor_id)`` as habitat episode files write them.

    Gibson floors (``meta["dataset"] == "gibson"``): ``gibson_semantic/<Scene>.glb`` and the floor
    index; a scene with ``meta["scene_id"]`` uses it; otherwise the scene name (procedural homes:
    ``procedural/train/0003``) and ``meta.get("floor_id", 0)``.
    """
    meta = scene.meta or {}
    if "scene_id" in meta:
        return str(meta["scene_id"]), int(meta.get("floor_id", meta.get("floor", 0)))
    if meta.get("dataset") == "gibson":
        try:
            floor = int(meta.get("floor", 0))
        except (TypeError, ValueError):
            raise ValueError(f"scene {scene.name}: Gibson floor {meta.get('floor')!r} is not an integer") from None
        return f"gibson_semantic/{meta['scene']}.glb", floor
    return scene.name, int(meta.get("floor_id", 0))


def island_radius(traversable: np.ndarray, cell_size: float) -> np.ndarray:
    """float (H, W): per traversable cell, the radius (m) of its 4-connected island (farthest
    cell centre from the island centroid); 0 elsewhere. The geodesic graph's moves never leave a
    4-connected component, so these are also its connected components."""
    labels, n = ndimage.label(traversable)
    if n == 0:
        return np.zeros(traversable.shape)
    rows, cols = np.nonzero(labels)
    lab = labels[rows, cols]
    counts = np.bincount(lab, minlength=n + 1).astype(np.float64)
    counts[0] = 1.0
    cr = np.bincount(lab, weights=rows, minlength=n + 1) / counts
    cc = np.bincount(lab, weights=cols, minlength=n + 1) / counts
    dist = np.hypot(rows - cr[lab], cols - cc[lab])
    radius = np.zeros(n + 1)
    np.maximum.at(radius, lab, dist)
    out = np.zeros(traversable.shape)
    out[rows, cols] = radius[lab] * cell_size
    return out


def _keep_straight(ratio: float, cfg: EpisodeConfig, rng: np.random.Generator) -> bool:
    """habitat-lab's straight-line filter: always keep ratio >= threshold, else keep rarely."""
    if ratio >= cfg.geodesic_to_euclid_min_ratio:
        return True
    keep = cfg.ratio_keep_scale * (ratio - cfg.ratio_keep_offset) ** 2
    return bool(rng.random() < keep)


def present_goal_categories(scene: Scene, cfg: EpisodeConfig) -> list[str]:
    """The config's goal categories with at least one object in ``scene`` that can be seen from
    the traversable area (a non-empty goal region), in config order."""
    present = set(scene.present_categories())
    return [c for c in cfg.goal_categories if c in present and scene_goal_field(scene, c, cfg).reachable]


def why_no_episodes(scene: Scene, cfg: EpisodeConfig) -> str:
    """Why ``scene`` yields no episodes under ``cfg`` (for error messages and the dataset doctor)."""
    present = set(scene.present_categories())
    goals = [c for c in cfg.goal_categories if c in present]
    if not goals:
        return f"no object of any goal category {list(cfg.goal_categories)} (episodes.goal_categories)"
    return (f"goal categories {goals} are present, but none has a start {cfg.min_geodesic:g}-{cfg.max_geodesic:g} m "
            f"away from which the agent can walk into its goal region")


def _start_cells(field: GoalField, islands_ok: np.ndarray, cfg: EpisodeConfig) -> np.ndarray:
    d = field.distance
    ok = islands_ok & np.isfinite(d) & (d >= cfg.min_geodesic) & (d <= cfg.max_geodesic)
    return np.argwhere(ok)


def generate_scene_episodes(scene: Scene, per_scene: int, cfg: EpisodeConfig, seed: int,
                            motion: Motion) -> list[ObjectNavEpisode]:
    """``per_scene`` episodes of one scene (fewer only if some category has no valid start)."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(scene.name.encode())])
    categories = present_goal_categories(scene, cfg)
    if not categories or per_scene <= 0:
        return []
    islands_ok = island_radius(scene.traversable, scene.cell_size) >= cfg.min_island_radius
    pools = {}
    for name in categories:
        field = scene_goal_field(scene, name, cfg)
        cells = _start_cells(field, islands_ok, cfg)
        if len(cells):
            euclid = ndimage.distance_transform_edt(~field.region) * scene.cell_size
            pools[name] = (field, cells, euclid)
    order = [c for c in categories if c in pools]
    if not order:
        return []
    order = [order[i] for i in rng.permutation(len(order))]
    scene_id, floor_id = habitat_scene_id(scene)
    episodes = []
    for i in range(per_scene):
        name = order[i % len(order)]
        field, cells, euclid = pools[name]
        drawn = _draw_start(scene, field, cells, euclid, cfg, motion, rng)
        if drawn is None:
            continue
        pose, fallback = drawn
        cell = scene.to_cell(pose.xy)
        episode = ObjectNavEpisode.from_pose(
            episode_id=f"{scene.name}:{i}", scene_id=scene_id, scene_key=scene.name, pose=pose,
            floor_height=scene.floor_height, category=name,
            geodesic_distance=float(field.distance[cell[0], cell[1]]), floor_id=floor_id)
        episode.info["euclidean_distance"] = float(euclid[cell[0], cell[1]])
        episode.info["ratio_fallback"] = fallback
        episodes.append(episode)
    return episodes


def _draw_start(scene: Scene, field: GoalField, cells: np.ndarray, euclid: np.ndarray, cfg: EpisodeConfig,
                motion: Motion, rng: np.random.Generator) -> Optional[tuple[Pose2D, bool]]:
    """A start pose passing both filters; else the latest draw passing the action-path check,
    flagged as a ratio fallback; else ``None``. The action path (the costly check) is planned only
    for draws that are kept or needed as fallback."""
    rejected: list[Pose2D] = []
    for _ in range(cfg.retries_per_episode):
        cell = cells[rng.integers(len(cells))]
        xy = scene.to_xy(cell)
        pose = Pose2D(float(xy[0]), float(xy[1]), float(rng.uniform(-math.pi, math.pi)))
        e = euclid[cell[0], cell[1]]
        ratio = field.distance[cell[0], cell[1]] / e if e > 0 else math.inf
        if not _keep_straight(ratio, cfg, rng):
            rejected.append(pose)
        elif _walkable(scene, field, pose, cfg, motion):
            return pose, False
    for pose in reversed(rejected):
        if _walkable(scene, field, pose, cfg, motion):
            return pose, True
    return None


def _walkable(scene: Scene, field: GoalField, pose: Pose2D, cfg: EpisodeConfig, motion: Motion) -> bool:
    """Whether the discrete agent can walk from ``pose`` into the goal region (habitat-lab's
    generator likewise drops episodes its shortest-path follower cannot finish)."""
    if not cfg.require_action_path:
        return True
    path = plan_action_path(scene, field, pose, motion, cfg)
    return path is not None and path.complete


def generate_episodes(scenes: Sequence[Scene], per_scene: int, cfg: EpisodeConfig, seed: int,
                      motion: Motion) -> list[ObjectNavEpisode]:
    """ObjectNav episodes (habitat-lab schema) for ``scenes``: ``per_scene`` each (module doc).

    motion: the simulator's motion model for the action-path check (``Motion.from_sim_config``).
    """
    check_config(cfg)
    if per_scene < 0:
        raise ValueError(f"per_scene must be >= 0, got {per_scene}")
    episodes = []
    for scene in scenes:
        episodes.extend(generate_scene_episodes(scene, per_scene, cfg, seed, motion))
    return episodes
