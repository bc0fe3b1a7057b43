"""A corpus built in one process: episodes collected (``agent/collect.py``), converted to topo-polar
trajectories and inserted in plan order into the memory at a store URI, resumably (what ``trajrag
corpus build`` does without ``--workers``; ``distributed/corpus.py`` is the same build on Ray)."""

from __future__ import annotations

import sys
import time
from collections import Counter

from tqdm import tqdm

from trajrag.agent.collect import Collector, collection_settings, collector_settings, episode_policy, trajectory_id
from trajrag.config import Settings
from trajrag.errors import UserError
from trajrag.memory.build_settings import BuildSettings
from trajrag.memory.shards import open_memory
from trajrag.memory.store import claim_store
from trajrag.memory.value_log import ValueLog
from trajrag.world.datasets import load_scenes
from trajrag.world.episode_gen import generate_episodes
from trajrag.world.geodesic import Motion


def build_corpus(scene_spec: str, per_scene: int, policy: str, store_uri: str, settings: Settings, seed=None,
                 progress: bool = True, writers: int = 1, mixed_settings: bool = False) -> dict:
    """Collect + convert + insert in this process, the store claimed for the job
    (``claim_store``), collectors and memory made from ``settings``; returns counts, decisions,
    throughput and time per stage. A store whose walks were collected with other settings is
    refused unless ``mixed_settings`` (``memory.build_settings``)."""
    if per_scene < 1:
        raise UserError(f"--episodes-per-scene must be >= 1, got {per_scene}")
    started = time.perf_counter()
    scenes = load_scenes(scene_spec, settings)
    episode_cfg = settings.episodes
    episodes = generate_episodes(scenes, per_scene, episode_cfg, episode_cfg.seed if seed is None else seed,
                                 Motion.from_sim_config(collector_settings(settings).sim))
    return collect_into(scenes, episodes, policy, store_uri, settings, f"corpus build of {scene_spec}", progress,
                        writers, mixed_settings, started)


def collect_into(scenes: list, episodes: list, policy: str, store_uri: str, settings: Settings, job: str,
                 progress: bool = True, writers: int = 1, mixed_settings: bool = False,
                 started: float | None = None) -> dict:
    """``episodes`` (of ``scenes``) walked with ``policy`` into the memory at ``store_uri``, the store
    claimed for ``job`` and its build settings admitted (``build_corpus``'s summary); episodes the
    store already holds are skipped. The revisit benchmark builds each home's memory with it."""
    started = time.perf_counter() if started is None else started
    with claim_store(store_uri, job):
        BuildSettings(store_uri).admit(collection_settings(settings, scenes), mixed_settings)
        return _collect_and_insert(scenes, episodes, policy, store_uri, settings, progress, started, writers)


def _collect_and_insert(scenes: list, episodes: list, policy: str, store_uri: str, settings: Settings,
                        progress: bool, started: float, writers: int = 1) -> dict:
    """``build_corpus``'s work once the store is claimed: the episodes not yet stored, walked and
    inserted in plan order, a batch at a time."""
    # With several writers this process runs them one after another: the same memory as the Ray
    # build with --writers, no faster.
    memory = open_memory(store_uri, settings.memory, writers)
    value_log = ValueLog(store_uri)
    collector = Collector(settings)
    todo = [e for e in episodes if not memory.known(
        trajectory_id(e, episode_policy(e, policy, collector.cfg.oracle_fraction, collector.cfg.seed)))]
    setup_s = time.perf_counter() - started
    by_name = {scene.name: scene for scene in scenes}
    decisions: Counter = Counter()
    collect_s = insert_s = 0.0
    batch, batch_size = [], memory.cfg.batch_size
    bar = tqdm(total=len(todo), desc="corpus", unit="traj", disable=not progress, file=sys.stderr)

    def insert(batch):
        nonlocal insert_s
        t = time.perf_counter()
        # Decisions before trajectories: a walk whose chunk is stored has its decisions (memory.value_log).
        value_log.append((i.trajectory_id, i.value_decisions) for i in batch if i.value_decisions is not None)
        # Keyed as collect.trajectory_id keys them and inserted in plan order, as the Ray writer
        # does (distributed/corpus.py): grouping depends on the order, so both build one memory.
        for item in batch:
            item.trajectory.trajectory_id, item.trajectory.policy = item.trajectory_id, item.policy
        decisions.update(d.action for d in memory.insert_many([item.trajectory for item in batch]))
        insert_s += time.perf_counter() - t

    for episode in todo:
        t = time.perf_counter()
        batch.append(collector.collect_one(episode, by_name[episode.scene_key], policy))
        collect_s += time.perf_counter() - t
        bar.update(1)
        bar.set_postfix(traj_per_s=f"{bar.n / max(collect_s + insert_s, 1e-9):.2f}")
        if len(batch) >= batch_size:
            insert(batch)
            batch = []
    if batch:
        insert(batch)
    bar.close()
    total_s = time.perf_counter() - started
    return {
        "episodes_planned": len(episodes),
        "skipped_already_stored": len(episodes) - len(todo),
        "collected": len(todo),
        "decisions": dict(decisions),
        "chunks": memory.n_chunks,
        "groups": memory.n_groups,
        "walks_with_value_decisions": len(value_log),
        "traj_per_s": len(todo) / total_s if todo else 0.0,
        "seconds": {"setup": setup_s, "collect_and_convert": collect_s, "insert": insert_s, "total": total_s},
    }
