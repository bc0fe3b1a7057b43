"""Geodesic distances and ObjectNav episode generation (world/geodesic.py, world/episode_gen.py)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from trajrag import config
from trajrag.world.episode_gen import check_config, generate_episodes, present_goal_categories, scene_goal_field
from trajrag.world.geodesic import Motion, geodesic_field, goal_region, neighbour_offsets, path_to_goal
from trajrag.world.scene import NO_CATEGORY, Scene

CELL = 0.05
RADIUS = config.load("episodes").geodesic_neighbourhood_radius  # the configured neighbourhood
MOTION = Motion.from_sim_config(config.load("sim"))  # the simulator's steps and turns
CATEGORIES = ("chair", "bed", "plant", "toilet", "tv_monitor", "sofa", "table")


def make_scene(traversable: np.ndarray, objects: dict[str, list[tuple[slice, slice]]],
               name: str = "test/scene", meta: dict | None = None) -> Scene:
    """A hand-built scene: each object is a rectangle of cells (its cells are not traversable)."""
    traversable = traversable.copy()
    instance_map = np.zeros(traversable.shape, dtype=np.int32)
    instance_category = [NO_CATEGORY]
    for category, boxes in objects.items():
        for box in boxes:
            instance_category.append(CATEGORIES.index(category))
            instance_map[box] = len(instance_category) - 1
            traversable[box] = False
    instance_category = np.array(instance_category, dtype=np.int16)
    return Scene(name=name, categories=CATEGORIES, traversable=traversable, floor=np.ones_like(traversable),
                 instance_map=instance_map, category_map=instance_category[instance_map],
                 instance_category=instance_category, cell_size=CELL, origin=(0.0, 0.0),
                 floor_height=0.1, meta=meta or {})


def two_room_scene(name: str = "test/two_rooms") -> Scene:
    """6 m x 4 m: a wall down the middle with a 1 m door; chair in the left room, bed in the right."""
    trav = np.zeros((80, 120), dtype=bool)
    trav[2:78, 2:118] = True
    trav[:, 58:62] = False
    trav[60:78, 58:62] = True  # the door, near the top
    return make_scene(trav, {"chair": [(slice(10, 16), slice(10, 16))],
                             "bed": [(slice(20, 40), slice(95, 115))]}, name=name)


@pytest.fixture(scope="module")
def cfg():
    return config.load("episodes")


# -- geodesic ---------------------------------------------------------------------------------
@pytest.mark.parametrize("radius, max_error", [(2, 0.03), (3, 0.015)])
def test_geodesic_matches_euclidean_on_an_open_square(radius, max_error):
    """16 neighbours stay within 3 % of the straight line (8 would be 8 %), 32 within 1.5 %."""
    n = 201
    source = np.zeros((n, n), dtype=bool)
    source[n // 2, n // 2] = True
    field = geodesic_field(np.ones((n, n), dtype=bool), source, CELL, radius=radius)
    rows, cols = np.mgrid[:n, :n]
    euclid = np.hypot(rows - n // 2, cols - n // 2) * CELL
    far = euclid > 1.0
    error = field[far] / euclid[far] - 1.0
    assert error.min() > -1e-9, "a grid path is never shorter than the straight line"
    assert error.max() <= max_error
    assert error.mean() <= max_error / 2


def test_configured_neighbourhood_error_is_small(cfg):
    """The default (configs/episodes.yaml) keeps SPL's shortest length within 1.5 % of exact."""
    assert cfg.geodesic_neighbourhood_radius >= 2
    assert 2 * len(neighbour_offsets(cfg.geodesic_neighbourhood_radius)) >= 16


def test_geodesic_never_crosses_a_thin_wall():
    """A one-cell wall between two neighbouring cells forces the path round its end."""
    trav = np.ones((40, 40), dtype=bool)
    trav[5:40, 20] = False  # wall from row 5 to the top edge; the way round is via rows 0..4
    source = np.zeros_like(trav)
    source[30, 19] = True
    field = geodesic_field(trav, source, CELL, RADIUS)
    # Through traversable cells only: up column 19 to row 4, across row 4, down column 21.
    around = (26 + 2 + 26) * CELL
    assert field[30, 21] == pytest.approx(around, rel=1e-9)
    assert field[30, 21] > 20 * 2 * CELL  # and not the 0.1 m straight through the wall
    assert np.isinf(field[~trav]).all()


def test_geodesic_does_not_slip_through_a_diagonal_gap():
    """Two wall cells touching at a corner block the diagonal between them."""
    trav = np.ones((3, 3), dtype=bool)
    trav[0, 1] = trav[1, 0] = False
    trav[2, :] = False
    trav[:, 2] = False  # only (0,0) and (1,1) remain, touching at a corner
    source = np.zeros_like(trav)
    source[1, 1] = True
    assert np.isinf(geodesic_field(trav, source, CELL, RADIUS)[0, 0])


