"""``trajrag eval``: ObjectNav evaluation of planners and retrieval variants over a memory store.

Each (planner, variant) is one *run* labelled ``planner`` or ``planner-variant`` (or ``--label``):
its per-episode records go to ``<out>/<label>/episodes.jsonl`` (re-running skips finished
episodes), its summary to ``<out>/<label>/summary.json`` and the settings it was made with (planner,
``--set`` values, memory and model, and what those held: ``agent.run_claims.run_inputs``) to
``<out>/<label>/run.json``: a resume with other settings, or on a memory, encoder or value that
changed under the same path, is refused, so one label never mixes two configurations; and while
a process walks a label, another eval of it stops (``claim_runs``; the shards of one evaluation share it).
``<out>/results.md`` and ``results.csv`` tabulate every run found in ``<out>``, so ablations run
one by one build one table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from trajrag import artefacts, config
from trajrag.agent.names import AGENT_NAMES, RETRIEVING_AGENTS, VALUE_AGENTS
from trajrag.cli import UserError, add_override_arg, known_homes, output_folder
from trajrag.cli.episodes import EPISODES_HELP, SCENES_HELP
from trajrag.config import Settings


@dataclass
class EvalConfig:
    """``configs/eval.yaml``: the named retrieval variants (override lists) of the paper's tables."""

    variants: dict[str, list[str]]


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "eval",
        help=f"evaluate planners ({', '.join(AGENT_NAMES)}) on ObjectNav episodes",
        description="Runs each planner (and retrieval variant) on the episodes, writes per-episode JSONL "
        "records (resumable), prints one JSON summary per run (episodes, sr, spl, dtg_m, planner_calls, "
        "fallbacks, retrieval_ms_p50) and writes <out>/results.md and results.csv across every run in <out>. "
        "Variants are named in configs/eval.yaml; node-representation ablations (TNA, TPS-G, TPS-S) use "
        "an encoder trained with encoder.node.representation=... passed as --model.",
    )
    parser.add_argument("--scenes", required=True, help=SCENES_HELP)
    parser.add_argument("--episodes", required=True, help=EPISODES_HELP)
    parser.add_argument("--planner", required=True,
                        help="planner name(s), comma-separated: trajrag (retrieval scoring), llm, graphrag, embodied-rag "
                        "(semantic forest of the home), navprobe (subgoal agenda), value (the learned "
                        "frontier value alone: --set scoring.value_model=VALUE.json), "
                        "frontier (nearest), random, oracle (shortest walk); frontier-oracle ranks the frontiers with the "
                        "simulator's distances to the goal (the ceiling of every frontier-ranking planner, "
                        "configs/audit.yaml)")
    parser.add_argument("--variant", default="", help="retrieval variant(s) from configs/eval.yaml, comma-separated "
                        "(full, no_coarse, te, trajtextrag); applies to retrieving planners")
    parser.add_argument("--store", default="", help=f"memory store URI (needed by {', '.join(RETRIEVING_AGENTS)})")
    parser.add_argument("--model", default="", help="trained encoder folder or URI (trajrag encoder train --out); the "
                        "store's chunks must hold its embeddings (trajrag encoder eval writes them), or "
                        "--set retrieval.embed_missing=true embeds them in memory at start-up (slow on large stores)")
    parser.add_argument("--out", required=True, help="output folder or object-store URI (s3://...; records kept locally, uploaded at the end)")
    parser.add_argument("--label", default="", help="name of the run in the table (one planner and variant only); "
                        "a run resumes only with the settings in its run.json")
    parser.add_argument("--lifelong", action="store_true",
                        help="insert each finished episode into the store as it runs (writes to --store) "
                        "and record SR/SPL against episodes seen in <out>/<label>/lifelong.csv")
    parser.add_argument("--audit-decisions", action="store_true",
                        help="record at each planner decision every candidate's true geodesic distance to the "
                        "goal (simulator knowledge the agent never sees) in the episode records, and add "
                        "decision_best_rate, decision_regret_m and decision_score_rho to the summary: does the "
                        "planner pick the frontier that leads to the goal? (one process; not with the Ray job)")
    parser.add_argument("--json", action="store_true", help="print the summary JSON only")
    ray_group = parser.add_argument_group(
        "Ray", "run the episodes on N evaluator actors (trajrag.distributed.evaluate; configs/eval_job.yaml); "
        "the trajrag planner and retriever are then served by Ray Serve")
    ray_group.add_argument("--workers", type=int, default=None, metavar="N",
                           help="evaluator actors (implies the Ray job; default there: eval_job.evaluators)")
    ray_group.add_argument("--shard", default="", metavar="I/N",
                           help="evaluate only episode range I of N (0-based; implies the Ray job): split one "
                           "evaluation over several jobs or machines writing to the same --out")
    ray_group.add_argument("--ray-address", default=None, help="Ray cluster (implies the Ray job; default: "
                           "$RAY_ADDRESS or a local Ray)")
    ray_group.add_argument("--distributed", action="store_true", help="use the Ray job (jobs/evaluate.py sets it)")
    known_homes.add_arguments(parser)
    add_override_arg(parser)
    parser.set_defaults(func=eval_command)


