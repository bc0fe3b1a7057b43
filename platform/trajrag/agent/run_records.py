"""An evaluation run's episode records: ``<out>/<label>/episodes*.jsonl``, one JSON object per
finished episode, read back and checked line by line (a torn last line is a crash's and left out,
any other line that is no record is named ``file:line``), written atomically where whole files
are, and the counters a summary adds to the records' metrics."""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from trajrag.planners.base import TIMING_LISTS
from trajrag.world.metrics import EpisodeMetrics


# The metrics a summary reads from each record (all of ``EpisodeMetrics``); a paired comparison
# reads only success and SPL, so records written by hand or by an older trajrag still pair.
SUMMARY_METRICS = tuple(f.name for f in fields(EpisodeMetrics))
PAIRED_METRICS = ("success", "spl")


class RecordsError(ValueError):
    """A line of a run's episode records that is no episode record, named ``file:line``. Its run
    cannot resume: re-running the episode would put two records of it in one run."""


@dataclass
class AgentRun:
    """Where one agent's episodes go: ``<out>/<agent>/episodes.jsonl``."""

    name: str
    directory: Path

    @property
    def records(self) -> Path:
        return self.directory / "episodes.jsonl"

    def finished(self, metrics: Sequence[str] = SUMMARY_METRICS) -> dict[tuple[str, str], dict]:
        """Records already written, keyed by (scene_key, episode_id), each carrying ``metrics``
        (``read_records``: a torn last line is left out, any other line that is not a record
        raises ``RecordsError``)."""
        done: dict[tuple[str, str], dict] = {}
        # episodes.jsonl, and the episodes.shard-I-of-N.jsonl of sharded Ray jobs
        for path in sorted(self.directory.glob("episodes*.jsonl")):
            done.update(read_records(path, metrics))
        return done

    @property
    def settings_path(self) -> Path:
        return self.directory / "run.json"


def read_records(path: Path, metrics: Sequence[str] = SUMMARY_METRICS) -> Iterator[tuple[tuple[str, str], dict]]:
    """Each episode record of the JSONL file ``path`` with its key (scene_key, episode_id), checked
    to carry ``metrics`` of the right types (``record_problem``). A last line with no newline that
    is not JSON is a write a crash cut short: it is left out (``cut_torn_tail`` removes it before
    the next append). Any other line that is not a record raises ``RecordsError`` naming
    ``file:line``; blank lines hold nothing and are passed over."""
    lines = path.read_bytes().split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:  # not JSON, or not UTF-8
            if number == len(lines):  # after the last newline: torn, not damaged
                continue
            raise _bad_record(path, number, f"not JSON ({exc})") from None
        problem = record_problem(record, metrics)
        if problem:
            raise _bad_record(path, number, problem)
        yield (record["scene_key"], record["episode_id"]), record


def _bad_record(path: Path, number: int, problem: str) -> RecordsError:
    return RecordsError(f"{path}:{number}: not an episode record: {problem}; nothing was changed: fix or remove "
                        f"that line to go on (a removed line's episode runs again on resume)")


def record_problem(record, metrics: Sequence[str] = SUMMARY_METRICS) -> str:
    """What makes ``record`` (parsed JSON) no episode record carrying ``metrics``; "" if it is one."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {shown(record)}"
    for key in ("scene_key", "episode_id"):
        if not isinstance(record.get(key), str):
            return f"{key} must be a string, got {shown(record.get(key))}"
    if not isinstance(record.get("metrics"), dict):
        return f"metrics must be a JSON object, got {shown(record.get('metrics'))}"
    return metrics_problem(record["metrics"], metrics)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# What each metric must be: a check and its wording. A NaN fails every comparison, so SPL's too.
_METRIC_CHECKS = {
    "success": (lambda v: isinstance(v, bool), "true or false"),
    "called_stop": (lambda v: isinstance(v, bool), "true or false"),
    "spl": (lambda v: _is_number(v) and 0 <= v <= 1, "a number from 0 to 1"),
    "distance_to_goal": (lambda v: v is None or _is_number(v), "metres, or null where unreachable"),
    "path_length": (_is_number, "metres"),
    "geodesic_distance": (_is_number, "metres"),
    "steps": (_is_count, "a count"),
    "collisions": (_is_count, "a count"),
    "episode_id": (lambda v: isinstance(v, str), "a string"),
    "scene_key": (lambda v: isinstance(v, str), "a string"),
    "category": (lambda v: isinstance(v, str), "a string"),
}


def metrics_problem(stored: dict, metrics: Sequence[str] = SUMMARY_METRICS) -> str:
    """What makes a record's ``metrics`` object lack one of ``metrics`` or hold a metric of the
    wrong type (``_METRIC_CHECKS``); "" if nothing does. Keys it does not know are left alone."""
    missing = [key for key in metrics if key not in stored]
    if missing:
        return f"metrics lack {', '.join(missing)}"
    for key, (check, wanted) in _METRIC_CHECKS.items():
        if key in stored and not check(stored[key]):
            return f"metrics.{key} must be {wanted}, got {shown(stored[key])}"
    return ""


def shown(value) -> str:
    """``value`` as JSON, cut short: enough to recognise it in an error line."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def cut_torn_tail(path: Path) -> None:
    """Before appending to the records file ``path``: a last line that a crash left without its
    newline would run into the next record, so it is cut off when it is not JSON (a record half
    written; its episode runs again), saying so on stderr, and ended when it is a whole record.
    The lines before it stay byte for byte."""
    if not path.is_file():
        return
    with path.open("r+b") as records:
        data = records.read()
        if not data or data.endswith(b"\n"):
            return
        start = data.rfind(b"\n") + 1
        try:
            json.loads(data[start:])
        except ValueError:
            records.truncate(start)
            print(f"warning: {path}: cut a torn last line ({len(data) - start} bytes, a record cut short by a "
                  f"crash); its episode runs again", file=sys.stderr)
            return
        records.write(b"\n")


