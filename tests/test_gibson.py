"""Gibson semantic maps -> scenes, and the restricted unpickler that reads them."""

from __future__ import annotations

import bz2
import collections
import io
import os
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import ndimage
from skimage.morphology import disk

from trajrag import config
from trajrag.safe_pickle import CorruptFileError, UnsafePickleError, load_pbz2, restricted_load
from trajrag.world.frames import habitat_to_map_xy
from trajrag.world.gibson import GibsonFormatError, build_scene, load_gibson_scenes

TRAIN_SCENES = {
    "Allensville", "Beechwood", "Benevolence", "Coffeen", "Cosmos", "Forkland", "Hanson", "Hiteman",
    "Klickitat", "Lakeville", "Leonardo", "Lindenwood", "Marstons", "Merom", "Mifflinburg",
    "Newfields", "Onaga", "Pinesdale", "Pomaria", "Ranchester", "Shelbyville", "Stockman", "Tolstoy",
    "Wainscott", "Woodbine",
}
GIBSON = config.load("gibson")  # configs/gibson.yaml
HABITAT_GOALS = {"chair", "sofa", "plant", "bed", "toilet", "tv_monitor"}


@pytest.fixture(scope="module")
def scenes(gibson_train_path):
    return load_gibson_scenes(gibson_train_path, GIBSON)


@pytest.fixture(scope="module")
def raw(gibson_train_path):
    """The file as the release wrote it (through the restricted unpickler)."""
    return load_pbz2(gibson_train_path)


# -- the real train file --------------------------------------------------------------------
def test_train_file_has_the_25_gibson_training_homes_one_floor_each(scenes):
    assert len(scenes) == 25
    assert {s.name for s in scenes} == {f"gibson/{name}/0" for name in TRAIN_SCENES}
    for s in scenes:
        assert s.cell_size == 0.05 and s.meta["scene"] in TRAIN_SCENES and s.meta["floor"] == 0
        assert s.meta["source"].endswith("train_info.pbz2")


def test_categories_use_habitat_names_and_goals_are_present(scenes):
    cfg = GIBSON
    for s in scenes:
        assert len(s.categories) == 15
        assert {"sofa", "plant", "tv_monitor"} <= set(s.categories)
        assert not {"couch", "potted plant", "tv"} & set(s.categories)
        assert set(s.meta["goal_categories"]) == HABITAT_GOALS
        assert set(s.present_categories()) & HABITAT_GOALS, s.name
        # category_map agrees with the instances and the instance table
        np.testing.assert_array_equal(s.category_map, s.instance_category[s.instance_map])
    assert cfg.category_names == {"couch": "sofa", "potted plant": "plant", "tv": "tv_monitor"}
    # every goal category is findable in many homes (chair and toilet are in most of them)
    present = collections.Counter(c for s in scenes for c in s.present_categories())
    assert all(present[c] >= 10 for c in HABITAT_GOALS), present
    assert present["toilet"] >= 20


def test_traversable_area_is_the_dilated_floor_not_eroded(scenes, raw):
    for s in scenes:
        frac = s.traversable.mean()
        assert 0.1 < frac < 0.5, (s.name, frac)
        assert not (s.traversable & ~s.floor).any(), "traversable must lie on wall-free floor"
        assert s.floor.sum() > 1.2 * s.traversable.sum(), "walls start an agent radius outside"
        assert (s.instance_map == 0)[~s.floor].all(), "object cells are floor, never wall"
        sem = raw[s.meta["scene"]][0]["sem_map"]
        samples = sem[0] > 0
        assert s.traversable[samples].all(), f"{s.name}: a navmesh floor sample is not traversable"
        np.testing.assert_array_equal(s.traversable, ndimage.binary_dilation(samples, disk(2)))


def test_every_object_cell_belongs_to_an_instance_and_small_objects_stay_visible(scenes, raw):
    for s in scenes:
        sem = raw[s.meta["scene"]][0]["sem_map"][1:] > 0
        off_floor = sem.any(axis=0) & ~s.traversable
        assert (s.instance_map[off_floor] > 0).all()
        # object bleed onto the navmesh floor stays floor: the agent never stands inside an object
        assert not (s.instance_map[~off_floor]).any()
        ids = np.unique(s.instance_map)
        np.testing.assert_array_equal(ids, np.arange(len(s.instance_category)))  # no empty instance
        for cat in range(15):  # each instance's category really is drawn where it is
            cells = s.category_map == cat
            assert sem[cat][cells].all(), (s.name, s.categories[cat])


