"""How a memory's walks were collected: the world and sensor settings, kept beside its chunks.

An evaluation run records its settings in ``run.json`` and refuses to resume with others; a
memory does the same for the walks it holds. Table ``build_settings`` of the memory's LanceDB
database: one row per distinct set of settings that walks were added with (``recorded_at``,
``settings`` as sorted JSON: ``{"sim": {...}, "perception": {...}, "episodes": {...},
"datasets": [...]}``, ``agent.collect.collection_settings``). A build whose settings match a
recorded row adds walks; one that differs is refused, naming the keys, unless the caller asks for
a mixed memory, which records the new row beside the old ones. A store built before this table
existed has no row: its first build records its settings from then on. A setting added after
memories were built (``ADDED_LATER``) reads, in a row recorded without it, as the behaviour every
walk had before it existed.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa

from trajrag.memory.side_table import SideTable
from trajrag.memory.store import StoreError

TABLE = "build_settings"
# Settings added since the table exists -> the value that means "as every walk was made before".
ADDED_LATER = {"sim.allow_sliding": False}
SCHEMA = pa.schema([pa.field("recorded_at", pa.string(), nullable=False),
                    pa.field("settings", pa.string(), nullable=False)])


class BuildSettingsError(StoreError):
    """A build would add walks collected with other settings than the memory's."""


def flatten(settings: dict, prefix: str = "") -> dict[str, object]:
    """``{"sim": {"hfov_deg": 79}}`` -> ``{"sim.hfov_deg": 79}`` (lists are values)."""
    flat: dict[str, object] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def differences(stored: dict, wanted: dict) -> list[str]:
    """``key: stored -> wanted`` for every flattened key whose value differs (or is missing)."""
    a, b = flatten(stored), flatten(wanted)
    return [f"{key}: {a.get(key, '(unset)')!r} -> {b.get(key, '(unset)')!r}"
            for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]


class BuildSettings:
    """The ``build_settings`` table of the memory at ``uri`` (created on the first record)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._side = SideTable(uri, TABLE, "its build settings")

    def recorded(self) -> list[dict]:
        """Every recorded set of settings, oldest first (``recorded_at`` added to each)."""
        table = self._side.read(["recorded_at", "settings"])
        rows = [] if table is None else sorted(table.to_pylist(), key=lambda row: row["recorded_at"])
        return [{"recorded_at": row["recorded_at"], **json.loads(row["settings"])} for row in rows]

    def admit(self, settings: dict, allow_mixed: bool) -> None:
        """Record ``settings`` unless a row holds them already; ``BuildSettingsError`` naming the
        differing keys (against the newest row) when others are recorded and not ``allow_mixed``.
        Nothing is written when the build is refused."""
        recorded = [with_added_later({k: v for k, v in row.items() if k != "recorded_at"})
                    for row in self.recorded()]
        if _canonical(settings) in {_canonical(row) for row in recorded}:
            return
        if recorded and not allow_mixed:
            diff = differences(recorded[-1], settings)
            raise BuildSettingsError(
                f"memory store {self.uri}: its walks were collected with other settings ({'; '.join(diff)}); "
                "build into another store, or pass --mixed-settings to add these walks too (the store "
                "then records both sets)")
        row = pa.table({"recorded_at": [datetime.now(timezone.utc).isoformat()],
                        "settings": [_canonical(settings)]}, schema=SCHEMA)
        self._side.append(row)


def with_added_later(row: dict) -> dict:
    """``row`` with each ``ADDED_LATER`` key it lacks set to its earlier behaviour (sections the
    row has only; the row itself is not changed)."""
    row = json.loads(_canonical(row))
    for dotted, value in ADDED_LATER.items():
        section, key = dotted.split(".")
        if isinstance(row.get(section), dict):
            row[section].setdefault(key, value)
    return row


def _canonical(settings: dict) -> str:
    return json.dumps(settings, sort_keys=True, default=str)
