"""The frontier value's decisions collected on Ray: one task per scene, the walks in parallel.

``agent.value_data.collect_value_decisions`` walks episodes one after another; a value fit on
the 40 corpus homes of ``trajrag run`` walked 80 episodes at ~4 s each on one core while the
other sat idle. Here every scene's episodes are one Ray task (a scene's episodes share its goal
fields and the task builds its agent once), scenes travel through the object store once, and
the decisions come back in scene order, so the fit is the same as in one process. Each
scene is handed on as its task returns (``on_scene``: ``agent/value_parts.py`` keeps it), and a
scene that fails is named once the others are done, never silently dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

import ray
from tqdm import tqdm

from trajrag.agent.value_data import collect_value_decisions
from trajrag.agent.value_parts import ValueWalkError
from trajrag.config import Settings
from trajrag.distributed.shards import first_line
from trajrag.planners.frontier_value import ValueDecision

if TYPE_CHECKING:  # the walking code is imported by the tasks, not by the driver
    from trajrag.agent.value_data import SceneDone


def _scene_decisions(scene: Any, episodes: list, settings: Settings) -> tuple[list[ValueDecision], list[str]]:
    return collect_value_decisions([scene], episodes, settings, progress=False)


def collect_value_decisions_ray(scenes: Sequence[Any], episodes: Sequence[Any], settings: Settings,
                                progress: bool = True, on_scene: Optional[SceneDone] = None
                                ) -> tuple[list[ValueDecision], list[str]]:
    """``collect_value_decisions`` with one Ray task (one CPU) per scene on the running Ray;
    returns the decisions in scene order and the agents' vocabulary. ``on_scene`` is called as
    each scene's task returns (in the order they finish). A scene whose task fails does not stop
    the others: once they are done, ``ValueWalkError`` names each failed scene and its error."""
    by_scene: dict[str, list] = {}
    for episode in episodes:
        by_scene.setdefault(episode.scene_key, []).append(episode)
    remote = ray.remote(num_cpus=1)(_scene_decisions)
    order = [scene.name for scene in scenes if scene.name in by_scene]
    refs = [remote.remote(ray.put(scene), by_scene[scene.name], settings) for scene in scenes if scene.name in by_scene]
    scene_of = dict(zip(refs, order))
    results: dict[str, tuple] = {}
    failed: dict[str, str] = {}
    with tqdm(total=len(episodes), desc="value decisions", unit="ep", disable=not progress) as bar:
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            name = scene_of[done[0]]
            bar.update(len(by_scene[name]))
            try:
                results[name] = ray.get(done[0])
            except ray.exceptions.RayError as err:
                failed[name] = first_line(err)
                continue
            if on_scene is not None:
                on_scene(name, *results[name])
    if failed:
        said = "; ".join(f"{name}: {error}" for name, error in failed.items())
        raise ValueWalkError(f"value decisions: {len(failed)} of {len(order)} scenes failed ({said}); walk one "
                             f"with --workers 0 to see its traceback")
    decisions: list[ValueDecision] = []
    vocabularies = set()
    for name in order:
        found, vocabulary = results[name]
        decisions += found
        vocabularies.add(tuple(vocabulary))
    if len(vocabularies) > 1:
        raise RuntimeError(f"value decisions: the Ray tasks' agents have different vocabularies {vocabularies}")
    return decisions, list(vocabularies.pop()) if vocabularies else []
