"""Ray Tune sweep of the retrieval and planner hyperparameters of the TrajRAG (scoring) planner.

Each trial runs the ``trajrag`` agent with one setting of ``configs/sweep.yaml`` ``params``
(retrieval.top_k, memory.mutual_k, memory.ransac_threshold_m, topo.d_min_m, topo.sector_radius_m,
scoring weights) on the tuning episodes, ``chunk_episodes`` at a time, and reports the running
SR / SPL / DTG after each chunk, so the ASHA scheduler stops poor trials after a chunk or two.
The search algorithm is Optuna's TPE (``ray.tune.search.optuna``; ``search: random`` falls back to
Tune's random sampling). Every trial is logged to W&B, offline unless ``WANDB_MODE`` says otherwise.

The tuning scenes must never be the ones the tables report on: the default is procedural *train*
homes 40..49 (``procedural:train:40-50``), which the default corpus (``procedural:train:40`` =
homes 0..39) never saw and the val tables never use.

A trial evaluates in its own process, in-process retrieval (no Serve): its memory.* settings
change the retriever's matching, so it needs a retriever of its own; the encoder (the slow part
to load) is shared between the trials a Tune worker process runs.

Outputs under ``out``: ``best_config.json`` (the best trial's parameters, as values and as
``--set`` overrides, among the trials that ran every chunk), ``results.csv`` (one row per trial:
parameters and last reported metrics) and Tune's experiment folder ``tune/`` with the W&B
offline runs of each trial (``tune/<name>/<trial>/wandb/offline-run-*``).
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from trajrag import artefacts, config
from trajrag.agent.episode_runner import run_episode
from trajrag.agent.navigator import make_navigator
from trajrag.config import ConfigError, Settings
from trajrag.errors import UserError
from trajrag.planners.scoring import ScoringPlanner
from trajrag.ray_cluster import ensure_ray, finish_wandb, import_wandb
from trajrag.retrieval.retriever import load_encoder, load_retriever
from trajrag.world.datasets import load_episodes, load_scenes
from trajrag.world.metrics import summarize
from trajrag.world.sim import GridSimulator

PARAM_KINDS = ("uniform", "loguniform", "randint")
OBJECTIVES = ("sr", "spl")


@dataclass
class SweepParam:
    """One searched hyperparameter: ``kind`` uniform | loguniform (floats in [low, high]) or
    randint (integers in [low, high), Tune's convention)."""

    kind: str
    low: float
    high: float


@dataclass
class SweepConfig:
    """``configs/sweep.yaml``: tuning episodes, search, scheduler and tracking."""

    scenes: str
    episodes: str
    shuffle_seed: int
    chunk_episodes: int
    objective: str
    mode: str
    search: str
    seed: int
    num_samples: int
    max_concurrent_trials: int
    trial_num_cpus: float
    grace_chunks: int
    reduction_factor: int
    experiment_name: str
    wandb: bool
    wandb_project: str
    params: dict[str, SweepParam]


def check_config(cfg: SweepConfig) -> None:
    """``UserError`` naming the first bad value of the sweep config."""
    if cfg.objective not in OBJECTIVES:
        raise UserError(f"sweep.objective must be one of {OBJECTIVES}, got {cfg.objective!r}")
    if cfg.mode not in ("max", "min"):
        raise UserError(f"sweep.mode must be max or min, got {cfg.mode!r}")
    if cfg.search not in ("optuna", "random"):
        raise UserError(f"sweep.search must be optuna or random, got {cfg.search!r}")
    if cfg.chunk_episodes < 1 or cfg.num_samples < 1:
        raise UserError("sweep.chunk_episodes and sweep.num_samples must be >= 1")
    if not cfg.params:
        raise UserError("sweep.params is empty: nothing to search")
    for key, p in cfg.params.items():
        if p.kind not in PARAM_KINDS:
            raise UserError(f"sweep.params[{key}].kind must be one of {PARAM_KINDS}, got {p.kind!r}")
        if not p.low < p.high or (p.kind == "loguniform" and p.low <= 0):
            raise UserError(f"sweep.params[{key}]: need low < high (and low > 0 for loguniform)")
        value = int(p.low) if p.kind == "randint" else p.low
        try:  # the key must name a field of a config section (structured configs reject others)
            config.check_overrides([f"{key}={value}"])
        except ConfigError as exc:
            raise UserError(f"sweep.params: {key} is not a config value: {exc}") from None


def search_space(params: dict[str, SweepParam]) -> dict[str, Any]:
    """Tune's search space: one sampler per ``section.key``."""
    from ray import tune

    samplers = {"uniform": tune.uniform, "loguniform": tune.loguniform,
                "randint": lambda low, high: tune.randint(int(low), int(high))}
    return {key: samplers[p.kind](p.low, p.high) for key, p in params.items()}


def to_overrides(params: dict[str, Any]) -> list[str]:
    """``{"scoring.w_context": 1.5}`` -> ``["scoring.w_context=1.5"]`` (``--set`` syntax)."""
    return [f"{key}={value}" for key, value in sorted(params.items())]


# -- one trial (runs in a Tune worker process) ----------------------------------------------------
_ENCODERS: dict[str, Any] = {}


def _agent(settings: Settings) -> Any:
    """A trajrag navigator with a retriever of its own (memory.* settings differ per trial) and
    the process's shared encoder."""
    model_dir = settings.retrieval.model_dir
    key = json.dumps([model_dir, config.to_dict(settings.encoder)], sort_keys=True)
    if key not in _ENCODERS:
        _ENCODERS[key] = load_encoder(model_dir, settings.encoder)
    retriever = load_retriever(settings, encoder=_ENCODERS[key])
    planner = ScoringPlanner(retriever, settings.scoring)
    return make_navigator(planner, settings, seed=0)


def _trial_wandb(params: dict, project: str) -> Any:
    """The trial's W&B run, in the trial's folder (``<trial>/wandb/offline-run-*``, offline unless
    WANDB_MODE says otherwise). Started from the trial itself rather than with Ray's
    WandbLoggerCallback, whose logging actor imports wandb before any code of ours runs in it,
    leaving two temporary folders in /tmp per trial (``ray_cluster.import_wandb``)."""
    from ray import tune

    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    folder = tune.get_context().get_trial_dir()
    import_wandb(folder)
    from ray.air.integrations.wandb import setup_wandb

    return setup_wandb(params, project=project, dir=folder)


def run_trial(params: dict, *, scenes: Sequence[Any], episodes: Sequence[Any], settings: Settings,
              chunk_episodes: int, wandb_project: str | None) -> None:
    """Evaluate ``params`` (overrides on top of the driver's ``settings``) chunk by chunk;
    ``tune.report`` the running means after each chunk:
    ``sr``, ``spl``, ``dtg_m`` (over finite DTGs), ``episodes``, ``seconds``; the same to the
    trial's W&B run when ``wandb_project`` is given."""
    from ray import tune

    started = time.perf_counter()
    trial = settings.with_overrides(to_overrides(params))
    sim = GridSimulator(trial.sim)
    episode_cfg = trial.episodes
    agent = _agent(trial)
    by_name = {scene.name: scene for scene in scenes}
    wandb_run = _trial_wandb(params, wandb_project) if wandb_project else None
    metrics = []
    # Tune stops a trial inside tune.report (SystemExit), ASHA's early stops and the last chunk
    # alike, and Ray kills the process right after: the W&B run is finished and wandb's service
    # stopped (ray_cluster.finish_wandb) before the last report, and in a finally for early stops
    # (best effort: that finally races the kill).
    chunks = range(0, len(episodes), chunk_episodes)
    try:
        for start in chunks:
            for episode in episodes[start:start + chunk_episodes]:
                result = run_episode(sim, agent, episode, by_name[episode.scene_key], cfg=episode_cfg)
                metrics.append(result.metrics)
            s = summarize(metrics)
            dtg = s["dtg_m"] if math.isfinite(s["dtg_m"]) else None
            report = {"sr": s["sr"], "spl": s["spl"], "dtg_m": dtg, "episodes": len(metrics),
                      "seconds": time.perf_counter() - started}
            if wandb_run is not None:
                wandb_run.log(report)
                if start == chunks[-1]:
                    finish_wandb(wandb_run)
                    wandb_run = None
            tune.report(report)
    finally:
        finish_wandb(wandb_run)


# -- the driver -----------------------------------------------------------------------------------
def tuning_episodes(cfg: SweepConfig, settings: Settings) -> tuple[list, list]:
    """The tuning scenes and their episodes, shuffled once (fixed seed) so that every chunk
    mixes homes and every trial sees the same episodes in the same order (ASHA compares trials
    at equal chunks)."""
    scenes = load_scenes(cfg.scenes, settings)
    episodes = list(load_episodes(cfg.episodes, scenes, settings))
    random.Random(cfg.shuffle_seed).shuffle(episodes)
    return scenes, episodes


def sweep(store: str, model_dir: str, out_dir: str | Path, settings: Settings, *,
          num_samples: int | None = None, progress: bool = True, ray_address: str | None = None) -> dict:
    """Run the sweep of the ``sweep`` section of ``settings`` for the memory ``store`` and the
    encoder ``model_dir``; write ``best_config.json`` and ``results.csv`` under ``out_dir`` and
    return the best trial with a few counts. ``out_dir``: a folder or an object-store URI
    (``trajrag.artefacts``; Tune's experiment state then goes there directly)."""
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    started = time.perf_counter()
    cfg = settings.sweep
    if num_samples is not None:
        cfg = replace(cfg, num_samples=int(num_samples))
    check_config(cfg)
    if not store or not model_dir:
        raise UserError("the sweep evaluates the trajrag planner: pass --store and --model")
    # Trials run in other folders (Tune's trial dirs): local paths must be absolute.
    base = settings.with_values({"retrieval.store": _absolute(store), "retrieval.model_dir": _absolute(model_dir)},
                                beneath=True)
    scenes, episodes = tuning_episodes(cfg, base)
    n_chunks = math.ceil(len(episodes) / cfg.chunk_episodes)
    own_ray = ensure_ray(ray_address, max(os.cpu_count() or 1, cfg.max_concurrent_trials * cfg.trial_num_cpus))
    try:
        trainable = tune.with_resources(
            tune.with_parameters(run_trial, scenes=scenes, episodes=episodes, settings=base,
                                 chunk_episodes=cfg.chunk_episodes,
                                 wandb_project=cfg.wandb_project if cfg.wandb else None),
            {"cpu": cfg.trial_num_cpus})
        scheduler = ASHAScheduler(time_attr="training_iteration", max_t=n_chunks,
                                  grace_period=min(cfg.grace_chunks, n_chunks), reduction_factor=cfg.reduction_factor)
        tuner = tune.Tuner(
            trainable, param_space=search_space(cfg.params),
            tune_config=tune.TuneConfig(metric=cfg.objective, mode=cfg.mode, search_alg=_searcher(cfg),
                                        scheduler=scheduler, num_samples=cfg.num_samples,
                                        max_concurrent_trials=cfg.max_concurrent_trials),
            run_config=tune.RunConfig(name=cfg.experiment_name, storage_path=_tune_storage(out_dir),
                                      verbose=1 if progress else 0))
        results = tuner.fit()
    finally:
        if own_ray:
            ray.shutdown()
    # Both files written beside each other, uploaded together to a URI --out.
    with artefacts.output_file(artefacts.join(out_dir, "best_config.json")) as best:
        summary = _write_outputs(results, cfg, best.parent, len(episodes), n_chunks, time.perf_counter() - started)
    return {**summary, "best_config": artefacts.join(out_dir, "best_config.json"),
            "results_csv": artefacts.join(out_dir, "results.csv")}


def _tune_storage(out_dir: str | Path) -> str:
    """Tune's experiment folder: ``<out>/tune``, absolute (trials run in other folders)."""
    return artefacts.join(out_dir if artefacts.is_uri(out_dir) else _absolute(str(out_dir)), "tune")


def _absolute(path: str) -> str:
    return path if "://" in path else str(Path(path).expanduser().resolve())


def _searcher(cfg: SweepConfig) -> Any:
    if cfg.search == "random":
        return None  # Tune's BasicVariantGenerator: independent random samples
    from ray.tune.search.optuna import OptunaSearch

    return OptunaSearch(seed=cfg.seed)


def _write_outputs(results: Any, cfg: SweepConfig, out: Path, n_episodes: int, n_chunks: int,
                   seconds: float) -> dict:
    """``results.csv`` and ``best_config.json``; the best trial is chosen among those that ran
    every chunk (a trial stopped early scored fewer episodes), all trials if none did."""
    frame = results.get_dataframe()
    errors = [str(r.error) for r in results if r.error is not None]
    if frame.empty or cfg.objective not in frame:
        raise RuntimeError(f"no trial reported {cfg.objective}: {errors[:1] or 'no trials ran'}")
    param_cols = [f"config/{key}" for key in cfg.params]
    keep = ["trial_id", *param_cols, "sr", "spl", "dtg_m", "episodes", "training_iteration", "seconds"]
    table = frame[[c for c in keep if c in frame]].rename(columns={c: c[len("config/"):] for c in param_cols})
    table.to_csv(out / "results.csv", index=False)
    full = table[table["training_iteration"] >= n_chunks]
    pool = (full if not full.empty else table).dropna(subset=[cfg.objective])
    best = pool.sort_values(cfg.objective, ascending=cfg.mode == "min", kind="stable").iloc[0]
    params = {key: _plain(best[key]) for key in cfg.params}
    summary = {
        "objective": cfg.objective, "mode": cfg.mode, "value": float(best[cfg.objective]),
        "sr": float(best["sr"]), "spl": float(best["spl"]), "episodes": int(best["episodes"]),
        "trial_id": str(best["trial_id"]), "params": params, "overrides": to_overrides(params),
        "scenes": cfg.scenes, "episodes_spec": cfg.episodes, "tuning_episodes": n_episodes,
        "chunks": n_chunks, "trials": len(table), "trials_completed": len(full),
        "trials_stopped_early": int((table["training_iteration"] < n_chunks).sum()),
        "trial_errors": len(errors), "search": cfg.search, "seconds": seconds,
    }
    (out / "best_config.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _plain(value: Any) -> Any:
    """numpy scalars -> Python numbers (JSON)."""
    return value.item() if hasattr(value, "item") else value
