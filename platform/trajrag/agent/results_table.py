"""An evaluation folder as a reader sees it: ``results.md`` and ``results.csv`` (one row per run,
and each run's paired differences with nearest frontier) and pictures of one episode as several
runs walked it."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path
from typing import Sequence

from trajrag.agent.paired import EpisodePair, compare_runs
from trajrag.agent.run_records import AgentRun, RecordsError
from trajrag.world.scene import Scene


TABLE_COLUMNS = ("agent", "episodes", "sr", "spl", "dtg_m", "steps", "collisions", "planner_calls",
                 "fallbacks", "retrieval_ms_p50")
AUDIT_COLUMNS = ("decision_best_rate", "decision_score_rho")  # only when a run was audited


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


def render_pair_png(scene: Scene, pair: EpisodePair, run: str, baseline: str, path: Path) -> Path:
    """One episode of ``pair`` with both walks over ``scene`` and the goal outlined (PNG at ``path``)."""
    return _render_walks(scene, {run: pair.run, baseline: pair.baseline}, path, title=f"{pair.folder}\n")