@dataclass(frozen=True)
class EvalRun:
    """One requested run: its label and planner, its variant's overrides, and the settings it is
    walked with (the command's, with the memory and model paths and then the variant's overrides
    beneath the command line's: the last value of a key wins)."""

    label: str
    planner: str
    variant_overrides: list[str]
    settings: Settings


def _runs(args: argparse.Namespace, variants: dict[str, list[str]]) -> list[EvalRun]:
    """Each requested run (planners x variants x query kinds)."""
    planners = [p for p in args.planner.split(",") if p]
    names = [v for v in args.variant.split(",") if v] or [""]
    unknown = [p for p in planners if p not in AGENT_NAMES]
    if unknown:
        raise UserError(f"unknown planner(s) {unknown}; known: {sorted(AGENT_NAMES)}")
    missing = [v for v in names if v and v not in variants]
    if missing:
        raise UserError(f"unknown variant(s) {missing}; known (configs/eval.yaml): {sorted(variants)}")
    for variant in filter(None, names):
        _check_variant(variant, variants[variant])
    paths = {**({"retrieval.store": args.store} if args.store else {}),
             **({"retrieval.model_dir": args.model} if args.model else {})}
    runs = []
    for planner in planners:
        for variant in (names if planner in RETRIEVING_AGENTS else [""]):
            variant_overrides = list(variants.get(variant, []))
            settings = args.settings.with_overrides(variant_overrides, beneath=True).with_values(paths, beneath=True)
            for kind in known_homes.query_kinds(args):
                suffix, kind_values = known_homes.run_variant(kind)
                label = (args.label or (f"{planner}-{variant}" if variant else planner)) + suffix
                runs.append(EvalRun(label, planner, variant_overrides, settings.with_values(kind_values)))
    if args.label and len(runs) > 1:
        raise UserError("--label names one run: give one planner, at most one variant and one query kind")
    return runs


def _check_variant(name: str, overrides: list[str]) -> None:
    """A variant's overrides, checked as ``--set`` values are (``config.check_overrides``): eval
    adds them itself after the command line was checked, and a typo in ``eval.variants`` would
    otherwise change nothing (an unknown section is never loaded) or stop the run once its
    folder is made."""
    try:
        config.check_overrides(overrides)
    except config.ConfigError as exc:
        raise config.ConfigError(f"variant {name!r} (eval.variants.{name}): {exc}") from None


def eval_command(args: argparse.Namespace) -> int:
    from trajrag.retrieval.retriever import RetrievalError

    try:
        return _evaluate(args)
    except RetrievalError as exc:  # store errors are user errors for every command (cli/__init__)
        raise UserError(str(exc)) from exc


