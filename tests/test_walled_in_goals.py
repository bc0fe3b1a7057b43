"""Goals the 2.5D conversion used to wall in: low obstacles in front of them, goal regions that do
not pass diagonal wall corners, and the doctor naming every goal the mapper cannot map."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from trajrag import config
from trajrag.agent.goal_visibility import MappabilityCheck, instance_mappability, unmappable_goals
from trajrag.world.frames import Pose2D
from trajrag.world.geodesic import closed_corners, goal_region
from trajrag.world.gibson import build_scene, load_gibson_scenes
from trajrag.world.scene import Scene
from trajrag.world.sim import GridSimulator


@pytest.fixture(scope="module")
def check() -> MappabilityCheck:
    episodes = config.load("episodes")
    return MappabilityCheck(sim=GridSimulator(config.load("sim")), mapping=config.load("mapping"),
                            perception=config.load("perception"), view_radius_m=episodes.mappable_view_radius_m,
                            max_views=episodes.mappable_views,
                            enough_cells=config.load("navigator").goal_min_cells)


def _room_with_tv_behind_a_stand(cfg, stand_rows: int):
    """A 2 x 1.5 m room of floor samples; a tv whose front is ``stand_rows`` unlabelled cells past
    the open floor's edge (its stand), and more unlabelled cells (the wall) behind it."""
    sem = np.zeros((16, 90, 70))
    sem[0, 10:40:2, 10:60:2] = 1  # speckled floor samples: traversable rows ~8..41
    floor = build_scene("Toy", 0, {"floor_height": 0.0, "sem_map": sem, "origin": np.array([0, 0])}, cfg)
    open_edge = int(np.flatnonzero(floor.floor[:, 35])[-1])  # last wall-free row below the room
    tv = cfg.channels.index("tv")
    sem[1 + tv, open_edge + 1 + stand_rows: open_edge + 5 + stand_rows, 25:45] = 1
    return build_scene("Toy", 0, {"floor_height": 0.0, "sem_map": sem, "origin": np.array([0, 0])}, cfg)


def test_a_tv_behind_its_stand_faces_the_room_over_a_low_obstacle(check):
    cfg = config.load("gibson")
    stand_rows = 9  # 0.45 m of unlabelled cells, as the walled-in tv of issue 49
    scene = _room_with_tv_behind_a_stand(cfg, stand_rows)
    tv_rows = np.flatnonzero((scene.category_map == scene.category_id("tv_monitor")).any(axis=1))
    strip = scene.low_obstacle[:, 25:45]
    assert strip[tv_rows[0] - stand_rows: tv_rows[0]].all(), "the stand in front of the tv is low"
    assert not scene.low_obstacle[tv_rows[-1] + 1:].any(), "the wall behind the tv stays a wall"
    assert not (scene.low_obstacle & scene.traversable).any()

    instance = int(scene.instance_map[tv_rows[0], 30])
    now = instance_mappability(scene, instance, check.sim, check.mapping, check.perception,
                               check.view_radius_m, check.max_views, check.enough_cells)
    walled = _room_with_tv_behind_a_stand(dataclasses.replace(cfg, strip_max_gap=0.0), stand_rows)
    before = instance_mappability(walled, instance, check.sim, check.mapping, check.perception,
                                  check.view_radius_m, check.max_views, check.enough_cells)
    assert before.mapped_cells < check.enough_cells <= now.mapped_cells

    # the renderer draws the stand at its height: the tv shows above it from the room
    obs = check.sim.reset(scene, Pose2D(1.75, 1.5, math.pi / 2))
    assert (obs.category == scene.category_id("tv_monitor")).sum() > 500


def test_an_object_further_than_a_stand_from_the_floor_stays_walled_in(check):
    cfg = config.load("gibson")
    scene = _room_with_tv_behind_a_stand(cfg, stand_rows=int(cfg.strip_max_gap / cfg.cell_size) + 6)
    assert not scene.low_obstacle.any()
    rows = unmappable_goals(scene, ["tv_monitor"], check)
    assert [r["category"] for r in rows] == ["tv_monitor"]
    assert rows[0]["reason"].startswith("walled in:") and rows[0]["mapped_cells"] == 0


@pytest.fixture(scope="module")
def gibson(gibson_train_path):
    return {s.meta["scene"]: s for s in load_gibson_scenes(gibson_train_path, config.load("gibson"))}


@pytest.mark.parametrize("home, category", [("Cosmos", "tv_monitor"), ("Leonardo", "toilet")])
def test_the_walled_in_train_goals_of_issue_49_can_be_mapped(gibson, check, home, category):
    """Cosmos's tv and Leonardo's toilet were invisible from every traversable cell."""
    assert unmappable_goals(gibson[home], [category], check) == []


def test_the_doctor_names_each_train_goal_that_remains_unmappable_with_its_reason(gibson, check):
    rows = unmappable_goals(gibson["Hiteman"], ["toilet"], check)
    assert len(rows) == 1 and rows[0]["reason"].startswith("walled in: 0.")


def _diagonal_wall_scene() -> Scene:
    """A 30 x 30 floor cut by an 8-connected staircase wall (r + c == 20, touching only at
    corners); a tv in the corner on one side."""
    rows, cols = np.mgrid[:30, :30]
    wall = rows + cols == 20
    floor = ~wall
    instance = np.zeros((30, 30), dtype=np.int32)
    instance[5:8, 5:8] = 1  # 0.2-0.5 m from the wall, on the r + c < 20 side
    return Scene(name="toy/diagonal", categories=("tv_monitor",), traversable=floor & (instance == 0),
                 floor=floor, instance_map=instance, category_map=np.where(instance > 0, 0, -1),
                 instance_category=np.array([-1, 0]))


@pytest.mark.parametrize("rule", ["seen_path", "line_of_sight"])
def test_goal_regions_do_not_pass_between_diagonal_wall_cells(rule):
    scene = _diagonal_wall_scene()
    assert closed_corners(~scene.floor).any()
    region = goal_region(scene, "tv_monitor", 1.0, rule)
    rows, cols = np.nonzero(region)
    assert len(rows) > 0 and (rows + cols < 20).all(), "no cell behind the diagonal wall sees the tv"
