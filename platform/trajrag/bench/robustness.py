"""Robustness curves: SR and SPL against the detector's error level, with and without the defences.

``jobs/perception_curves.sh`` evaluates each planner at each error level into ``ROOT/level-<x>/``
(``x`` = ``perception.error_scale`` of the calibrated profile; 0 = exact semantics), once as shipped
with the perception preset (evidence in the map, verification before STOP: label ``<planner>``)
and once without them (label ``<planner>-unverified``). ``read_curves`` gathers their
``summary.json`` files; ``plot_curves`` draws them; ``recovered_share`` is the share of the SR the
errors cost a planner that its defences win back at one level.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen before pyplot loads)

LEVEL_PREFIX = "level-"
UNVERIFIED = "-unverified"


def read_curves(root: Path | str) -> dict:
    """``{"levels": [x...], "runs": {label: {"sr": [...], "spl": [...], "episodes": [...]}}}`` from
    every ``ROOT/level-<x>/<label>/summary.json`` (None where a run is missing at a level).
    ``ValueError`` if ``root`` holds no level folder."""
    root = Path(root)
    folders = sorted((p for p in root.glob(f"{LEVEL_PREFIX}*") if p.is_dir()),
                     key=lambda p: float(p.name[len(LEVEL_PREFIX):]))
    if not folders:
        raise ValueError(f"{root}: no {LEVEL_PREFIX}<error scale> folders (jobs/perception_curves.sh writes them)")
    levels = [float(p.name[len(LEVEL_PREFIX):]) for p in folders]
    labels = sorted({s.parent.name for p in folders for s in p.glob("*/summary.json")})
    runs = {label: {"sr": [], "spl": [], "episodes": []} for label in labels}
    for folder in folders:
        for label in labels:
            path = folder / label / "summary.json"
            summary = json.loads(path.read_text()) if path.is_file() else {}
            for key in ("sr", "spl", "episodes"):
                runs[label][key].append(summary.get(key))
    return {"levels": levels, "runs": runs}


def recovered_share(curves: dict, planner: str, level: float) -> float | None:
    """At ``level``: (SR with defences - SR without) / (SR at level 0 without - SR without), the
    share of the SR lost to the errors that the defences win back (None where a run is missing or
    the errors cost nothing)."""
    levels, runs = curves["levels"], curves["runs"]
    if level not in levels or 0.0 not in levels or planner not in runs or planner + UNVERIFIED not in runs:
        return None
    i, base = levels.index(level), levels.index(0.0)
    exact, unverified, verified = (runs[planner + UNVERIFIED]["sr"][base], runs[planner + UNVERIFIED]["sr"][i],
                                   runs[planner]["sr"][i])
    if None in (exact, unverified, verified) or exact - unverified <= 0:
        return None
    return (verified - unverified) / (exact - unverified)


def plot_curves(curves: dict, png: Path | str) -> Path:
    """SR and SPL against the error level, one line per run (dashed: without the defences)."""
    png = Path(png)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for label, run in sorted(curves["runs"].items()):
        style = "--" if label.endswith(UNVERIFIED) else "-"
        for axis, metric in zip(axes, ("sr", "spl")):
            points = [(x, y) for x, y in zip(curves["levels"], run[metric]) if y is not None]
            if points:
                axis.plot(*zip(*points), style, marker="o", label=label)
    for axis, metric in zip(axes, ("SR", "SPL")):
        axis.set_xlabel("detector error level (x the calibrated profile)")
        axis.set_ylabel(metric)
        axis.set_ylim(0, 1)
        axis.grid(alpha=0.3)
    episodes = [n for run in curves["runs"].values() for n in run["episodes"] if n]
    axes[0].set_title(f"success ({min(episodes) if episodes else 0}+ episodes per point)")
    axes[1].set_title("SPL")
    axes[1].legend(fontsize=8)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def robustness_report(root: Path | str, png: Path | str | None = None) -> dict:
    """The curves, the recovered share at each level for each planner, and the PNG's path."""
    curves = read_curves(root)
    planners = sorted({label[: -len(UNVERIFIED)] for label in curves["runs"] if label.endswith(UNVERIFIED)})
    recovered = {p: {str(x): recovered_share(curves, p, x) for x in curves["levels"] if x > 0} for p in planners}
    png = plot_curves(curves, png if png is not None else Path(root) / "curves.png")
    return {**curves, "recovered_share": recovered, "png": str(png)}
