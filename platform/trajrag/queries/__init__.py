"""Query kinds as Embodied-RAG defines them (seed 002, issue 47): what a user asks the robot.

* **explicit**: a goal category ("find a bed"), the ObjectNav episode as it is;
* **implicit**: a need ("somewhere to sleep"), resolved to a goal category by the offline text
  encoder against a fixed, tested table of needs (``queries.implicit``: ``implicit.py``);
* **global**: a question about the whole home ("which object categories are in this home", "how
  many beds"), answered from the home's memory and scored against the scene (``inventory.py``).

Explicit and implicit queries are navigation episodes (``trajrag eval --queries``); global
questions are answered from a revisit memory (``trajrag eval --revisit K --global-questions``).
"""

from __future__ import annotations

from dataclasses import dataclass

EXPLICIT = "explicit"
IMPLICIT = "implicit"
KINDS = (EXPLICIT, IMPLICIT)


class QueryError(ValueError):
    """A query the benchmark cannot ask: a need outside the table, a goal with no need."""


@dataclass
class QueryConfig:
    """``configs/queries.yaml``: the query kind of an evaluation run, the table of needs, and how
    global questions read a memory (distances in metres)."""

    kind: str
    implicit: dict[str, list[str]]
    sighting_distance_m: float
    count_merge_radius_m: float
