"""The revisit benchmark (issue 47): ObjectNav in homes the robot has walked before.

``trajrag eval --revisit K``: before a home's episodes run, that home's own memory holds K earlier
walks of it, collected with the corpus policies (``agent/collect.py``, as ``trajrag corpus
build`` collects) on episodes that are never the evaluated ones (``walks.py``). Each home has a
memory of its own under ``<out>/revisit/`` (``memories.py``), so a retrieving planner in home A
reads only walks of home A; ``PerHomeAgent`` (``agent.py``) gives each episode the agent of its
home's memory. Planners that read no memory (nearest frontier) walk the same episodes as
without ``--revisit``.
"""

from __future__ import annotations

from dataclasses import dataclass


class RevisitError(ValueError):
    """A revisit benchmark that cannot be set up as asked (too few walks, memories of other settings)."""


@dataclass
class RevisitConfig:
    """``configs/revisit.yaml``: earlier walks per home (0: no revisit), their seed, corpus policy,
    and the spare draws that replace walks coinciding with evaluated episodes."""

    walks: int
    seed: int
    policy: str
    spare_walks: int
