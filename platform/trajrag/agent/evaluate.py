"""Evaluate agents on a set of episodes: per-episode JSONL (resumable), summaries, a results table.

One process here; the platform issue fans the same episode loop out over Ray actors.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import hashlib
import json
import math
import os
import sys
import zlib
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
from tqdm import tqdm

from trajrag import artefacts, config
from trajrag.config import Settings
from trajrag.agent.decisions import AuditConfig, DecisionAudit, decision_quality
from trajrag.agent.episode_runner import EpisodeResult, run_episode
from trajrag.agent.names import RETRIEVING_AGENTS, VALUE_AGENTS
from trajrag.bootstrap import paired_interval
from trajrag.file_locks import holder, lock_file, sign
from trajrag.planners.base import TIMING_LISTS
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.episode_gen import scene_goal_field
from trajrag.world.metrics import EpisodeMetrics, summarize
from trajrag.world.scene import Scene

TABLE_COLUMNS = ("agent", "episodes", "sr", "spl", "dtg_m", "steps", "collisions", "planner_calls",
                 "fallbacks", "retrieval_ms_p50")
AUDIT_COLUMNS = ("decision_best_rate", "decision_score_rho")  # only when a run was audited
# /2: success counts a STOP under episodes.success_tolerance_m (0.1 m, habitat's) outside the goal
# region; /1 runs scored inside the region only, so their records neither resume nor pair with /2.
RUN_SETTINGS_FORMAT = "trajrag-eval-run/2"
# What records with no run.json were: walked before it existed, scored inside the region only.
_LEGACY_FORMAT = "no run.json (before trajrag-eval-run/1)"
# How a job runs, not what an episode does, so a resumed run may change them: configs/eval_job.yaml
# (actors, batching, Serve) and configs/run.yaml (`trajrag run`'s sizes and workers; the memory and
# model it builds are named by their paths; run.json records their content too, ``run_inputs``).
JOB_SECTIONS = ("eval_job", "run")
# The sections that make the world and the episodes, the same for every planner: two runs paired
# episode by episode must agree on them (``compare_runs`` says where they do not).
WORLD_SECTIONS = ("sim", "episodes", "perception", "procedural", "gibson", "mp3d")
# The metrics a summary reads from each record (all of ``EpisodeMetrics``); a paired comparison
# reads only success and SPL, so records written by hand or by an older trajrag still pair.
SUMMARY_METRICS = tuple(f.name for f in fields(EpisodeMetrics))
PAIRED_METRICS = ("success", "spl")
# What run.json's keys hold, where present (``run_settings``; older files lack some).
_SETTINGS_TYPES = {"format": str, "planner": str, "overrides": dict, "inputs": dict, "lifelong": bool}
_JSON_NAMES = {str: "a string", dict: "a JSON object", bool: "true or false"}


class RunSettingsError(ValueError):
    """A run label asked to resume with settings other than those its records were made with."""


class RunClaimedError(RuntimeError):
    """A run label another live process holds: it writes the same records file, or walks the
    label with other settings, or claims it this very moment (``claim_runs``)."""


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
        return f"expected a JSON object, got {_shown(record)}"
    for key in ("scene_key", "episode_id"):
        if not isinstance(record.get(key), str):
            return f"{key} must be a string, got {_shown(record.get(key))}"
    if not isinstance(record.get("metrics"), dict):
        return f"metrics must be a JSON object, got {_shown(record.get('metrics'))}"
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
            return f"metrics.{key} must be {wanted}, got {_shown(stored[key])}"
    return ""


def _shown(value) -> str:
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


def read_run_settings(path: Path) -> dict:
    """A run.json as ``run_settings`` wrote it. ``RunSettingsError`` names the file where it is
    not one: not JSON, or JSON of another shape (``_SETTINGS_TYPES``)."""
    try:
        stored = json.loads(path.read_text())
    except ValueError as exc:  # not JSON, or not UTF-8
        problem = str(exc)
    else:
        problem = _settings_problem(stored)
    if problem:
        raise RunSettingsError(f"{path}: not a run settings file ({problem}); its records are untouched: fix or "
                               f"remove the file to resume")
    return stored


def _settings_problem(stored) -> str:
    if not isinstance(stored, dict):
        return f"expected a JSON object, got {_shown(stored)}"
    wrong = [f"{key} must be {_JSON_NAMES[kind]}, got {_shown(stored[key])}"
             for key, kind in _SETTINGS_TYPES.items() if key in stored and not isinstance(stored[key], kind)]
    return "; ".join(wrong)


def run_settings(planner: str, settings: Settings, lifelong: bool = False) -> dict:
    """What makes one run's episodes one run: the planner and every ``section.key=value``
    override its settings were given (``Settings.overrides``: memory and model paths included,
    as absolute paths when they exist here, so a resume from another folder agrees; the last
    value of a key wins), the job sections left out; lifelong mode; and what the paths held
    (``run_inputs``)."""
    given: dict[str, str] = {}
    for item in settings.overrides:
        key, _, value = (part.strip() for part in item.partition("="))
        if key.split(".")[0] not in JOB_SECTIONS:
            given[key] = str(Path(value).resolve()) if value and Path(value).exists() else value
    return {"format": RUN_SETTINGS_FORMAT, "planner": planner, "overrides": dict(sorted(given.items())),
            **({"lifelong": True} if lifelong else {}), "inputs": run_inputs(planner, settings, lifelong)}


def run_inputs(planner: str, settings: Settings, lifelong: bool = False) -> dict:
    """What a run reads under its paths, by content: a memory rebuilt or grown, an encoder
    trained again or a value fitted again at the same path makes other episodes. For planners
    that retrieve, the memory's chunk and group counts and its chunks' encoder versions (the
    counts left out in lifelong mode, where the run itself grows the memory); for planners that
    score with a value model, the model file's SHA-256 (first 16 hex digits). A memory may mix
    datasets: ``memory.datasets`` counts its chunks per dataset (``memory_datasets``)."""
    inputs: dict = {}
    store_uri = settings.retrieval.store if planner in RETRIEVING_AGENTS else ""
    if store_uri:
        from trajrag.memory.store import MemoryStore

        store = MemoryStore(store_uri, read_only=True)
        try:
            chunks = store.read("chunks", ["encoder_version", "scene_hint"])
            versions = chunks.column("encoder_version").to_pylist()
            inputs["memory"] = {"encoder_versions": sorted({v for v in versions if v})}
            if not lifelong:
                inputs["memory"].update(chunks=store.count("chunks"), groups=store.count_groups(),
                                        datasets=memory_datasets(chunks.column("scene_hint").to_pylist()))
        finally:
            store.close()
    value_model = settings.scoring.value_model if planner in VALUE_AGENTS else ""
    if value_model:
        inputs["value_model_sha256"] = hashlib.sha256(artefacts.local_copy(value_model).read_bytes()).hexdigest()[:16]
    return inputs


def memory_datasets(scene_names: Sequence[str]) -> dict[str, int]:
    """Chunks per dataset, the first part of each chunk's scene name (``mp3d/<scan>/0`` -> mp3d,
    ``gibson/<Scene>/0`` -> gibson, ``procedural/train/0003`` -> procedural)."""
    return dict(sorted(Counter(str(name).split("/")[0] for name in scene_names if name).items()))


@contextlib.contextmanager
def claim_runs(out_dir: Path, settings: dict[str, dict], records: str = "episodes.jsonl") -> Iterator[None]:
    """Claim each run label for this process while the ``with`` body walks it: check its settings
    (``run_settings``) against ``<out>/<label>/run.json`` and write the file where it is missing;
    nothing is written unless every run agrees.

    A resume with other settings, or with other content under the same paths, would mix two
    configurations under one label, so it raises ``RunSettingsError`` naming each difference. A
    run.json written before runs recorded their inputs is checked on the rest and then records
    them. Records without a run.json were made before it existed, and so before success counted
    habitat's tolerance (format ``/2``): they are refused too, untouched. A label whose run
    finished no episode (it failed before its first: a bad path, a bad value) is claimed again
    with these settings, as there is nothing to mix, unless another process holds it; a run.json
    that is not one (``read_run_settings``) is refused whatever the records.

    Two processes must not both claim a label (``_hold_run``): the one that comes second gets
    ``RunClaimedError``. The shards of one evaluation (``records``: the file this process appends
    to, ``episodes.shard-I-of-N.jsonl``) share a label when their settings agree."""
    runs = [(AgentRun(label, Path(out_dir) / label), wanted) for label, wanted in sorted(settings.items())]
    with contextlib.ExitStack() as held:
        locks = [_hold_run(held, run, records) for run, _ in runs]  # label order: no two processes wait in a circle
        unclaimed = [(run, wanted) for (run, wanted), (_, alone) in zip(runs, locks) if _to_claim(run, wanted, alone)]
        for run, wanted in unclaimed:
            write_json(run.settings_path, wanted)
        for (run, wanted), (lock, alone) in zip(runs, locks):
            if alone:
                _share_run(lock, run, wanted)
        yield


def _hold_run(held: contextlib.ExitStack, run: AgentRun, records: str) -> tuple[int, bool]:
    """Lock ``run``'s folder for this process until ``held`` closes; returns the run.json lock and
    whether no other process holds the label.

    Locks are ``flock``s, which the kernel drops when their process ends however it ends: a
    killed evaluation leaves its lock files behind but holds nothing, and a re-run claims the
    label at once (the pid in a lock file only names its holder in errors). ``<records>.lock``:
    one process per records file, or two would walk the same episodes; ``RunClaimedError`` at
    once. ``run.json.lock``: exclusive while this process is the only one there (it may then
    write run.json), otherwise shared with the label's other shards (waiting the moment another
    one takes to claim)."""
    run.directory.mkdir(parents=True, exist_ok=True)
    walker = run.directory / f"{records}.lock"
    fd = lock_file(held, walker, fcntl.LOCK_EX | fcntl.LOCK_NB)
    if fd is None:
        raise RunClaimedError(f"{run.directory}: run {run.name!r} is being walked by another process "
                              f"({holder(walker)}, writing {records}): wait for it to finish, or give another "
                              f"--label or --out")
    sign(fd)
    settings_lock = run.directory / f"{run.settings_path.name}.lock"
    fd = lock_file(held, settings_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    if fd is not None:
        return fd, True
    return lock_file(held, settings_lock, fcntl.LOCK_SH), False


def _share_run(fd: int, run: AgentRun, wanted: dict) -> None:
    """After claiming ``run`` alone, let its other shards in: the run.json lock goes from exclusive
    to shared. ``flock`` may drop the lock before it takes it again, so a process that came at
    that moment may have claimed the label: ``RunClaimedError`` unless run.json is still ours."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _claimed(run, "claimed it at the same moment") from None
    except OSError:  # no locks on this file system (``lock_file`` said so)
        return
    if not _agrees(read_run_settings(run.settings_path), wanted):
        raise _claimed(run, "claimed it at the same moment")


