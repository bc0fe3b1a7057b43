"""One configuration per entry point, handed down: every value a run uses honours its ``--set``.

The command line makes one ``config.Settings`` of its overrides and every stage reads its
sections from it; no stage below ``cli/`` and ``jobs/`` loads a section itself (which is how a
default used to slip past ``--set``: the geodesic neighbourhood, the collectors' step budget, the
motion episodes were generated for).
"""

from __future__ import annotations

import ast
import functools
import json
import pickle
from pathlib import Path

import pytest

from conftest import REPO
from trajrag import cli, config
from trajrag.agent.collect import Collector
from trajrag.cli import main
from trajrag.world.datasets import load_episodes, load_scenes
from trajrag.world.episode_io import write_episodes

SMALL = ["sim.width=64", "sim.height=48", "mapping.pixel_stride=1"]
# Entry points: the CLI's commands, the jobs, and the LLM server's `python -m` main.
ENTRY_POINTS = ("platform/trajrag/cli/", "jobs/")
OTHER_ENTRY_FUNCTIONS = {("platform/trajrag/distributed/serve_llm.py", "main")}


def _eval(out: Path, planner: str, episodes: str, *sets: str) -> list[dict]:
    argv = ["eval", "--scenes", "procedural:val:1", "--episodes", episodes, "--planner", planner,
            "--out", str(out), "--json", *(a for o in [*SMALL, *sets] for a in ("--set", o))]
    assert main(argv) == 0
    return [json.loads(line) for line in (out / planner / "episodes.jsonl").read_text().splitlines()]


def test_the_geodesic_neighbourhood_set_on_the_command_line_measures_the_evaluation(tmp_path):
    """The same walks (episodes from a file, a seeded random planner cut short) end the same
    distance from the goal, measured on the geodesic field of the neighbourhood the command line
    sets: an 8-neighbourhood (radius 1) overestimates it more than the configured one (the field
    used to fall back to the YAML's)."""
    settings = config.settings()
    write_episodes(load_episodes("generated:2", load_scenes("procedural:val:1", settings), settings),
                   tmp_path / "episodes")
    short = ["episodes.max_steps=25", "navigator.initial_spin_turns=0"]
    configured = _eval(tmp_path / "configured", "random", str(tmp_path / "episodes"), *short)
    coarse = _eval(tmp_path / "coarse", "random", str(tmp_path / "episodes"), *short,
                   "episodes.geodesic_neighbourhood_radius=1")
    assert settings.episodes.geodesic_neighbourhood_radius > 1
    assert [r["actions"] for r in coarse] == [r["actions"] for r in configured]  # the same walks
    distances = [(c["metrics"]["distance_to_goal"], d["metrics"]["distance_to_goal"]) for c, d in zip(coarse, configured)]
    assert all(c >= d > 0 for c, d in distances) and any(c > d for c, d in distances), distances


@pytest.mark.slow  # an evaluation and a corpus build, ~10 s
def test_every_section_an_evaluation_or_a_corpus_build_reads_carries_the_command_line(tmp_path, monkeypatch):
    """Whatever a command reads once it has its settings, it reads with its ``--set`` values (a
    section read without them is a default that ignores the command line)."""
    reads: list[tuple[str, tuple[str, ...]]] = []
    real_load, real_presets, real_parser = config.load, cli.apply_presets, cli.build_parser
    recording = [False]

    def load(section, overrides=()):
        if recording[0]:
            reads.append((section, tuple(overrides)))
        return real_load(section, overrides)

    def parser():  # the help texts' defaults are read while the parser is built
        recording[0] = False
        return real_parser()

    def settings_made(args):  # and the overrides are checked section by section
        real_presets(args)
        recording[0] = True

    monkeypatch.setattr(config, "load", load)
    monkeypatch.setattr(cli, "build_parser", parser)
    monkeypatch.setattr(cli, "apply_presets", settings_made)
    mark = "episodes.success_tolerance_m=0.1"  # the default's value: changes nothing, marks every read
    _eval(tmp_path / "eval", "frontier", "generated:1", mark, "episodes.max_steps=40")
    assert main(["corpus", "build", "--scenes", "procedural:train:1", "--episodes-per-scene", "2", "--policy", "mix",
                 "--store", str(tmp_path / "memory"), "--json", "--set", mark, "--set", "episodes.max_steps=40",
                 *(a for o in SMALL for a in ("--set", o))]) == 0
    sections = {section for section, _ in reads}
    assert {"sim", "episodes", "navigator", "mapping", "perception", "policy", "topo", "memory", "corpus"} <= sections
    unmarked = sorted({section for section, overrides in reads if mark not in overrides})
    assert unmarked == [], f"read without the command line's overrides: {unmarked}"


