"""``trajrag run``: the main job on the embedded default (what ``make run`` calls).

Today: procedural val scenes -> generated ObjectNav episodes -> each agent in ``agents`` ->
per-episode records, a results table (markdown + CSV) and a picture of an episode. Re-running
the same command skips finished episodes.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from trajrag.cli import add_override_arg


@dataclass
class RunConfig:
    """``configs/run.yaml``: scenes and episodes specs (as in ``trajrag episodes check``), agent
    names, output folder."""

    scenes: str
    episodes: str
    agents: list[str]
    out: str


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "run",
        help="run the main job on the embedded default (make run)",
        description="Scenes -> episodes -> agents -> metrics table, offline. Defaults in configs/run.yaml.",
    )
    parser.add_argument("--scenes", help="scene spec (default: run.scenes)")
    parser.add_argument("--episodes", help="episode spec (default: run.episodes)")
    parser.add_argument("--agents", help="comma-separated agent names (default: run.agents)")
    parser.add_argument("--out", help="output folder (default: run.out)")
    parser.add_argument("--json", action="store_true", help="print the summaries as one JSON object")
    add_override_arg(parser)
    parser.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    from trajrag import config
    from trajrag.agent.evaluate import evaluate_agent, render_episode_png, write_results_table
    from trajrag.agent.registry import make_agent
    from trajrag.world.datasets import load_episodes, load_scenes
    from trajrag.world.sim import GridSimulator

    cfg: RunConfig = config.load("run", args.overrides)
    scene_spec = args.scenes or cfg.scenes
    episode_spec = args.episodes or cfg.episodes
    agents = args.agents.split(",") if args.agents else list(cfg.agents)
    out = Path(args.out or cfg.out)
    out.mkdir(parents=True, exist_ok=True)

    scenes = load_scenes(scene_spec, args.overrides)
    episodes = load_episodes(episode_spec, scenes, args.overrides)
    sim_cfg = config.load("sim", args.overrides)
    episode_cfg = config.load("episodes", args.overrides)
    sim = GridSimulator(sim_cfg)
    print(f"{len(scenes)} scenes, {len(episodes)} episodes -> {out}", file=sys.stderr)
    summaries = {}
    for name in agents:
        summaries[name] = evaluate_agent(
            name, lambda: make_agent(name, sim_cfg, args.overrides), sim, episodes, scenes, out,
            episode_cfg, progress=not args.json)
    table = write_results_table(summaries, out)
    picture = render_episode_png(scenes, out, agents, out / "episode.png")
    if args.json:
        print(json.dumps({"out": str(out), "summaries": summaries}, default=str))
    else:
        print(table)
        print(f"records: {out}/<agent>/episodes.jsonl  table: {out}/results.md  picture: {picture}")
    return 0
