"""Episode files (habitat layout) and dataset specs: read, write, validate against Gibson scenes."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from trajrag import config
from trajrag.world import episode_io
from trajrag.world.datasets import (
    DatasetError,
    known_categories,
    load_episodes,
    load_scenes,
    parse_generated_spec,
    parse_procedural_spec,
    validate_episodes,
)
from trajrag.world.episode_io import EpisodeError, episode_source, read_episodes, write_episodes
from trajrag.world.frames import map_to_habitat_position, map_yaw_to_habitat_yaw, wrap_angle, yaw_to_quaternion_xyzw

# Gibson release names on disk -> the names our scenes use.
RELEASE_NAMES = {"chair": "chair", "couch": "sofa", "potted plant": "plant", "bed": "bed",
                 "toilet": "toilet", "tv": "tv_monitor"}
OURS_TO_RELEASE = {v: k for k, v in RELEASE_NAMES.items()}
DEFAULTS = config.settings()  # configs/*.yaml
TOLERANCE = DEFAULTS.episodes.start_floor_tolerance_m
# what an episode file may name, and as what (configs/gibson.yaml)
NAMES = {"categories": known_categories(DEFAULTS.gibson), "aliases": DEFAULTS.gibson.category_names}


@pytest.fixture(scope="module")
def scenes(gibson_train_path):
    return load_scenes(str(gibson_train_path), DEFAULTS)  # cached: shared with test_gibson.py


@pytest.fixture(scope="module")
def by_name(scenes):
    return {s.name: s for s in scenes}


def _release_episodes(scene, n, rng, first_id=0):
    """Episodes as the SemExp release writes them: ids from 0, Gibson names, [w, x, y, z] or
    [x, y, z, w] rotations (alternating), starts at traversable cell centres. Returns the raw
    dicts and the map-frame poses (x, y, yaw) they encode."""
    cells = np.argwhere(scene.traversable)
    goals = [c for c in scene.present_categories() if c in OURS_TO_RELEASE]
    raw, poses = [], []
    for i in range(n):
        cell = cells[rng.integers(len(cells))]
        xy = scene.to_xy(cell)
        yaw = float(rng.uniform(-math.pi, math.pi))
        x, y, z, w = yaw_to_quaternion_xyzw(map_yaw_to_habitat_yaw(yaw))
        rotation = [w, x, y, z] if i % 2 else [x, y, z, w]
        raw.append({
            "episode_id": first_id + i,
            "scene_id": f"gibson_semantic/{scene.meta['scene']}.glb",
            "start_position": map_to_habitat_position(xy, scene.floor_height + 0.17),
            "start_rotation": rotation,
            "object_category": OURS_TO_RELEASE[goals[i % len(goals)]],
            "object_id": i % len(goals),
            "floor_id": 0,
            "goals": [],  # habitat keys we do not use are ignored
        })
        poses.append((float(xy[0]), float(xy[1]), yaw))
    return raw, poses


def _write_json_gz(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump(data, f)
    return path


@pytest.fixture()
def release_dir(tmp_path, by_name):
    """A split folder in the release layout: val/content/<Scene>_episodes.json.gz (+ val.json.gz)."""
    rng = np.random.default_rng(7)
    root = tmp_path / "val"
    _write_json_gz(root / "val.json.gz", {"episodes": []})
    expected = {}
    for name in ("Allensville", "Stockman", "Woodbine"):
        scene = by_name[f"gibson/{name}/0"]
        raw, poses = _release_episodes(scene, 6, rng)
        _write_json_gz(root / "content" / f"{name}_episodes.json.gz", {"episodes": raw})
        expected.update({(scene.name, str(e["episode_id"])): (p, e) for e, p in zip(raw, poses)})
    return root, expected


def _assert_pose(episode, pose):
    got = episode.start_pose()
    assert got.x == pytest.approx(pose[0], abs=1e-9) and got.y == pytest.approx(pose[1], abs=1e-9)
    assert abs(wrap_angle(got.yaw - pose[2])) < 1e-9


# -- reading --------------------------------------------------------------------------------
def test_release_layout_loads_with_scene_keys_poses_and_our_category_names(release_dir, scenes):
    root, expected = release_dir
    episodes = load_episodes(str(root), scenes, DEFAULTS)  # strict: every one must be usable
    assert len(episodes) == len(expected) == 18
    for ep in episodes:
        pose, raw = expected[(ep.scene_key, ep.episode_id)]
        assert ep.scene_key == f"gibson/{raw['scene_id'][16:-4]}/0"
        _assert_pose(ep, pose)  # both quaternion orders give the same map-frame pose
        assert ep.object_category == RELEASE_NAMES[raw["object_category"]]
        assert ep.info["object_id"] == raw["object_id"]
        assert ep.start_rotation[0] == 0 and ep.start_rotation[2] == 0  # normalised to [x, y, z, w]
        assert episode_source(ep).endswith(f"{raw['scene_id'][16:-4]}_episodes.json.gz")
    report = validate_episodes(episodes, scenes, TOLERANCE)
    assert report.ok and report.n_episodes == 18 and report.summary() == "18/18 episodes usable"


def test_write_then_read_gives_the_same_episodes_and_poses(release_dir, tmp_path, scenes):
    root, expected = release_dir
    episodes = read_episodes(root, **NAMES)
    written = write_episodes(episodes, tmp_path / "out")
    assert sorted(p.name for p in written) == [
        "Allensville_episodes.json.gz", "Stockman_episodes.json.gz", "Woodbine_episodes.json.gz"]
    assert all(p.parent == tmp_path / "out" / "content" for p in written)
    assert sorted(p.name for p in (tmp_path / "out" / "content").iterdir()) == sorted(p.name for p in written)
    again = read_episodes(tmp_path / "out", **NAMES)
    assert again == episodes
    for ep in again:
        _assert_pose(ep, expected[(ep.scene_key, ep.episode_id)][0])
    raw = json.loads(gzip.decompress(written[0].read_bytes()))
    assert raw["episodes"][0]["object_id"] == expected[(again[0].scene_key, again[0].episode_id)][1]["object_id"]


def test_generated_episodes_round_trip_through_files(scenes, by_name, tmp_path):
    two = [by_name["gibson/Allensville/0"], by_name["gibson/Benevolence/0"]]
    generated = load_episodes("generated:3:11", two, DEFAULTS)
    assert len(generated) == 6 and {e.scene_key for e in generated} == {s.name for s in two}
    write_episodes(generated, tmp_path)
    back = load_episodes(str(tmp_path), scenes, DEFAULTS)
    assert back == generated
    for a, b in zip(generated, back):
        assert a.start_pose() == b.start_pose()


def test_a_failed_write_leaves_no_partial_files(release_dir, tmp_path, monkeypatch):
    episodes = read_episodes(release_dir[0], **NAMES)
    out = tmp_path / "out"
    real = episode_io._write_temp
    calls = []

    def fail_on_second(target, data):
        calls.append(target)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(target, data)

    monkeypatch.setattr(episode_io, "_write_temp", fail_on_second)
    with pytest.raises(OSError, match="disk full"):
        write_episodes(episodes, out)
    assert list((out / "content").iterdir()) == []  # neither the first file nor a temporary
    monkeypatch.undo()
    episodes[0].info["bad"] = object()
    with pytest.raises(EpisodeError, match=f"episode {episodes[0].episode_id}"):
        write_episodes(episodes, out)
    assert list((out / "content").iterdir()) == []


# -- unusable episodes ----------------------------------------------------------------------
def test_off_map_start_and_absent_category_are_reported_with_file_and_id(tmp_path, by_name, scenes):
    stockman = by_name["gibson/Stockman/0"]  # a home with no chair, sofa, plant, bed or tv
    assert not {"chair", "sofa", "bed"} & set(stockman.present_categories())
    raw, _ = _release_episodes(stockman, 3, np.random.default_rng(1))
    raw[1]["start_position"] = map_to_habitat_position(stockman.to_xy(np.array([-50, 10])), 0.0)
    raw[2]["object_category"] = "couch"
    path = _write_json_gz(tmp_path / "Stockman_episodes.json.gz", {"episodes": raw})

    with pytest.raises(EpisodeError, match=r"Stockman_episodes\.json\.gz: episode 1 .*outside"):
        load_episodes(str(tmp_path), scenes, DEFAULTS)
    episodes = load_episodes(str(path), scenes, DEFAULTS, strict=False)
    report = validate_episodes(episodes, scenes, TOLERANCE)
    assert not report.ok and report.n_unusable == 2 and report.counts() == {"off_map": 1, "category_absent": 1}
    assert [(p.episode_id, p.kind) for p in report.problems] == [("1", "off_map"), ("2", "category_absent")]
    assert all(p.source == str(path) for p in report.problems)
    assert "'sofa' has no object" in str(report.problems[1]) and "1/3 episodes usable" in report.summary()
    with pytest.raises(EpisodeError, match=r"Stockman_episodes\.json\.gz: episode 2 .*'sofa' has no object"):
        validate_episodes(episodes[2:], scenes, TOLERANCE, strict=True)


def test_start_on_a_wall_cell_and_unknown_scene_are_reported(tmp_path, by_name, scenes):
    scene = by_name["gibson/Allensville/0"]
    raw, _ = _release_episodes(scene, 2, np.random.default_rng(2))
    wall = np.argwhere(~scene.floor)[0]
    raw[0]["start_position"] = map_to_habitat_position(scene.to_xy(wall), 0.0)
    raw[1]["scene_id"] = "gibson_semantic/Nowhere.glb"
    _write_json_gz(tmp_path / "x.json.gz", {"episodes": raw})
    report = validate_episodes(read_episodes(tmp_path, **NAMES), scenes, TOLERANCE)
    assert [p.kind for p in report.problems] == ["not_traversable", "unknown_scene"]
    assert "gibson/Nowhere/0" in report.problems[1].message


def test_a_start_on_another_floor_is_reported(tmp_path, by_name, scenes):
    scene = by_name["gibson/Allensville/0"]
    raw, _ = _release_episodes(scene, 3, np.random.default_rng(3))
    raw[1]["start_position"][1] = scene.floor_height + 2.8  # the floor above, at a cell of this map
    raw[2]["start_position"][1] = scene.floor_height + 0.6  # a step within this floor
    _write_json_gz(tmp_path / "x.json.gz", {"episodes": raw})
    report = validate_episodes(read_episodes(tmp_path, **NAMES), scenes, TOLERANCE)
    assert [(p.episode_id, p.kind) for p in report.problems] == [("1", "other_floor")]
    assert "+2.80 m from this map's floor" in report.problems[0].message
    with pytest.raises(EpisodeError, match="episode 1 .*another floor"):
        load_episodes(str(tmp_path), scenes, DEFAULTS)
    assert validate_episodes(read_episodes(tmp_path, **NAMES), scenes, 3.0).ok


@pytest.mark.parametrize("change, message", [
    (lambda e: e.pop("start_position"), r"episode 4: missing field\(s\) \['start_position'\]"),
    (lambda e: e.update(start_rotation=[0.7071068, 0.7071068, 0, 0]), "episode 4: start_rotation.*not a rotation about the up axis"),
    (lambda e: e.update(start_rotation=[0, 0, 0, 0]), "episode 4: start_rotation.*not a unit quaternion"),
    (lambda e: e.update(start_rotation=[0, 1, 0]), "episode 4: start_rotation must be 4 finite numbers"),
    (lambda e: e.update(start_position=[1.0, "a", 2.0]), "episode 4: start_position must be 3 finite numbers"),
    (lambda e: e.update(object_category="giraffe"), "episode 4: unknown object_category 'giraffe'"),
    (lambda e: e.update(floor_id=-1), "episode 4: floor_id must be an integer"),
    (lambda e: e.pop("episode_id"), r"episode #0: missing or invalid episode_id"),
])
def test_malformed_episodes_name_the_file_and_episode(tmp_path, by_name, change, message):
    raw, _ = _release_episodes(by_name["gibson/Allensville/0"], 1, np.random.default_rng(3), first_id=4)
    change(raw[0])
    _write_json_gz(tmp_path / "content" / "Allensville_episodes.json.gz", {"episodes": raw})
    with pytest.raises(EpisodeError, match=r"Allensville_episodes\.json\.gz: " + message):
        read_episodes(tmp_path, **NAMES)


def test_malformed_files_are_episode_errors_naming_the_file(tmp_path, by_name):
    (tmp_path / "a").mkdir()
    bad_json = tmp_path / "a" / "broken_episodes.json.gz"
    bad_json.write_bytes(gzip.compress(b'{"episodes": [{"episode_id": 0,'))
    truncated = tmp_path / "truncated.json.gz"
    truncated.write_bytes(gzip.compress(json.dumps({"episodes": [1] * 1000}).encode())[:40])
    not_gzip = tmp_path / "plain.json.gz"
    not_gzip.write_text('{"episodes": []}')
    no_list = _write_json_gz(tmp_path / "nolist.json.gz", {"episode": []})
    for path in (bad_json, truncated, not_gzip, no_list):
        with pytest.raises(EpisodeError, match=path.name):
            read_episodes(path, **NAMES)
    with pytest.raises(EpisodeError, match="no episode files"):
        read_episodes(_empty(tmp_path), **NAMES)
    raw, _ = _release_episodes(by_name["gibson/Allensville/0"], 1, np.random.default_rng(4))
    _write_json_gz(tmp_path / "dup" / "one.json.gz", {"episodes": raw})
    _write_json_gz(tmp_path / "dup" / "two.json.gz", {"episodes": raw})
    with pytest.raises(EpisodeError, match=r"two\.json\.gz: episode 0: .*already has an episode with this id"):
        read_episodes(tmp_path / "dup", **NAMES)


def _empty(tmp_path: Path) -> Path:
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


# -- specs ----------------------------------------------------------------------------------
def test_scene_specs(gibson_train_path, scenes):
    assert len(scenes) == 25
    assert [s.name for s in load_scenes(str(gibson_train_path.parent), DEFAULTS)] == [s.name for s in scenes]
    assert parse_procedural_spec("procedural:val:12") == ("val", 12)
    for bad, why in [("procedural:dev:3", "unknown split 'dev'"), ("procedural:train:0", "not a positive"),
                     ("procedural:train:x", "not a positive"), ("procedural:train", "expected procedural:SPLIT:N"),
                     ("/no/such/train_info.pbz2", "no such file"), (str(gibson_train_path.parents[2] / "README.md"),
                                                                     "expected a Gibson")]:
        with pytest.raises(DatasetError, match=why):
            load_scenes(bad, DEFAULTS)


def test_procedural_spec_loads_that_many_scenes():
    procedural = load_scenes("procedural:val:2", DEFAULTS)
    assert len(procedural) == 2 and len({s.name for s in procedural}) == 2


def test_episode_specs(scenes):
    assert parse_generated_spec("generated:5") == (5, None)
    assert parse_generated_spec("generated:5:-3") == (5, -3)
    for bad in ("generated:0", "generated:x", "generated:2:y", "generated:"):
        with pytest.raises(DatasetError, match="expected generated:K"):
            load_episodes(bad, scenes, DEFAULTS)
    with pytest.raises(FileNotFoundError, match="no/such/dir"):
        load_episodes("/no/such/dir", scenes, DEFAULTS)
