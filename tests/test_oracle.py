"""The privileged oracle agent in the real GridSimulator: it must be the SR/SPL upper bound."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from trajrag import config
from trajrag.agent.episode_runner import run_episode
from trajrag.agent.oracle import OracleAgent
from trajrag.world.datasets import load_scenes
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.episode_gen import generate_episodes, scene_goal_field
from trajrag.world.frames import Pose2D
from trajrag.world.geodesic import Motion
from trajrag.world.interface import Action
from trajrag.world.metrics import summarize
from trajrag.world.sim import GridSimulator
from test_episodes import make_scene, two_room_scene

TINY = ["sim.width=32", "sim.height=24"]  # the oracle needs no images
MOTION = Motion.from_sim_config(config.load("sim"))  # the simulator's steps and turns


@pytest.fixture(scope="module")
def setup():
    sim_cfg = config.load("sim", TINY)
    cfg = config.load("episodes")
    return GridSimulator(sim_cfg), OracleAgent(config.load("oracle"), sim_cfg, cfg), cfg


def run_all(setup, scenes, episodes):
    sim, agent, cfg = setup
    by_name = {s.name: s for s in scenes}
    return [run_episode(sim, agent, e, by_name[e.scene_key], cfg=cfg) for e in episodes]


def spl_ceiling(l: float, step: float = 0.25) -> float:
    """No discrete-step walk is shorter than l rounded up to whole steps."""
    return l / (step * math.ceil(l / step - 1e-9))


def test_oracle_walks_through_the_door_and_stops_in_the_goal_region(setup):
    scene = two_room_scene()
    start = Pose2D(2.0, 1.5, 0.3)
    goal = scene_goal_field(scene, "bed", setup[2])
    cell = scene.to_cell(start.xy)
    episode = ObjectNavEpisode.from_pose("door", scene.name, scene.name, start, 0.0, "bed",
                                         float(goal.distance[cell[0], cell[1]]))
    result = run_all(setup, [scene], [episode])[0]
    m = result.metrics
    assert m.success and m.collisions == 0
    assert result.actions[-1] == Action.STOP and result.actions.count(Action.STOP) == 1
    assert max(p[1] for p in result.poses) > 3.0, "it went round through the door (y 3.0..3.9 m)"
    assert m.spl >= 0.9 and m.spl <= spl_ceiling(m.geodesic_distance) + 1e-9


@pytest.mark.slow
def test_oracle_on_hand_built_scenes(setup):
    """Open room, two rooms with a door, and an L-shaped corridor: SR 1, SPL near the ceiling."""
    open_room = np.zeros((80, 80), dtype=bool)
    open_room[2:78, 2:78] = True
    corridor = np.zeros((100, 100), dtype=bool)
    corridor[5:20, 5:95] = True
    corridor[5:95, 80:95] = True
    scenes = [
        two_room_scene("test/rooms"),
        make_scene(open_room, {"plant": [(slice(60, 64), slice(60, 64))]}, name="test/open"),
        make_scene(corridor, {"toilet": [(slice(88, 95), slice(86, 92))]}, name="test/corridor"),
    ]
    episodes = generate_episodes(scenes, 6, setup[2], seed=5, motion=MOTION)
    results = run_all(setup, scenes, episodes)
    summary = summarize([r.metrics for r in results])
    assert summary["sr"] == 1.0
    assert all(r.metrics.collisions == 0 for r in results)
    for r in results:
        assert r.metrics.spl <= spl_ceiling(r.metrics.geodesic_distance) + 1e-9
    ceiling = np.mean([spl_ceiling(r.metrics.geodesic_distance) for r in results])
    assert summary["spl"] >= ceiling - 0.05


@pytest.mark.slow
def test_oracle_on_procedural_val_homes(setup):
    scenes = load_scenes("procedural:val:3", config.settings())
    episodes = generate_episodes(scenes, 4, setup[2], seed=0, motion=MOTION)
    summary = summarize([r.metrics for r in run_all(setup, scenes, episodes)])
    assert summary["episodes"] == 12
    assert summary["sr"] == 1.0
    assert summary["spl"] >= 0.9


@pytest.mark.slow
def test_oracle_on_gibson_train_homes(setup, gibson_train_path):
    scenes = [s for s in load_scenes(str(gibson_train_path), config.settings()) if s.name.split("/")[1] in ("Cosmos", "Leonardo")]
    episodes = generate_episodes(scenes, 4, setup[2], seed=0, motion=MOTION)
    summary = summarize([r.metrics for r in run_all(setup, scenes, episodes)])
    assert summary["episodes"] == 8
    assert summary["sr"] == 1.0
    assert summary["spl"] >= 0.9


def test_oracle_replans_after_being_pushed_off_its_plan(setup):
    """A simulator that swallows one move (as a collision would): the oracle replans and still
    succeeds."""
    sim, agent, cfg = setup
    scene = two_room_scene()
    goal = scene_goal_field(scene, "bed", cfg)
    start = Pose2D(2.0, 1.5, 0.0)
    cell = scene.to_cell(start.xy)
    episode = ObjectNavEpisode.from_pose("push", scene.name, scene.name, start, 0.0, "bed",
                                         float(goal.distance[cell[0], cell[1]]))

    class Slippery:
        """GridSimulator whose third MOVE_FORWARD is reported as blocked."""

        def __init__(self, inner):
            self.inner, self.moves = inner, 0

        def reset(self, scene, pose):
            return self.inner.reset(scene, pose)

        def step(self, action):
            if action == Action.MOVE_FORWARD:
                self.moves += 1
                if self.moves == 3:
                    obs = self.inner.render(collided=True)
                    return obs
            return self.inner.step(action)

    result = run_episode(Slippery(sim), agent, episode, scene, cfg=cfg)
    assert result.metrics.success and result.metrics.collisions == 1
    assert agent.plans == 2


def test_oracle_stops_when_the_goal_is_unreachable(setup):
    sim, agent, cfg = setup
    trav = np.zeros((60, 60), dtype=bool)
    trav[2:58, 2:28] = True
    trav[2:58, 32:58] = True  # two rooms, no door
    scene = make_scene(trav, {"chair": [(slice(30, 34), slice(50, 54))]}, name="test/walled")
    episode = ObjectNavEpisode.from_pose("x", scene.name, scene.name, Pose2D(0.5, 0.5, 0.0), 0.0,
                                         "chair", 5.0)
    result = run_episode(sim, agent, episode, scene, cfg=cfg)
    assert result.actions == [Action.STOP] and not result.metrics.success
    assert math.isinf(result.metrics.distance_to_goal)


@pytest.mark.slow
def test_sim_bench_reports_steps_and_oracle_figures(capsys, mp3d_scans_path):
    from trajrag.cli import main

    two_scans = ["--set", "mp3d.held_out_scans=[17DRP5sb8fy,HxpKQynjfin]",
                 "--set", f"bench.mp3d_scenes={mp3d_scans_path}@held_out"]
    assert main(["bench", "sim", "--quick", "--json", "--set", "bench.oracle_procedural_scenes=procedural:val:3",
                 *two_scans]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["oracle_episodes"] == 3 and out["oracle_sr"] == 1.0 and 0.85 <= out["oracle_spl"] <= 1.0
    assert out["oracle_episodes_gibson"] == 25 and out["oracle_sr_gibson"] == 1.0
    assert out["oracle_episodes_mp3d"] == 2 and out["oracle_sr_mp3d"] == 1.0
    assert out["largest_mp3d_scene"] == "mp3d/17DRP5sb8fy/0" and out["steps_per_s_640x480_largest_mp3d"] > 0
    assert out["steps_per_s_640x480"] > 0 and out["steps_per_s_160x120"] > out["steps_per_s_640x480"]
    assert main(["bench", "sim", "--quick", "--set", "bench.oracle_procedural_scenes=procedural:vall:2"]) == 2
    assert "vall" in capsys.readouterr().err


@pytest.mark.slow
def test_corpus_oracle_walks_can_look_around_first_and_at_the_goal_and_see_more_for_no_extra_path():
    from trajrag.agent.collect import Collector

    scenes = load_scenes("procedural:val:1", config.settings())
    episode = generate_episodes(scenes, 1, config.load("episodes"), seed=3, motion=MOTION)[0]
    collectors = [Collector(config.settings()), Collector(config.settings(["corpus.oracle_look_around_turns=12"])),
                  Collector(config.settings(["corpus.oracle_look_around_turns=12",
                                             "corpus.oracle_look_around_at_goal_turns=12"]))]
    plain, first, both = (c.collect_one(episode, scenes[0], "oracle") for c in collectors)
    explored = [int(c.agents["oracle"].builder.map.explored.sum()) for c in collectors]
    turn_left, stop = int(Action.TURN_LEFT), int(Action.STOP)
    assert first.result.actions[:12] == [turn_left] * 12
    assert first.result.actions[12:] == plain.result.actions  # then the same walk
    assert both.result.actions[:-13] == first.result.actions[:-1]  # the same walk, then
    assert both.result.actions[-13:] == [turn_left] * 12 + [stop]  # a look around before it STOPs
    for walk in (plain, first, both):
        assert walk.result.metrics.success
        assert walk.result.metrics.path_length == pytest.approx(plain.result.metrics.path_length)
    assert explored[0] < explored[1] < explored[2]  # each look around saw more of the home
    for key in ("oracle_look_around_turns", "oracle_look_around_at_goal_turns"):
        with pytest.raises(config.ConfigError, match=key):
            Collector(config.settings([f"corpus.{key}=-1"]))