def _claimed(run: AgentRun, what: str) -> RunClaimedError:
    return RunClaimedError(f"{run.directory}: another process {what} (run {run.name!r}): wait for it to finish, "
                           f"or give another --label or --out")


def _agrees(stored: dict, wanted: dict) -> bool:
    """Whether run.json's ``stored`` settings are ``wanted`` (inputs not recorded yet count as agreeing)."""
    return {**stored, "inputs": stored.get("inputs", wanted["inputs"])} == wanted


def _to_claim(run: AgentRun, wanted: dict, alone: bool = True) -> bool:
    """Whether ``run``'s run.json is to be written with ``wanted`` (``claim_runs``); raises
    ``RunSettingsError`` where its records were made otherwise, ``RunClaimedError`` where another
    process holds the label (not ``alone``) and run.json is not ``wanted`` (only a process alone
    there writes it)."""
    if not run.settings_path.is_file():
        finished = len(run.finished())
        if finished:
            raise RunSettingsError(f"{run.directory} holds {finished} finished episodes with no run.json: "
                                   f"an older trajrag's, scored inside the goal region only ({_LEGACY_FORMAT}); they "
                                   f"would mix with episodes scored as {wanted['format']}: give another --label or "
                                   f"--out (the records are untouched)")
        if not alone:
            raise _claimed(run, "is claiming it")
        return True
    stored = read_run_settings(run.settings_path)
    if _agrees(stored, wanted):
        return "inputs" not in stored and alone
    finished = len(run.finished())
    if not finished:  # a run that failed before its first episode (a bad path, a bad --set): nothing to mix
        if not alone:
            raise _claimed(run, f"walks it with other settings ({_settings_diff(stored, wanted)})")
        print(f"note: {run.settings_path}: its run finished no episode; claimed again with these settings "
              f"({_settings_diff(stored, wanted)})", file=sys.stderr)
        return True
    raise RunSettingsError(f"{run.directory} was run with other settings ({_settings_diff(stored, wanted)}); its "
                           f"{finished} finished episodes would mix with these: give another --label or --out, or "
                           f"the same settings to resume")


