"""``trajrag bench experience``: the retrieved-experience lookup at scale.

A LanceDB experience table of N past candidates (``retrieval.experience.write_experience``) with
the real feature width (``planners.frontier_value.feature_names`` of the agent's vocabulary and
goal categories) and goals drawn from them; the vectors are standardised Gaussian noise (a
fitted model standardises real ones the same way). Each timed decision is one
``ExperienceIndex.advantage`` call for ``candidates`` vectors; the same decisions are answered by
exact numpy search over the rows of that goal, and ``agreement`` is the share of decisions whose
mean advantages match (the LanceDB query is exact: flat search with a goal prefilter).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from trajrag import config


@dataclass
class ExperienceBenchConfig:
    """``configs/experience_bench.yaml``."""

    rows: int
    quick_rows: int
    candidates: int
    decisions: int
    warmup: int
    seed: int


def run(args: argparse.Namespace) -> dict:
    from trajrag.planners.frontier_value import feature_names
    from trajrag.retrieval.experience import ExperienceIndex, write_experience

    overrides = list(getattr(args, "overrides", []) or [])
    cfg: ExperienceBenchConfig = config.load("experience_bench", overrides)
    rows = int(getattr(args, "chunks", None) or (cfg.quick_rows if getattr(args, "quick", False) else cfg.rows))
    goals = list(config.load("episodes", overrides).goal_categories)
    width = len(feature_names(config.load("navigator", overrides).vocabulary, goals))
    k = config.load("scoring", overrides).experience_k
    rng = np.random.default_rng(cfg.seed)
    goal_of = rng.integers(len(goals), size=rows)
    vectors = rng.normal(size=(rows, width)).astype(np.float32)
    advantage = rng.uniform(0.0, 20.0, size=rows).astype(np.float32)
    work = tempfile.mkdtemp(prefix="trajrag-bench-experience-")
    try:
        start = time.perf_counter()
        write_experience(f"{work}/x.experience", [goals[g] for g in goal_of], vectors, advantage)
        write_s = time.perf_counter() - start
        index = ExperienceIndex(f"{work}/x.experience", width, k)
        lance_ms, numpy_ms, agree = [], [], []
        for i in range(cfg.warmup + cfg.decisions):
            goal = int(rng.integers(len(goals)))
            queries = rng.normal(size=(cfg.candidates, width)).astype(np.float32)
            start = time.perf_counter()
            found = index.advantage(queries, goals[goal])
            lance = (time.perf_counter() - start) * 1e3
            start = time.perf_counter()
            exact = _exact(queries, vectors[goal_of == goal], advantage[goal_of == goal], k)
            exact_ms = (time.perf_counter() - start) * 1e3
            if i >= cfg.warmup:
                lance_ms.append(lance)
                numpy_ms.append(exact_ms)
                agree.append(bool(np.allclose(found, exact, atol=1e-3)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"experience_rows": rows, "features": width, "k": k, "candidates": cfg.candidates,
            "decisions": cfg.decisions, "write_s": round(write_s, 2),
            "experience_ms_p50": round(float(np.percentile(lance_ms, 50)), 2),
            "experience_ms_p99": round(float(np.percentile(lance_ms, 99)), 2),
            "numpy_exact_ms_p50": round(float(np.percentile(numpy_ms, 50)), 2),
            "agreement": float(np.mean(agree))}


def _exact(queries: np.ndarray, rows: np.ndarray, advantage: np.ndarray, k: int) -> np.ndarray:
    """Mean advantage of each query's k nearest rows (squared L2), in numpy."""
    distance = (queries ** 2).sum(1)[:, None] - 2 * queries @ rows.T + (rows ** 2).sum(1)[None]
    nearest = np.argpartition(distance, min(k, len(rows)) - 1, axis=1)[:, :k]
    return advantage[nearest].mean(axis=1)