def json_safe(value):
    """``value`` with each non-finite float (the mean over no episode, an unreachable distance) as
    None, in nested dicts and lists too: JSON has no NaN or Infinity, and strict readers refuse them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def write_json(path: Path, data) -> None:
    """``data`` as JSON at ``path`` (``json_safe``), in one rename: a crash or a reader never sees
    half a file. The temporary file is this process's own: the shards of one job may write one
    path at once."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(json_safe(data), indent=2, default=_json_default, allow_nan=False) + "\n")
    os.replace(temporary, path)


def _json_default(value):
    return None if isinstance(value, float) and not math.isfinite(value) else str(value)


def record_metrics(stored: dict) -> EpisodeMetrics:
    """A record's ``metrics`` as ``EpisodeMetrics`` (a null distance to goal read back as
    unreachable); ``RecordsError`` names the episode where they are not all there, or not of
    their types. Keys of newer records that it does not know are left out."""
    problem = metrics_problem(stored) if isinstance(stored, dict) else f"expected a JSON object, got {shown(stored)}"
    if problem:
        where = "/".join(str(stored.get(k)) for k in ("scene_key", "episode_id")) if isinstance(stored, dict) else "?"
        raise RecordsError(f"episode record {where}: {problem}")
    known = {key: stored[key] for key in SUMMARY_METRICS}
    dtg = known["distance_to_goal"]
    return EpisodeMetrics(**{**known, "distance_to_goal": math.inf if dtg is None else dtg})


def perception_counters(records: Sequence[dict]) -> dict:
    """``perception_profile`` the episodes were seen with (comma-joined if several; None for agents
    that do not map) and ``goals_rejected``: mapped goals that verification found not there."""
    profiles = sorted({r["perception_profile"] for r in records if "perception_profile" in r})
    rejected = sum(int(r.get("agent_stats", {}).get("goals_rejected", 0)) for r in records)
    return {"perception_profile": ",".join(profiles) or None, "goals_rejected": rejected}


def planner_counters(records: Sequence[dict]) -> dict:
    """``planner_calls`` and ``fallbacks`` (sums over episodes), ``parse_failures`` (LLM answers
    that were no usable choice, summed; None for planners that ask no LLM),
    ``retrieval_ms_p50`` (median over every decision; None for planners that do not retrieve)
    and its split, ``coarse_ms_p50`` / ``encode_ms_p50`` / ``search_ms_p50`` (None where the
    records carry no split: other planners, older records)."""
    calls = sum(int(r.get("agent_stats", {}).get("planner_calls", 0)) for r in records)
    fallbacks = sum(int(r.get("planner_stats", {}).get("fallbacks", 0)) for r in records)
    failures = [int(r["planner_stats"]["parse_failures"]) for r in records
                if "parse_failures" in r.get("planner_stats", {})]
    counters = {"planner_calls": calls, "fallbacks": fallbacks,
                "parse_failures": sum(failures) if failures else None}
    for name in TIMING_LISTS:
        timings = [t for r in records for t in r.get("planner_stats", {}).get(name, [])]
        counters[f"{name}_p50"] = float(np.median(timings)) if timings else None
    return counters