def _settings_diff(stored: dict, wanted: dict) -> str:
    """``key: stored -> wanted`` for each difference (``(default)`` where a key was not set,
    ``(not recorded)`` where an input was not)."""
    diffs = []
    if stored.get("format") != wanted["format"]:
        diffs.append(f"format: {stored.get('format')} -> {wanted['format']} (success scored differently, "
                     f"agent/evaluate.py RUN_SETTINGS_FORMAT)")
    if stored.get("planner") != wanted["planner"]:
        diffs.append(f"planner: {stored.get('planner')} -> {wanted['planner']}")
    if stored.get("lifelong", False) != wanted.get("lifelong", False):
        diffs.append(f"lifelong: {stored.get('lifelong', False)} -> {wanted.get('lifelong', False)}")
    inputs = [dict(config.dotted(run.get("inputs", {}))) for run in (stored, wanted)]
    for prefix, unset, before, after in (("", "(default)", stored.get("overrides", {}), wanted["overrides"]),
                                         ("inputs.", "(not recorded)", *inputs)):
        diffs += [f"{prefix}{key}: {before.get(key, unset)} -> {after.get(key, unset)}"
                  for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]
    return "; ".join(diffs)


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
            record = _record(result, agent)
            if audited is not None:
                record["decisions"] = audited.records()
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            done[(record["scene_key"], record["episode_id"])] = record
            if on_episode is not None:
                on_episode(record, agent)
    wanted = sorted({(e.scene_key, str(e.episode_id)) for e in episodes})
    summary = summarize([_metrics(done[key]["metrics"]) for key in wanted])
    summary.update(planner_counters([done[key] for key in wanted]))
    summary.update(perception_counters([done[key] for key in wanted]))
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


