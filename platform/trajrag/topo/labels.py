"""Sector label codes (Eq. 2 of the paper): what a polar ray around a topo node hits first.

A code ``>= 0`` is a category id (an index into the map's ``categories``); the negative codes
are the three non-object outcomes. They are stored as int16 in sector vectors.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

FREE = -1
"""Nothing non-free within the sector radius: open space (a doorway or a room ahead)."""
OBSTACLE = -2
"""A mapped obstacle (wall, furniture not in any object channel)."""
UNKNOWN = -3
"""An unexplored cell (or the edge of the map)."""

SPECIAL_NAMES: dict[int, str] = {FREE: "free", OBSTACLE: "obstacle", UNKNOWN: "unknown"}
LABEL_DTYPE = np.int16


def label_name(code: int, categories: Sequence[str]) -> str:
    """Name of one label code: a category name, ``free``, ``obstacle`` or ``unknown``."""
    code = int(code)
    if code in SPECIAL_NAMES:
        return SPECIAL_NAMES[code]
    if 0 <= code < len(categories):
        return str(categories[code])
    raise ValueError(
        f"sector label {code} is neither a category id in [0, {len(categories)}) "
        f"nor one of {sorted(SPECIAL_NAMES)} ({', '.join(SPECIAL_NAMES.values())})"
    )


def label_names(codes: Iterable[int] | np.ndarray, categories: Sequence[str]) -> list[str]:
    """Names of label codes (any shape is flattened, in C order)."""
    return [label_name(c, categories) for c in np.asarray(codes).ravel()]


def is_object(codes: np.ndarray) -> np.ndarray:
    """Bool mask of the codes that are object categories."""
    return np.asarray(codes) >= 0
