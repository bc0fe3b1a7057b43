"""``trajrag value fit``: learn which frontier leads to the goal from decisions in the memory's homes.

``trajrag value fit --scenes SCENES --episodes EPISODES --out VALUE.json [--json]`` walks the
episodes with nearest frontier, records every decision's candidates with their true cost to the
goal (hindsight in those homes), fits ``planners.frontier_value.FrontierValueModel`` on all but
the last ``value.held_out_share`` of the scenes, reports how it ranks the held-out decisions next
to nearest frontier, then fits on every scene and writes the model. The scoring planner uses it
with ``--set scoring.value_model=VALUE.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from trajrag.cli import UserError, add_override_arg
from trajrag.cli.episodes import EPISODES_HELP, SCENES_HELP


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("value", help="the frontier value learned from past decisions")
    actions = parser.add_subparsers(dest="value_command", required=True, metavar="ACTION")
    fit = actions.add_parser(
        "fit", help="collect decisions in train homes and fit the frontier value",
        description="Walk the episodes with nearest frontier; at every decision record each candidate's "
        "features (from the agent's map) and its true cost to the goal (the simulator's geodesic field: "
        "hindsight, as for the corpus's oracle walks). Fit on all but the held-out scenes "
        "(configs/value.yaml held_out_share), report the held-out ranking next to nearest frontier "
        "(best-pick rate, regret in metres, Spearman rho with nearness to the goal), then fit on every "
        "scene and write the model (JSON). Use train scenes: never the scenes you evaluate on.")
    fit.add_argument("--scenes", required=True, help=SCENES_HELP)
    fit.add_argument("--episodes", required=True, help=EPISODES_HELP)
    fit.add_argument("--out", required=True, help="model file to write (JSON)")
    fit.add_argument("--json", action="store_true", help="print one JSON object, no progress")
    add_override_arg(fit)
    fit.set_defaults(func=fit_command)


def fit_command(args: argparse.Namespace) -> int:
    report = fit_value(args.scenes, args.episodes, args.out, args.overrides, progress=not args.json)
    print(json.dumps({"out": args.out, **report}))
    if not args.json:
        print(f"wrote {args.out}: use it with --set scoring.value_model={args.out}", file=sys.stderr)
    return 0


def fit_value(scenes_spec: str, episodes_spec: str, out: str, overrides: list[str], progress: bool = True) -> dict:
    """Collect the decisions, report the held-out ranking, fit on every scene and write ``out``;
    returns the model's report (also stored in the file)."""
    from trajrag import config
    from trajrag.agent.value_data import collect_value_decisions
    from trajrag.planners.frontier_value import fit_value_model, ranking_quality
    from trajrag.world.datasets import load_episodes, load_scenes

    cfg = config.load("value", overrides)
    audit = config.load("audit", overrides)
    episode_cfg = config.load("episodes", overrides)
    scenes = load_scenes(scenes_spec, overrides)
    episodes = load_episodes(episodes_spec, scenes, overrides)
    if not episodes:
        raise UserError(f"no episodes in {episodes_spec!r} for {scenes_spec!r}")
    goals = list(episode_cfg.goal_categories)
    decisions, vocabulary = collect_value_decisions(scenes, episodes, goals, config.load("sim", overrides),
                                                    episode_cfg, audit, cfg, overrides, progress=progress)
    names = sorted({scene.name for scene in scenes})
    held_out = set(names[len(names) - math.ceil(len(names) * cfg.held_out_share):]) if len(names) > 1 else set()
    testing = [d for d in decisions if d.scene in held_out]
    report = {"scenes": len(names), "episodes": len(episodes), "decisions": len(decisions),
              "held_out_scenes": sorted(held_out)}
    try:
        if testing:
            model = fit_value_model([d for d in decisions if d.scene not in held_out], vocabulary, goals, cfg)
            report["held_out"] = {"value": ranking_quality(testing, model.score, audit.tolerance_m),
                                  "nearest_frontier": ranking_quality(testing, lambda x: -x[:, 0], audit.tolerance_m)}
        model = fit_value_model(decisions, vocabulary, goals, cfg)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    model.report.update(report, scenes_spec=scenes_spec, episodes_spec=episodes_spec)
    model.save(out)
    return model.report
