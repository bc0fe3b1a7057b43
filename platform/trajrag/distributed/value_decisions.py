"""The frontier value's decisions collected on Ray: one task per scene, the walks in parallel.

``agent.value_data.collect_value_decisions`` walks episodes one after another; a value fit on
the 40 corpus homes of ``trajrag run`` walked 80 episodes at ~4 s each on one core while the
other sat idle. Here every scene's episodes are one Ray task (a scene's episodes share its goal
fields and the task builds its agent once), scenes travel through the object store once, and
the decisions come back in scene order, so the fit is the same as in one process.
"""

from __future__ import annotations

from typing import Any, Sequence

import ray
from tqdm import tqdm

from trajrag.planners.frontier_value import ValueDecision


def _scene_decisions(scene: Any, episodes: list, goals: list[str], sim_cfg: Any, episode_cfg: Any, audit: Any,
                     cfg: Any, overrides: list[str]) -> tuple[list[ValueDecision], list[str]]:
    from trajrag.agent.value_data import collect_value_decisions

    return collect_value_decisions([scene], episodes, goals, sim_cfg, episode_cfg, audit, cfg, overrides,
                                   progress=False)


def collect_value_decisions_ray(scenes: Sequence[Any], episodes: Sequence[Any], goals: Sequence[str], sim_cfg: Any,
                                episode_cfg: Any, audit: Any, cfg: Any, overrides: Sequence[str] = (),
                                progress: bool = True) -> tuple[list[ValueDecision], list[str]]:
    """``collect_value_decisions`` with one Ray task (one CPU) per scene on the running Ray;
    returns the decisions in scene order and the agents' vocabulary."""
    by_scene: dict[str, list] = {}
    for episode in episodes:
        by_scene.setdefault(episode.scene_key, []).append(episode)
    remote = ray.remote(num_cpus=1)(_scene_decisions)
    order = [scene for scene in scenes if scene.name in by_scene]
    refs = [remote.remote(ray.put(scene), by_scene[scene.name], list(goals), sim_cfg, episode_cfg, audit, cfg,
                          list(overrides)) for scene in order]
    walks = {ref: len(by_scene[scene.name]) for ref, scene in zip(refs, order)}
    results: dict[Any, tuple] = {}
    with tqdm(total=len(episodes), desc="value decisions", unit="ep", disable=not progress) as bar:
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            results[done[0]] = ray.get(done[0])
            bar.update(walks[done[0]])
    decisions: list[ValueDecision] = []
    vocabularies = set()
    for ref in refs:
        found, vocabulary = results[ref]
        decisions += found
        vocabularies.add(tuple(vocabulary))
    if len(vocabularies) > 1:
        raise RuntimeError(f"value decisions: the Ray tasks' agents have different vocabularies {vocabularies}")
    return decisions, list(vocabularies.pop()) if vocabularies else []
