"""Matterport3D top-down semantic maps -> scenes: frame, labels, the restricted unpickler, episodes."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from scipy import ndimage
from numpy.lib import format as npy_format

from conftest import REPO
from trajrag import config
from trajrag.cli.episodes import check_dataset
from trajrag.safe_pickle import UnsafePickleError
from trajrag.world.datasets import DatasetError, load_episodes, load_scenes
from trajrag.world.frames import habitat_to_map_xy
from trajrag.world.mp3d import BEV_FILE, load_mp3d_scenes
from trajrag.world.scene import NO_CATEGORY

WALL, FLOOR, CHAIR, TABLE, TOILET, DOOR = 1, 2, 3, 5, 18, 4
MIN_X, MIN_Z = 480, 470  # the crop's first column (habitat X) and row (habitat Z) in the 1000 x 1000 grid


def write_scan(folder: Path, scan: str, labels: np.ndarray) -> Path:
    """A scan laid out as the release: ``<folder>/scenes/<scan>/BEV_semantic_map.npy``."""
    path = folder / "scenes" / scan / BEV_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    bev = {"min_x": np.int64(MIN_X), "max_x": np.int64(MIN_X + labels.shape[1]), "min_z": np.int64(MIN_Z),
           "max_z": np.int64(MIN_Z + labels.shape[0]), "min_X": -50.0, "max_X": 50.0, "min_Z": -50.0,
           "max_Z": 50.0, "W": 1000, "H": 1000, "semantic_map": labels.astype(np.int64)}
    np.save(path, np.array(bev, dtype=object), allow_pickle=True)
    return path


def two_rooms(with_toilet: bool = True) -> np.ndarray:
    """Rows run along habitat Z, columns along X (10 cm): two 3 m x 4 m rooms joined by a doorway,
    a chair in the first, a toilet in the second, void outside the walls."""
    labels = np.zeros((40, 90), dtype=np.int64)
    labels[2:38, 2:88] = WALL
    labels[4:36, 4:44] = FLOOR
    labels[4:36, 46:86] = FLOOR
    labels[18:24, 44:46] = FLOOR  # the doorway
    labels[10:14, 10:14] = CHAIR
    if with_toilet:
        labels[28:32, 78:82] = TOILET
    labels[4:6, 40:44] = DOOR  # an open door against the wall
    return labels


@pytest.fixture()
def scan_folder(tmp_path):
    write_scan(tmp_path, "synthAAAAAA", two_rooms())
    return tmp_path


def habitat_cell(scene, x: float, z: float) -> tuple[int, int]:
    return tuple(scene.to_cell(habitat_to_map_xy((x, 0.0, z))))


def bev_cell(scene, row: int, col: int) -> tuple[int, int]:
    """The scene cell at the centre of BEV cell (row, col), by the data README's formula."""
    return habitat_cell(scene, (col + MIN_X + 0.5) * 0.1 - 50, (row + MIN_Z + 0.5) * 0.1 - 50)


def test_a_synthetic_scan_loads_in_the_habitat_frame_with_its_labels(scan_folder):
    (scene,) = load_scenes(str(scan_folder / "scenes"), config.settings())
    assert scene.name == "mp3d/synthAAAAAA/0" and scene.meta["dataset"] == "mp3d"
    assert scene.cell_size == pytest.approx(0.05) and scene.shape == (180, 80)  # transposed, 2x finer
    assert not scene.traversable.flags.writeable and not scene.instance_map.flags.writeable  # cached, shared

    def at(row: int, col: int) -> tuple[float, float]:
        """Habitat (X, Z) of the centre of BEV cell (row, col), by the data README's formula."""
        return (col + MIN_X + 0.5) * 0.1 - 50, (row + MIN_Z + 0.5) * 0.1 - 50

    chair = scene.category_id("chair")
    assert scene.category_map[habitat_cell(scene, *at(11, 11))] == chair
    assert scene.category_map[habitat_cell(scene, *at(29, 79))] == scene.category_id("toilet")
    assert scene.is_traversable(habitat_to_map_xy((at(20, 20)[0], 0.0, at(20, 20)[1])))
    # walls, void and structure labels are walls; floor and objects are not; objects hide the floor
    assert not scene.floor[habitat_cell(scene, *at(3, 20))]       # wall
    assert not scene.floor[habitat_cell(scene, *at(0, 0))]        # void
    assert not scene.floor[habitat_cell(scene, *at(5, 41))]       # door (wall_labels)
    assert scene.floor[habitat_cell(scene, *at(11, 11))] and not scene.traversable[habitat_cell(scene, *at(11, 11))]
    # one source cell of floor is eroded off every edge: the floor's first row is not agent space
    assert not scene.traversable[habitat_cell(scene, *at(4, 20))]
    assert scene.traversable[habitat_cell(scene, *at(5, 20))]
    # the doorway (6 source cells wide) still joins the rooms after the erosion
    assert ndimage.label(scene.traversable)[1] == 1
    assert set(scene.present_categories()) == {"chair", "toilet"}


