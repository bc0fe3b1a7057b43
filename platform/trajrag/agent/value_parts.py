"""A value fit's walk that keeps each scene's decisions as soon as the scene is walked.

A rollout fit at cluster scale walks thousands of homes for tens of core-hours. ``trajrag value fit --save-decisions D.npz`` keeps each walked
scene in ``D.npz.parts/`` (one decisions file per scene, written whole or not at all). A killed
run, a lost node or a scene that raises then loses only the scenes still being walked, and the
same command resumes, walking only the scenes without a file. The settings the files were walked
with are kept beside them (``settings.json``) and a resume with other settings is refused once a
scene is kept: mixing two walkers' decisions in one fit would go unnoticed. Once every scene is in, ``D.npz`` is written
and the folder is removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Sequence

from trajrag.planners.frontier_value import ValueDecision, decisions_to_bytes, load_decisions

SETTINGS_FILE = "settings.json"


class ValueWalkError(RuntimeError):
    """A value fit's walk that cannot go on: its kept decisions were walked with other settings,
    or some scenes raised (the other scenes' decisions are kept)."""


class DecisionParts:
    """The per-scene decisions of one walk, in ``<target>.parts/`` (see the module docstring).

    settings: what the decisions depend on (scenes, episodes, overrides); JSON-serialisable."""

    def __init__(self, target: str | Path, settings: dict) -> None:
        self.folder = Path(f"{target}.parts")
        self.settings = json.loads(json.dumps(settings))  # as it reads back from the file

    def open(self, scenes: Sequence[str]) -> set[str]:
        """Create the folder, or check the settings of one made before; returns which of
        ``scenes`` are already kept. ``ValueWalkError`` when the settings differ and a scene is
        kept (a folder that keeps none, from a walk that failed at once, takes the new settings)."""
        path = self.folder / SETTINGS_FILE
        stored = json.loads(path.read_text()) if path.exists() else None
        if stored is not None and stored != self.settings and any(self.folder.glob("*.npz")):
            differ = sorted(k for k in set(stored) | set(self.settings) if stored.get(k) != self.settings.get(k))
            said = "; ".join(f"{k}: {stored.get(k)!r} there, {self.settings.get(k)!r} now" for k in differ)
            raise ValueWalkError(f"{self.folder}: its decisions were walked with other settings ({said}): "
                                 f"resume with those, or delete the folder, or give another --save-decisions")
        if stored != self.settings:
            self.folder.mkdir(parents=True, exist_ok=True)
            _write_whole(path, (json.dumps(self.settings, indent=2) + "\n").encode())
        return {scene for scene in scenes if self.path(scene).exists()}

    def path(self, scene: str) -> Path:
        """The file of ``scene``'s decisions: its name made safe, plus a hash (two names could
        make the same safe one)."""
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", scene)
        return self.folder / f"{safe}-{hashlib.sha1(scene.encode()).hexdigest()[:8]}.npz"

    def keep(self, scene: str, decisions: Sequence[ValueDecision], vocabulary: Sequence[str],
             goals: Sequence[str]) -> None:
        """Write ``scene``'s decisions (none is a result too: a walk may have no decision)."""
        _write_whole(self.path(scene), decisions_to_bytes(decisions, vocabulary, goals))

    def gather(self, scenes: Sequence[str]) -> tuple[list[ValueDecision], list[str], list[str]]:
        """Every kept scene's decisions, in the order of ``scenes``, with their vocabulary and goals."""
        decisions: list[ValueDecision] = []
        columns = set()
        for scene in scenes:
            found, vocabulary, goals = load_decisions(self.path(scene))
            decisions += found
            columns.add((tuple(vocabulary), tuple(goals)))
        if len(columns) != 1:
            raise ValueWalkError(f"{self.folder}: the scenes' decisions have different vocabularies or goals")
        vocabulary, goals = columns.pop()
        return decisions, list(vocabulary), list(goals)

    def remove(self) -> None:
        shutil.rmtree(self.folder)


def _write_whole(path: Path, data: bytes) -> None:
    """``data`` at ``path`` in one rename: a killed walk never leaves half a file."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)
