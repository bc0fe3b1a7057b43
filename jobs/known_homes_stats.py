"""The retrieval figures of docs/known_homes_planners.md, from a jobs/known_homes_planners.sh folder:
per run, retrievals per decision, the milliseconds of one retrieval (median and largest: the
first of a goal in a process embeds its query), the decisions nearest frontier made for lack of
a target (``fallbacks``), and the planners' own counters; for the known-home memory, the
forest's nodes per home and the ``forest`` table's bytes.

    python jobs/known_homes_stats.py runs/known_homes
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

COUNTERS = ("contradicted", "exhausted", "backtracks", "subgoals", "landmarks", "memory_landmarks")


def run_stats(records: list[dict]) -> dict:
    decisions = sum(r.get("agent_stats", {}).get("planner_calls", 0) for r in records)
    stats = [r.get("planner_stats", {}) for r in records]
    timings = [t for s in stats for t in s.get("retrieval_ms", [])]
    out = {"episodes": len(records), "decisions": decisions,
           "retrievals_per_decision": round(len(timings) / max(decisions, 1), 3),
           "fallbacks": sum(s.get("fallbacks", 0) for s in stats),
           "retrieval_ms_p50": round(float(np.median(timings)), 2) if timings else None,
           "retrieval_ms_max": round(float(np.max(timings)), 1) if timings else None}
    hits = [s["first_target_sees_goal"] for s in stats if s.get("first_target_sees_goal") is not None]
    if hits:
        out["first_target_sees_goal"] = f"{sum(hits)}/{len(hits)}"
    built = [s["forest_ms"] for s in stats if s.get("forest_ms", 0) > 100]
    if built:
        out["forest_first_use_ms_p50"] = round(float(np.median(built)), 1)
    for name in COUNTERS:
        if any(name in s for s in stats):
            out[name] = sum(s.get(name, 0) for s in stats)
    return out


def forest_stats(store: Path) -> dict:
    import lancedb

    db = lancedb.connect(str(store))
    if "forest" not in db.list_tables().tables:
        return {"forests": 0}
    table = db.open_table("forest")
    rows = table.search().select(["scene", "build_key", "node", "level"]).limit(None).to_arrow().to_pylist()
    nodes, leaves = defaultdict(set), defaultdict(set)  # per forest (a second build's copy counts once)
    for row in rows:
        forest = (row["scene"], row["build_key"])
        nodes[forest].add(row["node"])
        if row["level"] == 0:
            leaves[forest].add(row["node"])
    sizes = [len(v) for v in nodes.values()]
    return {"forests": len(sizes), "nodes_per_home_mean": round(float(np.mean(sizes)), 1),
            "nodes_per_home_range": [min(sizes), max(sizes)],
            "leaves_per_home_mean": round(float(np.mean([len(v) for v in leaves.values()])), 1),
            "table_bytes": int(table.stats()["total_bytes"])}


def main(folder: str) -> None:
    root = Path(folder)
    runs = {}
    for records in sorted((root / "eval").glob("*/episodes.jsonl")):
        runs[records.parent.name] = run_stats([json.loads(line) for line in records.read_text().splitlines() if line.strip()])
    print(json.dumps({"runs": runs, "forest": forest_stats(root / "K")}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/known_homes")
