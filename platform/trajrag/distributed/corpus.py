"""The corpus build on Ray: N collector actors -> one grouping actor (the single writer).

The same inputs and summary as ``trajrag.agent.corpus.build_corpus`` (one process), spread over
a Ray cluster:

* **Plan.** The driver loads the scenes (into the object store, once), generates the episodes
  (one Ray task per scene for large jobs) and computes every trajectory id
  (``agent.collect.trajectory_id``: scene/episode/policy). It asks the writer which ids the
  store does not hold yet (chunks, ids dropped as redundant and ids rejected as too short), so
  a rerun collects only what is missing (resume from the store).
* **Collect + convert.** ``CollectorWorker`` actors (one simulator + agents each, an
  ``agent.collect.Collector``) pull shards (contiguous runs of the scene-ordered episodes) from the driver's queue and
  *stream* each finished episode back (a Ray streaming generator), already converted to its
  topo-polar trajectory. Conversion stays in the collector on purpose, see
  ``CONVERSION_STAYS_IN_THE_COLLECTOR``.
* **Insert.** One ``GroupingWriter`` actor holds the ``memory.grouping.TrajectoryMemory`` (the
  memory is single-writer) and inserts a batch per call: one ``insert_many``, one LanceDB commit.
  With ``writers`` > 1 (``--writers N``) it is the committer of N ``ShardGrouper`` actors that
  group a share of the scenes each, in parallel (``memory.shards``): still one store, one commit
  per batch.
  Trajectories reach it in plan order, whatever order the collectors finish them in: grouping
  depends on the order of insertion, so one plan builds one memory, with any number of
  collectors and through crashes.
* **Backpressure.** At most ``shards_in_flight`` shards per collector, at most
  ``max_unconsumed_episodes`` streamed ahead of the driver per shard, at most
  ``writer_batch`` trajectories waiting in the driver and ``max_unacked_batches`` writer calls
  in flight. When the writer lags, the driver stops reading the streams and the collectors pause.
* **Exactly once.** Trajectory ids are the keys. A collector that crashes is restarted by Ray
  (``max_restarts``); the unfinished episodes of its shards go back to the front of the queue,
  one per shard, for any collector. The driver keeps every batch until the writer acknowledges
  its commit; if the writer crashes it is restarted, reloads its state from the store (and
  LanceDB's journal undoes a half-written batch), and the unacknowledged batches are sent again;
  whatever did get committed before the crash is skipped by id (``duplicate``).

The pipeline is Ray actors rather than Ray Data: the collectors are stateful (a simulator and
agents that take ~0.3 s to build, scene maps of ~0.5 MB each) and the writer must be a single
process, so an actor pool with an explicit work queue is the simpler fit and keeps the
exactly-once bookkeeping in one place (the driver).
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import ray
from ray.exceptions import ActorDiedError, RayError

from trajrag.agent.collect import Collector, collection_settings, collector_settings, episode_policy, trajectory_id
from trajrag.config import Settings
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
from trajrag.memory.build_settings import BuildSettings
from trajrag.memory.grouping import MemoryConfig, MemoryShard, TrajectoryMemory
from trajrag.memory.shards import ShardedMemory, open_shard
from trajrag.memory.store import claim_store
from trajrag.memory.value_log import ValueLog
from trajrag.ray_cluster import ensure_ray
from trajrag.world.datasets import load_scenes
from trajrag.world.episode_gen import check_config, generate_episodes
from trajrag.world.geodesic import Motion

# Why conversion to topo-polar form stays inside the collector instead of a separate actor pool
# (measured on procedural:train homes with the default collector sensors, 2-core dev machine):
# the input of the conversion is the episode's semantic map, 53.9 MB (a 72 m x 72 m grid at 5 cm,
# configs/mapping.yaml, pickled), while its output, the topo-polar trajectory, is 0.8-1.6 KB.
# Converting takes 3-22 ms against 0.1-0.2 s (oracle) and 1-5 s (explore) for running the
# episode, i.e. 1-6 % of a collector's time. A separate stage would ship ~50,000x more bytes
# through the object store to move a few per cent of the work, so the collector converts and
# only the ~1 KB trajectory travels.
CONVERSION_STAYS_IN_THE_COLLECTOR = True


@dataclass
class CorpusJobConfig:
    """``configs/corpus_job.yaml``: sizes of the actor pools, queues and retry budgets."""

    collectors: int
    shard_episodes: int
    shards_in_flight: int
    max_unconsumed_episodes: int
    writer_batch: int
    max_unacked_batches: int
    collector_max_restarts: int
    writer_max_restarts: int
    max_attempts: int
    retry_interval_s: float
    restart_timeout_s: float
    scene_cache: int
    parallel_plan_min_scenes: int
    collector_num_cpus: float
    writer_num_cpus: float
    writers: int
    shard_num_cpus: float
    poll_s: float


class CorpusJobError(RuntimeError):
    """The job cannot finish (e.g. the writer keeps failing on one batch)."""


@dataclass
class FaultPlan:
    """Fault injection for the fault tests: crash an actor's process once (``os._exit``, like a
    kill -9 or the OOM killer). ``marker`` is a file created when the fault fires, so it fires
    once across restarts and actors (tests run on one machine).

    collector_exit_after_episodes: a collector dies after finishing its n-th episode, before
        streaming it back (that episode and the rest of its shards are in flight).
    writer_exit_after_commits: the writer dies after its n-th commit, before acknowledging it
        (the committed batch is re-sent and must be skipped; later queued batches are lost).
    """

    marker: str
    collector_exit_after_episodes: int | None = None
    writer_exit_after_commits: int | None = None

    def fire(self) -> None:
        """Exit the process now, unless this plan's fault already fired."""
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.close(fd)
        os._exit(1)