def test_unreachable_cells_are_inf_and_sources_zero():
    trav = np.ones((20, 20), dtype=bool)
    trav[:, 10] = False
    source = np.zeros_like(trav)
    source[5, 2] = True
    field = geodesic_field(trav, source, CELL, RADIUS)
    assert field[5, 2] == 0.0
    assert np.isinf(field[:, 11:]).all() and np.isfinite(field[:, :10]).all()


def test_path_to_goal_descends_the_field_without_crossing_walls():
    scene = two_room_scene()
    goal = scene_goal_field(scene, "bed", config.load("episodes"))
    start = (20, 20)
    path = path_to_goal(goal.distance, start, goal.radius)
    assert path[0] == start and goal.region[path[-1]]
    cells = np.array(path)
    assert scene.traversable[cells[:, 0], cells[:, 1]].all()
    length = np.hypot(*np.diff(cells, axis=0).T).sum() * CELL
    assert length == pytest.approx(goal.distance[start], rel=1e-6)
    assert (cells[:, 0] >= 60).any(), "the path goes through the door"


def test_goal_region_is_traversable_cells_within_success_distance():
    scene = two_room_scene()
    region = goal_region(scene, "chair", 1.0)
    chair = np.argwhere(scene.category_map == CATEGORIES.index("chair"))
    cells = np.argwhere(region)
    dist = np.min(np.hypot(*(cells[:, None, :] - chair[None, :, :]).transpose(2, 0, 1)), axis=1) * CELL
    assert dist.max() <= 1.0 and scene.traversable[region].all()
    assert not region[60, 100], "no region cell 4 m from the chair"
    with pytest.raises(KeyError, match="test/two_rooms"):
        goal_region(scene, "piano", 1.0)


def _tv_behind_a_wall_and_one_in_sight() -> Scene:
    """2 m x 3 m: a room (rows 11-39) under a wall; one TV shut in behind the wall (rows 8-9, its
    nearest cells 0.25 m from cell (14, 27)), another in the room 0.46 m from that cell."""
    trav = np.zeros((40, 60), dtype=bool)
    trav[11:, :] = True
    scene = make_scene(trav, {"tv_monitor": [(slice(8, 10), slice(20, 27)), (slice(11, 13), slice(36, 42))]})
    floor = np.zeros_like(trav)
    floor[11:, :] = True
    return dataclasses.replace(scene, floor=floor)


def test_a_goal_region_by_line_of_sight_counts_the_object_in_sight_not_the_nearest():
    """seen_path measures against the nearest TV cell, behind the wall, so a cell 0.46 m from the
    TV in plain sight is left out; line_of_sight keeps it, and never sees through the wall."""
    scene = _tv_behind_a_wall_and_one_in_sight()
    by_path = goal_region(scene, "tv_monitor", 1.0, "seen_path")
    by_sight = goal_region(scene, "tv_monitor", 1.0, "line_of_sight")
    assert by_sight[14, 27] and not by_path[14, 27]
    assert not by_sight[13, 15], "0.32 m from the shut-in TV, 1.07 m from the other one"
    assert by_sight[11:, 30:].sum() > 0 and not by_sight[:11].any() and scene.traversable[by_sight].all()
    with pytest.raises(ValueError, match="line_of_sight"):
        goal_region(scene, "tv_monitor", 1.0, "view_points")


def test_the_goal_region_rule_is_checked_and_keys_the_goal_field_cache(cfg):
    scene = _tv_behind_a_wall_and_one_in_sight()
    by_sight = dataclasses.replace(cfg, goal_region="line_of_sight")
    assert scene_goal_field(scene, "tv_monitor", by_sight).region[14, 27]
    assert not scene_goal_field(scene, "tv_monitor", cfg).region[14, 27]
    with pytest.raises(config.ConfigError, match="goal_region"):
        check_config(dataclasses.replace(cfg, goal_region="view_points"))


