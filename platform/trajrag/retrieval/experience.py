"""Past frontier decisions, retrieved: how did candidates like this one turn out?

``trajrag value fit`` walks train homes and labels every candidate of every decision with its
true cost to the goal through its frontier (hindsight in those homes). Besides the fitted value
(a linear score, ``planners.frontier_value``), it keeps those candidates in a LanceDB table:
one row per candidate, its feature vector standardised with the value model's mean and scale,
its goal category and its *advantage*: the metres it was behind the best candidate of its
decision (0 for the best one, capped at ``value.experience_cap_m``).

At a decision, ``ExperienceIndex.advantage`` retrieves, for each candidate, the
``value.experience_k`` nearest past candidates searched for the same goal (exact L2 in the
standardised feature space) and returns their mean advantage: the metres a candidate like this
one was typically behind the best. The scoring planner subtracts ``w_experience`` times it. It is
non-parametric: it sees what the linear value cannot (a small frontier far away *and* opening on
unknown space) and grows with every walk collected.

LanceDB stores the table; the search runs on a copy held in memory, one float32 matrix per goal
(``scoring.experience_in_memory``, on: 18x faster than a flat LanceDB query with a goal
prefilter at 100k past candidates, 46x at 1M, `trajrag bench experience`; 1M candidates of 174
features are ~700 MB). Off, each decision is one multi-vector LanceDB query instead, for tables
larger than an evaluator's memory.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Callable

import numpy as np
import pyarrow as pa

from trajrag import artefacts
from trajrag.memory.store import sql_str

TABLE = "frontier_candidates"
VECTOR = "vector"


class ExperienceError(ValueError):
    """The experience table is missing, damaged, or was written for another value model."""


def experience_path(value_model: str | Path) -> str | Path:
    """Where the experience of a value model file lives: ``VALUE.experience`` beside ``VALUE.json``
    (a path beside a path, a URI beside a URI)."""
    name = PurePosixPath(str(value_model)).stem + ".experience"
    return artefacts.sibling(value_model, name) if artefacts.is_uri(value_model) else Path(value_model).with_name(name)


def write_experience(path: str | Path, goals: list[str], vectors: np.ndarray, advantage_m: np.ndarray) -> int:
    """Replace the table at ``path`` with one row per candidate: its goal, its standardised
    feature vector (float32) and its advantage in metres. Returns the row count."""
    import lancedb

    vectors = np.asarray(vectors, dtype=np.float32)
    if not (len(goals) == len(vectors) == len(advantage_m)) or vectors.ndim != 2:
        raise ExperienceError("experience rows: goals, vectors and advantages must have one entry per candidate")
    rows = pa.table({"goal": pa.array(goals, pa.string()),
                     VECTOR: pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), vectors.shape[1]),
                     "advantage_m": pa.array(np.asarray(advantage_m, dtype=np.float32))})
    db = lancedb.connect(str(path))
    # "overwrite" on a table that does not exist yet makes LanceDB log a warning on stderr.
    db.create_table(TABLE, rows, mode="overwrite" if TABLE in db.list_tables().tables else "create")
    return len(vectors)


class ExperienceIndex:
    """The experience table of one value model, searched per decision (module docstring)."""

    def __init__(self, path: str | Path, width: int, k: int, in_memory: bool = True) -> None:
        import lancedb

        self.path, self.k = Path(path), int(k)
        if self.k < 1:
            raise ExperienceError(f"value.experience_k must be >= 1, got {k}")
        missing = "no such folder; it is written beside the value model: copy both"
        try:
            if not self.path.is_dir():  # lancedb.connect would make it, empty
                raise FileNotFoundError(missing)
            self.table = lancedb.connect(str(self.path)).open_table(TABLE)
            field = self.table.schema.field(VECTOR)
        except (FileNotFoundError, ValueError, KeyError, OSError) as err:
            raise ExperienceError(f"{self.path}: no frontier experience table there ({err}); write it with "
                                  "`trajrag value fit`, or set scoring.w_experience=0") from None
        if field.type.list_size != width:
            raise ExperienceError(f"{self.path}: vectors of {field.type.list_size} features, the value model has "
                                  f"{width}: the table belongs to another model; fit it again with `trajrag value fit`")
        columns = ["goal", VECTOR, "advantage_m"] if in_memory else ["goal"]
        rows = self._read(lambda: self.table.search().select(columns).limit(None).to_arrow())
        self.rows = rows.num_rows
        goal_of = rows.column("goal").to_numpy(zero_copy_only=False)
        self.goals = set(goal_of.tolist())
        self.by_goal = _split_by_goal(rows, goal_of, width) if in_memory else None

    def advantage(self, vectors: np.ndarray, goal: str) -> np.ndarray:
        """float (C,): for each standardised candidate vector, the mean advantage (metres behind
        the best) of its ``k`` nearest past candidates with the same goal; 0 for a goal never
        seen in the table (no experience: no penalty)."""
        vectors = np.asarray(vectors, dtype=np.float32)
        if goal not in self.goals or not len(vectors):
            return np.zeros(len(vectors))
        if self.by_goal is not None:
            return self.by_goal[goal].mean_advantage(vectors, self.k)
        return self._lancedb_advantage(vectors, goal)

    def _read(self, query: Callable[[], pa.Table]) -> pa.Table:
        """``query()``; a damaged table (LanceDB raises RuntimeError, OSError, ...) becomes an
        ``ExperienceError`` naming it."""
        try:
            return query()
        except Exception as err:  # noqa: BLE001 - any backend read error becomes one clear line
            raise ExperienceError(f"{self.path}: the frontier experience table cannot be read ({err}); "
                                  "write it again with `trajrag value fit`, or set scoring.w_experience=0") from None

    def _lancedb_advantage(self, vectors: np.ndarray, goal: str) -> np.ndarray:
        """The same search as one multi-vector LanceDB query (flat, goal prefilter)."""
        result = self._read(
            lambda: (self.table.search(vectors if len(vectors) > 1 else vectors[0], vector_column_name=VECTOR)
                     .distance_type("l2").where(f"goal = {sql_str(goal)}", prefilter=True).bypass_vector_index()
                     .select(["advantage_m", "_distance"]).limit(self.k).to_arrow()))
        index = (result.column("query_index").to_numpy() if "query_index" in result.column_names
                 else np.zeros(result.num_rows, dtype=np.int64))
        advantage = result.column("advantage_m").to_numpy().astype(float)
        sums = np.bincount(index, weights=advantage, minlength=len(vectors))
        counts = np.bincount(index, minlength=len(vectors))
        return np.divide(sums, counts, out=np.zeros(len(vectors)), where=counts > 0)


class GoalRows:
    """One goal's past candidates in memory: vectors (N, F) float32 and advantages (N,) metres."""

    def __init__(self, vectors: np.ndarray, advantage_m: np.ndarray) -> None:
        self.vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self.squared_norms = np.einsum("ij,ij->i", self.vectors, self.vectors)
        self.advantage_m = np.asarray(advantage_m, dtype=float)

    def mean_advantage(self, queries: np.ndarray, k: int) -> np.ndarray:
        """Mean advantage of each query's ``k`` nearest rows (exact squared L2; all rows when
        fewer than ``k``)."""
        k = min(k, len(self.vectors))
        distance = self.squared_norms[None] - 2.0 * (queries @ self.vectors.T)  # + |q|^2: same order per query
        nearest = np.argpartition(distance, k - 1, axis=1)[:, :k]
        return self.advantage_m[nearest].mean(axis=1)


def _split_by_goal(rows: pa.Table, goal_of: np.ndarray, width: int) -> dict[str, GoalRows]:
    vectors = rows.column(VECTOR).combine_chunks().flatten().to_numpy().reshape(-1, width)
    advantage = rows.column("advantage_m").to_numpy()
    return {goal: GoalRows(vectors[goal_of == goal], advantage[goal_of == goal]) for goal in np.unique(goal_of)}