def test_held_out_and_rest_split_the_scans_by_the_config_list(tmp_path):
    for scan in ("scanA", "scanB", "scanC"):
        write_scan(tmp_path, scan, two_rooms())
    settings = config.settings(["mp3d.held_out_scans=[scanB]"])
    assert [s.name for s in load_scenes(f"{tmp_path}@held_out", settings)] == ["mp3d/scanB/0"]
    assert [s.name for s in load_scenes(f"{tmp_path}@rest", settings)] == ["mp3d/scanA/0", "mp3d/scanC/0"]
    with pytest.raises(DatasetError, match="mp3d.held_out_scans"):
        load_scenes(f"{tmp_path}@held_out", config.settings(["mp3d.held_out_scans=[elsewhere]"]))


def test_one_scans_own_folder_is_that_one_home(tmp_path):
    for scan in ("scanA", "scanB"):
        write_scan(tmp_path, scan, two_rooms())
    settings = config.settings()
    (alone,) = load_scenes(str(tmp_path / "scenes" / "scanB"), settings)
    among = {s.name: s for s in load_scenes(str(tmp_path), settings)}["mp3d/scanB/0"]
    assert alone.name == "mp3d/scanB/0"
    assert np.array_equal(alone.category_map, among.category_map)
    assert np.array_equal(alone.traversable, among.traversable)


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch /tmp/trajrag-mp3d-pwned",))


def test_a_pickle_naming_anything_but_arrays_and_containers_is_refused_before_it_runs(tmp_path):
    path = tmp_path / "scenes" / "evil" / BEV_FILE
    path.parent.mkdir(parents=True)
    payload = pickle.dumps(np.array({"semantic_map": _RunsCode()}, dtype=object), protocol=3)
    header = io.BytesIO()
    npy_format.write_array_header_1_0(header, {"descr": "|O", "fortran_order": False, "shape": ()})
    path.write_bytes(header.getvalue() + payload)  # the header writer adds the magic
    with pytest.raises(UnsafePickleError, match=r"evil/BEV_semantic_map.npy: refusing to load global posix.system"):
        load_mp3d_scenes(tmp_path, config.load("mp3d"))
    assert not Path("/tmp/trajrag-mp3d-pwned").exists()


def test_a_scan_without_the_goal_category_gives_an_error_naming_it(tmp_path):
    write_scan(tmp_path, "notoilet", two_rooms(with_toilet=False))
    scenes = load_scenes(str(tmp_path), config.settings())
    with pytest.raises(DatasetError, match=r"mp3d/notoilet/0: no object of any goal category \['toilet'\]"):
        load_episodes("generated:3", scenes, config.settings(["episodes.goal_categories=[toilet]"]))
    report = check_dataset(str(tmp_path), "generated:4", config.settings(["episodes.goal_categories=[chair,toilet]"]))
    assert report["per_category"]["chair"]["episodes"] == 4 and "toilet" not in report["per_category"]



def test_the_fragment_count_names_episodes_whose_nearest_toilet_is_one_stray_cell(tmp_path):
    """jobs/goal_fragments.py: a single toilet-labelled cell in the first room is nearer to every
    start there than the toilet in the second; with no toilet but the speck, only fragments."""
    spec = importlib.util.spec_from_file_location("goal_fragments", REPO / "jobs" / "goal_fragments.py")
    goal_fragments = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(goal_fragments)
    speck = two_rooms()
    speck[30, 20] = TOILET
    only_speck = two_rooms(with_toilet=False)
    only_speck[30, 20] = TOILET
    write_scan(tmp_path, "speckAAAAAA", speck)
    write_scan(tmp_path, "speckBBBBBB", only_speck)
    settings = config.settings(["episodes.goal_categories=[toilet]"])
    counts = goal_fragments.count(str(tmp_path), ["generated:6"], 4, settings)
    assert counts["episodes"] == 12 and counts["only_fragments"] == 6 and counts["only_fragments.toilet"] == 6
    assert 1 <= counts["nearest_is_fragment"] <= 6  # the starts nearer the speck than the real toilet
    assert goal_fragments.count(str(tmp_path), ["generated:6"], 0, settings) == {"episodes": 12}

    # mp3d.fragment_max_cells: the speck takes the floor around it; the real toilet stays
    cleaned = settings.with_overrides(["mp3d.fragment_max_cells=1"])
    with_speck, without = load_scenes(str(tmp_path), cleaned)
    assert with_speck.category_map[bev_cell(with_speck, 30, 20)] == NO_CATEGORY
    assert with_speck.traversable[bev_cell(with_speck, 30, 20)]
    assert with_speck.category_map[bev_cell(with_speck, 29, 79)] == with_speck.category_id("toilet")
    assert "toilet" not in without.present_categories()
    assert goal_fragments.count(str(tmp_path / "scenes"), ["generated:6"], 4, cleaned) == {"episodes": 6}

