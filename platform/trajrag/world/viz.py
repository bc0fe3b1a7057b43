"""Pictures of scenes (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from trajrag.world.scene import Scene  # noqa: E402

# grey levels of the background layers: walls / outside dark, low unlabelled obstacles darker
# grey, floor the agent cannot stand on mid grey (the agent-radius margin along walls and
# furniture), traversable floor light
_WALL, _LOW, _FLOOR, _TRAVERSABLE = 0.15, 0.4, 0.62, 0.93
# tab20 without its two greys (indices 14, 15), which would read as floor or wall
_PALETTE = np.array([c for i, c in enumerate(plt.get_cmap("tab20").colors) if i not in (14, 15)])


def scene_image(scene: Scene) -> np.ndarray:
    """RGB float image (H, W, 3) of a scene: walls dark, traversable light, objects coloured by
    category (tab20 colours without greys, by category id)."""
    grey = np.where(scene.traversable, _TRAVERSABLE,
                    np.where(scene.floor, _FLOOR, np.where(scene.low_obstacle, _LOW, _WALL)))
    image = np.repeat(grey[..., None], 3, axis=2)
    has_object = scene.category_map >= 0
    image[has_object] = _PALETTE[scene.category_map[has_object] % len(_PALETTE)]
    return image


def render_scene_png(scene: Scene, path: str | Path, *, dpi: int = 110, show_rooms: bool = True,
                     paths: dict[str, np.ndarray] | None = None, title: str | None = None,
                     goal: str | None = None) -> Path:
    """Write a top-down picture of ``scene`` to ``path`` (PNG) and return the path.

    Drawn with ``origin="lower"`` in metres (map frame), a legend of the categories present, and
    room names from ``scene.meta["rooms"]`` when there are any. ``paths`` maps a label to an
    (N, 2) map-frame track in metres (an agent's walk), drawn with its start and end marked.
    ``goal``: a category whose objects are outlined in red (an episode's goal).
    """
    path = Path(path)
    h, w = scene.shape
    x0, y0 = scene.origin
    extent = (x0, x0 + w * scene.cell_size, y0, y0 + h * scene.cell_size)
    fig, ax = plt.subplots(figsize=(max(4.0, 7.0 * w / max(h, w)) + 2.5, max(4.0, 7.0 * h / max(h, w))))
    ax.imshow(scene_image(scene), origin="lower", extent=extent, interpolation="nearest")
    if show_rooms:
        for room in scene.meta.get("rooms", []):
            bx0, by0, bx1, by1 = room["bbox"]
            ax.text((bx0 + bx1) / 2, (by0 + by1) / 2, room["name"], ha="center", va="center",
                    fontsize=6, color="black", alpha=0.7)
    if goal is not None and goal in scene.categories:
        goal_cells = (scene.category_map == scene.category_id(goal)).astype(float)
        if goal_cells.any():
            xs = x0 + (np.arange(w) + 0.5) * scene.cell_size
            ys = y0 + (np.arange(h) + 0.5) * scene.cell_size
            ax.contour(xs, ys, goal_cells, levels=[0.5], colors="red", linewidths=1.2)
    lines = []
    for label, track in (paths or {}).items():
        track = np.asarray(track, dtype=float).reshape(-1, 2)
        (line,) = ax.plot(track[:, 0], track[:, 1], lw=1.4, label=label)
        ax.plot(track[0, 0], track[0, 1], "o", color=line.get_color(), ms=5)
        ax.plot(track[-1, 0], track[-1, 1], "*", color=line.get_color(), ms=9)
        lines.append(line)
    handles = lines + [Patch(color=_PALETTE[scene.category_id(c) % len(_PALETTE)], label=c) for c in scene.present_categories()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    ax.set_title(title or scene.name, fontsize=9)
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi, bbox_inches="tight")  # the legend sits outside the axes
    plt.close(fig)
    return path
