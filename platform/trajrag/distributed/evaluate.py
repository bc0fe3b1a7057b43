"""ObjectNav evaluation on Ray: N evaluator actors, the driver as the single writer.

The same episodes, records and summary as ``trajrag eval`` (``agent.evaluate.evaluate_agent``),
spread over a Ray cluster:

* **Plan.** The driver takes the episodes (optionally one range of them, ``shard=(i, n)``, so
  several jobs or machines split one evaluation), reads the records already written under
  ``<out>/<label>/`` and keeps only the episodes without one (resume).
* **Planner.** For ``trajrag`` the planner and the retriever run as a Ray Serve application
  (``distributed.serve_planner``): the evaluators' navigators decide through a ``RemotePlanner``
  and a ``DeploymentHandle``, so the store and the encoder are loaded once per retriever replica,
  not once per evaluator. The baselines (frontier, random, oracle) and the planners that bring
  their own retrieval stack (llm, graphrag) run inside each evaluator as ``agent.registry`` makes
  them.
* **Evaluate.** ``EvaluatorWorker`` actors (a simulator + the agent each) pull shards of episodes
  from the driver's queue and stream each finished episode back (a Ray streaming generator) as
  its JSONL record, made by ``agent.evaluate.episode_record`` after ``agent.episode_runner.run_episode``:
  one implementation of the episode loop for both paths.
* **Write.** The driver appends each record to the run's JSONL as it arrives (flushed per line):
  ``episodes.jsonl``, or ``episodes.shard-I-of-N.jsonl`` for a shard, so each file has exactly one
  writer. Resume reads every ``episodes*.jsonl`` of the run; a torn last line is dropped and
  that episode runs again (cut off this job's file before it appends: ``cut_torn_tail``); a line
  that is no record stops the job before anything runs, named ``file:line``.
* **Exactly once.** Records are keyed by ``(scene_key, episode_id)``. An evaluator that dies is
  restarted by Ray (``evaluator_max_restarts``, then replaced); the episodes of its shards that
  did not come back go to the front of the queue, one per shard, for any evaluator. A record whose
  key was already written (a retried shard repeating an episode) is dropped, never duplicated.
  A decision that fails because a Serve replica died is retried by the ``RemotePlanner``; an
  episode whose planner stayed unreachable is re-queued like a crashed one.

Actors rather than Ray Data, as in ``distributed.corpus``: evaluators are stateful (a simulator
and a navigator with its map buffers, scene maps cached) and the writer must be one process.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayError

from trajrag.agent.episode_runner import run_episode
from trajrag.agent.evaluate import episode_record
from trajrag.agent.navigator import make_navigator
from trajrag.agent.registry import make_agent
from trajrag.agent.run_records import (
    SUMMARY_METRICS,
    AgentRun,
    cut_torn_tail,
    perception_counters,
    planner_counters,
    read_records,
    record_metrics,
    write_json,
)
from trajrag.config import Settings
from trajrag.distributed.corpus import FaultPlan
from trajrag.distributed.serve_planner import (
    PlannerServeConfig,
    RemotePlanner,
    ServeUnavailableError,
    delete_planner_app,
    deploy_planner_app,
)
from trajrag.distributed.shards import (
    ActorDown,
    SceneCache,
    Shard,
    ShardRun,
    SlotStats,
    first_line,
    timed_items,
)
from trajrag.errors import UserError
from trajrag.planners.frontier_value import load_value_model
from trajrag.ray_cluster import ensure_ray
from trajrag.world.metrics import summarize
from trajrag.world.sim import GridSimulator

# Planners whose decisions go through the Serve planner app (the others run in the evaluators).
SERVED_PLANNERS = ("trajrag",)


@dataclass
class EvalJobConfig:
    """``configs/eval_job.yaml``: evaluator pool, queues, retry budgets and the Serve app."""

    evaluators: int
    shard_episodes: int
    shards_in_flight: int
    max_unconsumed_episodes: int
    evaluator_max_restarts: int
    max_attempts: int
    retry_interval_s: float
    restart_timeout_s: float
    scene_cache: int
    evaluator_num_cpus: float
    poll_s: float
    serve: PlannerServeConfig


class EvalJobError(RuntimeError):
    """The job cannot go on (evaluators that cannot start, or do not come back)."""


@dataclass
class EvalFaultPlan:
    """Fault injection for the fault tests: an evaluator's process exits (``os._exit``, like a
    kill -9) after finishing its n-th episode, before streaming it back; once, through ``marker``
    (a file created when it fires)."""

    marker: str
    evaluator_exit_after_episodes: int | None = None

    def fire(self) -> None:
        FaultPlan(self.marker).fire()


@dataclass
class EvalItem:
    """One finished episode as an evaluator streams it: index into the planned episodes, its
    JSONL record (None with ``error`` when it raised; ``transient``: the planner app was
    unreachable, worth another try), wall and CPU seconds of the evaluator."""

    index: int
    record: dict | None = None
    error: str = ""
    transient: bool = False
    seconds: float = 0.0
    cpu_seconds: float = 0.0


class EvaluatorWorker:
    """An evaluator actor: one simulator and one agent (navigator + planner), made from the
    driver's ``settings``, or by the driver's ``make_agent`` (a known-homes agent, which reads
    each home's memory in the evaluator: ``trajrag eval --revisit K --workers N``), and wrapped
    by the driver's ``wrap_agent`` where one is given (implicit queries)."""

    def __init__(self, planner: str, settings: Settings, serve_app: str | None,
                 serve_cfg: PlannerServeConfig, scene_cache: int, fault: EvalFaultPlan | None = None,
                 make_agent: Callable[[], Any] | None = None, wrap_agent: Callable[[Any], Any] | None = None) -> None:
        self.sim = GridSimulator(settings.sim)
        self.episode_cfg = settings.episodes
        agent = make_agent() if make_agent else make_evaluator_agent(planner, settings, serve_app, serve_cfg)
        self.agent = wrap_agent(agent) if wrap_agent else agent
        self.fault = fault
        self.scenes = SceneCache(scene_cache)
        self.finished = 0

    def evaluate(self, indices: Sequence[int], episodes: Sequence[Any], scene_refs: dict[str, Any]):
        """Run ``episodes`` (planned ``indices``) one by one, yielding an ``EvalItem`` each."""
        def evaluate_one(index: int, episode: Any) -> EvalItem:
            scene = self.scenes.get(episode.scene_key, scene_refs)
            result = run_episode(self.sim, self.agent, episode, scene, cfg=self.episode_cfg)
            return EvalItem(index, record=episode_record(result, self.agent))

        def failed(index: int, exc: Exception) -> EvalItem:
            if isinstance(exc, ServeUnavailableError):  # Serve restarting: the episode is re-queued
                return EvalItem(index, error=str(exc), transient=True)
            return EvalItem(index, error=f"{type(exc).__name__}: {exc}")

        for item in timed_items(indices, episodes, evaluate_one, failed):
            self.finished += 1
            if self.fault and self.fault.evaluator_exit_after_episodes == self.finished:
                self.fault.fire()
            yield item

    def ping(self) -> bool:
        """Answers once the actor is up (start-up check, liveness after a failure)."""
        return True


def make_evaluator_agent(planner: str, settings: Settings, serve_app: str | None,
                         serve_cfg: PlannerServeConfig) -> Any:
    """The agent of an evaluator: the navigator with a ``RemotePlanner`` on app ``serve_app``, or
    the registry's agent ``planner`` when no app is given."""
    if serve_app:
        wants_place = bool(settings.retrieval.project_goal)
        scoring = settings.scoring
        value = load_value_model(scoring.value_model, settings.navigator.vocabulary, scoring)
        home = scoring if settings.retrieval.home_goals else None  # the app prices known-home places
        return make_navigator(RemotePlanner(serve_app, serve_cfg, wants_place=wants_place, value=value, home=home),
                              settings, seed=0)

    return make_agent(planner, settings)


# -- records: one writer per file, every file read on resume --------------------------------------
@dataclass
class ShardedRun(AgentRun):
    """``AgentRun`` whose records may be split by shard: this job writes ``records``
    (``episodes.jsonl``, or ``episodes.shard-I-of-N.jsonl``); ``finished`` reads them all."""

    shard: tuple[int, int] | None = None

    @property
    def records(self) -> Path:
        return self._shard_file("episodes", ".jsonl")

    @property
    def summary_path(self) -> Path:
        return self._shard_file("summary", ".json")

    def _shard_file(self, stem: str, suffix: str) -> Path:
        if self.shard is None or self.shard[1] == 1:
            return self.directory / f"{stem}{suffix}"
        i, n = self.shard
        return self.directory / f"{stem}.shard-{i}-of-{n}{suffix}"

    def finished(self, metrics: Sequence[str] = SUMMARY_METRICS) -> dict[tuple[str, str], dict]:
        """``AgentRun.finished`` over every shard's file, the first record of a key kept."""
        done: dict[tuple[str, str], dict] = {}
        for path in sorted(self.directory.glob("episodes*.jsonl")):
            for key, record in read_records(path, metrics):
                done.setdefault(key, record)
        return done


def parse_shard(spec: str | None) -> tuple[int, int] | None:
    """``"I/N"`` (0 <= I < N) -> ``(I, N)``; None or "" -> None. ``ValueError`` names the spec."""
    if not spec:
        return None
    try:
        i, n = (int(part) for part in spec.split("/"))
    except ValueError:
        raise ValueError(f"--shard {spec!r}: expected I/N, e.g. 0/4 (episode range I of N, from 0)") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"--shard {spec!r}: need 0 <= I < N")
    return i, n


