"""``trajrag bench pipeline``: throughput of the platform jobs on Ray.

* ``corpus_traj_per_s_1`` and ``corpus_traj_per_s_2``: the corpus build
  (``distributed.corpus.build_corpus_ray``) with 1 and 2 collector actors on the same small corpus
  (``configs/pipeline_bench.yaml``), each into a fresh store in a temporary folder. The rate is
  trajectories stored per second of the job's pipeline: actor start, collection, conversion and
  inserts, without starting Ray and generating the episodes (paid once per job, not per
  trajectory).
* ``eval_episodes_per_h_1`` and ``eval_episodes_per_h_2``: the evaluation job
  (``distributed.evaluate.evaluate_ray``) of the ``trajrag`` planner with 1 and 2 evaluator actors
  on the same episodes, each into a fresh output folder. The rate is episodes per hour of the
  job's pipeline (evaluator start included); the Serve app (planner + retriever) is deployed
  once before and shared, as jobs on one cluster share it. The memory is a small one built here
  (oracle walks + an untrained encoder: throughput does not depend on the weights) unless
  ``eval_store`` / ``eval_model`` name one.
* ``serve_ms_p50`` and ``serve_ms_p99``: end-to-end latency of one decision request through the
  Planner deployment's ``DeploymentHandle`` (request encoding, Planner -> Retriever -> scoring,
  answer), one request at a time, replaying the decision requests recorded from real navigation
  (nearest-frontier walks of the benchmark episodes, up to ``serve_requests`` decisions), each
  once and in order (``serve_comparison``); split into the retriever's ``serve_coarse_ms_p50`` / ``_encode_ms_p50`` /
  ``_search_ms_p50`` and ``serve_overhead_ms_p50`` (hops, wire format, scoring). The same replay
  on the app with the retriever as before (caches off, ``retrieval.fast_path=false``) gives
  ``serve_reference_*`` and ``serve_speedup_p50``; with a Retriever deployment apart from the
  Planner, ``serve_two_deployments_*`` (``SERVE_VARIANTS``).

Empty ``corpus_workers`` / ``eval_workers`` skip those runs (``--set
pipeline_bench.corpus_workers=[] --set pipeline_bench.eval_workers=[]``: the Serve replay alone).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trajrag.agent.corpus import build_corpus
from trajrag.agent.episode_runner import run_episode
from trajrag.agent.navigator import make_navigator
from trajrag.config import Settings
from trajrag.distributed.serve_planner import decision_request, delete_planner_app, deploy_planner_app
from trajrag.encoder.evaluate import embed_store
from trajrag.encoder.node_encoder import NodeEncoder
from trajrag.planners.frontier import NearestFrontierPlanner
from trajrag.planners.frontier_value import load_value_model
from trajrag.ray_cluster import ensure_ray
from trajrag.world.datasets import load_episodes, load_scenes
from trajrag.world.sim import GridSimulator


@dataclass
class PipelineBenchConfig:
    """``configs/pipeline_bench.yaml``: the corpus, the evaluation and the Serve replay measured,
    and their --quick variants."""

    corpus_scenes: str
    corpus_episodes_per_scene: int
    corpus_policy: str
    corpus_workers: list[int]
    quick_scenes: str
    quick_episodes_per_scene: int
    quick_policy: str
    quick_overrides: list[str]
    eval_store: str
    eval_model: str
    eval_memory_scenes: str
    eval_memory_episodes_per_scene: int
    eval_memory_overrides: list[str]
    eval_scenes: str
    eval_episodes: str
    eval_planner: str
    eval_workers: list[int]
    eval_overrides: list[str]
    serve_requests: int
    serve_warmup: int
    quick_eval_memory_scenes: str
    quick_eval_memory_episodes_per_scene: int
    quick_eval_scenes: str
    quick_eval_episodes: str
    quick_eval_overrides: list[str]
    quick_serve_requests: int


def corpus_throughput(scenes: str, per_scene: int, policy: str, workers: list[int],
                      settings: Settings, progress: bool = False) -> dict:
    """``corpus_traj_per_s_<n>`` for each collector count ``n`` (fresh stores), plus details."""
    from trajrag.distributed.corpus import build_corpus_ray

    result: dict = {}
    for n in workers:
        with tempfile.TemporaryDirectory(prefix="trajrag-bench-pipeline-") as tmp:
            summary = build_corpus_ray(scenes, per_scene, policy, os.path.join(tmp, "memory"),
                                       settings, workers=n, progress=progress)
        pipeline_s = summary["seconds"]["pipeline"]
        result[f"corpus_traj_per_s_{n}"] = summary["collected"] / pipeline_s if pipeline_s > 0 else 0.0
        result[f"corpus_seconds_{n}"] = summary["seconds"]
        collected, cpu = max(summary["collected"], 1), summary["cpu_seconds"]
        # Per-core costs (CPU seconds of the actor processes): the basis of a capacity plan.
        result[f"corpus_collect_cpu_s_per_traj_{n}"] = cpu["collect_and_convert"] / collected
        result[f"corpus_insert_cpu_s_per_traj_{n}"] = cpu["insert"] / collected
        result["corpus_trajectories"] = summary["collected"]
    return result


# -- the evaluation ---------------------------------------------------------------------------------
def small_memory(root: Path, scenes: str, per_scene: int, settings: Settings) -> tuple[str, str]:
    """A small real memory for retrieval: oracle walks of ``scenes`` converted and grouped into a
    store, and an *untrained* encoder folder (architecture + MiniLM node encoder, seed 0) whose
    embeddings are written to every chunk. Returns ``(store URI, model folder)``."""
    from trajrag.encoder.model import build_model, save_model_dir

    store, model_dir = str(root / "memory"), str(root / "model")
    build_corpus(scenes, per_scene, "oracle", store, settings, progress=False)
    cfg = settings.encoder
    node_encoder = NodeEncoder(cfg.node)
    save_model_dir(model_dir, build_model(cfg.model, node_encoder.dim, seed=0), cfg.model,
                   node_encoder.info(), extra={"seed": 0, "train_scenes": []})
    embed_store(store, model_dir, cfg, node_encoder=node_encoder)
    return store, model_dir


def eval_throughput(planner: str, scenes: list, episodes: list, workers: list[int], settings: Settings,
                    progress: bool = False) -> dict:
    """``eval_episodes_per_h_<n>`` for each evaluator count ``n`` (fresh output folders), plus
    the Serve latency the evaluators saw and per-core costs."""
    from trajrag.distributed.evaluate import evaluate_ray

    result: dict = {}
    for n in workers:
        with tempfile.TemporaryDirectory(prefix="trajrag-bench-eval-") as tmp:
            summary = evaluate_ray(f"bench-x{n}", planner, scenes, episodes, tmp, settings, workers=n,
                                   progress=progress)
        result[f"eval_episodes_per_h_{n}"] = summary["episodes_per_h"]
        result[f"eval_seconds_{n}"] = summary["seconds"]
        result[f"eval_cpu_s_per_episode_{n}"] = summary["cpu_seconds"]["evaluate"] / max(summary["evaluated"], 1)
        result[f"eval_serve_ms_p50_{n}"] = summary["serve_ms_p50"]
        result[f"eval_sr_{n}"], result[f"eval_spl_{n}"] = summary["sr"], summary["spl"]
    result["eval_episodes"] = len(episodes)
    return result


# -- Serve latency --------------------------------------------------------------------------------
class RecordingPlanner:
    """Wraps a planner and keeps the Serve decision request of every decision it makes (with the
    features of the app's frontier ``value`` model, when it has one)."""

    def __init__(self, inner, value=None) -> None:
        self.inner, self.name, self.value = inner, f"recording-{inner.name}", value
        self.requests: list[dict] = []

    def reset(self, goal: str, seed: int) -> None:
        self.inner.reset(goal, seed)

    def choose(self, ctx) -> int:
        self.requests.append(decision_request(ctx, self.value))
        return self.inner.choose(ctx)


def record_decisions(scenes: list, episodes: list, settings: Settings, at_least: int = 5) -> list[dict]:
    """Decision requests of nearest-frontier walks of the benchmark episodes, in order, until at
    least ``at_least`` decisions were recorded (realistic candidate payloads for the replay)."""
    scoring, navigator = settings.scoring, settings.navigator
    value = load_value_model(scoring.value_model, navigator.vocabulary, scoring)
    planner = RecordingPlanner(NearestFrontierPlanner(navigator.frontier_hysteresis_m), value)
    agent = make_navigator(planner, settings)
    sim, by_name = GridSimulator(settings.sim), {s.name: s for s in scenes}
    for episode in episodes:
        run_episode(sim, agent, episode, by_name[episode.scene_key], cfg=settings.episodes)
        if len(planner.requests) >= at_least:
            break
    return planner.requests


def latency_split(times: list[float], answers: list[dict], prefix: str = "serve") -> dict:
    """``<prefix>_ms_p50`` / ``_p99`` (and mean) of request round trips ``times`` (ms) and the
    retriever's split from their ``answers``: ``<prefix>_coarse_ms_p50``, ``_encode_ms_p50``,
    ``_search_ms_p50``, and ``<prefix>_overhead_ms_p50``, the round trip minus the retriever's
    compute time (the Serve hops, the wire format and scoring)."""
    retrieval = np.array([a["retrieval_ms"] for a in answers])
    coarse = np.array([a["coarse_ms"] for a in answers])
    encode = np.array([a["encode_ms"] for a in answers])
    return {f"{prefix}_ms_p50": float(np.percentile(times, 50)), f"{prefix}_ms_p99": float(np.percentile(times, 99)),
            f"{prefix}_ms_mean": float(np.mean(times)), f"{prefix}_retrieval_ms_p50": float(np.median(retrieval)),
            f"{prefix}_coarse_ms_p50": float(np.median(coarse)), f"{prefix}_encode_ms_p50": float(np.median(encode)),
            f"{prefix}_search_ms_p50": float(np.median(retrieval - coarse - encode)),
            f"{prefix}_overhead_ms_p50": float(np.median(np.array(times) - retrieval))}


# The apps the replay compares (result key prefix, overrides after the bench's own): the
# retriever as before (no caches, no fast path), the app as two deployments (a Retriever apart
# from the Planner), and the app as configured (one deployment by default).
SERVE_VARIANTS = (("serve_reference", ["retrieval.query_cache=0", "retrieval.fast_path=false",
                                       "retrieval.blas_threads=0"]),
                  ("serve_two_deployments", ["eval_job.serve.retriever_in_planner=false"]),
                  ("serve", []))


def serve_comparison(requests: list[dict], warmup: list[dict], settings: Settings) -> dict:
    """The Serve latency (``latency_split``) of the planner app as configured (``serve_*``) and,
    in the same run, of the same app with ``retrieval.query_cache=0``, ``fast_path=false`` and
    ``blas_threads=0`` (``serve_reference_*``: every decision computed afresh, the path before
    the caches and the fast path) and as two deployments (``serve_two_deployments_*``), plus what
    was replayed. A variant whose settings make the same app as an earlier one is left out (its
    keys with it): one app would answer the second call of each request from its caches.

    Every app runs at once and gets each request in turn (which goes first rotates), one request
    at a time, so all see the same load; each request once and in the recorded order (as an
    evaluator sends them: a request seen before would find every candidate in the retriever's
    cache), after the unmeasured ``warmup`` requests."""
    from ray import serve

    from trajrag.distributed.evaluate import job_config

    if not requests:
        raise RuntimeError("no decision was recorded: the benchmark episodes never reached a decision")
    sizes = [len(json.dumps(r)) for r in requests]
    result = {"serve_requests": len(requests), "serve_candidates_mean": float(np.mean([len(r["candidates"]) for r in requests])),
              "serve_request_kb_mean": float(np.mean(sizes)) / 1024}
    apps, names, ours = {}, set(), []
    try:
        for prefix, extra in SERVE_VARIANTS:
            variant = settings.with_overrides(extra)
            app, deployed = deploy_planner_app(variant, job_config(variant.eval_job).serve)
            ours += [app] if deployed else []
            if app not in names:
                names.add(app)
                apps[prefix] = serve.get_app_handle(app)
        for request in warmup:
            for handle in apps.values():
                handle.decide.remote(request).result()
        times: dict[str, list[float]] = {prefix: [] for prefix in apps}
        answers: dict[str, list[dict]] = {prefix: [] for prefix in apps}
        order = list(apps)
        for i, request in enumerate(requests):
            for prefix in order[i % len(order):] + order[:i % len(order)]:
                started = time.perf_counter()
                answers[prefix].append(apps[prefix].decide.remote(request).result())
                times[prefix].append((time.perf_counter() - started) * 1e3)
    finally:
        for app in ours:
            delete_planner_app(app)
    for prefix in apps:
        result.update(latency_split(times[prefix], answers[prefix], prefix))
    result["serve_speedup_p50"] = result["serve_reference_ms_p50"] / result["serve_ms_p50"]
    return result


def eval_and_serve(cfg: PipelineBenchConfig, quick: bool, settings: Settings, progress: bool) -> dict:
    """The evaluation throughput and the Serve latency on one memory (given or built small), the
    bench's own overrides beneath ``settings``' own."""
    from trajrag.distributed.evaluate import job_config

    memory_scenes = cfg.quick_eval_memory_scenes if quick else cfg.eval_memory_scenes
    memory_per_scene = cfg.quick_eval_memory_episodes_per_scene if quick else cfg.eval_memory_episodes_per_scene
    scene_spec = cfg.quick_eval_scenes if quick else cfg.eval_scenes
    episode_spec = cfg.quick_eval_episodes if quick else cfg.eval_episodes
    evaluated = settings.with_overrides([*cfg.eval_overrides, *(cfg.quick_eval_overrides if quick else [])],
                                        beneath=True)
    result: dict = {}
    with tempfile.TemporaryDirectory(prefix="trajrag-bench-memory-") as tmp:
        started = time.perf_counter()
        if cfg.eval_store and cfg.eval_model:
            store, model = cfg.eval_store, cfg.eval_model
        else:
            memory_overrides = [*cfg.eval_memory_overrides, *(cfg.quick_overrides if quick else [])]
            store, model = small_memory(Path(tmp), memory_scenes, memory_per_scene,
                                        settings.with_overrides(memory_overrides, beneath=True))
        result["eval_memory_build_s"] = time.perf_counter() - started
        evaluated = evaluated.with_values({"retrieval.store": store, "retrieval.model_dir": model}, beneath=True)
        scenes = load_scenes(scene_spec, evaluated)
        episodes = load_episodes(episode_spec, scenes, evaluated)
        if cfg.eval_workers:
            started = time.perf_counter()
            app, deployed = deploy_planner_app(evaluated, job_config(evaluated.eval_job).serve)
            result["serve_deploy_s"] = time.perf_counter() - started
            result.update(eval_throughput(cfg.eval_planner, scenes, episodes, list(cfg.eval_workers), evaluated,
                                          progress))
            if deployed:  # the replay deploys its own, one app at a time
                delete_planner_app(app)
        n = cfg.quick_serve_requests if quick else cfg.serve_requests
        # Warm-up requests recorded after the measured ones (the last ones again if too few).
        requests = record_decisions(scenes, episodes, evaluated, at_least=n + cfg.serve_warmup)
        warmup = requests[n:] or requests[-cfg.serve_warmup:]
        result.update(serve_comparison(requests[:n], warmup[:cfg.serve_warmup], evaluated))
    result.update(eval_scenes=scene_spec, eval_episodes_spec=episode_spec, eval_planner=cfg.eval_planner)
    return result


def run(args: argparse.Namespace, settings: Settings) -> dict:
    """One JSON object: ``corpus_traj_per_s_1/_2``, ``eval_episodes_per_h_1/_2``,
    ``serve_ms_p50``, ``serve_ms_p99`` and details."""
    from trajrag.distributed.evaluate import cpus_needed, job_config

    cfg = settings.pipeline_bench
    if args.quick:
        scenes, per_scene, policy = cfg.quick_scenes, cfg.quick_episodes_per_scene, cfg.quick_policy
        corpus = settings.with_overrides(cfg.quick_overrides, beneath=True)
    else:
        scenes, per_scene, policy = cfg.corpus_scenes, cfg.corpus_episodes_per_scene, cfg.corpus_policy
        corpus = settings
    # One Ray for all runs, with logical CPUs for the largest corpus run, the largest evaluation
    # (its evaluators + the Serve replicas) and the Serve replay's apps.
    job = job_config(settings.eval_job, max(cfg.eval_workers, default=1))
    served = cpus_needed(job, True)
    replay = len(SERVE_VARIANTS) * (served - cpus_needed(job, False))  # the compared apps, all at once
    own_ray = ensure_ray(None, max(os.cpu_count() or 1, *cfg.corpus_workers, math.ceil(max(served, replay))))
    try:
        result = corpus_throughput(scenes, per_scene, policy, list(cfg.corpus_workers), corpus,
                                   progress=args.progress)
        result.update(eval_and_serve(cfg, args.quick, settings, progress=args.progress))
    finally:
        if own_ray:
            import ray

            ray.shutdown()
    result.update(corpus_scenes=scenes, corpus_episodes_per_scene=per_scene, corpus_policy=policy,
                  cpus=os.cpu_count())
    return result
