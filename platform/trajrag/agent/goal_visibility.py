"""Can the agent's own mapper map a goal instance at all?

A goal an agent cannot put on its map is a goal it never stops at, whatever its planner does: a
2.5D conversion can wall an object in, or leave it showing only slivers that the mapper's mask
erosion and pixel stride drop (``mapping.object_erosion_px``, ``pixel_stride``), fewer cells than
``navigator.goal_min_cells``. ``instance_mappability`` answers it the way the agent would: one
frame of exact semantics, facing the instance from traversable cells around it, through the
configured simulator and mapper, and counts the instance's cells on the map.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from trajrag.mapping.semantic_map import MappingConfig, SemanticMapper
from trajrag.perception.config import PerceptionConfig
from trajrag.perception.oracle import OracleSegmenter
from trajrag.world.frames import Pose2D
from trajrag.world.scene import Scene
from trajrag.world.sim import GridSimulator

# Map cells of the category within this many metres of the instance count as its cells (the
# mapper's cells are 5 cm, like the scene's, but projection lands a cell or two off).
_ATTRIBUTION_M = 0.25


@dataclass(frozen=True)
class InstanceMappability:
    """How well one goal instance can be mapped from one frame.

    instance: the scene's instance id. mapped_cells: the most of its cells one frame put on the
    map. viewpoint: map-frame ``(x, y)`` metres of that frame, None if no cell could look at it.
    views: frames tried.
    """

    instance: int
    mapped_cells: int
    viewpoint: tuple[float, float] | None
    views: int


def exact_semantics(cfg: PerceptionConfig) -> PerceptionConfig:
    """The oracle segmenter without its error model: what a perfect detector would report."""
    return dataclasses.replace(cfg, segmenter="oracle", profile="oracle", error_scale=0.0, erosion_px=0)


def instance_mappability(scene: Scene, instance: int, sim: GridSimulator, mapping_cfg: MappingConfig,
                         perception_cfg: PerceptionConfig, view_radius_m: float, max_views: int,
                         enough_cells: int, box: tuple[slice, slice] | None = None) -> InstanceMappability:
    """Map ``instance`` from up to ``max_views`` traversable cells within ``view_radius_m`` metres
    (one per bearing sector around it, the nearest in each), stopping at the first frame that puts
    ``enough_cells`` of it on the map. ``box``: the instance's bounding slices in the scene's cells
    (``ndimage.find_objects``), found here when not given."""
    window = _window(scene, box or _bounding_box(scene, instance), view_radius_m)
    offset = np.array([window[0].start, window[1].start])
    category = scene.categories[int(scene.instance_category[instance])]
    footprint = scene.instance_map[window] == instance
    # Distances within the window are the scene's: it holds the whole instance and every cell
    # within view_radius_m of it.
    distance = ndimage.distance_transform_edt(~footprint) * scene.cell_size  # metres to the instance
    centre = scene.to_xy(np.argwhere(footprint) + offset).mean(axis=0)
    viewpoints = _viewpoints(scene, window, distance, centre, view_radius_m, max_views)
    near_instance = distance <= _ATTRIBUTION_M
    segmenter = OracleSegmenter((category,), scene.categories, exact_semantics(perception_cfg), seed=0)
    mapper = SemanticMapper(mapping_cfg, sim.intrinsics, (category,))
    best, best_xy = 0, None
    for xy in viewpoints:
        pose = Pose2D(float(xy[0]), float(xy[1]), math.atan2(centre[1] - xy[1], centre[0] - xy[0]))
        obs = sim.reset(scene, pose)
        mapper.reset(pose)
        masks, scores = segmenter.segment_with_scores(obs)
        mapper.update(obs.depth, masks, pose, scores)
        cells = _cells_on(mapper, scene, near_instance, offset)
        if cells > best:
            best, best_xy = cells, (float(xy[0]), float(xy[1]))
        if best >= enough_cells:
            break
    return InstanceMappability(instance, best, best_xy, len(viewpoints))


def _bounding_box(scene: Scene, instance: int) -> tuple[slice, slice]:
    rows, cols = np.nonzero(scene.instance_map == instance)
    return slice(int(rows.min()), int(rows.max()) + 1), slice(int(cols.min()), int(cols.max()) + 1)


def _window(scene: Scene, box: tuple[slice, slice], margin_m: float) -> tuple[slice, slice]:
    """``box`` grown by ``margin_m`` metres (and a cell), clipped to the scene: the part of a
    large home (an MP3D floor has millions of cells) that one instance's check needs."""
    pad = int(math.ceil(margin_m / scene.cell_size)) + 1
    h, w = scene.instance_map.shape
    return (slice(max(box[0].start - pad, 0), min(box[0].stop + pad, h)),
            slice(max(box[1].start - pad, 0), min(box[1].stop + pad, w)))