@dataclass
class EpisodeItem:
    """One finished episode as a collector streams it: index into the planned episode list,
    the policy that ran it, its trajectory (None with ``error`` when the episode raised).
    ``seconds`` is wall time, ``cpu_seconds`` the collector process's CPU time (the per-core
    cost, unaffected by other processes sharing the core)."""

    index: int
    policy: str = ""
    trajectory: Any = None
    success: bool = False
    spl: float = 0.0
    steps: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    error: str = ""
    value_decisions: bytes | None = None  # an exploration walk's decisions (memory.value_log)


class CollectorWorker:
    """A collector actor: one ``Collector`` (simulator + oracle and explore agents) of the
    driver's ``settings``."""

    def __init__(self, policy: str, settings: Settings, scene_cache: int,
                 fault: FaultPlan | None = None) -> None:
        self.collector = Collector(settings)
        self.policy = policy
        self.fault = fault
        self.finished = 0
        self.scenes = SceneCache(scene_cache)

    def collect(self, indices: Sequence[int], episodes: Sequence[Any], scene_refs: dict[str, Any]):
        """Run ``episodes`` (planned indices ``indices``) one by one, yielding an ``EpisodeItem``
        for each. ``scene_refs``: scene name -> object ref (nested in a dict, so Ray passes the
        refs and the actor fetches only the scenes it has not cached)."""
        def collect_one(index: int, episode: Any) -> EpisodeItem:
            scene = self.scenes.get(episode.scene_key, scene_refs)
            got = self.collector.collect_one(episode, scene, self.policy)
            metrics = got.result.metrics
            return EpisodeItem(index, got.policy, got.trajectory, bool(metrics.success),
                               float(metrics.spl), int(metrics.steps), value_decisions=got.value_decisions)

        def failed(index: int, exc: Exception) -> EpisodeItem:
            return EpisodeItem(index, error=f"{type(exc).__name__}: {exc}")

        for item in timed_items(indices, episodes, collect_one, failed):
            self.finished += 1
            if self.fault and self.fault.collector_exit_after_episodes == self.finished:
                self.fault.fire()
            yield item

    def ping(self) -> bool:
        """Answers once the actor is up (the driver's liveness check after a failure)."""
        return True


