"""``trajrag value fit``: learn which frontier leads to the goal from decisions in the memory's homes.

``trajrag value fit --scenes SCENES --episodes EPISODES --out VALUE.json [--json]`` walks the
episodes with nearest frontier (or, with ``--set value.walker=value``, with the value planner of
``scoring.value_model``: its own decisions, to fit again on), records every decision's
candidates with their true cost to the goal (hindsight in those homes), fits
``planners.frontier_value.FrontierValueModel`` on all but the last ``value.held_out_share`` of
the scenes, reports how it ranks the held-out decisions next to nearest frontier, then fits on
every scene and writes the model. The scoring planner uses it with ``--set
scoring.value_model=VALUE.json``.

``--save-decisions D.npz`` keeps the walked decisions (scene by scene as they are walked, so a
re-run resumes); instead of walking, ``--decisions D1.npz,D2.npz`` fits on kept ones and
``--store M1,M2`` on the decisions memories kept from their corpora's exploration walks, both
together when given (procedural and Gibson homes, say).
``--workers N`` walks the scenes as parallel Ray tasks (``distributed.value_decisions``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import math
import os
import sys
from pathlib import Path
from typing import Iterator

from trajrag import artefacts
from trajrag.cli import UserError, add_override_arg, output_file, output_folder
from trajrag.cli.episodes import EPISODES_HELP, SCENES_HELP
from trajrag.config import Settings


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("value", help="the frontier value learned from past decisions")
    actions = parser.add_subparsers(dest="value_command", required=True, metavar="ACTION")
    fit = actions.add_parser(
        "fit", help="collect decisions in train homes and fit the frontier value",
        description="Walk the episodes with nearest frontier (value.walker=value: with the value planner of "
        "scoring.value_model, to fit again on its own decisions); at every decision record each candidate's "
        "features (from the agent's map) and its true cost to the goal (the simulator's geodesic field: "
        "hindsight, as for the corpus's oracle walks). Fit on all but the held-out scenes "
        "(configs/value.yaml held_out_share), report the held-out ranking next to nearest frontier "
        "(best-pick rate, regret in metres, Spearman rho with nearness to the goal), then fit on every "
        "scene and write the model (JSON) and, beside it, its experience table (VALUE.experience, LanceDB: "
        "every candidate seen, searched by the scoring planner's experience term). Use train scenes: never "
        "the scenes you evaluate on. --set value.target=rollout costs each candidate instead by the metres the "
        "walker walks to success after taking it (the episode replayed with that choice forced, at "
        "value.rollout_decisions_per_episode sampled decisions per walk; C + 1 episodes per decision of C "
        "candidates: use --workers). --set value.prior_model=VALUE.json refines a fitted model (its "
        "standardisation kept, the weights pulled towards its own) instead of fitting from nothing.")
    fit.add_argument("--scenes", help=SCENES_HELP)
    fit.add_argument("--episodes", help=EPISODES_HELP)
    fit.add_argument("--decisions", help="fit on decisions kept by --save-decisions instead of walking "
                     "(comma-separated .npz files; with --store too, on all of them)")
    fit.add_argument("--store", help="fit on the decisions the memories at STORE kept from their exploration "
                     "walks (comma-separated; trajrag corpus build, corpus.keep_value_decisions) instead of walking")
    fit.add_argument("--save-decisions", help="also write the walked decisions to this .npz file; each scene is "
                     "kept in FILE.parts/ as it is walked, so the same command after a crash or a failed scene "
                     "walks only the scenes not kept yet")
    fit.add_argument("--out", required=True, help="model file to write (JSON; a path or s3://... URI, its .experience table beside it)")
    fit.add_argument("--workers", type=int, default=0,
                     help="walk the scenes as parallel Ray tasks on this many CPUs (0: one process, no Ray); "
                          "default: %(default)s")
    fit.add_argument("--ray-address", default=None,
                     help="Ray cluster to join with --workers (default: $RAY_ADDRESS, else a local Ray)")
    fit.add_argument("--json", action="store_true",
                     help="print one JSON object (progress only on a terminal's stderr)")
    add_override_arg(fit)
    fit.set_defaults(func=fit_command)


def fit_command(args: argparse.Namespace) -> int:
    walk = bool(args.scenes or args.episodes)
    kept = bool(args.decisions or args.store)
    if walk == kept or bool(args.scenes) != bool(args.episodes):
        raise UserError("value fit needs either --scenes and --episodes (walk and collect), or kept decisions: "
                        "--decisions (files) and/or --store (memories' exploration walks)")
    if args.save_decisions and not walk:
        raise UserError("--save-decisions keeps walked decisions: without --scenes/--episodes there is nothing new "
                        "to keep")
    if args.workers < 0:
        raise UserError(f"--workers must be >= 0, got {args.workers}")
    _check_outputs(args)
    if kept:
        report = fit_value_from_kept(_listed(args.decisions), _listed(args.store), args.out, args.settings)
    else:
        report = fit_value(args.scenes, args.episodes, args.out, args.settings, progress=args.progress,
                           save_decisions=args.save_decisions, workers=args.workers, ray_address=args.ray_address)
    print(json.dumps({"out": args.out, **report}))
    if not args.json:
        print(f"wrote {args.out}: use it with --set scoring.value_model={args.out}", file=sys.stderr)
    return 0


def _check_outputs(args: argparse.Namespace) -> None:
    """Every path ``value fit`` writes, checked before anything is walked or written: the model,
    its experience table beside it, and the kept decisions with their per-scene folder."""
    from trajrag.agent.value_parts import DecisionParts
    from trajrag.retrieval.experience import experience_path

    output_file(args.out, "--out")
    output_folder(experience_path(args.out), "--out's experience table")
    if args.save_decisions:
        output_file(args.save_decisions, "--save-decisions")
        output_folder(DecisionParts(args.save_decisions, {}).folder, "--save-decisions' scene folder")


@contextlib.contextmanager
def value_ray(workers: int, address: str | None) -> Iterator[None]:
    """A Ray for ``workers`` parallel walks (the running one, ``address``, or a local one shut
    down at the end); nothing when ``workers`` is 0."""
    if workers < 1:
        yield
        return
    import ray

    from trajrag.ray_cluster import ensure_ray

    own = ensure_ray(address, max(os.cpu_count() or 1, workers))
    try:
        yield
    finally:
        if own:
            ray.shutdown()


def fit_value(scenes_spec: str, episodes_spec: str, out: str, settings: Settings, progress: bool = True,
              save_decisions: str | None = None, workers: int = 0, ray_address: str | None = None) -> dict:
    """Collect the decisions (kept in ``save_decisions`` when given), report the held-out ranking,
    fit on every scene and write ``out``; returns the model's report (also stored in the file).

    workers: 0 walks in this process; >= 1 walks each scene as a Ray task (``value_ray``:
    the running Ray, ``ray_address``, or a local one, started once the scenes and episodes have
    loaded; ``distributed.value_decisions``; same decisions, in the same order).

    With ``save_decisions``, each scene is kept as it is walked and a re-run walks only the scenes
    not kept yet (``agent/value_parts.py``)."""
    from trajrag.agent.value_data import collect_value_decisions
    from trajrag.agent.value_parts import DecisionParts, ValueWalkError
    from trajrag.planners.frontier_value import save_decisions as keep
    from trajrag.world.datasets import load_episodes, load_scenes

    episode_cfg = settings.episodes
    value_cfg = settings.value
    if value_cfg.walker == "value" and not settings.scoring.value_model:
        raise UserError("value.walker=value walks with a fitted value: --set scoring.value_model=VALUE.json")
    scenes = load_scenes(scenes_spec, settings)
    episodes = load_episodes(episodes_spec, scenes, settings)
    if not episodes:
        raise UserError(f"no episodes in {episodes_spec!r} for {scenes_spec!r}")
    goals = list(episode_cfg.goal_categories)
    collect = collect_value_decisions
    if workers > 0:
        from trajrag.distributed.value_decisions import collect_value_decisions_ray as collect
    with_episodes = {episode.scene_key for episode in episodes}
    walked = [scene.name for scene in scenes if scene.name in with_episodes]
    parts = on_scene = None
    if save_decisions:
        parts = DecisionParts(save_decisions, {"scenes": scenes_spec, "episodes": episodes_spec,
                                               "overrides": list(settings.overrides)})
        kept = parts.open(walked)
        on_scene = functools.partial(parts.keep, goals=goals)
        if kept and progress:
            print(f"resuming: {len(kept)} of {len(walked)} scenes already walked in {parts.folder}", file=sys.stderr)
        scenes = [scene for scene in scenes if scene.name not in kept]
    to_walk = {scene.name for scene in scenes}
    todo = [episode for episode in episodes if episode.scene_key in to_walk]
    if todo:
        try:
            with value_ray(workers, ray_address):
                decisions, vocabulary = collect(scenes, todo, settings, progress=progress, on_scene=on_scene)
        except ValueWalkError as err:
            if parts is None:
                raise
            raise ValueWalkError(f"{err}. The scenes walked are kept in {parts.folder}: the same command walks "
                                 f"only the rest") from None
    if parts is not None:
        decisions, vocabulary, goals = parts.gather(walked)
        keep(save_decisions, decisions, vocabulary, goals)
        parts.remove()
    return fit_and_write(decisions, vocabulary, goals, out, settings,
                         {"episodes": len(episodes), "scenes_spec": scenes_spec, "episodes_spec": episodes_spec,
                          "walker": value_cfg.walker})


def _listed(value: str | None) -> list[str]:
    return [part for part in (value or "").split(",") if part]


def fit_value_from_kept(files: list[str], stores: list[str], out: str, settings: Settings) -> dict:
    """Fit on kept decisions: ``files`` written by ``--save-decisions`` and the exploration walks
    of the memories at ``stores`` (``memory.value_log``, kept by ``trajrag corpus build`` with
    ``corpus.keep_value_decisions``), all with the same vocabulary and goals."""
    collections = [_decisions_file(path) for path in files]
    source = {"decisions_files": files} if files else {}
    if stores:
        walks = [walk for store in stores for walk in _store_walks(store)]
        collections.extend(walks)
        source.update(stores=stores, walks=len(walks))
    what = " and ".join(filter(None, [files and f"the decisions files {files}",
                                      stores and f"the walks of {stores}"]))
    return _fit_collections(collections, what, out, settings, source)


def _decisions_file(path: str) -> tuple[list, list[str], list[str]]:
    from trajrag.planners.frontier_value import ValueModelError, load_decisions

    try:
        return load_decisions(path)
    except FileNotFoundError:
        raise UserError(f"no decisions file at {path}") from None
    except ValueModelError as exc:
        raise UserError(str(exc)) from None


def _store_walks(store: str) -> list[tuple[list, list[str], list[str]]]:
    """One ``(decisions, vocabulary, goals)`` per exploration walk the memory at ``store`` kept."""
    from trajrag.memory.store import StoreError
    from trajrag.memory.value_log import ValueLog
    from trajrag.planners.frontier_value import ValueModelError, load_decisions

    if "://" not in store and not Path(store).is_dir():
        raise UserError(f"no memory at {store}: build one with `trajrag corpus build`")
    try:
        rows = list(ValueLog(store).rows())
        collections = [load_decisions(io.BytesIO(blob), name=f"{store} value_decisions[{tid}]") for tid, blob in rows]
    except (StoreError, ValueModelError) as exc:
        raise UserError(str(exc)) from None
    if not collections:
        raise UserError(f"memory {store} keeps no exploration walks' decisions: build it with "
                        "corpus.keep_value_decisions=true and the explore or mix policy, or walk with --scenes/--episodes")
    return collections


def _fit_collections(collections: list[tuple[list, list[str], list[str]]], what: str, out: str,
                     settings: Settings, source: dict) -> dict:
    """``fit_and_write`` on several ``(decisions, vocabulary, goals)`` that must share vocabulary and goals."""
    kinds = {(tuple(vocabulary), tuple(goals)) for _, vocabulary, goals in collections}
    if len(kinds) != 1:
        raise UserError(f"{what} were collected with different vocabularies or goals")
    vocabulary, goals = (list(k) for k in kinds.pop())
    decisions = [d for kept, _, _ in collections for d in kept]
    return fit_and_write(decisions, vocabulary, goals, out, settings, source)


def fit_and_write(decisions: list, vocabulary: list[str], goals: list[str], out: str, settings: Settings,
                  source: dict) -> dict:
    """Report the held-out ranking (model and experience from all but the last
    ``held_out_share`` of the scenes, next to nearest frontier), then fit on every scene (the
    ``value`` section) and write ``out`` and its experience table."""
    from trajrag.planners.frontier_value import fit_value_model, save_experience

    cfg = settings.value
    names = sorted({d.scene for d in decisions})
    held_out = set(names[len(names) - math.ceil(len(names) * cfg.held_out_share):]) if len(names) > 1 else set()
    testing = [d for d in decisions if d.scene in held_out]
    report = {"scenes": len(names), "decisions": len(decisions), "held_out_scenes": sorted(held_out)}
    try:
        if testing:
            training = [d for d in decisions if d.scene not in held_out]
            report["held_out"] = held_out_ranking(fit_value_model(training, vocabulary, goals, cfg), training,
                                                  testing, settings)
        model = fit_value_model(decisions, vocabulary, goals, cfg)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    with artefacts.output_file(out) as local:  # a URI: the file and its experience table uploaded
        model.report.update(report, **source, experience_rows=save_experience(model, decisions, local))
        model.save(local)
    return model.report


def held_out_ranking(model, training: list, testing: list, settings: Settings) -> dict:
    """Best-pick rate, regret and rho on the held-out decisions: nearest frontier, the value,
    and the value with the experience of the training decisions (``scoring.w_experience``)."""
    import tempfile

    from trajrag.planners.frontier_value import ranking_quality, save_experience
    from trajrag.retrieval.experience import ExperienceIndex, experience_path

    tolerance_m = settings.audit.tolerance_m
    scoring = settings.scoring
    ranking = {"nearest_frontier": ranking_quality(testing, lambda x, goal: -x[:, 0], tolerance_m),
               "value": ranking_quality(testing, lambda x, goal: model.score(x), tolerance_m)}
    with tempfile.TemporaryDirectory() as scratch:
        path = f"{scratch}/held-out.json"
        save_experience(model, training, path)
        model.experience = ExperienceIndex(experience_path(path), len(model.feature_names), scoring.experience_k,
                                           scoring.experience_in_memory)
        ranking["value_and_experience"] = ranking_quality(
            testing, lambda x, goal: model.score_with_experience(x, goal, scoring.w_experience), tolerance_m)
    return ranking
