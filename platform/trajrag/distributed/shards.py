"""Bookkeeping shared by the driver loops of the Ray jobs (corpus build, evaluation).

Both jobs hand *shards* (runs of planned episode indices) to a pool of actors, stream results
back, re-queue what a dead actor did not finish, and ping an actor that failed until Ray has
restarted it. The actors keep the scenes they use in a small LRU cache fetched from the object
store.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import ray


@dataclass
class Shard:
    """Planned episode indices handed to one actor call; ``attempts``: times re-queued."""

    indices: list[int]
    attempts: int = 0


@dataclass
class ShardRun:
    """A shard streaming from the actor in slot ``slot`` (``actor``: the handle it went to)."""

    shard: Shard
    slot: int
    actor: Any
    received: set[int] = field(default_factory=set)


@dataclass
class SlotStats:
    """Per actor slot: episodes done, busy and CPU seconds, times the actor was replaced."""

    episodes: int = 0
    busy_s: float = 0.0
    cpu_s: float = 0.0
    replaced: int = 0


@dataclass
class ActorDown:
    """An actor that failed a call: pinged until it answers (Ray restarts it meanwhile).

    A call to an actor that is restarting fails at once, so nothing is sent to it until a ping
    comes back; ``ref`` is the ping in flight, ``retry_at`` when to ping again.
    """

    since: float
    ref: Any = None
    retry_at: float = 0.0


def timed_items(indices: Sequence[int], episodes: Sequence[Any], run_one: Callable[[int, Any], Any],
                failed: Callable[[int, Exception], Any]) -> Iterator[Any]:
    """The actors' per-episode loop: ``run_one(index, episode)`` for each, or ``failed(index,
    exc)`` when it raises (one bad episode never stops an actor), with the item's ``seconds``
    (wall) and ``cpu_seconds`` set."""
    for index, episode in zip(indices, episodes):
        started, cpu = time.perf_counter(), time.process_time()
        try:
            item = run_one(index, episode)
        except Exception as exc:  # noqa: BLE001 - reported in the item, the actor goes on
            item = failed(index, exc)
        item.seconds = time.perf_counter() - started
        item.cpu_seconds = time.process_time() - cpu
        yield item


def first_line(exc: BaseException) -> str:
    """The message of an actor error without Ray's traceback (the cause's last line)."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(exc).__name__


class SceneCache:
    """The last ``size`` scenes an actor used, fetched from the object store on a miss (shards
    are runs of scene-ordered episodes: few refetches)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._scenes: OrderedDict[str, Any] = OrderedDict()

    def get(self, name: str, refs: dict[str, Any]) -> Any:
        """Scene ``name``; ``refs``: scene name -> object ref."""
        if name not in self._scenes:
            self._scenes[name] = ray.get(refs[name])
            while len(self._scenes) > self.size:
                self._scenes.popitem(last=False)
        self._scenes.move_to_end(name)
        return self._scenes[name]