class ShardGrouper:
    """A grouping shard's actor (``memory.shards``): decides the trajectories of its scenes and
    hands the rows to its ``GroupingWriter``, which commits; it loads its state from the store.
    ``memory_cfg``: the ``memory`` section."""

    def __init__(self, store_uri: str, memory_cfg: MemoryConfig, index: int, count: int) -> None:
        self.memory = open_shard(store_uri, memory_cfg, MemoryShard(index, count))

    def decide_many(self, trajs: list, labels: list[str]) -> tuple:
        return self.memory.decide_many(trajs, labels)

    def reload(self) -> None:
        self.memory.reload()

    def ping(self) -> bool:
        return True


def _actor_shards(store_uri: str, memory_cfg: MemoryConfig, count: int, num_cpus: float) -> Any:
    """``memory.shards.ShardedMemory`` with each shard in a ``ShardGrouper`` actor (they decide a
    batch in parallel). A shard that fails takes its writer down with it (``os._exit``): the
    restarted writer makes fresh shards from the store and the driver resends every batch it had
    not acknowledged, in plan order, as after any writer crash; a writer that carried on would
    run the batches queued behind the failed one first."""
    grouper = ray.remote(ShardGrouper).options(num_cpus=num_cpus, max_restarts=0)

    class ActorShards(ShardedMemory):
        def _make_shard(self, shard):
            return grouper.remote(store_uri, memory_cfg, shard.index, shard.count)

        def _decide(self, labels, parts):
            try:
                return ray.get([s.decide_many.remote(p, labels) for s, p in zip(self.shards, parts)])
            except RayError:
                os._exit(1)

        def _reload_shards(self):
            ray.get([s.reload.remote() for s in self.shards])

    memory = ActorShards(store_uri, memory_cfg, count)
    ray.get([shard.ping.remote() for shard in memory.shards])  # up (and loaded) before the first batch
    return memory


class GroupingWriter:
    """The grouping actor: the single writer of the memory at ``store_uri`` (with ``writers`` > 1
    the committer of that many shard actors).

    Its state (summaries, known ids) is loaded from the store at construction, so a restarted
    writer continues where the last commit left off.
    """

    def __init__(self, store_uri: str, memory_cfg: MemoryConfig, fault: FaultPlan | None = None,
                 writers: int = 1, shard_num_cpus: float = 1.0) -> None:
        self.memory = (TrajectoryMemory(store_uri, memory_cfg) if writers == 1
                       else _actor_shards(store_uri, memory_cfg, writers, shard_num_cpus))
        self.value_log = ValueLog(store_uri)
        self.fault = fault
        self.commits = 0

    def missing(self, trajectory_ids: Sequence[str]) -> list[str]:
        """The ids among ``trajectory_ids`` the store has not decided on yet (``TrajectoryMemory.known``:
        chunks, ids dropped as redundant and ids rejected)."""
        return [tid for tid in trajectory_ids if not self.memory.known(tid)]

    def write(self, seq: int, batch: Sequence[tuple[str, EpisodeItem]]) -> dict:
        """Insert ``(trajectory_id, item)`` pairs in one ``insert_many`` (one commit); ids already
        decided are skipped. Returns each id's action, the time taken and the store's size."""
        started, cpu = time.perf_counter(), time.process_time()
        actions: dict[str, str] = {}
        fresh, walked = [], []
        for tid, item in batch:
            if self.memory.known(tid) or tid in actions:
                actions[tid] = "duplicate"
                continue
            traj = item.trajectory
            # The memory keys a trajectory by its ``trajectory_id`` attribute when it has one
            # (memory.grouping.trajectory_key): the collector's id, so both sides agree.
            traj.trajectory_id, traj.policy = tid, item.policy
            actions[tid] = "pending"
            fresh.append(traj)
            if item.value_decisions is not None:
                walked.append((tid, item.value_decisions))
        # Decisions before trajectories: a walk whose chunk is stored has its decisions (memory.value_log).
        self.value_log.append(walked)
        for decision in self.memory.insert_many(fresh) if fresh else []:
            actions[decision.trajectory_id] = decision.action
        self.commits += 1
        if self.fault and self.fault.writer_exit_after_commits == self.commits:
            self.fault.fire()
        return {"seq": seq, "actions": actions, "seconds": time.perf_counter() - started,
                "cpu_seconds": time.process_time() - cpu, **self.state()}

    def state(self) -> dict:
        return {"chunks": self.memory.n_chunks, "groups": self.memory.n_groups,
                "walks_with_value_decisions": len(self.value_log)}

    def ping(self) -> bool:
        """Answers once the actor is up (the driver's liveness check after a failure)."""
        return True


