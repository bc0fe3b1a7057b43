"""One memory per home: ``<out>/revisit/<home>/``, beside ``<out>/revisit/revisit.json``.

``revisit.json`` records what the memories were built with (walks per home, their seed and
policy, the walk plan, the memory and corpus settings, the encoder that embedded them): an
evaluation that would read them built otherwise is refused (``RevisitError``, naming the
differences), as a run label refuses a resume with other settings; give another ``--out``.
Building is resumable: a home's walks already stored are skipped (trajectory ids), and chunks
already embedded by the encoder are not embedded again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

from trajrag.memory.build_settings import differences
from trajrag.memory.store import CHUNKS, MemoryStore
from trajrag.revisit import RevisitError
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.scene import Scene

FOLDER = "revisit"
SETTINGS = "revisit.json"
FORMAT = "trajrag-revisit/1"

# collect(scene, walks, store_uri) -> summary: walk the episodes into the store (cli.corpus.collect_into)
Collect = Callable[[Scene, list, str], dict]
# embed(store_uri) -> chunks written: the encoder's embeddings into every chunk (encoder.evaluate.embed_store)
Embed = Callable[[str], int]


def home_folder(scene_name: str) -> str:
    """A scene name as one folder name (``gibson/Allensville/0`` -> ``gibson__Allensville__0``)."""
    return scene_name.replace("/", "__")


class HomeMemories:
    """The revisit memories of one evaluation folder (``<out>/revisit``)."""

    def __init__(self, out_dir: Path) -> None:
        self.root = Path(out_dir) / FOLDER

    def uri(self, scene_name: str) -> str:
        return str(self.root / home_folder(scene_name))

    def admit(self, settings: dict) -> None:
        """Record ``settings`` in ``revisit.json``, or check them against the recorded ones."""
        path = self.root / SETTINGS
        wanted = {"format": FORMAT, **settings}
        if path.is_file():
            stored = json.loads(path.read_text())
            diff = differences(stored, wanted)
            if diff:
                raise RevisitError(f"{self.root} holds memories built with other settings ({'; '.join(diff[:6])}"
                                   f"{'; ...' if len(diff) > 6 else ''}): give another --out")
            return
        self.root.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(wanted, indent=2, sort_keys=True) + "\n")
        temporary.replace(path)

    def build(self, plan: dict[str, list[ObjectNavEpisode]], scenes: Sequence[Scene], collect: Collect,
              embed: Embed | None, encoder_version: str | None) -> dict:
        """Walk each home's planned walks into its own memory, then embed its chunks (when
        ``embed``; skipped where every chunk already holds ``encoder_version``'s embedding).
        Returns per home ``{"chunks", "groups", "collected"}``."""
        by_name = {scene.name: scene for scene in scenes}
        built = {}
        for home, walks in plan.items():
            uri = self.uri(home)
            summary = collect(by_name[home], walks, uri)
            if embed is not None and not self._embedded(uri, encoder_version):
                embed(uri)
            built[home] = {"chunks": summary["chunks"], "groups": summary["groups"], "collected": summary["collected"]}
        return built

    @staticmethod
    def _embedded(uri: str, version: str | None) -> bool:
        store = MemoryStore(uri, read_only=True)
        try:
            versions = store.read(CHUNKS, ["encoder_version"]).column("encoder_version").to_pylist()
        finally:
            store.close()
        return bool(versions) and all(v == version for v in versions)

    def sizes(self, homes: Sequence[str]) -> dict[str, dict]:
        """Chunks, groups and bytes on disk of each home's memory."""
        sizes = {}
        for home in homes:
            store = MemoryStore(self.uri(home), read_only=True)
            try:
                sizes[home] = {"chunks": store.count(CHUNKS), "groups": store.count_groups(),
                               "bytes": int(sum(store.table_bytes().values()))}
            finally:
                store.close()
        return sizes