def test_origin_puts_habitat_positions_in_the_release_cells(scenes, raw):
    """row = (X - origin[1]/100) * 20, col = (Z - origin[0]/100) * 20 (the release's convention)."""
    rng = np.random.default_rng(0)
    for s in scenes[:5]:
        entry = raw[s.meta["scene"]][0]
        origin = entry["origin"]
        rows, cols = np.nonzero(entry["sem_map"][0] > 0)
        pick = rng.choice(len(rows), 20, replace=False)
        for r, c in zip(rows[pick], cols[pick]):
            X = origin[1] / 100 + (r + 0.5) / 20
            Z = origin[0] / 100 + (c + 0.5) / 20
            xy = habitat_to_map_xy((X, 0.1, Z))
            assert tuple(s.to_cell(xy)) == (r, c)
            assert s.is_traversable(xy)


@pytest.mark.slow
def test_loading_is_cached_and_cached_scenes_are_read_only(gibson_train_path, scenes):
    start = time.perf_counter()
    again = load_gibson_scenes(gibson_train_path, GIBSON)
    assert time.perf_counter() - start < 0.5
    assert [a is b for a, b in zip(again, scenes)] == [True] * 25
    with pytest.raises(ValueError):
        again[0].traversable[0, 0] = True
    other = load_gibson_scenes(gibson_train_path, config.load("gibson", ["gibson.agent_radius=0.5"]))
    assert other[0] is not scenes[0] and other[0].floor.sum() > scenes[0].floor.sum()


# -- bad files ------------------------------------------------------------------------------
@pytest.mark.slow
def test_truncated_file_is_a_corrupt_file_error_naming_it(gibson_train_path, tmp_path):
    data = gibson_train_path.read_bytes()
    cut = tmp_path / "cut_info.pbz2"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptFileError, match="cut_info.pbz2"):
        load_gibson_scenes(cut, GIBSON)
    garbage = tmp_path / "garbage_info.pbz2"
    garbage.write_bytes(b"BZh9" + bytes(range(256)) * 4)
    with pytest.raises(CorruptFileError, match="garbage_info.pbz2"):
        load_gibson_scenes(garbage, GIBSON)
    plain = tmp_path / "plain_info.pbz2"  # a pickle that was never compressed
    plain.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(CorruptFileError, match="plain_info.pbz2"):
        load_gibson_scenes(plain, GIBSON)