def _evaluate(args: argparse.Namespace) -> int:
    from trajrag.agent.evaluate import evaluate_agent
    from trajrag.agent.results_table import write_results_table
    from trajrag.agent.run_claims import claim_runs, run_settings
    from trajrag.agent.run_records import json_safe
    from trajrag.memory.store import claim_store
    from trajrag.world.datasets import load_episodes, load_scenes
    from trajrag.world.sim import GridSimulator

    args.settings = known_homes.apply_revisit(args)
    settings = args.settings
    runs = _runs(args, settings.eval.variants)
    _check_options(args, runs)
    ray_job = _ray_job(args) if _distributed(args) else None
    # Everything a user can get wrong is read before the runs are claimed and <out> is made: a
    # typo leaves no folder behind and no run.json that the corrected command must argue with.
    scenes = load_scenes(args.scenes, settings)
    episodes = load_episodes(args.episodes, scenes, settings)
    _check_goals(episodes, runs, settings.navigator.vocabulary)
    known = known_homes.prepare(args, runs, scenes, episodes)
    episode_cfg = settings.episodes
    sim = GridSimulator(settings.sim)
    audit = settings.audit if args.audit_decisions else None
    _check_value_models(runs)
    # A URI --out (s3://...): the records are kept in a local copy of it (with the records already
    # there, for resuming) and uploaded when the runs end, also when they fail.
    with artefacts.output_folder(args.out) as out:
        recorded = {r.label: run_settings(r.planner, r.settings, args.lifelong) for r in runs}
        # Held until every run is walked; lifelong runs write the store, as a corpus build does.
        with (claim_runs(out, recorded, _records_name(ray_job)),
              claim_store(args.store, "lifelong evaluation") if args.lifelong and args.store else contextlib.nullcontext()):
            print(f"{len(scenes)} scenes, {len(episodes)} episodes, runs {[r.label for r in runs]} -> {args.out}",
                  file=sys.stderr)
            known_homes.build_memories(known, args, runs, scenes, out)
            summaries = _eval_on_ray(args, ray_job, runs, scenes, episodes, out, known) if ray_job else {}
            for run in runs:
                if run.label in summaries:  # done by the Ray job
                    continue
                on_episode = _lifelong(run.label, run.planner, run.settings, out) if args.lifelong else None
                summary = evaluate_agent(run.label, _agent_factory(known, run), sim, episodes, scenes, out, episode_cfg,
                                         progress=args.progress, on_episode=on_episode, audit=audit)
                summaries[run.label] = {"planner": run.planner, "variant_overrides": run.variant_overrides, **summary}
        table = write_results_table(_all_runs(out), out)
    if len(summaries) == 1:
        (label,) = summaries
        printed = {"label": label, "out": str(args.out), **summaries[label], **known.report}
    else:
        printed = {"out": str(args.out), "runs": summaries, **known.report}
    print(json.dumps(json_safe(printed), default=str, allow_nan=False))
    if not args.json:
        print(table, file=sys.stderr)
    return 0


def _check_options(args: argparse.Namespace, runs: list[EvalRun]) -> None:
    """Options that do not go together, and an --out that cannot be a folder, refused before
    anything is read."""
    output_folder(args.out, "--out")
    known_homes.check_options(args)
    if args.lifelong and args.store:
        output_folder(args.store, "--store")
    elif args.store and "://" not in args.store and not Path(args.store).is_dir():
        raise UserError(f"--store {args.store}: no memory there: build one with `trajrag corpus build`")
    if any(r.planner in RETRIEVING_AGENTS for r in runs) and not (args.store or args.revisit):
        raise UserError(f"planners {', '.join(RETRIEVING_AGENTS)} retrieve from a memory: pass --store PATH "
                        "(or --revisit K: each home's own memory)")
    if args.audit_decisions and (_distributed(args) or any(r.planner == "oracle" for r in runs)):
        raise UserError("--audit-decisions audits frontier decisions of navigator planners in one process: "
                        "drop the Ray options (--workers, --shard, --ray-address) and the oracle")


def _check_value_models(runs: list[EvalRun]) -> None:
    """Each run's frontier value model (``scoring.value_model``), read and checked against the
    agent's vocabulary, as its agent will: a small JSON file, so a bad one is named before the
    run is claimed rather than after (``ValueModelError``)."""
    from trajrag.planners.frontier_value import FrontierValueModel

    for run in runs:
        path = run.settings.scoring.value_model if run.planner in VALUE_AGENTS else ""
        if path:
            FrontierValueModel.load(path).check_vocabulary(run.settings.navigator.vocabulary)


def _distributed(args: argparse.Namespace) -> bool:
    return bool(args.distributed or args.workers is not None or args.shard or args.ray_address)


def _records_name(ray_job: tuple | None) -> str:
    """The records file this process appends to in each run folder: a shard's own under ``--shard``
    (``claim_runs`` lets the shards of one evaluation share a label)."""
    from trajrag.distributed.evaluate import ShardedRun

    return ShardedRun("", Path(), ray_job[0] if ray_job else None).records.name


