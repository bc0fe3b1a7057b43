"""A memory remembers the world and sensor settings its walks were collected with, and refuses
walks made with others unless asked for a mixed memory (memory.build_settings)."""

from __future__ import annotations

import json

import pytest

from trajrag.cli import main
from trajrag.memory.build_settings import BuildSettings, BuildSettingsError
from trajrag.memory.store import MemoryStore

# 1 procedural train home x 2 oracle walks at 64x48: the settings are under test, not the walks.
BUILD = ["corpus", "build", "--scenes", "procedural:train:1", "--episodes-per-scene", "2", "--policy", "oracle",
         "--json", "--set", "sim.width=64", "--set", "sim.height=48", "--set", "mapping.pixel_stride=1"]


def _build(store, capsys, *extra: str) -> tuple[int, str]:
    code = main([*BUILD, "--store", str(store), *extra])
    captured = capsys.readouterr()
    return code, captured.out if code == 0 else captured.err


@pytest.mark.slow
def test_a_build_with_other_sensor_settings_is_refused_naming_the_keys_and_changes_nothing(tmp_path, capsys):
    store = tmp_path / "memory"
    code, out = _build(store, capsys)
    assert code == 0 and json.loads(out)["collected"] == 2
    versions = MemoryStore(str(store), read_only=True).versions()

    code, err = _build(store, capsys, "--set", "sim.hfov_deg=40", "--set", "sim.max_depth=2.0")
    assert code == 2
    assert "sim.hfov_deg: 79" in err and "-> 40" in err and "sim.max_depth: 5.0 -> 2.0" in err
    assert "--mixed-settings" in err and "Traceback" not in err
    assert MemoryStore(str(store), read_only=True).versions() == versions

    # the same settings again: nothing to add, nothing refused
    code, out = _build(store, capsys)
    assert code == 0 and json.loads(out)["collected"] == 0

    # asked for explicitly, the mixed memory records both sets
    code, out = _build(store, capsys, "--set", "sim.hfov_deg=40", "--set", "sim.max_depth=2.0",
                       "--episodes-per-scene", "4", "--mixed-settings")
    assert code == 0 and json.loads(out)["collected"] == 2
    assert main(["corpus", "stats", "--store", str(store), "--json"]) == 0
    recorded = json.loads(capsys.readouterr().out)["build_settings"]
    assert [(r["sim"]["hfov_deg"], r["sim"]["max_depth"]) for r in recorded] == [(79.0, 5.0), (40.0, 2.0)]
    assert all(r["datasets"] == ["procedural"] and r["sim"]["width"] == 64 for r in recorded)


@pytest.mark.slow
def test_more_walks_of_the_same_world_are_added_whatever_the_episode_seed(tmp_path, capsys):
    store = tmp_path / "memory"
    assert _build(store, capsys)[0] == 0
    code, out = _build(store, capsys, "--episodes-per-scene", "3", "--set", "episodes.seed=5")
    assert code == 0 and json.loads(out)["collected"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("dataset_change", [["--set", "episodes.goal_categories=[chair,bed]"]])
def test_another_goal_vocabulary_is_another_memory(tmp_path, capsys, dataset_change):
    store = tmp_path / "memory"
    assert _build(store, capsys)[0] == 0
    code, err = _build(store, capsys, *dataset_change)
    assert code == 2 and "episodes.goal_categories" in err


def test_a_memory_built_before_sliding_existed_takes_walks_without_it_and_refuses_them_with_it(tmp_path):
    # A row recorded before sim.allow_sliding existed was walked without sliding.
    memory = BuildSettings(str(tmp_path / "memory"))
    earlier = {"sim": {"hfov_deg": 79.0}, "perception": {}, "episodes": {}, "datasets": ["mp3d"]}
    memory.admit(earlier, allow_mixed=False)
    now = {**earlier, "sim": {"hfov_deg": 79.0, "allow_sliding": False}}
    memory.admit(now, allow_mixed=False)
    assert len(memory.recorded()) == 1
    sliding = {**earlier, "sim": {"hfov_deg": 79.0, "allow_sliding": True}}
    with pytest.raises(BuildSettingsError, match="sim.allow_sliding: False -> True"):
        memory.admit(sliding, allow_mixed=False)