class _RunsCommand:
    """Pickles as a call to os.system: what a malicious map file would carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_naming_os_system_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil_info.pbz2"
    payload = {"Evil": {0: {"floor_height": 0.0, "sem_map": _RunsCommand(marker), "origin": [0, 0]}}}
    evil.write_bytes(bz2.compress(pickle.dumps(payload)))
    with pytest.raises(UnsafePickleError) as info:
        load_gibson_scenes(evil, GIBSON)
    assert f"{os.system.__module__}.system" in str(info.value) and "evil_info.pbz2" in str(info.value)
    assert not marker.exists()


@pytest.mark.parametrize("obj, name", [
    (collections.OrderedDict(a=1), "collections.OrderedDict"),
    (eval, "builtins.eval"),
    (getattr, "builtins.getattr"),
    (np.load, "numpy.load"),
])
def test_other_globals_are_refused(obj, name, tmp_path):
    for protocol in (2, 4):
        with pytest.raises(UnsafePickleError, match=name):
            restricted_load(io.BytesIO(pickle.dumps(obj, protocol=protocol)), "x.pkl")


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_numpy_arrays_and_builtin_containers_load_under_every_protocol(protocol):
    value = {
        "map": np.arange(24, dtype=np.float64).reshape(2, 3, 4), "origin": np.array([-875, -196]),
        "h": np.float64(0.5), "i": np.int64(3), "s": {1, 2}, "f": frozenset("ab"), "c": 1 + 2j,
        "b": b"\x00\xff", "t": (1, [2.5, "x"]), "flag": True, 3: None,
        "fortran": np.asfortranarray(np.eye(3, dtype=np.float32)),
    }
    got = restricted_load(io.BytesIO(pickle.dumps(value, protocol=protocol)), "ok.pkl")
    assert got.keys() == value.keys()
    for key in value:
        if isinstance(value[key], np.ndarray):
            np.testing.assert_array_equal(got[key], value[key])
            assert got[key].dtype == value[key].dtype
        else:
            assert got[key] == value[key] and type(got[key]) is type(value[key])


def test_malformed_entries_name_the_file_and_scene(tmp_path):
    good = {"floor_height": 0.0, "sem_map": np.zeros((16, 8, 8)), "origin": np.array([0, 0])}
    good["sem_map"][0, 4, 4] = 1
    cases = {
        "wrong channel count": dict(good, sem_map=np.zeros((3, 8, 8))),
        "missing origin": {k: v for k, v in good.items() if k != "origin"},
        "bad origin": dict(good, origin=np.array([1, 2, 3])),
        "nan height": dict(good, floor_height=float("nan")),
        "empty floor": dict(good, sem_map=np.zeros((16, 8, 8))),
    }
    for i, (what, entry) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}_info.pbz2"
        path.write_bytes(bz2.compress(pickle.dumps({"Fakehome": {0: entry}})))
        with pytest.raises(GibsonFormatError, match=rf"bad{i}_info.pbz2.*Fakehome"):
            load_gibson_scenes(path, GIBSON)


def test_synthetic_floor_builds_the_expected_scene():
    """A cup on a table keeps its cells; object cells on the traversable floor stay floor; walls
    begin an agent radius past the traversable area."""
    cfg = GIBSON
    sem = np.zeros((16, 40, 40))
    sem[0, 10:30:2, 10:30:2] = 1  # speckled floor samples, 2 cells apart
    table, cup = cfg.channels.index("dining-table"), cfg.channels.index("cup")
    sem[1 + table, 26:36, 20:26] = 1  # rows 26..30 overlap the traversable floor
    sem[1 + cup, 32:34, 22:24] = 1
    s = build_scene("Toy", 1, {"floor_height": 1.5, "sem_map": sem, "origin": np.array([-100, 250])}, cfg)
    assert s.name == "gibson/Toy/1" and s.origin == (-1.0, 2.5) and s.floor_height == 1.5
    assert s.traversable[10:29, 10:29].all() and not s.traversable[:7].any()
    assert set(s.present_categories()) == {"dining-table", "cup"}
    assert (s.category_map[32:34, 22:24] == s.category_id("cup")).all()
    assert (s.category_map[31:36, 20:22] == s.category_id("dining-table")).all()
    assert (s.category_map[s.traversable] == -1).all()
    first = int(np.argmax(s.traversable[10]))  # walls begin agent_radius (3.6 cells) to the left
    radius = int(cfg.agent_radius / cfg.cell_size)
    assert s.floor[10, first - radius] and not s.floor[10, first - radius - 1]


def test_the_five_fold_presets_hold_out_every_gibson_scene_once(gibson_train_path):
    """jobs/gibson_crossval.sh runs one fold per preset: together they must evaluate every scene
    exactly once, and fold 0 is the default split every single-split table used."""
    from trajrag import config
    from trajrag.world.datasets import load_scenes

    everything = sorted(s.name for s in load_scenes(str(gibson_train_path), config.settings()))
    folds = [set(config.load("gibson", config.preset_overrides([f"gibson_fold{k}"])).held_out_scenes)
             for k in range(5)]
    held_out = [s for s in everything if s.split("/")[1] in set().union(*folds)]
    assert held_out == everything and sum(len(f) for f in folds) == len(set().union(*folds)) == 25
    assert folds[0] == set(config.load("gibson").held_out_scenes)


def test_the_crossval_job_parses_and_names_a_missing_gibson_file(tmp_path):
    import subprocess

    script = Path(__file__).resolve().parents[1] / "jobs" / "gibson_crossval.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    result = subprocess.run(["bash", str(script), str(tmp_path / "cv")], capture_output=True, text=True,
                            env={**os.environ, "GIBSON": str(tmp_path / "none.pbz2")})
    assert result.returncode == 2 and "no Gibson file at" in result.stderr
    assert not (tmp_path / "cv").exists()  # nothing written before the inputs are checked