def test_a_corpus_collector_walks_with_the_step_budget_set_on_the_command_line():
    """The collectors' episode loop used to take its budget from configs/episodes.yaml."""
    settings = config.settings([*SMALL, "episodes.max_steps=15"])
    scenes = load_scenes("procedural:train:1", settings)
    episode = load_episodes("generated:1", scenes, settings)[0]
    walked = Collector(settings).collect_one(episode, scenes[0], "explore")
    assert walked.policy == "explore" and walked.result.metrics.steps <= 15 < config.load("episodes").max_steps


def test_generated_episodes_follow_the_motion_set_on_the_command_line():
    """The walkable-start check plans the discrete agent's walk with the simulator's step (it
    used to take configs/sim.yaml's): 1 m steps fit through fewer gaps, and other starts are kept."""
    scenes = load_scenes("procedural:val:1", config.settings())
    default = load_episodes("generated:4", scenes, config.settings())
    other = load_episodes("generated:4", scenes, config.settings(["sim.forward_step=1.0"]))
    assert [e.start_pose() for e in other] != [e.start_pose() for e in default]


def test_settings_read_each_section_once_and_travel_pickled_with_what_they_read():
    settings = config.settings(["sim.width=96"])
    assert settings.sim is settings.sim and settings.sim.width == 96
    copy = pickle.loads(pickle.dumps(settings))  # what a Ray actor or a Tune trial receives
    assert copy.overrides == settings.overrides and copy.sim == settings.sim and "sim" in vars(copy)
    with pytest.raises(AttributeError, match="no attribute 'simm'"):
        settings.simm  # noqa: B018 - a misspelt section is an error, not None


def test_overrides_beneath_the_command_line_lose_to_it():
    command = config.settings(["sim.width=96"])
    beneath = command.with_overrides(["sim.width=32", "sim.height=24"], beneath=True)
    assert (beneath.sim.width, beneath.sim.height) == (96, 24)
    assert beneath.overrides == ("sim.width=32", "sim.height=24", "sim.width=96")
    on_top = command.with_values({"sim.width": 32, "retrieval.store": "runs/x/memory"})
    assert on_top.sim.width == 32 and on_top.retrieval.store == "runs/x/memory"
    assert on_top.overrides[-1] == "retrieval.store=runs/x/memory"  # recorded as a --set of it would be


@functools.lru_cache(maxsize=1)
def _sources() -> tuple[tuple[str, str, ast.Module], ...]:
    """(path from the repository root, text, syntax tree) of every module and job."""
    files = sorted([*(REPO / "platform" / "trajrag").rglob("*.py"), *(REPO / "jobs").glob("*.py")])
    return tuple((str(f.relative_to(REPO)), f.read_text(), ast.parse(f.read_text())) for f in files)


def _functions_and_calls(tree: ast.AST):
    """(enclosing top-level function name or "", node) for every node of ``tree``."""
    for top in tree.body:
        name = top.name if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)) else ""
        for node in ast.walk(top):
            yield name, node


def _is_entry_point(path: str, function: str) -> bool:
    return path.startswith(ENTRY_POINTS) or path == "platform/trajrag/config.py" or \
        (path, function) in OTHER_ENTRY_FUNCTIONS


def test_configuration_is_read_only_at_entry_points():
    """``config.load`` / ``config.settings`` (or a ``Settings`` made from override text) only in
    ``cli/``, ``jobs/`` and config.py: below them, stages get their sections handed down."""
    readers = {"load", "settings", "Settings"}
    found = []
    for path, text, tree in _sources():
        for function, node in _functions_and_calls(tree):
            if not isinstance(node, ast.Call):
                continue
            callee = node.func
            named = (isinstance(callee, ast.Attribute) and callee.attr in readers and isinstance(callee.value, ast.Name)
                     and callee.value.id in ("config", "config_mod")) or \
                    (isinstance(callee, ast.Name) and callee.id in ("Settings",))
            if named and not _is_entry_point(path, function):
                found.append(f"{path}:{node.lineno} ({function})")
        if not path.endswith("config.py"):
            assert "from trajrag.config import load" not in text, path
    assert found == [], "configuration read below the entry points: " + ", ".join(found)


def test_no_function_below_the_entry_points_takes_override_strings():
    taking = []
    for path, _, tree in _sources():
        for function, node in _functions_and_calls(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_entry_point(path, function):
                names = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
                taking += [f"{path}:{node.lineno} {node.name}({n})" for n in names if "overrides" in n]
    assert taking == [], "functions below the entry points that take override strings: " + ", ".join(taking)


def test_every_agent_the_command_line_names_has_a_factory_in_the_registry():
    """``agent/names.py`` lets commands check names without importing the agents: it must name
    exactly the registry's."""
    from trajrag.agent.names import AGENT_NAMES, RETRIEVING_AGENTS, VALUE_AGENTS
    from trajrag.agent.registry import AGENTS

    assert tuple(AGENTS) == AGENT_NAMES and set(RETRIEVING_AGENTS + VALUE_AGENTS) <= set(AGENT_NAMES)
