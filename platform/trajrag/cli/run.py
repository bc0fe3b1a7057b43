"""``trajrag run``: the whole pipeline, small, on the embedded default (what ``make run`` calls).

1. **corpus**: ObjectNav episodes on procedural *train* homes, collected by Ray actors (oracle
   and exploration walks mixed), converted to topo-polar chunks and grouped into the LanceDB
   memory ``<out>/memory``;
2. **encoder**: f_E trained on Ray Train (``<out>/model``), evaluated on held-out scenes
   (``<out>/encoder_eval.json``) and the chunk embeddings written into the memory;
3. **value**: the frontier value (``<out>/value.json``, ``trajrag value fit --store``) fitted on
   the decisions the corpus's exploration walks made in its homes, with their hindsight cost to
   the goal (the memory keeps them: ``memory.value_log``), which TrajRAG's scoring planner adds
   to its score;
4. **evaluation**: each agent (TrajRAG's retrieval-scoring planner and the baselines) on
   generated episodes of procedural *val* homes: ``<out>/<agent>/episodes.jsonl``;
5. **report**: ``<out>/results.md`` / ``results.csv``, ``episode.png`` (the agents' walks in one
   episode) and ``decision.png`` (one TrajRAG decision with its retrieved experiences).

Every stage resumes: the memory skips stored trajectories, a trained encoder and a fitted value
are kept, finished episodes are skipped. Sizes and the shared overrides are in ``configs/run.yaml``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from trajrag import config
from trajrag.agent.names import RETRIEVING_AGENTS, VALUE_AGENTS
from trajrag.cli import UserError, add_override_arg, output_folder
from trajrag.config import Settings
from trajrag.file_locks import claim

# Held by the run writing the folder (trajrag.file_locks: dropped when its process ends).
RUN_LOCK = "run.lock"
# The most decisive TrajRAG decision of the first episode, replayed (kept while no episode reruns).
DECISION_PNG = "decision.png"


@dataclass
class RunConfig:
    """``configs/run.yaml``: the corpus, encoder and evaluation sizes, agents, output folder and
    the overrides every stage shares."""

    corpus_scenes: str
    corpus_episodes_per_scene: int
    corpus_policy: str
    workers: int
    encoder_epochs: int
    scenes: str
    episodes: str
    agents: list[str]
    overrides: list[str]
    out: str


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "run",
        help="run the whole pipeline small on the embedded default (make run)",
        description="corpus (Ray collectors -> LanceDB memory) -> encoder (Ray Train) -> "
        "frontier value (decisions in the corpus homes) -> evaluation of TrajRAG against the baselines -> "
        "results table and pictures, offline. Sizes in configs/run.yaml; "
        "re-running resumes every stage.",
    )
    defaults = _defaults()
    parser.add_argument("--scenes", help=f"evaluation scene spec (default: run.scenes{defaults['scenes']})")
    parser.add_argument("--episodes", help=f"evaluation episode spec (default: run.episodes{defaults['episodes']})")
    parser.add_argument("--agents", help=f"comma-separated agent names (default: run.agents{defaults['agents']})")
    parser.add_argument("--out", help=f"output folder (default: run.out{defaults['out']})")
    parser.add_argument("--json", action="store_true", help="print the summaries as one JSON object")
    add_override_arg(parser)
    parser.set_defaults(func=run_command)


def _defaults() -> dict[str, str]:
    """`` = VALUE`` of the run.* keys the options default to, for the help text (empty when
    configs/run.yaml cannot be read: the command itself then says why)."""
    keys = ("scenes", "episodes", "agents", "out")
    try:
        cfg: RunConfig = config.load("run")
    except config.ConfigError:
        return dict.fromkeys(keys, "")
    values = {key: getattr(cfg, key) for key in keys}
    values["agents"] = ",".join(values["agents"])
    return {key: f" = {value}" for key, value in values.items()}


def run_command(args: argparse.Namespace) -> int:
    cfg: RunConfig = args.settings.run
    try:  # run.overrides are overrides too: checked like --set, before any stage runs
        config.check_overrides(cfg.overrides)
    except config.ConfigError as exc:
        raise config.ConfigError(f"run.overrides: {exc}") from None
    out = Path(args.out or cfg.out)
    output_folder(out, "--out")
    out.mkdir(parents=True, exist_ok=True)
    # The stages claim the memory and the evaluation runs, but nothing claimed the encoder's
    # folder: a second run there would train over the first's model. One run per folder.
    with claim(out / RUN_LOCK, "trajrag run", lambda other: UserError(
            f"{out} is being written by another trajrag run ({other}): wait for it to finish, "
            f"or give another --out")):
        return _run_stages(cfg, args, out)


def _run_stages(cfg: RunConfig, args: argparse.Namespace, out: Path) -> int:
    settings = args.settings.with_overrides(cfg.overrides, beneath=True)  # the command line's win
    agents = args.agents.split(",") if args.agents else list(cfg.agents)
    say = (lambda msg: print(msg, file=sys.stderr)) if args.progress else (lambda msg: None)
    seconds: dict[str, float] = {}
    store, model, value = str(out / "memory"), str(out / "model"), str(out / "value.json")
    made = {"retrieval.store": store, "retrieval.model_dir": model}  # what the stages make, for the evaluation
    with pipeline_ray(cfg.workers, settings):
        corpus = encoder = value_report = None
        if any(a in (*RETRIEVING_AGENTS, *VALUE_AGENTS) for a in agents):
            start = time.perf_counter()
            corpus = build_memory(cfg, store, settings, progress=args.progress, say=say)
            seconds["corpus"] = time.perf_counter() - start
        grew = corpus is not None and corpus["collected"] > 0
        if any(a in RETRIEVING_AGENTS for a in agents):
            start = time.perf_counter()
            encoder = train_and_embed(cfg, store, model, settings, say=say, corpus_grew=grew)
            seconds["encoder"] = time.perf_counter() - start
        if any(a in VALUE_AGENTS for a in agents):
            start = time.perf_counter()
            value_report = fit_value_stage(store, value, settings, say=say, corpus_grew=grew)
            seconds["value"] = time.perf_counter() - start
            made["scoring.value_model"] = value
        start = time.perf_counter()
        summaries = evaluate(cfg, args, agents, out, settings.with_values(made, beneath=True), say)
        seconds["evaluation"] = time.perf_counter() - start
    if args.json:
        print(json.dumps({"out": str(out), "corpus": corpus, "encoder": encoder, "value": value_report,
                          "summaries": summaries, "seconds": seconds}, default=str))
    return 0


@contextlib.contextmanager
def pipeline_ray(workers: int, settings: Settings) -> Iterator[None]:
    """One local Ray for every stage (or the running one), sized for ``workers`` actors plus the
    Serve replicas of the evaluation (``eval_job``); shut down at the end when started here."""
    from trajrag.ray_cluster import ensure_ray
    from trajrag.distributed.evaluate import cpus_needed, job_config

    if workers < 1:
        yield
        return
    import ray

    needed = math.ceil(cpus_needed(job_config(settings.eval_job, workers), served=True))
    own = ensure_ray(None, max(os.cpu_count() or 1, workers, needed))
    try:
        yield
    finally:
        if own:
            ray.shutdown()


def build_memory(cfg: RunConfig, store: str, settings: Settings, progress: bool, say) -> dict:
    """Stage 1: the corpus into ``store`` (Ray collectors; resumable)."""
    from trajrag.agent.corpus import build_corpus
    from trajrag.distributed.corpus import build_corpus_ray

    say(f"[1/5] corpus: {cfg.corpus_episodes_per_scene} episodes x {cfg.corpus_scenes} "
        f"({cfg.corpus_policy}), {cfg.workers} collectors -> {store}")
    if cfg.workers > 0:
        summary = build_corpus_ray(cfg.corpus_scenes, cfg.corpus_episodes_per_scene, cfg.corpus_policy, store,
                                   settings, workers=cfg.workers, progress=progress)
    else:
        summary = build_corpus(cfg.corpus_scenes, cfg.corpus_episodes_per_scene, cfg.corpus_policy, store,
                               settings, progress=progress)
    say(f"      {summary['chunks']} chunks in {summary['groups']} groups ({summary['traj_per_s']:.2f} trajectories/s)")
    return {k: summary.get(k) for k in ("episodes_planned", "collected", "chunks", "groups", "decisions",
                                        "walks_with_value_decisions", "traj_per_s")}


def train_and_embed(cfg: RunConfig, store: str, model: str, settings: Settings, say, corpus_grew: bool) -> dict:
    """Stage 2: train f_E (kept when ``model`` already holds one) and embed every chunk (kept,
    with its recall report, when the model was kept and the corpus did not grow)."""
    from trajrag.encoder.evaluate import evaluate_encoder
    from trajrag.encoder.model import read_meta
    from trajrag.encoder.train import train_encoder

    report = Path(model).parent / "encoder_eval.json"
    trained = (Path(model) / "encoder.json").is_file()
    if trained and report.is_file() and not corpus_grew:
        say(f"[2/5] encoder: keeping {model} and its embeddings ({report})")
        return json.loads(report.read_text())
    if not trained:
        say(f"[2/5] encoder: {cfg.encoder_epochs} epochs on Ray Train ({cfg.workers} workers) -> {model}")
        # run.encoder_epochs beneath the settings' own (a --set encoder.train.epochs wins)
        training = settings.with_values({"encoder.train.epochs": cfg.encoder_epochs}, beneath=True).encoder
        train_encoder(store, model, training, workers=max(cfg.workers, 1), log=say)
    else:
        say(f"[2/5] encoder: keeping {model} ({read_meta(model)['encoder_version']})")
    # recall on held-out scenes when the corpus holds queries, and every chunk's embedding written
    result = evaluate_encoder(store, model, settings.encoder)
    result["embedded_chunks"] = result["held_out"]["written"]
    if not result["recall_measured"]:
        say(f"      held-out recall not measured: {result['recall_not_measured_because']}")
    else:
        say("      held-out recall@5: trained {:.3f}, text {:.3f}, untrained {:.3f}".format(
            *(result[k]["recall@5"] for k in ("trained", "text", "untrained"))))
        vs_text = result["trained_minus_text"]["recall@5"]
        say("      trained - text {:+.3f} [{:+.3f}, {:+.3f}] over {} queries of one split "
            "(`trajrag encoder cv` pools every scene)".format(
                vs_text["mean"], *vs_text["ci95"], result["held_out"]["queries"]))
    report.write_text(json.dumps(result, indent=1))
    return result


def fit_value_stage(store: str, value: str, settings: Settings, say, corpus_grew: bool) -> dict:
    """Stage 3: the frontier value from the decisions of the corpus's exploration walks (kept
    when ``value`` exists and the corpus did not grow)."""
    from trajrag.cli.value import fit_value_from_kept
    from trajrag.planners.frontier_value import FrontierValueModel

    if Path(value).is_file() and not corpus_grew:
        say(f"[3/5] value: keeping {value}")
        return FrontierValueModel.load(value).report
    say(f"[3/5] value: fitted on the decisions of the corpus's exploration walks ({store}) -> {value}")
    report = fit_value_from_kept([], [store], value, settings)
    held_out = report.get("held_out")
    if held_out:
        say("      held-out best pick: value {:.3f}, nearest frontier {:.3f}".format(
            held_out["value"]["best_rate"], held_out["nearest_frontier"]["best_rate"]))
    return report


def evaluate(cfg: RunConfig, args: argparse.Namespace, agents: list[str], out: Path, settings: Settings,
             say) -> dict:
    """Stages 3 and 4: every agent on the evaluation episodes, the table and the pictures."""
    from trajrag.agent.evaluate import evaluate_agent
    from trajrag.agent.results_table import render_episode_png, write_results_table
    from trajrag.agent.run_claims import claim_runs, run_settings
    from trajrag.agent.registry import make_agent
    from trajrag.distributed.evaluate import evaluate_ray
    from trajrag.world.datasets import load_episodes, load_scenes
    from trajrag.world.sim import GridSimulator

    scenes = load_scenes(args.scenes or cfg.scenes, settings)
    episodes = load_episodes(args.episodes or cfg.episodes, scenes, settings)
    episode_cfg = settings.episodes
    sim = GridSimulator(settings.sim)
    say(f"[4/5] evaluation: {len(episodes)} episodes in {len(scenes)} val homes, agents {agents}")
    summaries = {}
    with claim_runs(out, {name: run_settings(name, settings) for name in agents}):  # held while they walk
        for name in agents:
            if cfg.workers > 0:  # evaluator actors; TrajRAG's planner and retriever behind Ray Serve
                summaries[name] = evaluate_ray(name, name, scenes, episodes, out, settings, workers=cfg.workers,
                                               progress=args.progress)
            else:
                summaries[name] = evaluate_agent(name, lambda: make_agent(name, settings), sim,
                                                 episodes, scenes, out, episode_cfg, progress=args.progress)
    table = write_results_table(summaries, out)
    pictures = [render_episode_png(scenes, out, agents, out / "episode.png")]
    if "trajrag" in agents:
        kept = out / DECISION_PNG
        if summaries["trajrag"]["evaluated"] == 0 and kept.is_file():  # a rerun: no episode walked again
            pictures.append(kept)
        else:
            pictures.append(decision_picture(sim, episodes[0], scenes, settings, out))
    say("[5/5] report\n" + table + f"records: {out}/<agent>/episodes.jsonl  table: {out}/results.md  "
        f"pictures: {', '.join(str(p) for p in pictures if p)}")
    return summaries


def decision_picture(sim, episode, scenes, settings: Settings, out: Path) -> Path | None:
    """``decision.png``: the most decisive TrajRAG decision of the first episode, replayed."""
    from trajrag.agent.registry import make_agent
    from trajrag.agent.replay import record_decisions
    from trajrag.retrieval.viz import render_decision_png

    scene = next(s for s in scenes if s.name == episode.scene_key)
    decisions = record_decisions(make_agent("trajrag", settings), sim, episode, scene, settings.episodes)
    if not decisions:
        return None
    return render_decision_png(max(decisions, key=lambda d: d.margin), out / DECISION_PNG)
