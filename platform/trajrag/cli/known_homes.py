"""``trajrag eval``'s known-homes options (issue 47): ``--revisit K``, ``--queries``, ``--global-questions``.

The configuration is loaded here, at the command, and handed to the stages as typed sections:
``revisit`` (``revisit/``: the earlier walks and each home's memory), ``queries`` (``queries/``:
implicit needs and global questions) and ``encoder.node`` (the text encoder that resolves needs).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from trajrag import config
from trajrag.agent.collect import POLICIES, collector_settings
from trajrag.agent.corpus import collect_into
from trajrag.agent.evaluate import write_json
from trajrag.agent.names import RETRIEVING_AGENTS
from trajrag.memory.store import MemoryStore
from trajrag.cli import UserError
from trajrag.config import Settings
from trajrag.queries import EXPLICIT, IMPLICIT, KINDS, QueryConfig, QueryError
from trajrag.queries.implicit import ImplicitQueryAgent
from trajrag.revisit import RevisitConfig, RevisitError
from trajrag.revisit.agent import PerHomeAgent
from trajrag.revisit.walks import plan_digest, plan_walks
from trajrag.world.geodesic import Motion

QUERY_CHOICES = (*KINDS, "both")
# the label suffix of a run asked implicit queries (its explicit twin keeps the plain label)
IMPLICIT_SUFFIX = "-implicit"
GLOBAL_QUESTIONS = "global_questions.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "known homes", "the revisit benchmark and Embodied-RAG's query kinds (docs/known_homes.md; --revisit "
        "runs alone or with --workers N on this machine, implicit queries wherever eval runs)")
    group.add_argument("--revisit", type=int, default=0, metavar="K",
                       help="before each home's episodes, that home's own memory (<out>/revisit/<home>) holds K "
                       "earlier walks of it (corpus policies, never the evaluated episodes; configs/revisit.yaml); "
                       "retrieving planners read it instead of --store (sets revisit.walks=K)")
    group.add_argument("--queries", choices=QUERY_CHOICES, default=EXPLICIT,
                       help="explicit: the goal category; implicit: a need from configs/queries.yaml resolved "
                       "to a category by the text encoder (runs labelled <run>-implicit); both: each run twice; "
                       "default: %(default)s")
    group.add_argument("--global-questions", action="store_true",
                       help="with --revisit: answer each home's inventory questions (which object categories, "
                       "how many of each goal) from its memory, scored against the scene "
                       f"(<out>/revisit/{GLOBAL_QUESTIONS})")


def check_options(args: argparse.Namespace) -> None:
    """What the known-homes options refuse, before anything is read."""
    if args.revisit < 0:
        raise UserError(f"--revisit must be >= 0 earlier walks per home, got {args.revisit}")
    if args.global_questions and not args.revisit:
        raise UserError("--global-questions reads each home's revisit memory: give --revisit K")
    if args.revisit and args.store:
        raise UserError("--revisit builds each home's memory under --out: drop --store")
    if args.revisit and args.lifelong:
        raise UserError("--lifelong is not available with --revisit (each home's memory is built before its "
                        "episodes; lifelong insertion into it is not implemented)")
    if args.revisit and (args.shard or args.ray_address or args.distributed):
        raise UserError("--revisit's memories are built under --out on this machine, which evaluators elsewhere "
                        "cannot read: run it here, alone or with --workers N, without --shard/--ray-address")


def apply_revisit(args: argparse.Namespace) -> Settings:
    """The command's settings with ``--revisit K`` as ``revisit.walks=K`` (every run's settings,
    so run.json records it), and ``args.revisit`` as the walks the configuration asks (``--set
    revisit.walks``)."""
    if args.revisit:
        return args.settings.with_values({"revisit.walks": args.revisit})
    args.revisit = args.settings.revisit.walks
    return args.settings


def query_kinds(args: argparse.Namespace) -> list[str]:
    return list(KINDS) if args.queries == "both" else [args.queries]


def run_variant(kind: str) -> tuple[str, dict[str, str]]:
    """(label suffix, setting values) of a run asked ``kind`` queries."""
    return (IMPLICIT_SUFFIX, {"queries.kind": IMPLICIT}) if kind == IMPLICIT else ("", {})


@dataclass
class KnownHomes:
    """What an evaluation's known-homes options set up before its runs walk: the implicit
    queries (None when no run asks them), each home's earlier walks (None without --revisit)
    and their memories."""

    implicit: Any = None
    plan: dict | None = None
    memories: Any = None
    report: dict = field(default_factory=dict)

    def agent_factory(self, planner: str, settings: Settings, make_agent: Callable[[Settings], Any]):
        """A function making the run's agent in this process: ``make_agent(settings)`` with the
        changes of ``home_agent_factory`` and ``query_wrapper``."""
        make_home_agent = self.home_agent_factory(planner, settings, make_agent)
        wrap = self.query_wrapper(settings)

        def make():
            agent = make_home_agent() if make_home_agent else make_agent(settings)
            return wrap(agent) if wrap else agent
        return make

    def home_agent_factory(self, planner: str, settings: Settings, make_agent: Callable[[Settings], Any]):
        """Under --revisit, a function making a retrieving planner's agent whose memory is its
        home's (picklable: ``--revisit --workers N`` hands it to each evaluator); else None."""
        if self.plan is None or planner not in RETRIEVING_AGENTS:
            return None
        memories = self.memories

        def home_agent(home: str):
            return make_agent(settings.with_values({"retrieval.store": memories.uri(home)}))
        return lambda: PerHomeAgent(home_agent)

    def query_wrapper(self, settings: Settings):
        """For a run asked implicit queries, a function wrapping its agent in ``ImplicitQueryAgent``
        (the needs resolved in advance: it pickles small to evaluators anywhere); else None."""
        if settings.queries.kind != IMPLICIT:
            return None
        implicit = self.implicit
        return lambda agent: ImplicitQueryAgent(agent, implicit)