def _viewpoints(scene: Scene, window: tuple[slice, slice], distance: np.ndarray, centre: np.ndarray,
                radius_m: float, max_views: int) -> np.ndarray:
    """(K, 2) map-frame metres: per bearing sector around the instance (``distance``: metres to
    it per cell of ``window``; ``centre``: its map-frame centre), its nearest traversable cell."""
    local = np.argwhere(scene.traversable[window] & (distance <= radius_m))
    if len(local) == 0:
        return np.zeros((0, 2))
    xy = scene.to_xy(local + np.array([window[0].start, window[1].start]))
    offset = xy - centre
    sector = ((np.arctan2(offset[:, 1], offset[:, 0]) + math.pi) / (2 * math.pi) * max_views).astype(int) % max_views
    near = distance[local[:, 0], local[:, 1]]
    order = np.lexsort((near, sector))
    first = order[np.r_[True, np.diff(sector[order]) != 0]]
    return xy[first[np.argsort(near[first])]]


def _cells_on(mapper: SemanticMapper, scene: Scene, near_instance: np.ndarray, offset: np.ndarray) -> int:
    """Cells of the mapper's only channel that fall on ``near_instance`` (a mask of the scene's
    cells from ``offset`` (row, col) on), read from the part of the map that can hold them."""
    sem = mapper.map
    corners = scene.to_xy(np.array([offset - 1, offset + near_instance.shape]))
    lo, hi = np.sort(sem.to_cell(corners), axis=0)
    lo, hi = np.maximum(lo - 1, 0), np.minimum(hi + 2, sem.shape)
    mapped = np.argwhere(sem.objects[0][lo[0]:hi[0], lo[1]:hi[1]]) + lo
    if len(mapped) == 0:
        return 0
    local = scene.to_cell(sem.to_xy(mapped)) - offset
    inside = ((local >= 0) & (local < near_instance.shape)).all(axis=1)
    local = local[inside]
    return int(near_instance[local[:, 0], local[:, 1]].sum())


@dataclass(frozen=True)
class MappabilityCheck:
    """What ``unmappable_goals`` needs: the agent's simulator, mapper and perception settings,
    where to look from (``EpisodeConfig.mappable_*``) and how many cells make a goal
    (``navigator.goal_min_cells``)."""

    sim: GridSimulator
    mapping: MappingConfig
    perception: PerceptionConfig
    view_radius_m: float
    max_views: int
    enough_cells: int


def unmappable_goals(scene: Scene, categories: list[str], check: MappabilityCheck) -> list[dict]:
    """One row per instance of ``categories`` in ``scene`` that no frame maps to ``enough_cells``:
    ``{scene, category, instance, mapped_cells, views, reason}``."""
    rows = []
    boxes = ndimage.find_objects(scene.instance_map)  # instance id i -> boxes[i - 1]
    for category in categories:
        if category not in scene.categories:
            continue
        for instance in np.flatnonzero(scene.instance_category == scene.category_id(category)):
            box = boxes[instance - 1] if instance - 1 < len(boxes) else None
            if box is None:  # an instance with no cell on this floor
                continue
            result = instance_mappability(scene, int(instance), check.sim, check.mapping, check.perception,
                                          check.view_radius_m, check.max_views, check.enough_cells, box)
            if result.mapped_cells < check.enough_cells:
                rows.append({"scene": scene.name, "category": category, "instance": int(instance),
                             "mapped_cells": result.mapped_cells, "views": result.views,
                             "reason": _why_unmapped(scene, int(instance), result, check, box)})
    return rows


def _why_unmapped(scene: Scene, instance: int, result: InstanceMappability, check: MappabilityCheck,
                  box: tuple[slice, slice]) -> str:
    if result.views == 0:
        return f"no traversable cell within {check.view_radius_m:g} m"
    # A frame was tried, so open floor lies within view_radius_m: the window holds the nearest.
    window = _window(scene, box, check.view_radius_m)
    instances = scene.instance_map[window]
    footprint = instances == instance
    open_side = scene.not_wall[window] & (instances == 0)  # floor or a low obstacle
    ring = ndimage.binary_dilation(footprint) & ~footprint
    if not (ring & open_side).any():
        if (ring & (instances > 0)).sum() >= (ring & ~scene.not_wall[window]).sum():
            return "hidden among other objects: no side on open floor"
        gap = (ndimage.distance_transform_edt(~open_side)[footprint].min() - 1) * scene.cell_size
        return f"walled in: {gap:.2f} m of wall to the nearest open floor"
    return (f"seen as {result.mapped_cells} cells at most (mapping erosion and stride leave fewer "
            f"than {check.enough_cells})")
