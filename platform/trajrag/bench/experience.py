"""``trajrag bench experience``: the retrieved-experience lookup at scale.

A LanceDB experience table of N past candidates (``retrieval.experience.write_experience``) with
the real feature width (``planners.frontier_value.feature_names`` of the agent's vocabulary and
goal categories) and goals drawn from them; the vectors are standardised Gaussian noise (a
fitted model standardises real ones the same way). Each timed decision is one
``ExperienceIndex.advantage`` call for ``candidates`` vectors, answered twice: by the table held
in memory (``experience_ms_*``, the default) and by a flat LanceDB query with a goal prefilter
(``lancedb_ms_*``, ``scoring.experience_in_memory=false``). Both are exact up to float32
rounding, which can swap two near-tied neighbours at the k-th place (each search does so about
once in 200 decisions against a float64 reference): ``agreement`` is the share of decisions whose
mean advantages match to 1 mm, ``max_difference_m`` the largest gap.
"""

from __future__ import annotations

import argparse
import shutil
import time
from dataclasses import dataclass

import numpy as np

from trajrag.bench import work_dir
from trajrag.config import Settings
from trajrag.planners.frontier_value import feature_names
from trajrag.retrieval.experience import ExperienceIndex, write_experience


@dataclass
class ExperienceBenchConfig:
    """``configs/experience_bench.yaml``."""

    rows: int
    quick_rows: int
    candidates: int
    decisions: int
    warmup: int
    seed: int


def run(args: argparse.Namespace, settings: Settings) -> dict:
    cfg = settings.experience_bench
    rows = int(getattr(args, "chunks", None) or (cfg.quick_rows if getattr(args, "quick", False) else cfg.rows))
    goals = list(settings.episodes.goal_categories)
    width = len(feature_names(settings.navigator.vocabulary, goals))
    k = settings.scoring.experience_k
    rng = np.random.default_rng(cfg.seed)
    goal_of = rng.integers(len(goals), size=rows)
    vectors = rng.normal(size=(rows, width)).astype(np.float32)
    advantage = rng.uniform(0.0, 20.0, size=rows).astype(np.float32)
    work = work_dir(args, "trajrag-bench-experience-")
    try:
        start = time.perf_counter()
        write_experience(f"{work}/x.experience", [goals[g] for g in goal_of], vectors, advantage)
        write_s = time.perf_counter() - start
        in_memory = ExperienceIndex(f"{work}/x.experience", width, k, in_memory=True)
        on_lancedb = ExperienceIndex(f"{work}/x.experience", width, k, in_memory=False)
        memory_ms, lance_ms, agree, differences = [], [], [], []
        for i in range(cfg.warmup + cfg.decisions):
            goal = int(rng.integers(len(goals)))
            queries = rng.normal(size=(cfg.candidates, width)).astype(np.float32)
            found, took_memory = _timed(in_memory.advantage, queries, goals[goal])
            queried, took_lance = _timed(on_lancedb.advantage, queries, goals[goal])
            if i >= cfg.warmup:
                memory_ms.append(took_memory)
                lance_ms.append(took_lance)
                agree.append(bool(np.allclose(found, queried, atol=1e-3)))
                differences.append(float(np.abs(found - queried).max()))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"experience_rows": rows, "features": width, "k": k, "candidates": cfg.candidates,
            "decisions": cfg.decisions, "write_s": round(write_s, 2),
            "experience_ms_p50": _percentile(memory_ms, 50), "experience_ms_p99": _percentile(memory_ms, 99),
            "lancedb_ms_p50": _percentile(lance_ms, 50), "lancedb_ms_p99": _percentile(lance_ms, 99),
            "speedup_p50": round(float(np.percentile(lance_ms, 50) / np.percentile(memory_ms, 50)), 1),
            "agreement": float(np.mean(agree)), "max_difference_m": round(max(differences), 4)}


def _timed(search, queries: np.ndarray, goal: str) -> tuple[np.ndarray, float]:
    start = time.perf_counter()
    found = search(queries, goal)
    return found, (time.perf_counter() - start) * 1e3


def _percentile(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 2)