def prepare(args: argparse.Namespace, runs: Sequence[Any], scenes, episodes) -> KnownHomes:
    """Everything the options need that a user can get wrong, checked before any run is claimed:
    the needs of every episode's category (implicit runs), each home's earlier walks (--revisit)."""
    settings = args.settings
    known = KnownHomes()
    kinds = {r.settings.queries.kind for r in runs}
    unknown = sorted(kinds - set(KINDS))
    if unknown:
        raise UserError(f"queries.kind {unknown[0]!r}: choose one of {list(KINDS)}")
    if IMPLICIT in kinds:
        known.implicit = implicit_queries(settings.queries, settings.encoder.node,
                                          settings.episodes.goal_categories).answered_in_advance()
        try:
            known.implicit.check_categories(sorted({e.object_category for e in episodes}))
        except QueryError as exc:
            raise UserError(str(exc)) from None
    revisit: RevisitConfig = settings.revisit
    if revisit.walks:
        if revisit.policy not in POLICIES:
            raise UserError(f"revisit.policy {revisit.policy!r}: choose one of {list(POLICIES)} (agent/collect.py)")
        try:
            known.plan = plan_walks(scenes, episodes, revisit.walks, revisit.seed, revisit.spare_walks,
                                    settings.episodes, Motion.from_sim_config(collector_settings(settings).sim))
        except RevisitError as exc:
            raise UserError(str(exc)) from None
    return known


def implicit_queries(queries: QueryConfig, node_cfg: Any, goal_categories: Sequence[str]):
    """The table of needs with the text encoder that resolves them among ``goal_categories``."""
    from trajrag.encoder.node_encoder import NodeEncoder
    from trajrag.queries.implicit import ImplicitQueries, NeedResolver

    return ImplicitQueries(queries.implicit, NeedResolver(NodeEncoder(node_cfg), goal_categories))


