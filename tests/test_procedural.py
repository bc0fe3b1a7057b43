"""Procedural homes: deterministic, scene-disjoint splits, navigable, furnished like real homes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import ndimage

from trajrag.config import load
from trajrag.world import priors
from trajrag.world.procedural import generate_home, procedural_scenes, split_seeds
from trajrag.world.scene import NO_INSTANCE

N_HOMES = 10


@pytest.fixture(scope="module")
def cfg():
    return load("procedural")


@pytest.fixture(scope="module")
def homes(cfg):
    return procedural_scenes("train", N_HOMES, cfg)


def _cells_of(scene, instance_id):
    return np.argwhere(scene.instance_map == instance_id)


def _inside(scene, cells, bbox) -> bool:
    """Whether all cells (row, col) lie inside a metre bbox [xmin, ymin, xmax, ymax]."""
    xy = scene.to_xy(cells)
    x0, y0, x1, y1 = bbox
    return bool(np.all((xy[:, 0] > x0) & (xy[:, 0] < x1) & (xy[:, 1] > y0) & (xy[:, 1] < y1)))


def test_same_seed_gives_byte_identical_home(cfg):
    a, b = generate_home(123, cfg), generate_home(123, cfg)
    for attr in ("traversable", "floor", "instance_map", "category_map", "instance_category"):
        assert getattr(a, attr).tobytes() == getattr(b, attr).tobytes(), attr
    assert a.meta == b.meta
    c = generate_home(124, cfg)
    assert c.shape != a.shape or not np.array_equal(c.floor, a.floor)


def test_splits_are_scene_disjoint_and_named(cfg):
    seeds = {split: set(split_seeds(split, 500, cfg)) for split in ("train", "val", "test")}
    assert not seeds["train"] & seeds["val"]
    assert not seeds["train"] & seeds["test"]
    assert not seeds["val"] & seeds["test"]
    val = procedural_scenes("val", 2, cfg)
    assert [s.name for s in val] == ["procedural/val/0000", "procedural/val/0001"]
    assert [s.meta["seed"] for s in val] == split_seeds("val", 2, cfg)
    train = procedural_scenes("train", 2, cfg)
    assert {s.name for s in train}.isdisjoint(s.name for s in val)
    assert not np.array_equal(train[0].floor, val[0].floor) or train[0].shape != val[0].shape


def test_split_errors_are_clear(cfg):
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        procedural_scenes("dev", 1, cfg)
    too_many = cfg.split_offsets["val"] - cfg.split_offsets["train"] + 1
    with pytest.raises(ValueError, match="would reuse val seeds"):
        split_seeds("train", too_many, cfg)
    with pytest.raises(ValueError, match="non-negative int"):
        generate_home(-3, cfg)
    narrow = dataclasses.replace(cfg, door_width=[0.3, 0.4])
    with pytest.raises(ValueError, match="door_width"):
        generate_home(0, narrow)


def test_every_home_has_every_goal_category(homes):
    for scene in homes:
        assert set(priors.GOAL_CATEGORIES) <= set(scene.present_categories()), scene.name


def test_category_ids_are_one_fixed_vocabulary(homes):
    for scene in homes:
        assert scene.categories == priors.CATEGORIES
        assert scene.categories[: len(priors.GOAL_CATEGORIES)] == priors.GOAL_CATEGORIES
        has = scene.instance_map != NO_INSTANCE
        assert np.array_equal(scene.category_map[has], scene.instance_category[scene.instance_map[has]])
        assert np.all(scene.category_map[~has] == -1)
        assert scene.instance_map.max() == len(scene.instance_category) - 1 == len(scene.meta["objects"])


def test_traversable_is_one_component_reaching_every_room(homes):
    for scene in homes:
        labels, n = ndimage.label(scene.traversable)
        assert n == 1, f"{scene.name}: {n} traversable components"
        for room in scene.meta["rooms"]:
            x0, y0, x1, y1 = room["bbox"]
            (r0, c0), (r1, c1) = scene.to_cell(np.array([[x0, y0], [x1 - 1e-6, y1 - 1e-6]]))
            assert scene.traversable[r0 : r1 + 1, c0 : c1 + 1].any(), f"{scene.name}: {room['name']} unreachable"


def test_every_door_lets_the_agent_through(homes):
    for scene in homes:
        assert scene.meta["doors"], scene.name
        for door in scene.meta["doors"]:
            assert scene.is_traversable(np.array(door["center"])), f"{scene.name}: door {door}"


def test_goal_objects_have_traversable_floor_within_success_distance(homes):
    for scene in homes:
        to_trav = ndimage.distance_transform_edt(~scene.traversable) * scene.cell_size
        goal_ids = [scene.category_id(c) for c in priors.GOAL_CATEGORIES]
        for inst in range(1, len(scene.instance_category)):
            if scene.instance_category[inst] in goal_ids:
                cells = _cells_of(scene, inst)
                assert to_trav[cells[:, 0], cells[:, 1]].min() <= 1.0, f"{scene.name}: instance {inst}"


def test_traversable_keeps_agent_radius_from_walls_and_objects(homes, cfg):
    for scene in homes:
        free = scene.floor & (scene.instance_map == NO_INSTANCE)
        clearance = ndimage.distance_transform_edt(free) * scene.cell_size
        assert np.all(clearance[scene.traversable] >= cfg.agent_radius), scene.name
        assert not np.any(scene.traversable & ~scene.floor)
        assert not np.any((scene.instance_map != NO_INSTANCE) & ~scene.floor), "objects must stand on floor"


def test_toilets_in_bathrooms_beds_in_bedrooms_sofa_and_tv_in_living_room(homes):
    for scene in homes:
        rooms = scene.meta["rooms"]
        for obj in scene.meta["objects"]:
            cells = _cells_of(scene, obj["id"])
            home = [r for r in rooms if _inside(scene, cells, r["bbox"])]
            assert len(home) == 1 and home[0]["name"] == obj["room"], f"{scene.name}: {obj}"
            if obj["category"] == "toilet":
                assert home[0]["type"] == "bathroom", f"{scene.name}: {obj}"
            if obj["category"] == "bed":
                assert home[0]["type"] == "bedroom", f"{scene.name}: {obj}"
        living = [o["category"] for o in scene.meta["objects"] if o["room"].startswith("living_room")]
        assert "sofa" in living and "tv_monitor" in living, scene.name


def test_rooms_connect_like_real_homes(homes):
    for scene in homes:
        types = {r["name"]: r["type"] for r in scene.meta["rooms"]}
        parent = {r["name"]: r["parent"] for r in scene.meta["rooms"]}
        links = {frozenset(types[n] for n in d["rooms"]) for d in scene.meta["doors"]}
        named = [tuple(d["rooms"]) for d in scene.meta["doors"]]
        assert frozenset({"corridor", "living_room"}) in links, scene.name
        assert frozenset({"dining_room", "kitchen"}) in links, scene.name
        for name, kind in types.items():
            partners = {types[b if a == name else a] for a, b in named if name in (a, b)}
            if kind == "bathroom":
                assert partners <= {"corridor", "bedroom"}, f"{scene.name}: {name} opens onto {partners}"
            if kind == "bedroom":
                assert "corridor" in partners, f"{scene.name}: {name}"
            if parent[name] is not None:
                assert partners == {"bedroom"}, f"{scene.name}: en-suite {name} opens onto {partners}"


def test_home_footprints_are_house_sized(homes, cfg):
    lo, hi = cfg.home_side
    for scene in homes:
        x0, y0, x1, y1 = scene.meta["footprint_bbox"]
        assert lo - 0.1 <= x1 - x0 <= hi + 0.1 and lo - 0.1 <= y1 - y0 <= hi + 0.1, scene.name
        assert len(scene.meta["rooms"]) >= 6, scene.name


@pytest.mark.slow
def test_render_scene_png_writes_a_picture(homes, tmp_path):
    from trajrag.world.viz import render_scene_png

    path = render_scene_png(homes[0], tmp_path / "home.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000
