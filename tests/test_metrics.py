"""ObjectNav metrics as habitat-lab defines them, through the episode runner and the simulator."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from trajrag import config
from trajrag.agent.episode_runner import run_episode
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.episode_gen import scene_goal_field
from trajrag.world.frames import Pose2D
from trajrag.world.interface import Action
from trajrag.world.metrics import EpisodeMetrics, episode_metrics, spl, summarize
from trajrag.world.scene import NO_CATEGORY, Scene
from trajrag.world.sim import GridSimulator

CELL = 0.05
F, L, R, S = Action.MOVE_FORWARD, Action.TURN_LEFT, Action.TURN_RIGHT, Action.STOP


def detour_scene() -> Scene:
    """3 m x 3 m; a wall (x 1.40..1.60 m) from the bottom up to y = 2.25 m forces a detour over
    its top; a chair at the bottom right (x 2.50..2.70, y 0.25..0.45 m)."""
    trav = np.ones((60, 60), dtype=bool)
    trav[0:45, 28:32] = False
    instance_map = np.zeros((60, 60), dtype=np.int32)
    instance_map[5:9, 50:54] = 1
    trav[instance_map > 0] = False
    instance_category = np.array([NO_CATEGORY, 0], dtype=np.int16)
    return Scene(name="test/detour", categories=("chair",), traversable=trav, floor=np.ones_like(trav),
                 instance_map=instance_map, category_map=instance_category[instance_map],
                 instance_category=instance_category, cell_size=CELL)


class Scripted:
    """An agent that plays a fixed list of actions, then turns left forever."""

    def __init__(self, actions):
        self.actions = list(actions)

    def reset(self, episode, scene):
        self.queue = list(self.actions)

    def act(self, observations):
        return self.queue.pop(0) if self.queue else L


# Start at (0.525, 0.525) m facing +y; up 7 steps (to y = 2.275, above the wall), right 6 steps
# (x = 2.025, past the wall), down 4 steps (y = 1.275: 0.99 m from the chair's nearest cell).
UP, OVER, DOWN = [F] * 7, [R, R, R] + [F] * 6, [R, R, R] + [F] * 4
WALKED = (7 + 6 + 4) * 0.25


@pytest.fixture(scope="module")
def world():
    scene = detour_scene()
    cfg = config.load("episodes")
    sim = GridSimulator(config.load("sim", ["sim.width=32", "sim.height=24"]))
    goal = scene_goal_field(scene, "chair", cfg)
    start = Pose2D(0.525, 0.525, math.pi / 2)
    cell = scene.to_cell(start.xy)
    episode = ObjectNavEpisode.from_pose("0", "test/detour", scene.name, start, 0.0, "chair",
                                         float(goal.distance[cell[0], cell[1]]))
    return scene, cfg, sim, goal, episode


def test_spl_of_a_known_detour_is_l_over_p(world):
    scene, cfg, sim, goal, episode = world
    result = run_episode(sim, Scripted(UP + OVER + DOWN + [S]), episode, scene, cfg=cfg)
    m = result.metrics
    l = episode.info["geodesic_distance"]
    assert m.success and result.outcome == "success"
    assert m.path_length == pytest.approx(WALKED, abs=1e-9)  # turns add no length
    assert m.spl == pytest.approx(l / WALKED, rel=1e-12)
    assert m.distance_to_goal == 0.0 and m.collisions == 0
    # the wall makes the shortest path longer than the straight line, and our walk longer still
    straight = math.hypot(2.025 - 0.525, 1.275 - 0.525)
    assert straight < l < WALKED
    assert m.steps == len(UP + OVER + DOWN) + 1


def test_stopping_1_2_m_from_the_goal_fails(world):
    scene, cfg, sim, goal, episode = world
    result = run_episode(sim, Scripted(UP + OVER + DOWN[:-1] + [S]), episode, scene, cfg=cfg)
    m = result.metrics
    final = np.array(result.poses[-1][:2])
    assert 1.15 < math.hypot(*(final - np.array([2.525, 0.425]))) < 1.25
    assert not m.success and m.spl == 0.0 and result.outcome == "stopped_outside_goal"
    assert 0.1 < m.distance_to_goal < 0.3 and m.called_stop


def test_a_stop_a_cell_outside_the_goal_region_succeeds_as_in_habitat(world):
    # habitat-lab's ObjectNav success: STOP under 0.1 m (geodesic) from a view point; the goal
    # region plays the view points' part, so a STOP one or two cells outside it succeeds.
    scene, cfg, sim, goal, episode = world
    assert cfg.success_tolerance_m == pytest.approx(0.1)
    outside = [tuple(c) for c in np.argwhere(np.isfinite(goal.distance) & ~goal.region)]
    one_cell = next(c for c in outside if goal.distance[c] == pytest.approx(CELL))
    three_cells = next(c for c in outside if goal.distance[c] == pytest.approx(3 * CELL))

    def stop_at(cell, tolerance):
        return episode_metrics(episode_id="0", scene_key=scene.name, category="chair", goal=goal, final_cell=cell,
                               geodesic_distance=2.0, travelled_m=2.5, steps=20, collisions=0, called_stop=True,
                               max_steps=cfg.max_steps, success_tolerance_m=tolerance)

    assert stop_at(one_cell, cfg.success_tolerance_m).success
    assert stop_at(one_cell, cfg.success_tolerance_m).spl == pytest.approx(2.0 / 2.5)
    assert not stop_at(three_cells, cfg.success_tolerance_m).success
    assert not stop_at(one_cell, 0.0).success, "tolerance 0: only inside the region"


def test_reaching_the_goal_without_stop_fails(world):
    scene, cfg, sim, goal, episode = world
    path = UP + OVER + DOWN
    result = run_episode(sim, Scripted(path), episode, scene, max_steps=len(path) + 5, cfg=cfg)
    m = result.metrics
    assert m.distance_to_goal == 0.0, "it stands in the goal region"
    assert not m.success and not m.called_stop and result.outcome == "step_budget_exhausted"
    assert m.steps == len(path) + 5


def test_stop_counts_against_the_step_budget(world):
    scene, cfg, sim, goal, episode = world
    path = UP + OVER + DOWN + [S]
    on_time = run_episode(sim, Scripted(path), episode, scene, max_steps=len(path), cfg=cfg)
    assert on_time.metrics.success
    late = run_episode(sim, Scripted(path), episode, scene, max_steps=len(path) - 1, cfg=cfg)
    assert not late.metrics.success and late.outcome == "step_budget_exhausted"


def test_blocked_moves_add_no_path_length(world):
    scene, cfg, sim, goal, episode = world
    # facing +y then turning right faces +x: three steps reach x = 1.275, the fourth hits the wall
    result = run_episode(sim, Scripted([R, R, R] + [F] * 6 + [S]), episode, scene, cfg=cfg)
    assert result.metrics.collisions == 3
    assert result.metrics.path_length == pytest.approx(3 * 0.25, abs=1e-9)
    assert result.collided == [False] * 6 + [True] * 3


def test_spl_definition():
    assert spl(False, 5.0, 5.0) == 0.0
    assert spl(True, 5.0, 4.0) == 1.0  # a path shorter than l (grid rounding) is capped at 1
    assert spl(True, 4.0, 5.0) == pytest.approx(0.8)


def test_summarize_means_and_per_category():
    def metrics(category, success, spl_value, dtg):
        return EpisodeMetrics("e", "s", category, success, spl_value, dtg, 5.0, 4.0, 30, 0, True)

    summary = summarize([metrics("chair", True, 0.9, 0.0), metrics("chair", False, 0.0, 2.0),
                         metrics("bed", True, 0.6, 0.0)])
    assert summary["episodes"] == 3
    assert summary["sr"] == pytest.approx(2 / 3) and summary["spl"] == pytest.approx(0.5)
    assert summary["dtg_m"] == pytest.approx(2 / 3)
    assert summary["per_category"]["chair"] == {"episodes": 2, "sr": 0.5, "spl": 0.45, "dtg_m": 1.0}
    assert summary["per_category"]["bed"]["sr"] == 1.0


def test_result_is_json_serialisable(world):
    scene, cfg, sim, goal, episode = world
    result = run_episode(sim, Scripted(UP + [S]), episode, scene, cfg=cfg)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["metrics"]["episode_id"] == "0" and data["category"] == "chair"
    assert len(data["poses"]) == 8 and data["actions"][-1] == int(S)


def test_episode_of_another_scene_is_refused(world):
    scene, cfg, sim, goal, episode = world
    other = ObjectNavEpisode(**{**episode.to_json(), "scene_key": "gibson/Elsewhere/0"})
    with pytest.raises(ValueError, match="gibson/Elsewhere/0"):
        run_episode(sim, Scripted([S]), other, scene, cfg=cfg)
