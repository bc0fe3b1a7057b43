"""The grid simulator and its 2.5D renderer, on small hand-built scenes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trajrag import config as config_mod
from trajrag.bench.sim import hand_built_flat, measure_steps_per_s
from trajrag.world.frames import Pose2D
from trajrag.world.interface import Action
from trajrag.world.scene import NO_CATEGORY, Scene
from trajrag.world.sim import GridSimulator

CELL = 0.05
CATEGORIES = ("chair", "bed", "plant", "sofa", "wardrobe")


def make_scene(size_m: float = 10.0, walls=(), objects=(), name: str = "test/room",
               blocked=()) -> Scene:
    """A square room of ``size_m`` metres (the grid edge is the outer wall).

    walls: boxes ``(x0, y0, x1, y1)`` in metres that are not floor. objects: ``(category, box)``.
    blocked: extra non-traversable boxes. Traversable = floor without objects and ``blocked``.
    """
    n = int(round(size_m / CELL))
    cells = lambda box: (slice(int(round(box[1] / CELL)), int(round(box[3] / CELL))),  # noqa: E731
                         slice(int(round(box[0] / CELL)), int(round(box[2] / CELL))))
    floor = np.ones((n, n), dtype=bool)
    for box in walls:
        floor[cells(box)] = False
    instance_map = np.zeros((n, n), dtype=np.int32)
    instance_category = [NO_CATEGORY]
    for i, (category, box) in enumerate(objects, start=1):
        instance_map[cells(box)] = i
        instance_category.append(CATEGORIES.index(category))
    instance_category = np.array(instance_category, dtype=np.int16)
    traversable = floor & (instance_map == 0)
    for box in blocked:
        traversable[cells(box)] = False
    return Scene(name=name, categories=CATEGORIES, traversable=traversable, floor=floor,
                 instance_map=instance_map, category_map=instance_category[instance_map],
                 instance_category=instance_category, cell_size=CELL)


@pytest.fixture(scope="module")
def sim() -> GridSimulator:
    return GridSimulator(config_mod.load("sim"))


def row_slopes(sim: GridSimulator) -> np.ndarray:
    """Vertical ray slope ``y_r`` of every image row (up positive)."""
    cam = sim.intrinsics
    return (cam.height / 2.0 - np.arange(cam.height) - 0.5) / cam.focal


# -- config ----------------------------------------------------------------------------------

def test_defaults_are_habitat_objectnav():
    cfg = config_mod.load("sim")
    assert (cfg.width, cfg.height, cfg.hfov_deg, cfg.camera_height) == (640, 480, 79.0, 0.88)
    assert (cfg.min_depth, cfg.max_depth, cfg.forward_step, cfg.turn_angle_deg) == (0.5, 5.0, 0.25, 30.0)
    assert (cfg.agent_radius, cfg.agent_height) == (0.18, 0.88)


def test_bad_sensor_is_a_clear_config_error():
    with pytest.raises(config_mod.ConfigError, match="unknown sensors.*lidar"):
        GridSimulator(config_mod.load("sim", ["sim.sensors=[depth,semantic,lidar]"]))


# -- depth ---------------------------------------------------------------------------------

def test_wall_depth_at_known_distance_and_constant_across_a_facing_wall(sim):
    scene = make_scene(walls=[(4.0, 0.0, 10.0, 10.0)])  # wall face at x = 4.0 m
    obs = sim.reset(scene, Pose2D(1.025, 5.025, 0.0))
    distance = 4.0 - 1.025
    h, w = obs.depth.shape
    assert obs.depth[h // 2, w // 2] == pytest.approx(distance, abs=CELL)
    row = obs.depth[h // 2]
    assert np.ptp(row) < 1e-4, "z-depth of a wall faced square-on must not vary across the image"
    assert np.all(np.abs(row - distance) < CELL)
    assert np.all(obs.instance[h // 2] == 0) and np.all(obs.category[h // 2] == NO_CATEGORY)


def test_floor_depth_is_camera_height_over_tan_angle(sim):
    scene = make_scene()  # far wall 9.5 m away: beyond max_depth
    obs = sim.reset(scene, Pose2D(0.525, 5.025, 0.0))
    cam = sim.intrinsics
    slope = row_slopes(sim)
    below = slope < 0
    expected = np.full(cam.height, np.inf)
    expected[below] = cam.camera_height / -slope[below]  # cam_h / tan(angle below horizon)
    floor_rows = (expected >= cam.min_depth) & (expected <= cam.max_depth)
    assert floor_rows.sum() > 100
    np.testing.assert_allclose(obs.depth[floor_rows], np.broadcast_to(expected[floor_rows, None],
                               (floor_rows.sum(), cam.width)), rtol=0.01)
    # Beyond max_depth nothing is in range: habitat-style clipping to max_depth, no semantics.
    far_rows = below & (expected > cam.max_depth + 0.1)
    assert far_rows.any()
    assert np.all(obs.depth[far_rows] == cam.max_depth)
    assert np.all(obs.instance[far_rows] == 0)


def test_ceiling_is_at_wall_height(sim):
    scene = make_scene()
    obs = sim.reset(scene, Pose2D(0.525, 5.025, 0.0))
    cam = sim.intrinsics
    slope = row_slopes(sim)
    expected = (sim.cfg.wall_height - cam.camera_height) / slope[0]
    assert obs.depth[0, cam.width // 2] == pytest.approx(expected, rel=0.01)


# -- occlusion -----------------------------------------------------------------------------

def test_low_object_hides_a_tall_one_only_up_to_its_own_height(sim):
    bed = ("bed", (2.0, 4.5, 3.0, 5.5))
    wardrobe = ("wardrobe", (3.5, 4.25, 4.0, 5.75))
    pose = Pose2D(0.525, 5.025, 0.0)
    cam = sim.intrinsics
    c = cam.width // 2
    both = sim.reset(make_scene(objects=[bed, wardrobe]), pose)
    column = both.instance[:, c]
    bed_rows, wardrobe_rows = np.nonzero(column == 1)[0], np.nonzero(column == 2)[0]
    assert bed_rows.size and wardrobe_rows.size
    assert wardrobe_rows.max() < bed_rows.min(), "the tall object must appear only above the low one"
    # The bed's top far edge (x = 3.0 m, at the bed's height) sets the boundary row.
    bed_top = sim.cfg.object_heights["bed"]
    slope = (bed_top - cam.camera_height) / (3.0 - pose.x)
    boundary = cam.height / 2.0 - 0.5 - cam.focal * slope
    assert abs(bed_rows.min() - boundary) <= 1.0
    # Without the bed the wardrobe is visible below that row too: the bed did the hiding.
    alone = sim.reset(make_scene(objects=[wardrobe]), pose)
    assert np.nonzero(alone.instance[:, c] == 1)[0].max() > bed_rows.min() + 20


# -- actions -------------------------------------------------------------------------------

def test_turn_left_is_counter_clockwise_from_above(sim):
    plant = ("plant", (4.8, 7.0, 5.25, 7.45))  # on the agent's left (+y) when it faces +x
    scene = make_scene(objects=[plant])
    start = sim.reset(scene, Pose2D(5.025, 5.025, 0.0))
    assert not (start.instance == 1).any()
    after_two = None
    for k in range(3):
        obs = sim.step(Action.TURN_LEFT)
        if k == 1:
            after_two = obs
    assert sim.pose.yaw == pytest.approx(math.pi / 2, abs=1e-9)
    assert np.nonzero(after_two.instance == 1)[1].mean() < sim.intrinsics.width / 2, \
        "after 60 deg left the object must be in the left half of the image"
    cols = np.nonzero(obs.instance == 1)[1]
    assert cols.size and abs(cols.mean() - (sim.intrinsics.width - 1) / 2) < 5
    sim.step(Action.TURN_RIGHT)
    assert sim.pose.yaw == pytest.approx(math.pi / 3, abs=1e-9)


def test_move_forward_moves_along_heading(sim):
    scene = make_scene()
    yaw = math.radians(30)
    sim.reset(scene, Pose2D(2.025, 2.025, yaw))
    obs = sim.step(Action.MOVE_FORWARD)
    assert not obs.collided
    assert (obs.pose.x, obs.pose.y) == pytest.approx((2.025 + 0.25 * math.cos(yaw), 2.025 + 0.25 * math.sin(yaw)))
    assert obs.pose.yaw == pytest.approx(yaw)
    obs = sim.step(Action.STOP)
    assert obs.pose == sim.pose and not obs.collided


def test_move_forward_is_blocked_before_a_wall_without_sliding(sim):
    scene = make_scene(walls=[(3.0, 0.0, 10.0, 10.0)])
    start = Pose2D(2.85, 5.025, math.radians(10))
    sim.reset(scene, start)
    obs = sim.step(Action.MOVE_FORWARD)
    assert obs.collided and sim.pose == start and obs.pose == start


@pytest.fixture(scope="module")
def sliding_sim() -> GridSimulator:
    return GridSimulator(config_mod.load("sim", ["sim.allow_sliding=true"]))


def test_a_blocked_move_slides_along_the_wall_with_sliding(sliding_sim):
    # habitat-sim's allow_sliding: heading 30 deg into a wall at x = 3 m, the agent keeps the
    # step's y component and ends against the wall, with the collision reported.
    scene = make_scene(walls=[(3.0, 0.0, 10.0, 10.0)])
    yaw = math.radians(30)
    sliding_sim.reset(scene, Pose2D(2.85, 5.025, yaw))
    obs = sliding_sim.step(Action.MOVE_FORWARD)
    assert obs.collided
    assert 2.95 < obs.pose.x < 3.0 and obs.pose.y == pytest.approx(5.025 + 0.25 * math.sin(yaw))
    assert obs.pose.yaw == pytest.approx(yaw) and scene.pose_is_valid(obs.pose)


def test_a_head_on_or_cornered_move_stops_at_the_obstacle_with_sliding(sliding_sim):
    scene = make_scene(walls=[(3.0, 0.0, 10.0, 10.0), (0.0, 5.2, 3.0, 10.0)])
    obs = sliding_sim.reset(scene, Pose2D(2.85, 4.5, 0.0))
    obs = sliding_sim.step(Action.MOVE_FORWARD)  # head on: up to the wall, nothing to slide
    assert obs.collided and 2.95 < obs.pose.x < 3.0 and obs.pose.y == pytest.approx(4.5)
    sliding_sim.reset(scene, Pose2D(2.9, 5.1, math.radians(60)))
    obs = sliding_sim.step(Action.MOVE_FORWARD)  # into the corner: both slides blocked
    assert obs.collided and scene.pose_is_valid(obs.pose)
    assert 2.9 <= obs.pose.x < 3.0 and 5.1 <= obs.pose.y < 5.2


def test_move_forward_checks_the_whole_segment(sim):
    # A one-cell-thick non-traversable strip between start and target: both ends are free.
    scene = make_scene(blocked=[(2.25, 0.0, 2.30, 10.0)])
    start = Pose2D(2.125, 5.025, 0.0)
    assert scene.is_traversable(np.array([2.375, 5.025]))
    sim.reset(scene, start)
    assert sim.step(Action.MOVE_FORWARD).collided and sim.pose == start


@pytest.mark.parametrize("pose", [(4.5, 5.0, 0.0), (12.0, 5.0, 0.0), (1.0, float("nan"), 0.0)])
def test_reset_off_the_traversable_area_names_scene_and_pose(sim, pose):
    scene = make_scene(walls=[(4.0, 0.0, 10.0, 10.0)], name="test/walled")
    with pytest.raises(ValueError, match="test/walled"):
        sim.reset(scene, pose)


# -- semantics -----------------------------------------------------------------------------

def test_semantic_ids_are_the_scene_ids(sim):
    objects = [("chair", (2.5, 4.0, 3.0, 4.5)), ("sofa", (3.0, 5.5, 4.0, 6.5))]
    scene = make_scene(objects=objects)
    obs = sim.reset(scene, Pose2D(0.525, 5.025, 0.0))
    assert obs.instance.dtype == np.int32 and obs.category.dtype == np.int16
    assert obs.depth.dtype == np.float32
    assert set(np.unique(obs.instance)) == {0, 1, 2}
    assert np.array_equal(obs.category, scene.instance_category[obs.instance])
    assert np.all(obs.category[obs.instance == 1] == scene.category_id("chair"))
    assert np.all(obs.category[obs.instance == 2] == scene.category_id("sofa"))
    # Object pixels are where the scene's object cells are: depth to the chair's front face.
    chair_depths = obs.depth[obs.instance == 1]
    assert chair_depths.min() == pytest.approx(2.5 - 0.525, abs=CELL)


def _reference_raycast(scene: Scene, sim: GridSimulator, pose: Pose2D, rows, cols, step=0.002):
    """Brute-force ray caster: march each pixel's 3D ray in ``step`` metres of z-depth."""
    cfg, cam = sim.cfg, sim.intrinsics
    heights = np.array([cfg.object_heights.get(c, cfg.default_object_height) for c in scene.categories])
    x_c = (cols + 0.5 - cam.width / 2) / cam.focal
    y_r = (cam.height / 2 - rows - 0.5) / cam.focal
    z = np.arange(step, cam.max_depth + step, step)
    fwd = np.array([math.cos(pose.yaw), math.sin(pose.yaw)])
    right = np.array([math.sin(pose.yaw), -math.cos(pose.yaw)])
    ground = fwd[None, :] + x_c[:, None] * right[None, :]
    xy = pose.xy + z[None, :, None] * ground[:, None, :]
    cells = scene.to_cell(xy)
    inside = scene.in_bounds(cells)
    r, c = np.clip(cells[..., 0], 0, scene.shape[0] - 1), np.clip(cells[..., 1], 0, scene.shape[1] - 1)
    inst = np.where(inside, scene.instance_map[r, c], 0)
    wall = ~inside | (~scene.floor[r, c] & (inst == 0))
    top = np.where(inst > 0, heights[scene.instance_category[inst]], 0.0)
    height = cam.camera_height + z[None, :] * y_r[:, None]
    hit = wall | (height <= top) | (height >= cfg.wall_height)
    first = np.where(hit.any(axis=1), hit.argmax(axis=1), len(z) - 1)
    k = np.arange(len(rows))
    seen = np.where(wall[k, first] | (height[k, first] >= cfg.wall_height), 0, inst[k, first])
    seen = np.where(hit.any(axis=1), seen, 0)
    depth = np.where(hit.any(axis=1), z[first], cam.max_depth)
    return seen, np.clip(depth, cam.min_depth, cam.max_depth)


