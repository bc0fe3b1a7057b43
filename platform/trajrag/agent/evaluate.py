"""Evaluate one agent on a set of episodes in this process: each finished episode appended to
the run's JSONL records as it ends (a re-run skips the finished ones), then the run's summary.

The Ray job (``distributed/evaluate.py``) fans the same episode loop out over actors. Beside this
module: the records and their checks (``run_records``), the run settings and their locks
(``run_claims``), paired comparisons with bootstrap intervals (``paired``) and the results table
(``results_table``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Sequence

from tqdm import tqdm

from trajrag.agent.decisions import AuditConfig, DecisionAudit, decision_quality
from trajrag.agent.episode_runner import EpisodeResult, run_episode
from trajrag.agent.run_records import (AgentRun, cut_torn_tail, perception_counters, planner_counters, record_metrics,
                                       write_json)
from trajrag.topo.describe import describe
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.episode_gen import scene_goal_field
from trajrag.world.metrics import summarize
from trajrag.world.scene import Scene


def evaluate_agent(name: str, make_agent: Callable[[], object], sim, episodes: Sequence[ObjectNavEpisode],
                   scenes: Sequence[Scene], out_dir: Path, episode_cfg, progress: bool = True,
                   on_episode: Callable[[dict, object], None] | None = None,
                   audit: AuditConfig | None = None) -> dict:
    """Run one agent on every episode not yet in ``out_dir/name/episodes.jsonl`` and summarise all.

    ``on_episode(record, agent)`` runs after each episode is written (lifelong memory inserts).
    ``audit``: record every planner decision against the privileged geodesic field into the
    episode records (``agent/decisions.py``; navigators only) and add ``decision_quality`` to
    the summary over the episodes that carry an audit.
    Returns ``summarize`` of the metrics (``episodes``, ``sr``, ``spl``, ``dtg_m``, ...) plus the
    planner's counters (``planner_calls``, ``fallbacks``, ``retrieval_ms_p50``).
    """
    run = AgentRun(name, Path(out_dir) / name)
    run.directory.mkdir(parents=True, exist_ok=True)
    done = run.finished()
    cut_torn_tail(run.records)
    by_name = {scene.name: scene for scene in scenes}
    todo = [e for e in episodes if (e.scene_key, str(e.episode_id)) not in done]
    agent = make_agent()
    with run.records.open("a") as sink:
        for episode in tqdm(todo, desc=f"eval {name}", unit="ep", disable=not progress):
            scene = by_name[episode.scene_key]
            audited = _start_audit(agent, scene, episode, episode_cfg, audit)
            result = run_episode(sim, agent, episode, scene, cfg=episode_cfg)
            record = episode_record(result, agent)
            if audited is not None:
                record["decisions"] = audited.records()
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            done[(record["scene_key"], record["episode_id"])] = record
            if on_episode is not None:
                on_episode(record, agent)
    wanted = sorted({(e.scene_key, str(e.episode_id)) for e in episodes})
    summary = summarize([record_metrics(done[key]["metrics"]) for key in wanted])
    summary.update(planner_counters([done[key] for key in wanted]))
    summary.update(perception_counters([done[key] for key in wanted]))
    # The same counts as the Ray evaluation's summary: a rerun that walked nothing says so.
    summary.update(evaluated=len(todo), skipped_already_done=len(wanted) - len(todo))
    if audit is not None:
        summary.update(decision_quality([done[key]["decisions"] for key in wanted if "decisions" in done[key]],
                                        audit.tolerance_m))
    write_json(run.directory / "summary.json", summary)
    return summary


def _start_audit(agent, scene: Scene, episode: ObjectNavEpisode, episode_cfg, audit: AuditConfig | None):
    """Hook a fresh ``DecisionAudit`` into a navigator for one episode (None: no audit)."""
    if audit is None:
        return None
    if not hasattr(agent, "decision_observer"):
        raise ValueError(f"the decision audit needs a navigator agent (frontier, random, trajrag, graphrag, "
                         f"llm), not {type(agent).__name__}")
    agent.decision_observer = DecisionAudit(scene, scene_goal_field(scene, episode.object_category, episode_cfg),
                                            audit.search_radius_m)
    return agent.decision_observer


def episode_record(result: EpisodeResult, agent) -> dict:
    """The JSONL record of one episode: metrics, raw trajectory (poses, actions, outcome) and,
    for agents that map what they see, the topo-polar trajectory and its description."""
    record = result.to_dict()
    if hasattr(agent, "topo_trajectory"):
        topo = agent.topo_trajectory(success=result.metrics.success)
        record["topo_polar"] = topo.to_dict()
        record["description"] = describe(topo)
        if hasattr(agent, "stats"):
            record["agent_stats"] = {k: v for k, v in vars(agent.stats).items() if not isinstance(v, list)}
        builder = getattr(agent, "builder", None)
        if builder is not None:
            record["perception_profile"] = builder.perception_cfg.profile
        episode_stats = getattr(getattr(agent, "planner", None), "episode_stats", None)
        if episode_stats is not None:  # retrieval timings, LLM fallbacks
            record["planner_stats"] = episode_stats()
    extras = getattr(agent, "episode_extras", None)
    if extras is not None:  # what an implicit query asked (queries.implicit)
        record.update(extras())
    metrics = record["metrics"]
    if not math.isfinite(metrics["distance_to_goal"]):
        metrics["distance_to_goal"] = None  # JSON has no inf; read back as unreachable
    return record
