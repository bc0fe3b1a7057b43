"""``trajrag bench topo``: cost of the navigation stack (one CPU core).

* ``agent_ms_per_step_p50`` (and p95): what the nearest-frontier navigator spends per step at
  640x480 on perception + mapping + (at decisions) frontiers, topo graph and candidate paths +
  the local policy; rendering is the simulator's and is not counted.
* ``decision_ms_p50``: one decision alone (frontiers + topo graph + BFS candidates + planner).
* ``conversion_traj_per_s``: finished episodes (final map + poses) converted to topo-polar
  trajectories per second (Eq. 5: skeleton, nodes, sectors, assignment, f_PL).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from trajrag.agent.episode_runner import run_episode
from trajrag.agent.registry import make_frontier_agent
from trajrag.bench.sim import one_core
from trajrag.config import Settings
from trajrag.topo.trajectory import build_topo_polar
from trajrag.world.datasets import load_episodes, load_scenes
from trajrag.world.sim import GridSimulator

_FULL = {"scenes": 4, "episodes_per_scene": 2, "conversion_repeats": 5}
_QUICK = {"scenes": 1, "episodes_per_scene": 1, "conversion_repeats": 2}


def run(args: argparse.Namespace, settings: Settings) -> dict:
    size = _QUICK if args.quick else _FULL
    sim_cfg, episode_cfg = settings.sim, settings.episodes
    scenes = load_scenes(f"procedural:val:{size['scenes']}", settings)
    episodes = load_episodes(f"generated:{size['episodes_per_scene']}", scenes, settings)
    by_name = {s.name: s for s in scenes}
    sim = GridSimulator(sim_cfg)
    agent = make_frontier_agent(settings)
    step_ms: list[float] = []
    decision_ms: list[float] = []
    finished = []  # (map, poses, goal, reference yaw) of each episode, for the conversion timing
    with one_core():
        for episode in episodes:
            run_episode(sim, agent, episode, by_name[episode.scene_key], episode_cfg)
            step_ms += agent.stats.step_ms
            decision_ms += agent.stats.decision_ms
            finished.append((agent.builder.map.copy(), np.asarray(agent.builder.poses), episode.object_category,
                             episode.start_pose().yaw))
        topo_cfg = agent.topo_cfg
        start = time.perf_counter()
        for _ in range(size["conversion_repeats"]):
            for sem, poses, goal, yaw in finished:
                build_topo_polar(sem, poses, goal, topo_cfg, reference_yaw=yaw)
        conversion_s = (time.perf_counter() - start) / (size["conversion_repeats"] * len(finished))
    return {
        "resolution": f"{sim_cfg.width}x{sim_cfg.height}",
        "episodes": len(episodes),
        "steps": len(step_ms),
        "agent_ms_per_step_p50": float(np.percentile(step_ms, 50)),
        "agent_ms_per_step_p95": float(np.percentile(step_ms, 95)),
        "agent_ms_per_step_mean": float(np.mean(step_ms)),
        "decisions": len(decision_ms),
        "decision_ms_p50": float(np.percentile(decision_ms, 50)) if decision_ms else None,
        "conversion_ms": conversion_s * 1e3,
        "conversion_traj_per_s": 1.0 / conversion_s,
    }