def test_matches_a_brute_force_ray_caster(sim):
    objects = [("chair", (2.0, 2.0, 2.5, 2.5)), ("bed", (3.0, 5.0, 5.0, 6.5)),
               ("wardrobe", (6.0, 3.0, 6.6, 4.5)), ("plant", (1.5, 7.0, 1.9, 7.4))]
    scene = make_scene(walls=[(4.0, 2.5, 4.1, 4.5), (7.5, 0.0, 10.0, 1.5)], objects=objects)
    rng = np.random.default_rng(0)
    agree_inst, depth_err = [], []
    for pose in [Pose2D(1.0, 1.0, 0.7), Pose2D(2.0, 5.0, -0.3), Pose2D(5.0, 2.0, 2.2)]:
        obs = sim.reset(scene, pose)
        rows = rng.integers(0, sim.intrinsics.height, 400)
        cols = rng.integers(0, sim.intrinsics.width, 400)
        ref_inst, ref_depth = _reference_raycast(scene, sim, pose, rows, cols)
        agree_inst.append(obs.instance[rows, cols] == ref_inst)
        depth_err.append(np.abs(obs.depth[rows, cols] - ref_depth))
    agree, err = np.concatenate(agree_inst), np.concatenate(depth_err)
    assert agree.mean() > 0.98
    assert np.median(err) < 0.01 and np.quantile(err, 0.95) < CELL


