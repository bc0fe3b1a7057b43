"""Configuration: every ``--set`` names a real section and key, or the command stops; the cluster
file listens on loopback only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trajrag import config
from trajrag.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("override, needle", [
    ("foo", "expected SECTION.KEY=VALUE"),
    ("=3", "expected SECTION.KEY=VALUE"),
    ("sim.=3", "expected SECTION.KEY=VALUE"),
    ("nosuch.key=1", "no config section 'nosuch'"),
    ("sims.width=160", "did you mean sim.width?"),
    # a section the command never loads is checked all the same
    ("retrieval.nosuch=2", "has no key 'retrieval.nosuch'"),
    ("llm.chat.backnd=fixed", "did you mean llm.chat.backend"),
    ("sim.width.x=3", "has no key 'sim.width.x'"),
    ("sim.width=abc", "could not be converted to Integer (key sim.width)"),
])
def test_a_bad_override_stops_the_command_in_one_line_naming_it(override, needle, tmp_path, capsys):
    store = tmp_path / "memory"
    assert main(["corpus", "stats", "--store", str(store), "--set", "sim.height=120", "--set", override]) == 2
    err = capsys.readouterr().err
    assert f"override {override!r}" in err and needle in err, err
    assert len(err.strip().splitlines()) == 1
    assert not store.exists()  # stopped before the command ran


@pytest.mark.parametrize("override", [
    "llm.chat.backend=fixed", "mapping.frontier.min_size_m=0.5", "encoder.train.epochs=1",
    "llm.chat.fixed_answer=I think option 2}}", "navigator.vocabulary=[chair,bed]",
    # entries of free-form mappings (names -> values): new names are keys too
    "eval.variants.mine=[memory.candidates=3]", "sim.object_heights.lamp=1.0", "memory.verifier.weights.inliers=0.3",
])
def test_nested_keys_and_entries_of_free_form_mappings_are_accepted(override):
    config.check_overrides([override])


@pytest.mark.slow
def test_every_set_in_the_docs_jobs_and_tests_names_a_real_key():
    """The ``--set`` examples users copy (README, docs, jobs) and the tests' own."""
    files = [REPO / "README.md", *REPO.glob("docs/*.md"), *(p for p in REPO.glob("jobs/*") if p.is_file()),
             *REPO.glob("tests/*.py")]
    pattern = re.compile(r"""--set[= ]+['"]?([a-z_]+\.[\w.]+)=|"--set",\s*f?"([a-z_]+\.[\w.]+)=""")
    keys = {m.group(1) or m.group(2) for f in files for m in pattern.finditer(f.read_text())}
    keys -= {"memory.KEY", "section.key"}  # placeholders
    assert len(keys) > 30
    for key in sorted(keys):
        section = key.split(".")[0]
        config._check_key(config._merged(section), section, f"{key}=x")


def test_the_shared_data_paths_follow_trajrag_shared_data(monkeypatch):
    """A checkout whose ../shared/data is elsewhere names it once, as the tests and notebooks do."""
    monkeypatch.delenv("TRAJRAG_SHARED_DATA", raising=False)
    assert config.load("bench").mp3d_scenes == "../shared/data/mp3d-bev/scenes"
    monkeypatch.setenv("TRAJRAG_SHARED_DATA", "/data/shared")
    assert config.load("bench").gibson_scenes == "/data/shared/gibson-objectnav-v1.1/train/train_info.pbz2"
    run = config.load("run", config.preset_overrides(["mp3d"]))
    assert (run.corpus_scenes, run.scenes) == ("/data/shared/mp3d-bev/scenes@rest",
                                               "/data/shared/mp3d-bev/scenes@held_out")

def test_the_ray_up_head_keeps_its_dashboard_on_loopback():
    """Jobs reach it through ``ray dashboard``'s SSH tunnel (cluster/README.md); on 0.0.0.0 its job
    API would run code for anyone who reaches the port."""
    import yaml

    cluster = yaml.safe_load((REPO / "cluster" / "ray-cluster.yaml").read_text())
    head = " ".join(c for c in cluster["head_start_ray_commands"] if c.startswith("ray start"))
    assert "--dashboard-host=127.0.0.1" in head and "0.0.0.0" not in head