def _record(result: EpisodeResult, agent) -> dict:
    """The JSONL record of one episode: metrics, raw trajectory (poses, actions, outcome) and,
    for agents that map what they see, the topo-polar trajectory and its description."""
    record = result.to_dict()
    if hasattr(agent, "topo_trajectory"):
        from trajrag.topo.describe import describe

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
    metrics = record["metrics"]
    if not math.isfinite(metrics["distance_to_goal"]):
        metrics["distance_to_goal"] = None  # JSON has no inf; read back as unreachable
    return record


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


def _metrics(stored: dict) -> EpisodeMetrics:
    """A record's ``metrics`` as ``EpisodeMetrics`` (a null distance to goal read back as
    unreachable); ``RecordsError`` names the episode where they are not all there, or not of
    their types. Keys of newer records that it does not know are left out."""
    problem = metrics_problem(stored) if isinstance(stored, dict) else f"expected a JSON object, got {_shown(stored)}"
    if problem:
        where = "/".join(str(stored.get(k)) for k in ("scene_key", "episode_id")) if isinstance(stored, dict) else "?"
        raise RecordsError(f"episode record {where}: {problem}")
    known = {key: stored[key] for key in SUMMARY_METRICS}
    dtg = known["distance_to_goal"]
    return EpisodeMetrics(**{**known, "distance_to_goal": math.inf if dtg is None else dtg})


