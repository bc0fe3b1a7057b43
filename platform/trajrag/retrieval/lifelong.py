"""Lifelong mode: finished evaluation episodes go into the memory while the evaluation runs.

The paper's memory "natively supports dynamic updates at test time" but is frozen for its
tables; here it is an option (``trajrag eval --lifelong``) and measured: ``lifelong.csv`` holds,
after each episode, the running SR and SPL and the number of chunks in the store.

One process is the store's single writer: the evaluation inserts each finished episode's
topo-polar trajectory through ``TrajectoryMemory`` (same matching, grouping and redundancy rules
as a corpus build), writes its f_E embedding, and refreshes the retriever. The ids are
``lifelong/<run label>/<scene>/<episode>``, so a rerun never inserts an episode twice.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trajrag.memory.grouping import TrajectoryMemory
from trajrag.memory.store import MemoryStore

if TYPE_CHECKING:
    from trajrag.memory.grouping import MemoryConfig


class LifelongMemory:
    """An ``on_episode`` callback for ``agent.evaluate.evaluate_agent`` (see the module docstring);
    ``memory_cfg``: the ``memory`` section its insertions group by."""

    def __init__(self, retriever: Any, label: str, csv_path: Path, memory_cfg: MemoryConfig) -> None:
        self.retriever = retriever
        self.label = label
        writer_store = MemoryStore(retriever.store.uri)
        self.memory = TrajectoryMemory(writer_store, memory_cfg)
        self.csv_path = Path(csv_path)
        self.outcomes: list[tuple[bool, float]] = []

    def __call__(self, record: dict, agent: Any) -> None:
        success = bool(record["metrics"]["success"])
        tid = f"lifelong/{self.label}/{record['scene_key']}/{record['episode_id']}"
        # with its map, which a memory of maps (memory.summary_geometry) groups by
        trajectory = agent.topo_trajectory(success=success, with_place=True)
        decision = self.memory.insert(trajectory, trajectory_id=tid)
        self.memory.flush()
        if decision.action in ("new", "merge", "fuse"):
            z = self.retriever.encoder.encode_trajectories([trajectory])
            self.memory.store.update_embeddings([tid], z, self.retriever.encoder.version)
        self.retriever.refresh()
        self.outcomes.append((success, float(record["metrics"]["spl"])))
        self._append_row(decision.action)

    def _append_row(self, action: str) -> None:
        new_file = not self.csv_path.is_file()
        n = len(self.outcomes)
        with self.csv_path.open("a", newline="") as fh:
            writer = csv.writer(fh)
            if new_file:
                writer.writerow(["episodes_seen", "sr", "spl", "chunks", "last_action"])
            writer.writerow([n, sum(s for s, _ in self.outcomes) / n, sum(p for _, p in self.outcomes) / n,
                             len(self.retriever.ids), action])