def build_memories(known: KnownHomes, args: argparse.Namespace, runs: Sequence[Any], scenes, out: Path) -> None:
    """Each home's memory under ``<out>/revisit`` (resumable; refused when ``revisit.json`` says it
    was built otherwise), embedded with ``--model`` where one is given, then the global questions.
    Nothing is built for runs that read no memory, unless the global questions ask."""
    from trajrag.revisit.memories import HomeMemories

    if known.plan is None:
        return
    known.memories = HomeMemories(out)
    if not (args.global_questions or any(r.planner in RETRIEVING_AGENTS for r in runs)):
        return
    revisit: RevisitConfig = args.settings.revisit
    walk_settings = args.settings.with_values({"corpus.keep_value_decisions": False})  # no value is fitted on these
    encoder = _trajectory_encoder(args.model, walk_settings)
    try:
        known.memories.admit({"walks": revisit.walks, "seed": revisit.seed, "policy": revisit.policy,
                              "plan": plan_digest(known.plan),
                              "memory": config.to_dict(walk_settings.memory),
                              "corpus": config.to_dict(walk_settings.corpus),
                              "encoder_version": encoder.version if encoder else None})
    except RevisitError as exc:
        raise UserError(str(exc)) from None
    print(f"revisit: {revisit.walks} earlier walks in each of {len(known.plan)} homes -> {known.memories.root}",
          file=sys.stderr)
    built = known.memories.build(known.plan, scenes, _collector(revisit.policy, walk_settings, args.progress),
                                 _embedder(args.model, walk_settings, encoder), encoder.version if encoder else None)
    sizes = known.memories.sizes(sorted(built))
    known.report["revisit"] = {"walks_per_home": revisit.walks, "memories": str(known.memories.root),
                               "chunks_per_home": _mean([s["chunks"] for s in sizes.values()]),
                               "groups_per_home": _mean([s["groups"] for s in sizes.values()]),
                               "bytes_per_home": _mean([s["bytes"] for s in sizes.values()])}
    if args.global_questions:
        known.report["global_questions"] = answer_global_questions(known.memories, [s for s in scenes if s.name in known.plan], args.settings)


def _trajectory_encoder(model_dir: str, settings: Settings):
    from trajrag.encoder.model import TrajectoryEncoder

    return TrajectoryEncoder(model_dir, settings.encoder) if model_dir else None


def _collector(policy: str, settings: Settings, progress: bool):
    return lambda scene, walks, uri: collect_into([scene], walks, policy, uri, settings,
                                                  f"revisit memory of {scene.name}", progress=progress)


def _embedder(model_dir: str, settings: Settings, encoder):
    from trajrag.encoder.evaluate import embed_store

    if encoder is None:
        return None
    return lambda uri: embed_store(uri, model_dir, settings.encoder, node_encoder=encoder.node_encoder)


def answer_global_questions(memories, scenes, settings: Settings) -> dict:
    """Each home's inventory questions answered from its memory and scored (``queries.inventory``),
    written to ``<out>/revisit/global_questions.json``; returns the summary over homes."""
    from trajrag.queries.inventory import answer_questions, summarize_scores

    queries: QueryConfig = settings.queries
    vocabulary = settings.navigator.vocabulary
    counted = settings.episodes.goal_categories
    homes = []
    for scene in scenes:
        store = MemoryStore(memories.uri(scene.name), read_only=True)
        try:
            homes.append(answer_questions(store, scene, vocabulary, counted, queries.sighting_distance_m,
                                          queries.count_merge_radius_m))
        finally:
            store.close()
    summary = summarize_scores(homes)
    write_json(memories.root / GLOBAL_QUESTIONS, {"summary": summary, "homes": homes})
    return summary


def _mean(values: list) -> float | None:
    return sum(values) / len(values) if values else None
