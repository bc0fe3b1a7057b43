"""A picture of one memory group: its summary graph in the group frame, with every member
trajectory moved into that frame and coloured by the scene it came from.

A group that mixes homes (a false merge) shows as two colours on one summary; a home split over
several groups shows as small groups of one colour. ``trajrag corpus show`` writes it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from trajrag.memory.se2 import Transform2D  # noqa: E402
from trajrag.memory.store import MemoryStore, StoreError  # noqa: E402

# Scenes drawn with their own colour and legend entry; the rest share grey.
_MAX_SCENE_COLOURS = 10
# Summary node marker area per member trajectory that visited the node, points^2.
_NODE_AREA_PER_VISIT = 6.0


def pick_group(store: MemoryStore, which: str) -> int:
    """A group id from ``which``: a number, ``largest`` (most members) or ``mixed`` (the largest
    group whose members come from more than one scene)."""
    if which.lstrip("-").isdigit():
        return int(which)
    groups = store.list_groups()
    if not groups:
        raise StoreError(f"memory store {store.uri} holds no groups")
    if which == "mixed":
        groups = [g for g in groups if len(set(h for h in (g["scene_hints"] or []) if h)) > 1]
        if not groups:
            raise StoreError(f"memory store {store.uri}: no group mixes scenes")
    elif which != "largest":
        raise ValueError(f"--group must be a group id, 'largest' or 'mixed', got {which!r}")
    return int(max(groups, key=lambda g: (g["n_members"], -g["group_id"]))["group_id"])


def render_group_png(store: MemoryStore, group_id: int, path: str | Path, *, dpi: int = 110) -> Path:
    """Write the picture of group ``group_id`` (PNG, metres in the group frame); return the path."""
    summary = store.get_summary(group_id)
    if summary is None:
        raise StoreError(f"memory store {store.uri}: no group {group_id}")
    chunks = store.get_group_chunks(group_id)
    scenes = Counter(c["scene_hint"] or "?" for c in chunks)
    colours = {s: plt.cm.tab10(i) for i, (s, _) in enumerate(scenes.most_common(_MAX_SCENE_COLOURS))}
    fig, ax = plt.subplots(figsize=(6.4, 6.0))
    nodes = np.asarray(summary["node_xy"], dtype=np.float64).reshape(-1, 2)
    for a, b in np.asarray(summary["edges"], dtype=np.int64).reshape(-1, 2):
        ax.plot(nodes[[a, b], 0], nodes[[a, b], 1], color="0.75", lw=3, zorder=1)
    ax.scatter(nodes[:, 0], nodes[:, 1], s=_NODE_AREA_PER_VISIT * np.asarray(summary["node_count"]),
               color="0.35", zorder=2, label=f"summary: {len(nodes)} nodes")
    labelled: set[str] = set()
    for chunk in chunks:
        scene = chunk["scene_hint"] or "?"
        moved = Transform2D(*chunk["group_transform"]).apply(np.asarray(chunk["node_xy"]).reshape(-1, 2))
        label = None
        if scene in colours and scene not in labelled:
            label = f"{scene} ({scenes[scene]})"
            labelled.add(scene)
        ax.plot(moved[:, 0], moved[:, 1], "-o", ms=2, lw=1, alpha=0.7, zorder=3,
                color=colours.get(scene, "0.5"), label=label)
    majority = scenes.most_common(1)[0][1] / max(len(chunks), 1)
    ax.set_title(f"group {group_id}: {len(chunks)} trajectories from {len(scenes)} scene(s), "
                 f"majority share {majority:.2f}", fontsize=9)
    ax.set_xlabel("x (m, group frame)")
    ax.set_ylabel("y (m, group frame)")
    ax.set_aspect("equal", adjustable="datalim")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    # format given: matplotlib would otherwise add ".png" to a name without a suffix, and the
    # path returned (and printed by `corpus show`) would not be the file written.
    fig.savefig(Path(path), dpi=dpi, format="png")
    plt.close(fig)
    return Path(path)
