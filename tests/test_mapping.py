"""Semantic map M_t and frontiers, fed with synthetic depth images rendered from hand-built grids."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from trajrag import config
from trajrag.mapping.frontiers import find_frontiers
from trajrag.mapping.semantic_map import MappingConfig, SemanticMap, SemanticMapper, dilate_disk
from trajrag.world.frames import Pose2D
from trajrag.world.interface import CameraIntrinsics

CELL = 0.05
INTR = CameraIntrinsics(width=640, height=480, hfov=math.radians(79), camera_height=0.88, min_depth=0.5, max_depth=5.0)


@pytest.fixture(scope="module")
def cfg() -> MappingConfig:
    return config.load("mapping")


def _rays(intr: CameraIntrinsics) -> tuple[np.ndarray, np.ndarray]:
    """Per-column right slope x_c and per-row up slope y_r (camera convention of world/sim.py)."""
    f = intr.focal
    x_c = (np.arange(intr.width) + 0.5 - intr.width / 2.0) / f
    y_r = (intr.height / 2.0 - np.arange(intr.height) - 0.5) / f
    return x_c, y_r


def render_depth(
    walls: np.ndarray, origin: tuple[float, float], pose: Pose2D, intr: CameraIntrinsics = INTR
) -> np.ndarray:
    """Z-depth of full-height walls (bool grid, ``CELL`` cells) over a flat floor, habitat-clipped."""
    x_c, y_r = _rays(intr)
    c, s = math.cos(pose.yaw), math.sin(pose.yaw)
    direction = np.stack([c + x_c * s, s - x_c * c], axis=1)  # heading + x_c * right
    hfac = np.linalg.norm(direction, axis=1)
    direction /= hfac[:, None]
    t = np.arange(0.0, intr.max_depth * 1.5, 0.005)
    pts = pose.xy[None, None, :] + t[None, :, None] * direction[:, None, :]
    col = np.floor((pts[..., 0] - origin[0]) / CELL).astype(int)
    row = np.floor((pts[..., 1] - origin[1]) / CELL).astype(int)
    inside = (row >= 0) & (row < walls.shape[0]) & (col >= 0) & (col < walls.shape[1])
    hit = np.zeros_like(inside)
    hit[inside] = walls[row[inside], col[inside]]
    first = np.where(hit.any(axis=1), hit.argmax(axis=1), -1)
    wall_hd = np.where(first >= 0, t[np.maximum(first, 0)], np.inf)
    z_wall = (wall_hd / hfac)[None, :]
    with np.errstate(divide="ignore"):
        z_floor = np.where(y_r < 0, intr.camera_height / -y_r, np.inf)[:, None]
    depth = np.minimum(z_wall, z_floor)
    return np.clip(depth, intr.min_depth, intr.max_depth).astype(np.float32)


def wall_ahead_depth(distance: float, columns: slice = slice(None), intr: CameraIntrinsics = INTR) -> np.ndarray:
    """A wall perpendicular to the heading at ``distance`` m, in the given image columns only."""
    _, y_r = _rays(intr)
    with np.errstate(divide="ignore"):
        z_floor = np.where(y_r < 0, intr.camera_height / -y_r, np.inf)[:, None].repeat(intr.width, 1)
    depth = z_floor.copy()
    depth[:, columns] = np.minimum(z_floor[:, columns], distance)
    return np.clip(depth, intr.min_depth, intr.max_depth).astype(np.float32)


def _mapper(cfg: MappingConfig, pose: Pose2D, categories=("chair", "bed")) -> SemanticMapper:
    mapper = SemanticMapper(cfg, INTR, categories)
    mapper.reset(pose)
    return mapper


# -- back-projection -------------------------------------------------------------------------------
@pytest.mark.parametrize("yaw_deg", [0.0, 90.0])
def test_wall_two_metres_ahead_lands_on_the_right_cells(cfg, yaw_deg):
    pose = Pose2D(1.0, -2.0, math.radians(yaw_deg))
    mapper = _mapper(cfg, pose)
    assert mapper.update(wall_ahead_depth(2.0), None, pose)
    xy = mapper.map.to_xy(np.argwhere(mapper.map.obstacle))
    rel = xy - pose.xy
    heading = np.array([math.cos(pose.yaw), math.sin(pose.yaw)])
    forward = rel @ heading
    lateral = rel @ np.array([-heading[1], heading[0]])
    assert len(xy) > 50
    assert np.all(np.abs(forward - 2.0) <= CELL), "every obstacle cell lies on the wall plane 2 m ahead"
    half_width = 2.0 * math.tan(INTR.hfov / 2.0)
    assert lateral.min() < -0.9 * half_width and lateral.max() > 0.9 * half_width


def test_right_half_of_the_image_maps_to_the_right_of_the_heading(cfg):
    # Heading +y (yaw 90 deg, counter-clockwise frame seen from above): the agent's right is +x.
    pose = Pose2D(0.0, 0.0, math.radians(90.0))
    mapper = _mapper(cfg, pose)
    mapper.update(wall_ahead_depth(2.0, columns=slice(INTR.width // 2 + 8, None)), None, pose)
    xy = mapper.map.to_xy(np.argwhere(mapper.map.obstacle))
    assert len(xy) > 20
    assert np.all(xy[:, 0] > pose.x), "pixels right of the image centre must land right of the heading"
    assert np.all(np.abs(xy[:, 1] - 2.0) <= CELL)


def test_height_band_keeps_floor_free_and_marks_walls(cfg):
    pose = Pose2D(0.0, 0.0, 0.0)
    mapper = _mapper(cfg, pose)
    floor_only = wall_ahead_depth(100.0)  # floor below the horizon, no return above it
    assert mapper.update(floor_only, None, pose)
    assert not mapper.map.obstacle.any(), "floor points are not obstacles"
    assert mapper.map.explored.sum() > 1000, "seen floor is explored"
    mapper.update(wall_ahead_depth(3.0), None, pose)
    assert mapper.map.obstacle.sum() > 50


def test_explored_grows_and_never_reaches_behind_a_wall(cfg):
    # An 8 x 8 m room with a 2 m partition 1.5 m ahead of the agent.
    origin = (-4.0, -4.0)
    walls = np.zeros((160, 160), dtype=bool)
    walls[:2, :] = walls[-2:, :] = walls[:, :2] = walls[:, -2:] = True
    pose = Pose2D(-2.0, 0.0, 0.0)
    part_x = -0.5
    walls[int((-1.0 - origin[1]) / CELL) : int((1.0 - origin[1]) / CELL), int((part_x - origin[0]) / CELL)] = True
    mapper = _mapper(cfg, pose)
    counts = []
    for yaw in (0.0, 90.0, 180.0, -90.0):
        p = Pose2D(pose.x, pose.y, math.radians(yaw))
        mapper.update(render_depth(walls, origin, p), None, p)
        counts.append(int(mapper.map.explored.sum()))
    assert all(b > a for a, b in zip(counts, counts[1:])), counts
    xy = mapper.map.to_xy(np.argwhere(mapper.map.explored))
    assert np.all(np.abs(xy) <= 4.0 + CELL), "nothing outside the room's walls is explored"
    behind = xy[xy[:, 0] > part_x + 2 * CELL]
    # Where a cell's sight line from the agent crosses the partition's plane.
    cross_y = pose.y + (behind[:, 1] - pose.y) * (part_x - pose.x) / (behind[:, 0] - pose.x)
    assert not np.any(np.abs(cross_y) < 0.9), "cells in the partition's shadow must stay unexplored"
    free = mapper.map.free()
    assert free[tuple(mapper.map.to_cell(np.array([-1.0, 0.0])))], "floor between agent and partition is free"


def test_masks_land_in_the_channel_of_their_name(cfg):
    from trajrag.perception.oracle import OracleSegmenter

    pose = Pose2D(0.0, 0.0, 0.0)
    mapper = _mapper(cfg, pose, categories=("bed", "chair"))
    depth = wall_ahead_depth(2.0)
    scene_categories = ("chair", "sofa", "bed")
    category = np.full(depth.shape, -1, dtype=np.int16)
    instance = np.zeros(depth.shape, dtype=np.int32)
    # A chair (scene id 0) on the left of the image, a sofa (not in the vocabulary) on the right.
    category[200:300, 100:200], instance[200:300, 100:200] = 0, 1
    category[200:300, 450:550], instance[200:300, 450:550] = 1, 2
    obs = SimpleNamespace(depth=depth, instance=instance, category=category, rgb=None, pose=pose)
    seg = OracleSegmenter(("bed", "chair"), scene_categories, config.load("perception"), seed=0)
    mapper.update(depth, seg.segment(obs), pose)
    chair = mapper.map.to_xy(np.argwhere(mapper.map.object_channel("chair")))
    assert len(chair) > 5
    assert not mapper.map.object_channel("bed").any(), "the sofa is not in the vocabulary and maps nowhere"
    assert np.all(np.abs(chair[:, 0] - 2.0) <= CELL), "the chair lies on the wall 2 m ahead"
    assert np.all(chair[:, 1] > 0.0), "left image columns are left of the heading (+y at yaw 0)"


# -- bad input -------------------------------------------------------------------------------------
def test_bad_frames_give_clear_errors_or_no_update(cfg):
    pose = Pose2D(0.0, 0.0, 0.0)
    mapper = _mapper(cfg, pose)
    with pytest.raises(ValueError, match="non-finite"):
        mapper.update(wall_ahead_depth(2.0), None, SimpleNamespace(x=float("nan"), y=0.0, yaw=0.0))
    assert mapper.update(np.zeros((0, 0), dtype=np.float32), None, pose) is False
    no_return = np.full((INTR.height, INTR.width), INTR.max_depth, dtype=np.float32)
    assert mapper.update(no_return, None, pose) is False
    assert mapper.update(np.full((INTR.height, INTR.width), np.nan, dtype=np.float32), None, pose) is False
    assert not mapper.map.explored.any(), "skipped frames leave the map untouched"
    with pytest.raises(ValueError, match="off the semantic map"):
        mapper.update(wall_ahead_depth(2.0), None, Pose2D(100.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="shape"):
        mapper.update(np.ones((10, 10), dtype=np.float32), None, pose)
    with pytest.raises(ValueError, match="masks"):
        mapper.update(wall_ahead_depth(2.0), np.zeros((3, 480, 640), dtype=bool), pose)
    assert not mapper.map.explored.any(), "a frame with bad masks is rejected before anything is mapped"


def test_map_is_centred_on_the_start(cfg):
    pose = Pose2D(3.0, -7.0, 1.0)
    sem = _mapper(cfg, pose).map
    n = int(round(cfg.map_size_m / cfg.cell_size_m))
    assert sem.shape == (n, n)
    assert tuple(sem.to_cell(pose.xy)) == (n // 2, n // 2)
    assert sem.channels().shape == (2 + 2, n, n)


def test_config_rejects_a_bad_band(cfg):
    bad = config.load("mapping", ["mapping.obstacle_min_height_m=2.0"])
    with pytest.raises(ValueError, match="obstacle_min_height_m"):
        SemanticMapper(bad, INTR, ("chair",))


def test_dilate_disk_matches_scipy():
    from scipy import ndimage as ndi

    rng = np.random.default_rng(0)
    mask = rng.random((60, 70)) < 0.02
    mask[0, 0] = mask[-1, 5] = True  # dilation at the borders
    for radius in (0.5, 1, 2.0000000000000004, 3.6, 5):
        r = int(radius + 1e-6)
        d = np.arange(-r, r + 1)
        footprint = d[:, None] ** 2 + d[None, :] ** 2 <= radius**2 + 1e-6
        assert np.array_equal(dilate_disk(mask, radius), ndi.binary_dilation(mask, footprint)), radius
    # 0.18 m agent radius on 5 cm cells: cells whose centre is within 0.18 m of an obstacle cell's.
    assert dilate_disk(np.pad([[True]], 5), 0.18 / 0.05).sum() == 37


# -- frontiers -------------------------------------------------------------------------------------
def _half_explored_room() -> SemanticMap:
    """A 4 x 4 m room (walls on the border) whose left half (cols < 40) is explored."""
    sem = SemanticMap.empty((100, 100), ("chair",), CELL, (0.0, 0.0))
    r0, r1, c0, c1 = 10, 90, 10, 90
    sem.obstacle[r0, c0:c1] = sem.obstacle[r1 - 1, c0:c1] = True
    sem.obstacle[r0:r1, c0] = sem.obstacle[r0:r1, c1 - 1] = True
    sem.explored[r0:r1, c0:40] = True
    return sem


def test_frontier_of_a_half_explored_room_is_the_boundary(cfg):
    sem = _half_explored_room()
    frontiers = find_frontiers(sem, cfg.frontier, agent_xy=np.array([1.0, 2.5]))
    assert len(frontiers) == 1
    f = frontiers[0]
    assert np.all(f.cells[:, 1] == 39), "frontier cells are the last explored column"
    clearance = round(cfg.frontier.obstacle_clearance_m / CELL)
    assert f.size == 78 - 2 * clearance, "the whole boundary between the room's walls, less the clearance"
    assert sem.free()[tuple(f.centroid_cell)], "the representative point lies on the frontier"
    assert any((f.cells == f.centroid_cell).all(axis=1))
    assert abs(f.centroid_xy[1] - 2.5) < 0.1 and abs(f.centroid_xy[0] - 1.975) < 1e-9


def test_tiny_and_unreachable_frontiers_are_dropped(cfg):
    sem = _half_explored_room()
    sem.explored[50:52, 40:42] = True  # a 2-cell bump: its own frontier is short noise
    # A separate explored pocket inside walls, not connected to the agent.
    sem.obstacle[60:75, 60] = sem.obstacle[60:75, 80] = sem.obstacle[60, 60:81] = sem.obstacle[74, 60:81] = True
    sem.explored[60:75, 60:70] = True
    agent = np.array([1.0, 2.5])
    sizes = sorted(f.size for f in find_frontiers(sem, cfg.frontier))
    assert min(sizes) >= cfg.frontier.min_size_m / CELL, "short frontiers are filtered"
    pocket = [f for f in find_frontiers(sem, cfg.frontier) if f.cells[:, 1].min() >= 60]
    assert pocket, "the pocket's frontier exists"
    reachable = find_frontiers(sem, cfg, agent_xy=agent)
    assert all(f.cells[:, 1].max() < 60 for f in reachable), "the pocket cannot be reached from the agent"
    assert find_frontiers(SemanticMap.empty((50, 50), ("chair",), CELL, (0.0, 0.0)), cfg) == []


def test_frontiers_from_a_mapped_frame_are_on_the_view_boundary(cfg):
    pose = Pose2D(0.0, 0.0, 0.0)
    mapper = _mapper(cfg, pose)
    mapper.update(wall_ahead_depth(100.0), None, pose)
    sem = mapper.map
    frontiers = find_frontiers(sem, cfg, agent_xy=pose.xy)
    assert frontiers
    unexplored = ~sem.explored
    for f in frontiers:
        r, c = f.cells[:, 0], f.cells[:, 1]
        assert sem.free()[r, c].all()
        touches = unexplored[r - 1, c] | unexplored[r + 1, c] | unexplored[r, c - 1] | unexplored[r, c + 1]
        assert touches.all(), "every frontier cell borders unexplored space"


# -- against the real simulator (the camera contract of world/sim.py) ------------------------------
def _two_room_scene():
    from trajrag.world.scene import Scene

    n = 120  # 6 x 6 m
    floor = np.zeros((n, n), dtype=bool)
    floor[2:-2, 2:-2] = True
    floor[60:62, 2:80] = False  # partition with a gap on the right
    instance = np.zeros((n, n), dtype=np.int32)
    instance[20:30, 20:30] = 1  # chair, bottom left (rows are y)
    instance[35:55, 85:110] = 2  # bed, bottom right
    categories = ("chair", "bed")
    instance_category = np.array([-1, 0, 1], dtype=np.int16)
    traversable = ~dilate_disk(~(floor & (instance == 0)), 0.18 / CELL)
    return Scene(
        name="test/two_rooms",
        categories=categories,
        traversable=traversable,
        floor=floor,
        instance_map=instance,
        category_map=instance_category[instance],
        instance_category=instance_category,
        cell_size=CELL,
        origin=(0.0, 0.0),
    )


def test_maps_of_simulator_frames_agree_with_the_scene(cfg):
    from scipy import ndimage as ndi

    from trajrag.perception.oracle import OracleSegmenter
    from trajrag.world.sim import GridSimulator

    scene = _two_room_scene()
    sim = GridSimulator(config.load("sim"))
    vocab = ("bed", "chair")
    seg = OracleSegmenter(vocab, scene.categories, config.load("perception"), seed=0)
    mapper = SemanticMapper(cfg, sim.intrinsics, vocab)
    start = Pose2D(3.0, 2.0, 0.0)
    obs = sim.reset(scene, start)
    mapper.reset(start)
    for _ in range(12):  # a full turn in place
        mapper.update(obs.depth, seg.segment(obs), obs.pose)
        obs = sim.step(2)  # TURN_LEFT
    sem = mapper.map

    def scene_cells(mask: np.ndarray) -> np.ndarray:
        cells = scene.to_cell(sem.to_xy(np.argwhere(mask)))
        assert scene.in_bounds(cells).all()
        return cells

    solid = ndi.binary_dilation(~scene.floor | (scene.instance_map > 0), iterations=2)
    obstacle = scene_cells(sem.obstacle)
    assert len(obstacle) > 200
    assert solid[obstacle[:, 0], obstacle[:, 1]].mean() > 0.98, "obstacles lie on walls and objects"
    free = scene_cells(sem.free())
    assert scene.floor[free[:, 0], free[:, 1]].mean() > 0.98, "free space lies on the floor"
    above = free[:, 0] > 62
    assert not above.any() or free[above, 1].min() >= 75, "nothing seen through the partition"
    for name in vocab:
        cells = scene_cells(sem.object_channel(name))
        near = ndi.binary_dilation(scene.category_map == scene.categories.index(name), iterations=2)
        assert len(cells) > 5 and near[cells[:, 0], cells[:, 1]].all(), f"{name} lands on the {name}"


def test_a_disk_stamped_at_the_grid_edge_keeps_the_part_on_the_grid():
    from trajrag.mapping.semantic_map import disk_footprint, stamp_disk

    mask = np.zeros((30, 40), dtype=bool)
    stamp_disk(mask, np.array([15, 20]), 4.0)
    assert mask.sum() == disk_footprint(4.0).sum()
    corner = np.zeros((30, 40), dtype=bool)
    stamp_disk(corner, np.array([1, 39]), 4.0)  # most of the disk is off the grid
    assert corner.any() and corner[1, 39] and corner.sum() < disk_footprint(4.0).sum()
    stamp_disk(corner, np.array([-20, -20]), 4.0)  # wholly off the grid: nothing, no error
    assert corner.sum() < disk_footprint(4.0).sum()
