"""Runs compared episode by episode with a baseline: SR and SPL differences with paired
bootstrap intervals, pooled over evaluation folders (``trajrag compare``, the results table), the
world settings on which the two runs differ, and the episodes one run lost or won."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from trajrag.agent.run_claims import LEGACY_FORMAT, RunSettingsError, read_run_settings
from trajrag.agent.run_records import PAIRED_METRICS, AgentRun
from trajrag.bootstrap import paired_interval


# The sections that make the world and the episodes, the same for every planner: two runs paired
# episode by episode must agree on them (``compare_runs`` says where they do not).
WORLD_SECTIONS = ("sim", "episodes", "perception", "procedural", "gibson", "mp3d")


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
    another way; a run with no run.json counts as ``LEGACY_FORMAT``); none when a run.json is
    unreadable or of another shape (``claim_runs`` names that one)."""
    stored = []
    for label in (run, baseline):
        path = AgentRun(label, folder / label).settings_path
        try:
            stored.append(read_run_settings(path))
        except FileNotFoundError:  # walked before run.json existed
            stored.append({"format": LEGACY_FORMAT})
        except (OSError, RunSettingsError):
            return []
    formats = [s.get("format") for s in stored]
    mine, theirs = (_world_of(s) for s in stored)
    notes = [f"format: {formats[0]} ({run}) vs {formats[1]} ({baseline}): success scored differently"] \
        if formats[0] != formats[1] else []
    return notes + [f"{key}: {mine.get(key, '(default)')} ({run}) vs {theirs.get(key, '(default)')} ({baseline})"
                    for key in sorted(set(mine) | set(theirs)) if mine.get(key) != theirs.get(key)]


def world_overrides(folder: Path, label: str) -> list[str]:
    """The world settings (``WORLD_SECTIONS``) run ``label`` in ``folder`` was walked with, as
    ``--set`` strings from its run.json; none for a run walked before run.json existed.
    ``RunSettingsError`` names a run.json that cannot be read."""
    try:
        stored = read_run_settings(AgentRun(label, folder / label).settings_path)
    except FileNotFoundError:
        return []
    return [f"{key}={value}" for key, value in sorted(_world_of(stored).items())]


def _world_of(stored: dict) -> dict[str, str]:
    return {k: v for k, v in stored.get("overrides", {}).items() if k.split(".")[0] in WORLD_SECTIONS}


def _success_spl(record: dict) -> tuple[float, float]:
    return float(record["metrics"]["success"]), float(record["metrics"]["spl"])


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