# -- episodes ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_episode_generation_is_deterministic_and_valid(cfg):
    scenes = [two_room_scene("procedural/val/0000"), two_room_scene("procedural/val/0001")]
    episodes = generate_episodes(scenes, 6, cfg, seed=3, motion=MOTION)
    again = generate_episodes(scenes, 6, cfg, seed=3, motion=MOTION)
    assert [e.to_json() for e in episodes] == [e.to_json() for e in again]
    other = generate_episodes(scenes, 6, cfg, seed=4, motion=MOTION)
    assert [e.start_position for e in other] != [e.start_position for e in episodes]
    # a scene's episodes do not depend on the other scenes in the list
    alone = generate_episodes(scenes[1:], 6, cfg, seed=3, motion=MOTION)
    assert [e.to_json() for e in alone] == [e.to_json() for e in episodes[6:]]

    assert len(episodes) == 12
    for episode in episodes:
        scene = scenes[0] if episode.scene_key == scenes[0].name else scenes[1]
        pose = episode.start_pose()
        assert scene.is_traversable(pose.xy)
        geodesic = episode.info["geodesic_distance"]
        assert cfg.min_geodesic <= geodesic <= cfg.max_geodesic
        field = scene_goal_field(scene, episode.object_category, cfg)
        cell = scene.to_cell(pose.xy)
        assert geodesic == field.distance[cell[0], cell[1]]
        assert episode.scene_id == scene.name and episode.start_position[1] == scene.floor_height
        json.dumps(episode.to_json())
    assert {e.object_category for e in episodes} == {"chair", "bed"}


def test_every_present_category_gets_episodes_and_absent_ones_none(cfg):
    scene = two_room_scene()
    assert present_goal_categories(scene, cfg) == ["chair", "bed"]
    episodes = generate_episodes([scene], 5, cfg, seed=0, motion=MOTION)
    counts = {c: sum(e.object_category == c for e in episodes) for c in ("chair", "bed")}
    assert sorted(counts.values()) == [2, 3]
    assert not {e.object_category for e in episodes} - {"chair", "bed"}, "no toilet/sofa/... episodes"
    # table is an object category but not an ObjectNav goal
    with_table = make_scene(scene.traversable, {"table": [(slice(30, 34), slice(30, 34))]}, name="t")
    assert generate_episodes([with_table], 4, cfg, seed=0, motion=MOTION) == []


def test_starts_need_a_walkable_route_not_just_grid_connectivity(cfg):
    """A pocket joined to the house only by a one-cell sliver gets no starts: no 0.25 m step
    of the discrete agent fits through (habitat-lab drops episodes its follower cannot do)."""
    trav = np.zeros((100, 100), dtype=bool)
    trav[40:98, 2:98] = True  # the house
    trav[2:12, 40:60] = True  # the pocket
    trav[12:40, 50] = True  # the sliver joining them
    scene = make_scene(trav, {"chair": [(slice(80, 84), slice(80, 84))]})
    pocket = np.zeros_like(trav)
    pocket[2:12, 40:60] = True
    field = scene_goal_field(scene, "chair", cfg)
    assert np.isfinite(field.distance[pocket]).all(), "the grid connects the pocket"
    episodes = generate_episodes([scene], 30, cfg, seed=1, motion=MOTION)
    assert len(episodes) == 30
    assert not any(pocket[tuple(scene.to_cell(e.start_pose().xy))] for e in episodes)


def test_gibson_like_scene_ids(cfg):
    scene = two_room_scene("gibson/Allensville/0")
    scene.meta.update({"dataset": "gibson", "scene": "Allensville", "floor": 0})
    episode = generate_episodes([scene], 1, cfg, seed=0, motion=MOTION)[0]
    assert episode.scene_id == "gibson_semantic/Allensville.glb"
    assert episode.floor_id == 0 and episode.scene_key == "gibson/Allensville/0"


@pytest.mark.slow
def test_generated_episodes_on_real_gibson_maps(gibson_train_path, cfg):
    from trajrag.world.gibson import load_gibson_scenes

    scenes = [s for s in load_gibson_scenes(gibson_train_path, config.load("gibson")) if s.name.split("/")[1] in ("Allensville", "Hiteman")]
    episodes = generate_episodes(scenes, 6, cfg, seed=0, motion=MOTION)
    for scene in scenes:
        mine = [e for e in episodes if e.scene_key == scene.name]
        assert {e.object_category for e in mine} == set(present_goal_categories(scene, cfg))
        assert all(scene.is_traversable(e.start_pose().xy) for e in mine)


def test_goal_region_does_not_leak_through_a_wall():
    """An object against a wall is not "reached" from the room on the other side of it."""
    scene = two_room_scene()
    chair = np.argwhere(scene.category_map == CATEGORIES.index("chair"))
    region = goal_region(scene, "chair", 1.0)
    walls = ~scene.floor
    # every region cell sees a chair cell along a straight line that crosses no wall cell
    for r, c in np.argwhere(region)[::7]:
        d = np.hypot(chair[:, 0] - r, chair[:, 1] - c)
        tr, tc = chair[int(np.argmin(d))]
        t = np.linspace(0.0, 1.0, 50)
        line = np.round(np.stack([r + t * (tr - r), c + t * (tc - c)], 1)).astype(int)
        assert not walls[line[:, 0], line[:, 1]].any(), (r, c)
