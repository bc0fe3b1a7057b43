"""Paired bootstrap intervals, shared by the evaluation tables and the encoder's cross-validation."""

from __future__ import annotations

import numpy as np


def paired_interval(differences: np.ndarray, rng: np.random.Generator, resamples: int = 2000,
                    level: float = 0.95) -> tuple[float, float]:
    """The ``level`` percentile interval of the mean of ``differences`` (one per paired item:
    episode, query), resampling the items with replacement ``resamples`` times."""
    d = np.asarray(differences, dtype=np.float64)
    boot = d[rng.integers(len(d), size=(resamples, len(d)))].mean(axis=1)
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(boot, [tail, 100.0 - tail])
    return float(low), float(high)