def _json_default(value):
    return None if isinstance(value, float) and not math.isfinite(value) else str(value)


def write_results_table(summaries: dict[str, dict], out_dir: Path) -> str:
    """``results.md`` and ``results.csv`` with one row per agent; returns the markdown."""
    audited = any(s.get(k) is not None for s in summaries.values() for k in AUDIT_COLUMNS)
    columns = TABLE_COLUMNS + (AUDIT_COLUMNS if audited else ())
    rows = [{"agent": name, **{k: s.get(k) for k in columns[1:]}} for name, s in summaries.items()]
    with (Path(out_dir) / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row[c]) for c in columns) + " |")
    markdown = "\n".join(lines) + "\n"
    paired = paired_differences(Path(out_dir), list(summaries), baseline="frontier")
    if paired:
        markdown += "\n" + paired
    (Path(out_dir) / "results.md").write_text(markdown)
    return markdown


def paired_differences(out_dir: Path, runs: Sequence[str], baseline: str, resamples: int = 2000,
                       seed: int = 0) -> str:
    """Markdown: each run's SR and SPL minus ``baseline``'s on the episodes both finished, with a
    95% bootstrap interval over those episodes (paired: the same episodes, so the spread of
    episode difficulty cancels). Empty when the baseline has no records."""
    try:
        comparisons = [c for c in compare_runs([Path(out_dir)], baseline, [r for r in runs if r != baseline],
                                               resamples, seed, missing_ok=True) if c.episodes]
    except RecordsError as exc:  # another run's damaged records cost this table its pairs, not more
        print(f"warning: no paired differences in {Path(out_dir) / 'results.md'}: {exc}", file=sys.stderr)
        return ""
    except ValueError:  # with missing_ok, only a baseline without records
        return ""
    lines = [f"Paired differences vs {baseline} (same episodes; 95% bootstrap interval):", "",
             "| run | episodes | d_sr | d_spl |", "|---|---|---|---|"]
    for c in comparisons:
        cells = [f"{d:+.3f} [{low:+.3f}, {high:+.3f}]" for d, (low, high) in ((c.d_sr, c.d_sr_interval),
                                                                             (c.d_spl, c.d_spl_interval))]
        lines.append(f"| {c.run} | {c.episodes} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


@dataclass
class PairedComparison:
    """One run against a baseline on the episodes both finished, pooled over evaluation folders
    (folds, episode seeds): SR and SPL as fractions, differences run - baseline with a 95%
    paired bootstrap interval, and the differences within each folder."""

    run: str
    baseline: str
    episodes: int
    sr: float
    spl: float
    baseline_sr: float
    baseline_spl: float
    d_sr: float
    d_sr_interval: tuple[float, float]
    d_spl: float
    d_spl_interval: tuple[float, float]
    folders: list[dict]
    # world settings (WORLD_SECTIONS) and run.json formats on which the run and the baseline differ,
    # per folder (``world_differences``)
    warnings: list[str] = field(default_factory=list)


def compare_runs(out_dirs: Sequence[Path], baseline: str, runs: Sequence[str] | None = None,
                 resamples: int = 2000, seed: int = 0, missing_ok: bool = False) -> list[PairedComparison]:
    """Pair each run's episode records with ``baseline``'s in every ``trajrag eval --out`` folder of
    ``out_dirs`` (by scene and episode id, within a folder only: episode ids repeat across
    generated seeds) and pool the pairs. ``runs``: labels to compare (None: every run found beside
    the baseline). ``ValueError`` names what is missing (a folder, the baseline, a run with no
    episode shared with the baseline) unless ``missing_ok``, which keeps such a run with 0 episodes."""
    folders = [Path(d) for d in out_dirs]
    for folder in folders:
        if not folder.is_dir():
            raise ValueError(f"{folder}: no such evaluation folder (trajrag eval --out)")
    bases = {folder: AgentRun(baseline, folder / baseline).finished(PAIRED_METRICS) for folder in folders}
    if not any(bases.values()):
        raise ValueError(f"no records of the baseline {baseline!r} in {', '.join(map(str, folders))}")
    if runs is None:
        found = sorted({p.parent.name for f in folders for p in f.glob("*/episodes*.jsonl")})
        runs = [label for label in found if label != baseline]
        if not runs:
            raise ValueError(f"no run to compare with the baseline {baseline!r} in {', '.join(map(str, folders))}: "
                             f"the runs with records there are {found}")
    return [_compare_one(run, baseline, folders, bases, resamples, seed, missing_ok) for run in runs]


def _compare_one(run: str, baseline: str, folders: Sequence[Path], bases: dict, resamples: int, seed: int,
                 missing_ok: bool) -> PairedComparison:
    """``compare_runs`` for one run: (success, spl) of baseline and run on each shared episode."""
    rows, per_folder, warnings = {}, [], []
    for folder in folders:
        pairs = _paired_records(folder, run, bases[folder])
        base = np.array([_success_spl(theirs) for _, theirs in pairs]).reshape(-1, 2)
        mine = np.array([_success_spl(ours) for ours, _ in pairs]).reshape(-1, 2)
        rows[folder] = (base, mine)
        if pairs:
            d = (mine - base).mean(axis=0)
            per_folder.append({"folder": str(folder), "episodes": len(pairs), "d_sr": float(d[0]),
                               "d_spl": float(d[1])})
            warnings += [f"{folder}: {difference}" for difference in world_differences(folder, run, baseline)]
    # Pooled in path order, not argument order: the bootstrap draws index rows, so the same folders
    # given in another order must stack the same way to give the same interval.
    pooled = [rows[folder] for folder in sorted(rows, key=lambda f: str(f.resolve()))]
    base, mine = (np.vstack([pair[i] for pair in pooled]) for i in (0, 1))
    if not len(base) and not missing_ok:
        raise ValueError(f"run {run!r} shares no finished episode with {baseline!r} in "
                         f"{', '.join(map(str, folders))}")
    rng = np.random.default_rng([seed, zlib.crc32(run.encode())])  # the same interval in any table
    intervals = [paired_interval(mine[:, i] - base[:, i], rng, resamples) if len(base) else (math.nan, math.nan)
                 for i in range(2)]
    base_mean, run_mean = (base.mean(axis=0), mine.mean(axis=0)) if len(base) else (np.full(2, math.nan),) * 2
    return PairedComparison(run=run, baseline=baseline, episodes=len(base),
                            sr=float(run_mean[0]), spl=float(run_mean[1]),
                            baseline_sr=float(base_mean[0]), baseline_spl=float(base_mean[1]),
                            d_sr=float(run_mean[0] - base_mean[0]), d_sr_interval=intervals[0],
                            d_spl=float(run_mean[1] - base_mean[1]), d_spl_interval=intervals[1],
                            folders=per_folder, warnings=warnings)


def _paired_records(folder: Path, run: str, baseline_records: dict) -> list[tuple[dict, dict]]:
    """(run's record, baseline's record) of each episode both finished in ``folder``, in key order
    (``baseline_records``: the baseline's ``AgentRun.finished()`` there, read once for every run)."""
    mine = AgentRun(run, folder / run).finished(PAIRED_METRICS)
    return [(mine[key], baseline_records[key]) for key in sorted(set(baseline_records) & set(mine))]


def world_differences(folder: Path, run: str, baseline: str) -> list[str]:
    """``key: run's value vs baseline's`` for each world setting (``WORLD_SECTIONS``) on which the
    two runs' run.json in ``folder`` differ, and their format when it differs (success was scored
    another way; a run with no run.json counts as ``_LEGACY_FORMAT``); none when a run.json is
    unreadable or of another shape (``claim_runs`` names that one)."""
    stored = []
    for label in (run, baseline):
        path = AgentRun(label, folder / label).settings_path
        try:
            stored.append(read_run_settings(path))
        except FileNotFoundError:  # walked before run.json existed
            stored.append({"format": _LEGACY_FORMAT})
        except (OSError, RunSettingsError):
            return []
    formats = [s.get("format") for s in stored]
    mine, theirs = ({k: v for k, v in s.get("overrides", {}).items() if k.split(".")[0] in WORLD_SECTIONS}
                    for s in stored)
    notes = [f"format: {formats[0]} ({run}) vs {formats[1]} ({baseline}): success scored differently"] \
        if formats[0] != formats[1] else []
    return notes + [f"{key}: {mine.get(key, '(default)')} ({run}) vs {theirs.get(key, '(default)')} ({baseline})"
                    for key in sorted(set(mine) | set(theirs)) if mine.get(key) != theirs.get(key)]


def _success_spl(record: dict) -> tuple[float, float]:
    return float(record["metrics"]["success"]), float(record["metrics"]["spl"])


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if math.isfinite(value) else "-"
    return "-" if value is None else str(value)


def render_episode_png(scenes: Sequence[Scene], out_dir: Path, agents: Sequence[str], path: Path) -> Path | None:
    """A picture of the first recorded episode with every agent's walk over the scene (None if
    no agent has recorded it)."""
    records = {name: AgentRun(name, Path(out_dir) / name).finished() for name in agents}
    first = next((key for r in records.values() for key in r), None)
    if first is None:
        return None
    scene = next(s for s in scenes if s.name == first[0])
    return _render_walks(scene, {name: recs[first] for name, recs in records.items() if first in recs}, path)


def _render_walks(scene: Scene, records: dict[str, dict], path: Path, title: str = "") -> Path:
    """``records`` (agent name -> one episode's record) drawn as walks over ``scene``, the goal outlined."""
    from trajrag.world.viz import render_scene_png

    tracks = {}
    for name, rec in records.items():
        m = rec["metrics"]
        verdict = "success" if m["success"] else rec["outcome"]
        tracks[f"{name} ({verdict}, SPL {m['spl']:.2f}, {m['steps']} steps)"] = [p[:2] for p in rec["poses"]]
    first = next(iter(records.values()))
    return render_scene_png(scene, path, paths=tracks, goal=first["category"],
                            title=f"{title}{scene.name} episode {first['episode_id']}: find {first['category']}")


@dataclass(frozen=True)
class EpisodePair:
    """One episode as walked by a run and by its baseline, in one evaluation folder (their records)."""

    folder: Path
    run: dict
    baseline: dict

    @property
    def d_spl(self) -> float:
        return float(self.run["metrics"]["spl"]) - float(self.baseline["metrics"]["spl"])


def discordant_pairs(out_dirs: Sequence[Path], baseline: str, run: str) -> tuple[list[EpisodePair], list[EpisodePair]]:
    """The episodes that one of ``run`` and ``baseline`` succeeded in and the other failed, over every
    folder (paired within a folder, as ``compare_runs``): ``(lost, won)``, lost where the baseline
    succeeded, each with the largest SPL difference first. Where a planner loses is seen in these."""
    lost, won = [], []
    for folder in map(Path, out_dirs):
        baseline_records = AgentRun(baseline, folder / baseline).finished(PAIRED_METRICS)
        for ours, theirs in _paired_records(folder, run, baseline_records):
            pair = EpisodePair(folder, ours, theirs)
            succeeded = (bool(ours["metrics"]["success"]), bool(theirs["metrics"]["success"]))
            if succeeded == (False, True):
                lost.append(pair)
            elif succeeded == (True, False):
                won.append(pair)
    return sorted(lost, key=lambda p: p.d_spl), sorted(won, key=lambda p: -p.d_spl)


def render_pair_png(scene: Scene, pair: EpisodePair, run: str, baseline: str, path: Path) -> Path:
    """One episode of ``pair`` with both walks over ``scene`` and the goal outlined (PNG at ``path``)."""
    return _render_walks(scene, {run: pair.run, baseline: pair.baseline}, path, title=f"{pair.folder}\n")