# -- rgb, resolution, bench ------------------------------------------------------------------

def test_rgb_only_when_requested_and_shows_objects():
    objects = [("chair", (2.5, 4.5, 3.0, 5.5))]
    scene = make_scene(objects=objects)
    pose = Pose2D(0.525, 5.025, 0.0)
    assert GridSimulator(config_mod.load("sim")).reset(scene, pose).rgb is None
    sim = GridSimulator(config_mod.load("sim", ["sim.sensors=[depth,semantic,rgb]", "sim.width=160",
                                                "sim.height=120"]))
    obs = sim.reset(scene, pose)
    assert obs.rgb.shape == (120, 160, 3) and obs.rgb.dtype == np.uint8
    chair = obs.rgb[obs.instance == 1].astype(float).mean(axis=0)
    structure = obs.rgb[obs.instance == 0].astype(float)
    assert np.ptp(chair) > 30, "object pixels must be coloured, not grey"
    assert np.abs(structure - structure.mean(axis=1, keepdims=True)).max() < 2, "walls/floor are grey"


def test_resolution_is_configurable():
    sim = GridSimulator(config_mod.load("sim", ["sim.width=160", "sim.height=120"]))
    obs = sim.reset(make_scene(), Pose2D(5.0, 5.0, 0.0))
    assert obs.depth.shape == obs.instance.shape == obs.category.shape == (120, 160)
    assert sim.intrinsics.width == 160


def test_bench_measures_steps_per_second():
    assert measure_steps_per_s(64, 48, 5, hand_built_flat(), config_mod.load("sim")) > 0