def test_generated_episodes_on_a_synthetic_scan_start_on_floor_and_reach_the_goal(scan_folder):
    report = check_dataset(str(scan_folder), "generated:6", config.settings())
    assert report["episodes"] == 6 and report["starts_traversable_frac"] == 1.0
    assert report["goals_reachable_frac"] == 1.0 and set(report["per_category"]) == {"chair", "toilet"}
    assert report["scenes_without_episodes"] == {}


@pytest.mark.slow
def test_the_shipped_held_out_scans_give_walkable_episodes_of_both_vocabularies(mp3d_scans_path):
    report = check_dataset(f"{mp3d_scans_path}@held_out", "generated:2",
                           config.settings(["mp3d.held_out_scans=[17DRP5sb8fy,s8pcmisQ38h]"]))
    assert report["scenes"] == 2 and report["episodes"] == 4 and report["problems"] == []
    assert report["starts_traversable_frac"] == 1.0 and report["goals_reachable_frac"] == 1.0
    wide = check_dataset(f"{mp3d_scans_path}@held_out", "generated:12",
                         config.settings(["mp3d.held_out_scans=[17DRP5sb8fy]"] + config.preset_overrides(["mp3d21"])))
    assert len(wide["per_category"]) >= 8 and wide["goals_reachable_frac"] == 1.0
    assert json.dumps(wide)  # the --json output is plain data


@pytest.mark.slow
def test_a_frontier_agent_finds_the_goal_in_a_synthetic_scan_and_the_run_names_its_dataset(scan_folder, tmp_path):
    from trajrag.agent.evaluate import evaluate_agent
    from trajrag.agent.run_claims import memory_datasets
    from trajrag.agent.registry import make_frontier_agent
    from trajrag.world.sim import GridSimulator

    settings = config.settings(["sim.width=160", "sim.height=120"])
    scenes = load_scenes(str(scan_folder), settings)
    episodes = load_episodes("generated:2", scenes, settings)
    summary = evaluate_agent("frontier", lambda: make_frontier_agent(settings), GridSimulator(settings.sim),
                             episodes, scenes, tmp_path, settings.episodes, progress=False)
    assert summary["episodes"] == 2 and summary["sr"] == 1.0
    records = [json.loads(line) for line in (tmp_path / "frontier" / "episodes.jsonl").read_text().splitlines()]
    assert {r["scene_key"] for r in records} == {"mp3d/synthAAAAAA/0"}
    assert memory_datasets(["mp3d/a/0", "gibson/B/0", "mp3d/c/0", ""]) == {"gibson": 1, "mp3d": 2}


@pytest.mark.slow
def test_the_calibrated_detector_runs_in_an_mp3d_home_and_its_defences_still_find_the_goals(scan_folder, tmp_path):
    from trajrag.agent.evaluate import evaluate_agent
    from trajrag.agent.registry import make_frontier_agent
    from trajrag.world.sim import GridSimulator

    summaries = {}
    for profile, preset in (("oracle", []), ("calibrated", config.preset_overrides(["perception_calibrated"]))):
        settings = config.settings(["sim.width=160", "sim.height=120"] + preset)
        scenes = load_scenes(str(scan_folder), settings)
        episodes = load_episodes("generated:2", scenes, settings)
        summaries[profile] = evaluate_agent("frontier", lambda: make_frontier_agent(settings), GridSimulator(settings.sim),
                                            episodes, scenes, tmp_path / profile, settings.episodes, progress=False)
    calibrated = summaries["calibrated"]
    assert calibrated["perception_profile"] == "calibrated"
    assert calibrated["episodes"] == 2 and calibrated["sr"] == 1.0, calibrated
    # evidence and verification take their views: the detector is at work, not the oracle
    assert calibrated["steps"] > summaries["oracle"]["steps"]


def test_a_truncated_scan_is_one_clear_line_naming_the_file(tmp_path, capsys):
    from trajrag.cli import main

    path = write_scan(tmp_path, "cut", two_rooms())
    path.write_bytes(path.read_bytes()[:300])
    assert main(["episodes", "check", "--scenes", str(tmp_path), "--episodes", "generated:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cut/BEV_semantic_map.npy" in err and "Traceback" not in err and len(err.splitlines()) == 1