def shard_range(n_episodes: int, shard: tuple[int, int] | None) -> range:
    """The contiguous episode range of ``shard`` (all episodes when None)."""
    if shard is None:
        return range(n_episodes)
    i, n = shard
    return range(i * n_episodes // n, (i + 1) * n_episodes // n)


def episode_key(episode: Any) -> tuple[str, str]:
    return (episode.scene_key, str(episode.episode_id))


# -- the driver -----------------------------------------------------------------------------------
class _EvalPipeline:
    """The driver's event loop: work queue -> evaluators -> records file."""

    def __init__(self, cfg: EvalJobConfig, workers: int, todo: Sequence[int], episodes: Sequence[Any],
                 scene_refs: dict[str, Any], make_evaluator: Callable[[], Any], sink: Any,
                 done: dict, bar: Any, on_record: Callable[[dict], None] | None) -> None:
        self.cfg, self.episodes, self.scene_refs = cfg, episodes, scene_refs
        self.make_evaluator, self.sink, self.done, self.bar, self.on_record = (
            make_evaluator, sink, done, bar, on_record)
        step = max(1, min(cfg.shard_episodes, -(-len(todo) // (workers * cfg.shards_in_flight))))
        self.queue = deque(Shard(list(todo[i:i + step])) for i in range(0, len(todo), step))
        self.actors = [make_evaluator() for _ in range(min(workers, len(self.queue)))]
        self.slots = [SlotStats() for _ in self.actors]
        self.runs: dict[Any, ShardRun] = {}
        self.down: dict[int, ActorDown] = {}
        self.failed: dict[str, str] = {}
        self.counts: Counter = Counter()
        self.started = time.perf_counter()
        self.seconds = 0.0  # the pipeline's wall time, set when it has run

    def check_started(self) -> None:
        """Wait for every evaluator to be up: a config or store error surfaces here, once, and
        so does a cluster too small to place them (instead of waiting forever)."""
        try:
            ray.get([actor.ping.remote() for actor in self.actors], timeout=self.cfg.restart_timeout_s)
        except GetTimeoutError:
            raise EvalJobError(
                f"{len(self.actors)} evaluators ({self.cfg.evaluator_num_cpus} CPU each) did not start within "
                f"{self.cfg.restart_timeout_s:.0f} s; the cluster has {ray.cluster_resources().get('CPU', 0)} "
                "logical CPUs: lower --workers or eval_job.evaluator_num_cpus") from None
        except RayError as exc:
            raise EvalJobError(f"an evaluator could not start: {first_line(exc)}") from None

    def run(self) -> None:
        while self.queue or self.runs:
            self._ping_down()
            self._submit()
            self._wait()

    def _submit(self) -> None:
        """Hand out shards round-robin, up to ``shards_in_flight`` per evaluator."""
        busy = Counter(run.slot for run in self.runs.values())
        while self.queue:
            free = [s for s in range(len(self.actors)) if s not in self.down and busy[s] < self.cfg.shards_in_flight]
            if not free:
                return
            for slot in free:
                if not self.queue:
                    return
                shard, actor = self.queue.popleft(), self.actors[slot]
                episodes = [self.episodes[i] for i in shard.indices]
                gen = actor.evaluate.options(
                    _generator_backpressure_num_objects=self.cfg.max_unconsumed_episodes,
                ).remote(shard.indices, episodes, {e.scene_key: self.scene_refs[e.scene_key] for e in episodes})
                self.runs[gen] = ShardRun(shard, slot, actor)
                busy[slot] += 1

    def _wait(self) -> None:
        pings = {d.ref: slot for slot, d in self.down.items() if d.ref is not None}
        waitables = list(self.runs) + list(pings)
        timeout = self.cfg.poll_s
        if any(d.ref is None for d in self.down.values()):
            timeout = min(timeout, self.cfg.retry_interval_s)
        if not waitables:
            time.sleep(timeout)
            return
        ready, _ = ray.wait(waitables, num_returns=1, timeout=timeout)
        for ref in ready:
            if ref in pings:
                self._on_ping(pings[ref], ref)
            else:
                self._on_stream(ref)
        self._refresh_bar()

    # -- evaluators that failed ---------------------------------------------------------------
    def _ping_down(self) -> None:
        now = time.perf_counter()
        for slot, down in self.down.items():
            if down.ref is None and now >= down.retry_at:
                down.ref = self.actors[slot].ping.remote()

    def _on_ping(self, slot: int, ref: Any) -> None:
        down = self.down[slot]
        try:
            ray.get(ref)
        except ActorDiedError as exc:  # out of restarts: a fresh actor
            if self.slots[slot].replaced >= self.cfg.max_attempts:
                raise EvalJobError(f"evaluator {slot} was replaced {self.slots[slot].replaced} times and "
                                   f"died again: {first_line(exc)}") from None
            ray.kill(self.actors[slot], no_restart=True)
            self.actors[slot] = self.make_evaluator()
            self.slots[slot].replaced += 1
        except RayError as exc:  # still restarting
            waited = time.perf_counter() - down.since
            if waited > self.cfg.restart_timeout_s:
                raise EvalJobError(f"evaluator {slot} has not come back after {waited:.0f} s: "
                                   f"{first_line(exc)}") from None
            down.ref, down.retry_at = None, time.perf_counter() + self.cfg.retry_interval_s
            return
        del self.down[slot]

    # -- results ------------------------------------------------------------------------------
    def _on_stream(self, gen: Any) -> None:
        run = self.runs[gen]
        try:
            item = ray.get(next(gen))
        except StopIteration:
            del self.runs[gen]
            self._requeue(run, "stream ended early")  # no-op when every episode came back
            return
        except RayError as exc:
            del self.runs[gen]
            self.counts["evaluator_interruptions"] += 1
            if self.actors[run.slot] is run.actor and run.slot not in self.down:
                self.down[run.slot] = ActorDown(since=time.perf_counter())
            self._requeue(run, f"{type(exc).__name__}: {first_line(exc)}")
            return
        run.received.add(item.index)
        self._accept(run, item)

    def _accept(self, run: ShardRun, item: EvalItem) -> None:
        episode = self.episodes[item.index]
        key = episode_key(episode)
        if item.error:
            if item.transient and run.shard.attempts + 1 < self.cfg.max_attempts:
                self.queue.append(Shard([item.index], run.shard.attempts + 1))
                self.counts["episodes_requeued"] += 1
                return
            self.failed["/".join(key)] = item.error
            self.bar.update(1)
            return
        if key in self.done:  # a retried shard repeated an episode: keep the first record
            self.counts["duplicates_dropped"] += 1
            return
        self.sink.write(json.dumps(item.record) + "\n")
        self.sink.flush()
        self.done[key] = item.record
        stats = self.slots[run.slot]
        stats.episodes += 1
        stats.busy_s += item.seconds
        stats.cpu_s += item.cpu_seconds
        self.counts["evaluated"] += 1
        self.bar.update(1)
        if self.on_record is not None:
            self.on_record(item.record)

    def _requeue(self, run: ShardRun, reason: str) -> None:
        """The episodes of ``run`` that did not come back go to the front, one per shard."""
        left = [i for i in run.shard.indices if i not in run.received]
        attempts = run.shard.attempts + 1
        for index in reversed(left):
            if attempts >= self.cfg.max_attempts:
                self.failed["/".join(episode_key(self.episodes[index]))] = (
                    f"evaluator failed {attempts} times: {reason}")
                self.bar.update(1)
            else:
                self.queue.appendleft(Shard([index], attempts))
                self.counts["episodes_requeued"] += 1

    def _refresh_bar(self) -> None:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        self.bar.set_postfix(ep_per_h=f"{self.counts['evaluated'] * 3600 / elapsed:.0f}",
                             failed=len(self.failed), refresh=False)


# -- entry points ---------------------------------------------------------------------------------
def job_config(cfg: EvalJobConfig, workers: int | None = None) -> EvalJobConfig:
    """The ``eval_job`` section ``cfg`` with ``workers`` replacing ``evaluators`` if given."""
    if workers is not None:
        cfg = replace(cfg, evaluators=int(workers))
    if cfg.evaluators < 1:
        raise UserError(f"the Ray evaluation needs at least 1 evaluator, got {cfg.evaluators}")
    return cfg


def cpus_needed(cfg: EvalJobConfig, served: bool) -> float:
    """Logical CPUs the job reserves: evaluators, plus the Serve replicas when it serves."""
    serve = cfg.serve
    planners = serve.retriever_replicas if serve.retriever_in_planner else serve.planner_replicas
    replicas = (serve.retriever_replicas * serve.retriever_num_cpus +
                planners * serve.planner_num_cpus) if served else 0.0
    return cfg.evaluators * cfg.evaluator_num_cpus + replicas


@contextlib.contextmanager
def ray_for_eval(address: str | None, cfg: EvalJobConfig, served: bool) -> Iterator[None]:
    """Use the running Ray, or ``address``, or a local Ray big enough for the job (shut down at
    the end when started here)."""
    own = ensure_ray(address, max(os.cpu_count() or 1, math.ceil(cpus_needed(cfg, served))))
    try:
        yield
    finally:
        if own:
            ray.shutdown()


def evaluate_ray(label: str, planner: str, scenes: Sequence[Any], episodes: Sequence[Any], out_dir: Path | str,
                 settings: Settings, *, workers: int | None = None, shard: tuple[int, int] | None = None,
                 progress: bool = True, ray_address: str | None = None, faults: EvalFaultPlan | None = None,
                 on_record: Callable[[dict], None] | None = None, make_agent: Callable[[], Any] | None = None,
                 wrap_agent: Callable[[Any], Any] | None = None) -> dict:
    """Evaluate ``planner`` made from ``settings`` on ``episodes`` (the ``shard`` range of them)
    with ``workers`` evaluator actors (default ``eval_job.evaluators``); records under
    ``<out_dir>/<label>/``.

    Returns ``trajrag eval``'s summary (``episodes``, ``sr``, ``spl``, ``dtg_m``, ``planner_calls``,
    ``fallbacks``, ``retrieval_ms_p50``, per category...) over the shard's finished episodes, plus
    the job's counts, ``episodes_per_h``, seconds per stage, Serve latencies and fault handling.
    ``on_record(record)`` runs in the driver after each record is written. ``make_agent``: each
    evaluator's agent made by it instead (pickled to the actors; no Serve app: a retrieving
    planner retrieves inside the evaluator). ``wrap_agent(agent)``: each evaluator's agent as the
    run asks it (pickled too; e.g. ``ImplicitQueryAgent``).
    """
    started = time.perf_counter()
    cfg = job_config(settings.eval_job, workers)
    served = planner in SERVED_PLANNERS and make_agent is None
    keys = [episode_key(e) for e in episodes]
    repeated = [k for k, n in Counter(keys).items() if n > 1]
    if repeated:
        raise UserError(f"episode {'/'.join(repeated[0])} appears twice: episode ids must be unique per scene")
    run = ShardedRun(label, Path(out_dir) / label, shard)
    run.directory.mkdir(parents=True, exist_ok=True)
    done = run.finished()
    wanted = list(shard_range(len(episodes), shard))
    todo = [i for i in wanted if keys[i] not in done]
    app, deployed, deploy_s, pipe = None, False, 0.0, None
    # A finished run is only summarised: no Ray to start (a resumed sweep of many runs).
    with ray_for_eval(ray_address, cfg, served) if todo else contextlib.nullcontext():
        if todo:
            _warn_if_too_small(cfg, served)
        if todo and served:
            app, deployed, deploy_s = _deploy(settings, cfg.serve)
        try:
            pipe = _run_pipeline(cfg, label, planner, settings, scenes, episodes, todo, app, run,
                                 done, progress, faults, on_record, make_agent, wrap_agent) if todo else None
        finally:
            if deployed and not cfg.serve.keep_app:
                delete_planner_app(app)
    total_s = time.perf_counter() - started
    return _summarize(run, episodes, keys, wanted, todo, pipe, cfg, planner, app, deploy_s, total_s)


def pending_episodes(label: str, episodes: Sequence[Any], out_dir: Path | str,
                     shard: tuple[int, int] | None = None) -> int:
    """Episodes of the ``shard`` range with no record yet under ``<out_dir>/<label>/`` (0: the run
    is finished and ``evaluate_ray`` only summarises it)."""
    done = ShardedRun(label, Path(out_dir) / label, shard).finished()
    return sum(episode_key(episodes[i]) not in done for i in shard_range(len(episodes), shard))


def _warn_if_too_small(cfg: EvalJobConfig, served: bool) -> None:
    """Say so when the cluster has fewer logical CPUs than the job reserves (Serve would wait for
    them without a word; an autoscaling cluster may still add nodes)."""
    have, need = ray.cluster_resources().get("CPU", 0.0), cpus_needed(cfg, served)
    if need > have:
        print(f"warning: the evaluation reserves {need:g} logical CPUs ({cfg.evaluators} evaluators x "
              f"{cfg.evaluator_num_cpus:g}, Serve replicas {need - cfg.evaluators * cfg.evaluator_num_cpus:g}); "
              f"the Ray cluster has {have:g}: it waits until they exist (lower --workers or "
              "eval_job.serve.retriever_num_cpus)", file=sys.stderr)


def _deploy(settings: Settings, serve_cfg: PlannerServeConfig) -> tuple[str, bool, float]:
    started = time.perf_counter()
    try:
        app, deployed = deploy_planner_app(settings, serve_cfg)
    except RuntimeError as exc:
        raise UserError(str(exc)) from None
    return app, deployed, time.perf_counter() - started


def _run_pipeline(cfg: EvalJobConfig, label: str, planner: str, settings: Settings, scenes: Sequence[Any],
                  episodes: Sequence[Any], todo: list[int], app: str | None, run: ShardedRun, done: dict,
                  progress: bool, faults: EvalFaultPlan | None, on_record: Callable[[dict], None] | None,
                  make_agent: Callable[[], Any] | None, wrap_agent: Callable[[Any], Any] | None) -> _EvalPipeline:
    from tqdm import tqdm

    needed = {episodes[i].scene_key for i in todo}
    scene_refs = {s.name: ray.put(s) for s in scenes if s.name in needed}
    missing = needed - set(scene_refs)
    if missing:
        raise UserError(f"episodes of scene(s) {sorted(missing)[:3]} but no such scene was loaded")
    evaluator_cls = ray.remote(EvaluatorWorker).options(
        num_cpus=cfg.evaluator_num_cpus, max_restarts=cfg.evaluator_max_restarts, max_task_retries=0)
    made: list[Any] = []

    def make_evaluator() -> Any:
        actor = evaluator_cls.remote(planner, settings, app, cfg.serve, cfg.scene_cache, faults, make_agent,
                                     wrap_agent)
        made.append(actor)
        return actor

    cut_torn_tail(run.records)
    try:
        with run.records.open("a") as sink, tqdm(total=len(todo), desc=f"eval {label} x{cfg.evaluators}",
                                                 unit="ep", disable=not progress, file=sys.stderr) as bar:
            pipe = _EvalPipeline(cfg, cfg.evaluators, todo, episodes, scene_refs, make_evaluator, sink,
                                 done, bar, on_record)
            pipe.check_started()
            pipe.run()
    finally:
        for actor in made:
            ray.kill(actor, no_restart=True)
    pipe.seconds = time.perf_counter() - pipe.started
    return pipe


def _summarize(run: ShardedRun, episodes: Sequence[Any], keys: list, wanted: list[int], todo: list[int],
               pipe: _EvalPipeline | None, cfg: EvalJobConfig, planner: str, app: str | None,
               deploy_s: float, total_s: float) -> dict:
    """``trajrag eval``'s summary over the shard's finished episodes, plus the job's numbers;
    written to the run's summary file (and to ``summary.json`` once every episode is done)."""
    done = run.finished()
    summary = records_summary([done[keys[i]] for i in wanted if keys[i] in done])
    counts = pipe.counts if pipe else Counter()
    pipeline_s = pipe.seconds if pipe else 0.0

    def decisions(name: str) -> list[float]:  # per decision, over the episodes this job ran
        return [t for i in todo if keys[i] in done for t in done[keys[i]].get("planner_stats", {}).get(name, [])]

    serve_ms, overhead_ms = decisions("serve_ms"), decisions("serve_overhead_ms")
    summary.update({
        "planner": planner,
        "workers": cfg.evaluators,
        "shard": None if run.shard is None else f"{run.shard[0]}/{run.shard[1]}",
        "episodes_planned": len(wanted),
        "skipped_already_done": len(wanted) - len(todo),
        "evaluated": counts["evaluated"],
        "failed": len(pipe.failed) if pipe else 0,
        "failed_episodes": dict(sorted(pipe.failed.items())) if pipe else {},
        "complete": all(k in done for k in keys),
        "episodes_per_h": counts["evaluated"] * 3600.0 / pipeline_s if pipeline_s > 0 else 0.0,
        "serve_app": app,
        "serve_ms_p50": float(np.percentile(serve_ms, 50)) if serve_ms else None,
        "serve_ms_p99": float(np.percentile(serve_ms, 99)) if serve_ms else None,
        "serve_overhead_ms_p50": float(np.percentile(overhead_ms, 50)) if overhead_ms else None,
        "seconds": {"serve_deploy": deploy_s, "pipeline": pipeline_s, "total": total_s},
        "cpu_seconds": {"evaluate": sum(s.cpu_s for s in pipe.slots) if pipe else 0.0},
        "actors": {"evaluators": [{"episodes": s.episodes, "busy_s": s.busy_s, "cpu_s": s.cpu_s,
                                   "replaced": s.replaced} for s in (pipe.slots if pipe else [])]},
        "faults": {k: counts[k] for k in ("evaluator_interruptions", "episodes_requeued", "duplicates_dropped")},
    })
    write_json(run.summary_path, summary)
    if run.summary_path.name != "summary.json" and summary["complete"]:
        write_json(run.directory / "summary.json",
                   {**records_summary([done[k] for k in sorted(set(keys))]), "planner": planner})
    return summary


def records_summary(records: Sequence[dict]) -> dict:
    """``evaluate_agent``'s summary of finished records: metric means and planner counters."""
    summary = summarize([record_metrics(r["metrics"]) for r in records])
    summary.update(planner_counters(records))
    summary.update(perception_counters(records))
    return summary
