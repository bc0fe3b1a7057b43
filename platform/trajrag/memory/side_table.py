"""Tables kept beside the memory's own in its LanceDB database, outside the chunk journal: the
exploration walks' decisions (``memory.value_log``) and the build settings
(``memory.build_settings``). ``MemoryStore.compact`` compacts them with the memory's tables."""

from __future__ import annotations

import pyarrow as pa

from trajrag.memory.store import StoreError, open_committed


class SideTable:
    """A table kept beside the memory's own in its LanceDB database, outside the chunk journal
    (the exploration walks' decisions, the build settings): opened if it exists, created by the
    first ``append`` (also where a killed creation left its folder without a version). ``what``
    names it in the one-line ``StoreError`` a backend failure becomes."""

    def __init__(self, uri: str, name: str, what: str) -> None:
        import lancedb

        self.name = name
        try:
            self._db = lancedb.connect(uri)
            self.table = open_committed(self._db, [name]).get(name)
        except Exception as exc:  # noqa: BLE001 - any backend error becomes one clear line
            raise StoreError(f"memory store {uri}: {what} cannot be read: {exc}") from exc

    def read(self, columns: list[str], where: str | None = None) -> pa.Table | None:
        """Every row's ``columns`` (those matching the SQL ``where``), or None while the table
        does not exist."""
        if self.table is None:
            return None
        query = self.table.search() if where is None else self.table.search().where(where)
        return query.select(columns).limit(None).to_arrow()

    def append(self, rows: pa.Table) -> None:
        """Add ``rows`` (one LanceDB commit), creating the table with their schema the first time."""
        if self.table is None:
            self.table = self._db.create_table(self.name, rows)
        else:
            self.table.add(rows)