def _ray_job(args: argparse.Namespace) -> tuple:
    """The Ray job's ``(shard, job config)``, its options checked (before any run is claimed)."""
    from trajrag.distributed.evaluate import job_config, parse_shard

    if args.lifelong:
        raise UserError("--lifelong inserts into the store as episodes finish, in one process: "
                        "run it without --workers/--shard/--ray-address")
    try:
        shard = parse_shard(args.shard)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return shard, job_config(args.settings.eval_job, args.workers)


def _eval_on_ray(args: argparse.Namespace, ray_job: tuple, runs: list[EvalRun], scenes, episodes,
                 out: Path, known: known_homes.KnownHomes) -> dict:
    """Each run as a Ray evaluation job (``distributed.evaluate.evaluate_ray``), on one Ray
    (``ray_job``: ``_ray_job``'s shard and job config). Under --revisit each evaluator makes the
    known-homes agent (its home's memory read in the evaluator, no Serve app); an implicit run's
    evaluators wrap their agent in the needs resolved here."""
    from trajrag.distributed.evaluate import SERVED_PLANNERS, evaluate_ray, pending_episodes, ray_for_eval

    shard, cfg = ray_job
    pending = [r.planner for r in runs if pending_episodes(r.label, episodes, out, shard)]
    served = known.plan is None and any(planner in SERVED_PLANNERS for planner in pending)
    summaries = {}
    # One Ray for every run with episodes left; finished runs are only summarised.
    with ray_for_eval(args.ray_address, cfg, served) if pending else contextlib.nullcontext():
        for run in runs:
            summary = evaluate_ray(run.label, run.planner, scenes, episodes, out, run.settings,
                                   workers=args.workers, shard=shard, progress=args.progress,
                                   make_agent=known.home_agent_factory(run.planner, run.settings, _registry_agent(run)),
                                   wrap_agent=known.query_wrapper(run.settings))
            summaries[run.label] = {"planner": run.planner, "variant_overrides": run.variant_overrides, **summary}
    return summaries


def _agent_factory(known: known_homes.KnownHomes, run: EvalRun):
    """A function making ``run``'s agent (the registry's, as the known-homes options change it)."""
    return known.agent_factory(run.planner, run.settings, _registry_agent(run))


def _registry_agent(run: EvalRun):
    """``settings -> run's agent`` as the registry makes it."""
    from trajrag.agent.registry import make_agent

    return lambda settings: make_agent(run.planner, settings)


def _check_goals(episodes, runs: list[EvalRun], vocabulary: Sequence[str]) -> None:
    """Goal categories the mapping agents cannot look for (not in their open ``vocabulary``,
    ``navigator.vocabulary``) are a user error before anything runs, not a crash in the middle
    of an evaluation."""
    if all(r.planner == "oracle" for r in runs):
        return
    unknown = sorted({e.object_category for e in episodes} - set(vocabulary))
    if unknown:
        raise UserError(f"goal categories {unknown} are not in the agent vocabulary: add them to "
                        "navigator.vocabulary (configs/navigator.yaml) or --set navigator.vocabulary=[...]")


def _lifelong(label: str, planner: str, settings: Settings, out: Path):
    from trajrag.planners.scoring import shared_retriever
    from trajrag.retrieval.lifelong import LifelongMemory

    if planner not in RETRIEVING_AGENTS:
        raise UserError(f"--lifelong needs a retrieving planner ({', '.join(RETRIEVING_AGENTS)}), got {planner}")
    return LifelongMemory(shared_retriever(settings), label, out / label / "lifelong.csv", settings.memory)


def _all_runs(out: Path) -> dict[str, dict]:
    """Every run's summary.json under ``out`` (runs of earlier invocations included). One that is
    not a summary is named on stderr and left out of the table: another run's damaged file must
    not cost this run its table."""
    runs = {}
    for path in sorted(out.glob("*/summary.json")):
        try:
            summary = json.loads(path.read_text())
            problem = "" if isinstance(summary, dict) else f"expected a JSON object, got {type(summary).__name__}"
        except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
            problem = str(exc)
        if problem:
            print(f"warning: {path}: not a run summary ({problem}); left out of {out / 'results.md'}", file=sys.stderr)
            continue
        runs[path.parent.name] = summary
    return runs
