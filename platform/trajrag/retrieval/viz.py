"""A picture of one TrajRAG decision: the map with the candidate paths and their scores, and the
top experiences retrieved for the chosen candidate (each a past topo-polar trajectory drawn in
its own frame, nodes coloured by the objects around them).

``render_decision_png`` draws one ``RecordedDecision`` (``agent.replay.record_decisions`` keeps
every decision of an episode walked by a retrieval-scoring agent).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from trajrag.retrieval.types import DecisionRetrieval  # noqa: E402

# grey levels of the map layers: unexplored, explored free, obstacle
_UNEXPLORED, _FREE, _OBSTACLE = 0.55, 0.95, 0.15
# Unexplored margin shown around the explored area, cells (1 m at 5 cm).
_MARGIN_CELLS = 20


@dataclass
class RecordedDecision:
    """What one decision saw: the planner context, the retrieval and the scores."""

    ctx: Any
    retrieval: DecisionRetrieval
    scores: np.ndarray
    choice: int

    @property
    def margin(self) -> float:
        """Best minus second-best score: how decisive the experience was."""
        s = np.sort(self.scores)[::-1]
        return float(s[0] - s[1]) if len(s) > 1 else 0.0


def _map_image(sem: Any) -> tuple[np.ndarray, tuple[float, float, float, float]]:
    grey = np.where(sem.obstacle, _OBSTACLE, np.where(sem.explored, _FREE, _UNEXPLORED))
    h, w = grey.shape
    x0, y0 = sem.origin
    return grey, (x0, x0 + w * sem.cell_size, y0, y0 + h * sem.cell_size)


def render_decision_png(decision: RecordedDecision, path: str | Path, *, n_experiences: int = 3,
                        dpi: int = 110) -> Path:
    """Write the decision picture (PNG) and return its path."""
    path = Path(path)
    ctx, retrieval = decision.ctx, decision.retrieval
    experiences = retrieval.experiences[decision.choice][:n_experiences] if retrieval.experiences else []
    fig, axes = plt.subplots(1, 1 + max(len(experiences), 1), figsize=(4.2 * (1 + max(len(experiences), 1)), 4.6),
                             gridspec_kw={"width_ratios": [2] + [1] * max(len(experiences), 1)})
    ax = axes[0]
    image, extent = _map_image(ctx.sem_map)
    ax.imshow(image, origin="lower", extent=extent, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    for i, candidate in enumerate(ctx.candidates):
        xy = np.asarray(candidate.trajectory.node_xy)
        chosen = i == decision.choice
        ax.plot(xy[:, 0], xy[:, 1], "-o", ms=2.5, lw=2.2 if chosen else 0.9,
                color="tab:red" if chosen else "tab:blue", alpha=1.0 if chosen else 0.6)
        ax.annotate(f"{decision.scores[i]:.2f}", xy[-1], fontsize=7, color="tab:red" if chosen else "tab:blue")
    ax.plot(ctx.pose.x, ctx.pose.y, "k^", ms=7)
    bbox = ctx.sem_map.explored_bbox(margin=_MARGIN_CELLS)
    if bbox is not None:  # the explored part, not the whole map the agent allocated
        r0, r1, c0, c1 = bbox
        x0, y0 = ctx.sem_map.origin
        cell = ctx.sem_map.cell_size
        ax.set_xlim(x0 + c0 * cell, x0 + c1 * cell)
        ax.set_ylim(y0 + r0 * cell, y0 + r1 * cell)
    ax.set_title(f"find {ctx.goal}: {len(ctx.candidates)} candidates (red: chosen, score)", fontsize=8)
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    for ax, exp in zip(axes[1:], experiences):
        _draw_experience(ax, exp, retrieval.names)
    if not experiences:
        axes[1].text(0.5, 0.5, "no experience retrieved", ha="center", va="center")
        axes[1].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _draw_experience(ax: Any, exp: Any, names: dict[int, str]) -> None:
    xy = np.asarray(exp.node_xy)
    ax.plot(xy[:, 0], xy[:, 1], "-", color="0.5", lw=1)
    labels = []
    for k, row in enumerate(np.asarray(exp.sectors)):
        objects = sorted({names.get(int(c), str(c)) for c in row if c >= 0})
        ax.plot(xy[k, 0], xy[k, 1], "o", ms=4, color="tab:green" if objects else "0.4")
        if objects and (k == len(xy) - 1 or k % 2 == 0):
            labels.append(ax.annotate(", ".join(objects[:3]), xy[k], fontsize=6))
    ax.plot(xy[-1, 0], xy[-1, 1], "*", ms=10, color="tab:red" if exp.success else "0.3")
    ax.set_aspect("equal", adjustable="datalim")
    verdict = "reached" if exp.success else "not reached"
    ax.set_title(f"{exp.goal} {verdict} | sim {exp.similarity:.2f}\n{exp.scene_hint}", fontsize=7)
    ax.tick_params(labelsize=6)