# -- the driver -----------------------------------------------------------------------------------
@dataclass
class _Batch:
    seq: int
    items: list[tuple[str, EpisodeItem]]
    attempts: int = 0


WRITER = "writer"  # the key of the writer among the actors that are down (collectors: slot index)


class _Pipeline:
    """The driver's event loop: work queue -> collectors -> batch buffer -> writer."""

    def __init__(self, cfg: CorpusJobConfig, ids: Sequence[str], todo: Sequence[int],
                 episodes: Sequence[Any], scene_refs: dict[str, Any], make_collector: Callable[[], Any],
                 make_writer: Callable[[], Any], writer: Any, bar: Any) -> None:
        self.cfg, self.ids, self.bar = cfg, ids, bar
        self.episodes, self.scene_refs = episodes, scene_refs
        self.make_collector, self.make_writer, self.writer = make_collector, make_writer, writer
        # Small jobs: shrink the shards so that every collector gets work from the start.
        slots = cfg.collectors * cfg.shards_in_flight
        step = max(1, min(cfg.shard_episodes, -(-len(todo) // slots)))
        self.queue = deque(Shard(list(todo[i:i + step])) for i in range(0, len(todo), step))
        # No more collectors than shards (a small resume needs no full fleet).
        self.actors = [make_collector() for _ in range(min(cfg.collectors, len(self.queue)))]
        self.slots = [SlotStats() for _ in self.actors]
        self.runs: dict[Any, ShardRun] = {}
        # Trajectories go to the writer in plan order (``todo``), whatever order the collectors
        # finish them in: grouping depends on the order of insertion, so the same plan builds
        # the same memory with any number of collectors, crashes or not. ``held`` keeps those
        # that came early (~1 KB each; a few shards' worth).
        self.order, self.released = list(todo), 0
        self.held: dict[int, tuple[str, EpisodeItem]] = {}
        self.buffer: list[tuple[str, EpisodeItem]] = []
        self.unacked: dict[Any, _Batch] = {}
        self.resend: list[_Batch] = []
        self.down: dict[Any, ActorDown] = {}
        self.delivered: set[int] = set()
        self.failed: dict[str, str] = {}
        self.decisions: Counter = Counter()
        self.counts: Counter = Counter()
        self.insert_s = self.insert_cpu_s = 0.0
        self.seq = 0
        self.started = time.perf_counter()

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        while self.queue or self.runs or self.held or self.buffer or self.unacked or self.resend:
            if self.held and not (self.queue or self.runs):
                raise CorpusJobError(f"internal: {len(self.held)} collected trajectories wait for episode "
                                     f"{self.order[self.released]}, which is neither collected nor failed")
            self._ping_down()
            self._submit_shards()
            self._send_batch()
            self._wait()

    def _submit_shards(self) -> None:
        """Hand out shards round-robin (one per collector per pass), up to the in-flight cap."""
        busy = Counter(run.slot for run in self.runs.values())
        while self.queue:
            free = [slot for slot in range(len(self.actors))
                    if slot not in self.down and busy[slot] < self.cfg.shards_in_flight]
            if not free:
                return
            for slot in free:
                if not self.queue:
                    return
                shard, actor = self.queue.popleft(), self.actors[slot]
                episodes = [self.episodes[i] for i in shard.indices]
                gen = actor.collect.options(
                    # Ray's streaming-generator backpressure: the actor pauses this far ahead.
                    _generator_backpressure_num_objects=self.cfg.max_unconsumed_episodes,
                ).remote(shard.indices, episodes,
                         {e.scene_key: self.scene_refs[e.scene_key] for e in episodes})
                self.runs[gen] = ShardRun(shard, slot, actor)
                busy[slot] += 1

    def _send_batch(self) -> None:
        if WRITER in self.down:
            return
        for batch in sorted(self.resend, key=lambda b: b.seq):
            self._submit_batch(batch)
        self.resend = []
        if not self.buffer or len(self.unacked) >= self.cfg.max_unacked_batches:
            return
        collecting = bool(self.queue or self.runs)
        # Adaptive batching: a full batch, or whatever is waiting when the writer is idle.
        if len(self.buffer) < self.cfg.writer_batch and self.unacked and collecting:
            return
        items, self.buffer = self.buffer[:self.cfg.writer_batch], self.buffer[self.cfg.writer_batch:]
        self._submit_batch(_Batch(self.seq, items))
        self.seq += 1

    def _submit_batch(self, batch: _Batch) -> None:
        self.unacked[self.writer.write.remote(batch.seq, batch.items)] = batch

    def _wait(self) -> None:
        # Backpressure: with a full batch waiting for the writer, leave the streams unread.
        reading = len(self.buffer) < self.cfg.writer_batch
        pings = {d.ref: key for key, d in self.down.items() if d.ref is not None}
        waitables = list(self.unacked) + list(pings) + (list(self.runs) if reading else [])
        timeout = self.cfg.poll_s
        if any(d.ref is None for d in self.down.values()):
            timeout = min(timeout, self.cfg.retry_interval_s)
        if not waitables:
            time.sleep(timeout)
            return
        ready, _ = ray.wait(waitables, num_returns=1, timeout=timeout)
        for handle in ready:
            if handle in self.unacked:
                self._on_ack(handle)
            elif handle in pings:
                self._on_ping(pings[handle], handle)
            else:
                self._on_stream(handle)
        self._refresh_bar()

    # -- actors that failed -----------------------------------------------------------------
    def _actor(self, key: Any) -> Any:
        return self.writer if key == WRITER else self.actors[key]

    def _mark_down(self, key: Any) -> None:
        if key not in self.down:
            self.down[key] = ActorDown(since=time.perf_counter())

    def _ping_down(self) -> None:
        now = time.perf_counter()
        for key, down in self.down.items():
            if down.ref is None and now >= down.retry_at:
                down.ref = self._actor(key).ping.remote()

    def _on_ping(self, key: Any, ref: Any) -> None:
        down = self.down[key]
        try:
            ray.get(ref)
        except ActorDiedError:
            self._replace(key)  # out of restarts: a fresh actor (nothing else holds its state)
        except RayError as exc:  # still restarting
            waited = time.perf_counter() - down.since
            if waited > self.cfg.restart_timeout_s:
                raise CorpusJobError(f"the {'grouping writer' if key == WRITER else 'collector'} "
                                     f"has not come back after {waited:.0f} s: "
                                     f"{first_line(exc)}") from None
            down.ref, down.retry_at = None, time.perf_counter() + self.cfg.retry_interval_s
            return
        del self.down[key]

    def _replace(self, key: Any) -> None:
        ray.kill(self._actor(key), no_restart=True)
        if key == WRITER:
            self.writer = self.make_writer()
            self.counts["writer_replaced"] += 1
        else:
            self.actors[key] = self.make_collector()
            self.slots[key].replaced += 1

    # -- collectors -------------------------------------------------------------------------
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
            self.counts["collector_interruptions"] += 1
            if self.actors[run.slot] is run.actor:
                self._mark_down(run.slot)
            self._requeue(run, f"{type(exc).__name__}: {first_line(exc)}")
            return
        self._accept(run, item)

    def _accept(self, run: ShardRun, item: EpisodeItem) -> None:
        run.received.add(item.index)
        tid = self.ids[item.index]
        if item.error:
            self.failed[tid] = item.error
            self.bar.update(1)
            self._release()
            return
        if item.index in self.delivered:  # a retried shard repeated an episode: keep one
            self.counts["duplicates_dropped"] += 1
            return
        self.delivered.add(item.index)
        self.held[item.index] = (tid, item)
        self._release()
        stats = self.slots[run.slot]
        stats.episodes += 1
        stats.busy_s += item.seconds
        stats.cpu_s += item.cpu_seconds
        self.counts["collected"] += 1
        self.bar.update(1)

    def _release(self) -> None:
        """Move the held trajectories that are next in plan order to the writer's buffer, skipping
        episodes that failed for good."""
        while self.released < len(self.order):
            index = self.order[self.released]
            if index in self.held:
                self.buffer.append(self.held.pop(index))
            elif self.ids[index] not in self.failed:
                return
            self.released += 1

    def _requeue(self, run: ShardRun, reason: str) -> None:
        """The unfinished episodes of ``run`` go back to the front, one per shard."""
        left = [i for i in run.shard.indices if i not in run.received]
        attempts = run.shard.attempts + 1
        for index in reversed(left):
            if attempts >= self.cfg.max_attempts:
                self.failed[self.ids[index]] = f"collector failed {attempts} times: {reason}"
                self.bar.update(1)
            else:
                self.queue.appendleft(Shard([index], attempts))
                self.counts["episodes_requeued"] += 1
        self._release()

    # -- the writer -------------------------------------------------------------------------
    def _on_ack(self, ref: Any) -> None:
        batch = self.unacked.pop(ref)
        try:
            ack = ray.get(ref)
        except RayError as exc:
            # Crashed or failed before acknowledging: send again once the writer answers;
            # anything it did commit comes back as "duplicate".
            self.counts["writer_failures"] += 1
            batch.attempts += 1
            if batch.attempts >= self.cfg.max_attempts:
                raise CorpusJobError(f"the grouping writer failed {batch.attempts} times on batch "
                                     f"{batch.seq} ({len(batch.items)} trajectories): "
                                     f"{first_line(exc)}") from None
            self.counts["batches_resent"] += 1
            self.resend.append(batch)
            self._mark_down(WRITER)
            return
        for action in ack["actions"].values():
            self.decisions[action] += 1
        self.insert_s += ack["seconds"]
        self.insert_cpu_s += ack["cpu_seconds"]
        self.counts["batches"] += 1

    def _refresh_bar(self) -> None:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        self.bar.set_postfix(traj_per_s=f"{self.counts['collected'] / elapsed:.2f}",
                             committed=sum(n for a, n in self.decisions.items() if a != "duplicate"),
                             unacked=len(self.unacked), refresh=False)


# -- entry points ---------------------------------------------------------------------------------
def _scene_episodes(scene: Any, per_scene: int, episode_cfg: Any, seed: int, motion: Any) -> list:
    """One scene's episodes (a Ray task; episode generation is seeded per scene, so the union
    over scenes equals ``generate_episodes`` over all of them)."""
    return generate_episodes([scene], per_scene, episode_cfg, seed, motion)


def _generate(scenes: Sequence[Any], scene_refs: dict[str, Any], per_scene: int, episode_cfg: Any,
              seed: int, motion: Any, cfg: CorpusJobConfig, progress: bool) -> list:
    """All episodes, in scene order. Many scenes: one Ray task per scene (~0.05 s an episode,
    so 350k episodes would take the driver alone ~5 h)."""
    from tqdm import tqdm

    if len(scenes) < cfg.parallel_plan_min_scenes:
        return generate_episodes(scenes, per_scene, episode_cfg, seed, motion)
    check_config(episode_cfg)
    task = ray.remote(_scene_episodes).options(num_cpus=cfg.collector_num_cpus)
    refs = [task.remote(scene_refs[scene.name], per_scene, episode_cfg, seed, motion) for scene in scenes]
    pending = list(refs)
    with tqdm(total=len(refs), desc="episodes", unit="scene", disable=not progress, file=sys.stderr) as bar:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            bar.update(len(done))
    return [episode for part in ray.get(refs) for episode in part]


def _plan(scenes: list, scene_spec: str, per_scene: int, policy: str, settings: Settings, seed: int | None,
          cfg: CorpusJobConfig, progress: bool):
    """Scenes (as object refs), episodes (for the collectors' motion, ``collector_settings``)
    and the trajectory id of each episode (``policy`` resolved per episode)."""
    corpus_cfg = settings.corpus
    scene_refs = {scene.name: ray.put(scene) for scene in scenes}
    episode_cfg = settings.episodes
    motion = Motion.from_sim_config(collector_settings(settings).sim)
    episodes = _generate(scenes, scene_refs, per_scene, episode_cfg,
                         episode_cfg.seed if seed is None else seed, motion, cfg, progress)
    ids = [trajectory_id(e, episode_policy(e, policy, corpus_cfg.oracle_fraction, corpus_cfg.seed))
           for e in episodes]
    repeated = [tid for tid, n in Counter(ids).items() if n > 1]
    if repeated:
        raise UserError(f"episodes of {scene_spec} repeat trajectory ids (e.g. {repeated[0]!r}); "
                        "episode ids must be unique per scene")
    return scene_refs, episodes, ids


class _Actors:
    """Makes the job's actors and kills them all at the end (none outlive the job)."""

    def __init__(self, cfg: CorpusJobConfig, store_uri: str, policy: str, settings: Settings,
                 faults: FaultPlan | None) -> None:
        self.cfg, self.store_uri, self.policy, self.settings, self.faults = (
            cfg, store_uri, policy, settings, faults)
        # Retries are the driver's (max_task_retries=0): it knows what came back and what was
        # acknowledged; Ray only restarts the processes.
        self.writer_cls = ray.remote(GroupingWriter).options(
            num_cpus=cfg.writer_num_cpus, max_restarts=cfg.writer_max_restarts, max_task_retries=0)
        self.collector_cls = ray.remote(CollectorWorker).options(
            num_cpus=cfg.collector_num_cpus, max_restarts=cfg.collector_max_restarts,
            max_task_retries=0)
        self.made: list[Any] = []

    def writer(self) -> Any:
        return self._keep(self.writer_cls.remote(self.store_uri, self.settings.memory, self.faults,
                                                 self.cfg.writers, self.cfg.shard_num_cpus))

    def collector(self) -> Any:
        return self._keep(self.collector_cls.remote(self.policy, self.settings,
                                                    self.cfg.scene_cache, self.faults))

    def _keep(self, actor: Any) -> Any:
        self.made.append(actor)
        return actor

    def kill_all(self) -> None:
        for actor in self.made:
            ray.kill(actor, no_restart=True)


def build_corpus_ray(scene_spec: str, per_scene: int, policy: str, store_uri: str,
                     settings: Settings, seed: int | None = None,
                     workers: int | None = None, progress: bool = True,
                     ray_address: str | None = None, faults: FaultPlan | None = None,
                     writers: int | None = None, mixed_settings: bool = False) -> dict:
    """Collect + convert + insert on Ray with ``workers`` collectors (default: corpus_job.collectors)
    and ``writers`` grouping writers (default: corpus_job.writers). A store whose walks were
    collected with other settings is refused unless ``mixed_settings`` (``memory.build_settings``).

    Collectors and writers are made from ``settings``. Returns ``build_corpus``'s summary (counts, decisions, throughput, seconds per stage) plus
    per-actor times and what the fault handling did. Uses the running Ray if there is one, else
    starts a local one for the job.
    """
    started = time.perf_counter()
    cfg = settings.corpus_job
    cfg = replace(cfg, collectors=cfg.collectors if workers is None else int(workers),
                  writers=cfg.writers if writers is None else int(writers))
    if cfg.collectors < 1:
        raise UserError(f"the Ray corpus build needs at least 1 collector, got {cfg.collectors}")
    if cfg.writers < 1:
        raise UserError(f"the Ray corpus build needs at least 1 writer, got {cfg.writers}")
    if per_scene < 1:
        raise UserError(f"--episodes-per-scene must be >= 1, got {per_scene}")
    scenes = load_scenes(scene_spec, settings)  # a bad spec or file fails here, before a cluster starts
    with claim_store(store_uri, f"Ray corpus build of {scene_spec}"):  # and a second build of the store
        BuildSettings(store_uri).admit(collection_settings(settings, scenes), mixed_settings)
        own_ray = ensure_ray(ray_address, max(os.cpu_count() or 1, cfg.collectors * cfg.collector_num_cpus
                                              + (cfg.writers > 1) * cfg.writers * cfg.shard_num_cpus))
        actors = _Actors(cfg, store_uri, policy, settings, faults)
        try:
            return _build(cfg, actors, scenes, scene_spec, per_scene, policy, settings, seed, progress, started)
        finally:
            actors.kill_all()
            if own_ray:
                ray.shutdown()


def _build(cfg: CorpusJobConfig, actors: _Actors, scenes: list, scene_spec: str, per_scene: int, policy: str,
           settings: Settings, seed: int | None, progress: bool, started: float) -> dict:
    """Plan, ask the store what is missing, run the pipeline, summarise."""
    from tqdm import tqdm

    scene_refs, episodes, ids = _plan(scenes, scene_spec, per_scene, policy, settings, seed, cfg, progress)
    writer = actors.writer()
    try:
        missing = set(ray.get(writer.missing.remote(ids)))
    except RayError as exc:  # e.g. the store URI cannot be opened
        raise UserError(f"memory store {actors.store_uri}: the grouping writer could not start: "
                        f"{first_line(exc)}") from None
    todo = [i for i, tid in enumerate(ids) if tid in missing]
    setup_s = time.perf_counter() - started
    pipe = None
    if todo:
        with tqdm(total=len(todo), desc=f"corpus x{cfg.collectors}", unit="traj",
                  disable=not progress, file=sys.stderr) as bar:
            pipe = _Pipeline(cfg, ids, todo, episodes, scene_refs, actors.collector, actors.writer,
                             writer, bar)
            pipe.run()
        writer = pipe.writer
    state = ray.get(writer.state.remote())
    return _summary(ids, todo, pipe, state, cfg.collectors, setup_s, time.perf_counter() - started)


def _summary(ids, todo, pipe: _Pipeline | None, state: dict, workers: int, setup_s: float,
             total_s: float) -> dict:
    """``build_corpus``'s keys, plus per-actor times and the fault handling counts."""
    counts = pipe.counts if pipe else Counter()
    decisions = dict(pipe.decisions) if pipe else {}
    collected = counts["collected"]
    slots = pipe.slots if pipe else []
    insert_s = pipe.insert_s if pipe else 0.0
    return {
        "episodes_planned": len(ids),
        "skipped_already_stored": len(ids) - len(todo),
        "collected": collected,
        "failed": len(pipe.failed) if pipe else 0,
        "failed_ids": dict(sorted(pipe.failed.items())) if pipe else {},
        "decisions": decisions,
        "chunks": state["chunks"],
        "groups": state["groups"],
        "walks_with_value_decisions": state["walks_with_value_decisions"],
        "traj_per_s": collected / total_s if collected else 0.0,
        "workers": workers,
        "seconds": {
            "setup": setup_s,
            # actor-seconds, summed over the collectors (they run in parallel)
            "collect_and_convert": sum(s.busy_s for s in slots),
            "insert": insert_s,
            "pipeline": total_s - setup_s,
            "total": total_s,
        },
        # CPU seconds of the actor processes: the per-core cost, whatever else shares the cores
        "cpu_seconds": {"collect_and_convert": sum(s.cpu_s for s in slots),
                        "insert": pipe.insert_cpu_s if pipe else 0.0},
        "actors": {
            "collectors": [{"episodes": s.episodes, "busy_s": s.busy_s, "cpu_s": s.cpu_s,
                            "replaced": s.replaced} for s in slots],
            "writer": {"batches": counts["batches"], "busy_s": insert_s,
                       "cpu_s": pipe.insert_cpu_s if pipe else 0.0},
        },
        "faults": {key: counts[key] for key in (
            "collector_interruptions", "episodes_requeued", "duplicates_dropped",
            "writer_failures", "batches_resent", "writer_replaced")},
    }
