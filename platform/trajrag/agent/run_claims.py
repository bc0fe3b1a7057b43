"""What makes an evaluation run one run, and who may walk it: ``<out>/<label>/run.json`` (the
planner, the overrides it was given and what its memory, encoder and value paths held:
``run_settings``) checked on every resume, and the locks that keep a second process off a label
it would mix into (``claim_runs``)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Iterator, Sequence

from trajrag import artefacts, config
from trajrag.agent.names import RETRIEVING_AGENTS, VALUE_AGENTS
from trajrag.agent.run_records import AgentRun, shown, write_json
from trajrag.config import Settings
from trajrag.file_locks import holder, lock_file, sign
from trajrag.memory.store import MemoryStore


# /2: success counts a STOP under episodes.success_tolerance_m (0.1 m, habitat's) outside the goal
# region; /1 runs scored inside the region only, so their records neither resume nor pair with /2.
RUN_SETTINGS_FORMAT = "trajrag-eval-run/2"
# What records with no run.json were: walked before it existed, scored inside the region only.
LEGACY_FORMAT = "no run.json (before trajrag-eval-run/1)"
# How a job runs, not what an episode does, so a resumed run may change them: configs/eval_job.yaml
# (actors, batching, Serve) and configs/run.yaml (`trajrag run`'s sizes and workers; the memory and
# model it builds are named by their paths; run.json records their content too, ``run_inputs``).
JOB_SECTIONS = ("eval_job", "run")
# What run.json's keys hold, where present (``run_settings``; older files lack some).
_SETTINGS_TYPES = {"format": str, "planner": str, "overrides": dict, "inputs": dict, "lifelong": bool}
_JSON_NAMES = {str: "a string", dict: "a JSON object", bool: "true or false"}


class RunSettingsError(ValueError):
    """A run label asked to resume with settings other than those its records were made with."""


class RunClaimedError(RuntimeError):
    """A run label another live process holds: it writes the same records file, or walks the
    label with other settings, or claims it this very moment (``claim_runs``)."""


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
        return f"expected a JSON object, got {shown(stored)}"
    wrong = [f"{key} must be {_JSON_NAMES[kind]}, got {shown(stored[key])}"
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
                                   f"an older trajrag's, scored inside the goal region only ({LEGACY_FORMAT}); they "
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
                     f"agent/run_claims.py RUN_SETTINGS_FORMAT)")
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
