"""The TrajRAG planner and retriever as Ray Serve deployments, and the planner that calls them.

One Serve application per planner configuration:

* ``RetrieverDeployment`` (deployment ``Retriever``) wraps ``retrieval.load_retriever(settings)``:
  the store's chunks, summaries and the encoder, loaded once per replica (~10 s, hundreds of MB
  for large stores). ``retrieve({"goal", "candidates"}) -> {"experiences", "names", ...}``.
* ``PlannerDeployment`` (deployment ``Planner``, the ingress) holds the ``ScoringPlanner``'s
  scoring (``configs/scoring.yaml``) and calls the retriever through its ``DeploymentHandle``.
  ``decide(request) -> {"choice", "scores", "retrieval_ms", ...}`` inside the cluster; the same
  over HTTP as ``POST <route_prefix>/<app>`` with a JSON body, on the Serve proxy bound to
  ``127.0.0.1`` by default (``configs/eval_job.yaml`` ``serve.host``).
* With ``serve.retriever_in_planner`` (the default) the app is the ``Planner`` deployment alone,
  each replica loading its own retriever (sized by the ``retriever_*`` keys): one hop per
  decision instead of two, and no experiences on the wire; without it, the two deployments
  above, which scale apart.
* ``RemotePlanner`` implements ``planners.base.Planner`` for the evaluator actors: each decision
  becomes one request to the Planner deployment through a handle.

Requests and responses are JSON-safe dicts (``decision_request``; candidate trajectories as
``TopoPolarTrajectory.to_dict``, ``inf`` distances as ``null``): nothing user-defined is pickled
and the HTTP ingress takes the very same body. Replica counts, ``max_ongoing_requests`` and the
retry budget come from ``configs/eval_job.yaml`` (``serve``): Serve's default of 5 ongoing
requests per replica throttles many concurrent callers badly (DESIGN.md).

A replica that dies (killed, OOM) is replaced by the Serve controller; ``RemotePlanner`` retries a
failed decision with backoff for up to ``request_retry_s`` seconds (a decision is a pure function
of its request, so a retry is safe), so an evaluation survives replica restarts unchanged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from trajrag import artefacts, config
from trajrag.config import Settings
from trajrag.distributed.shards import first_line
from trajrag.memory.store import MemoryStore
from trajrag.planners.base import PlannerContext, RetrievalTimings
from trajrag.planners.frontier_value import candidate_features, load_value_model
from trajrag.planners.scoring import (ScoringConfig, ScoringPlanner, unvisited_home_points, with_home_points,
                                      with_kept_points)
from trajrag.retrieval.retriever import load_retriever
from trajrag.retrieval.types import DecisionRetrieval, Experience
from trajrag.topo.candidates import CandidatePath, MapPlace
from trajrag.topo.trajectory import TopoPolarTrajectory

log = logging.getLogger(__name__)

RETRIEVER, PLANNER = "Retriever", "Planner"
# The sections that change what the app computes (and so its name): retrieval, matching, encoder
# and scoring. Navigation sections (topo, mapping, ...) act in the evaluators, not here.
APP_SECTIONS = ("retrieval", "memory", "encoder", "scoring")


@dataclass
class PlannerServeConfig:
    """``eval_job.serve`` in ``configs/eval_job.yaml``: the planner app's sizing and addresses."""

    app_name: str
    http: bool
    host: str
    port: int
    route_prefix: str
    retriever_in_planner: bool
    retriever_replicas: int
    retriever_max_ongoing_requests: int
    retriever_num_cpus: float
    planner_replicas: int
    planner_max_ongoing_requests: int
    planner_num_cpus: float
    health_check_period_s: float
    request_timeout_s: float
    request_retry_s: float
    retry_backoff_s: float
    keep_app: bool


class PlannerRequestError(ValueError):
    """A decision request that cannot be served (malformed payload): never retried."""


class ServeUnavailableError(RuntimeError):
    """The planner app did not answer within the retry budget (``request_retry_s``)."""


# -- the wire format ------------------------------------------------------------------------------
def decision_request(ctx: PlannerContext, value: Any = None) -> dict:
    """The JSON-safe request of one decision: the goal, the previous waypoint, the whole map
    (``MapPlace``, or ``None``) and, per candidate, its hypothetical trajectory, path length,
    geodesic distance to its frontier (``None`` = not found) and the frontier's centroid
    (map-frame metres). With the app's frontier ``value`` model, also ``value_features``: read
    from this side's map, which the app never sees."""
    candidates = []
    for c in ctx.candidates:
        distance = float(ctx.frontier_distances[c.frontier_index])
        centroid = np.asarray(ctx.frontiers[c.frontier_index].centroid_xy, dtype=float)
        candidates.append({"trajectory": c.trajectory.to_dict(), "length_m": float(c.length_m),
                           "frontier_distance_m": distance if math.isfinite(distance) else None,
                           "frontier_xy": centroid.tolist()})
    waypoint = None if ctx.current_waypoint is None else np.asarray(ctx.current_waypoint, float).tolist()
    place = None if ctx.place is None else ctx.place.to_dict()
    request = {"goal": str(ctx.goal), "step": int(ctx.step), "current_waypoint": waypoint,
               "candidates": candidates, "place": place}
    if value is not None:
        request["value_features"] = candidate_features(ctx, value.goals, value.config).tolist()
    return request


def value_features_from_request(request: Mapping[str, Any], value: Any) -> np.ndarray | None:
    """The request's ``value_features`` (one row per candidate, the value model's columns), or
    None when the app has no value model; ``PlannerRequestError`` when the model needs them and
    they are missing or of the wrong shape."""
    if value is None:
        return None
    shape = (len(request["candidates"]), len(value.feature_names))
    try:
        features = np.asarray(request["value_features"], dtype=float)
    except (KeyError, TypeError, ValueError):
        features = None
    if features is None or features.shape != shape:
        raise PlannerRequestError(f"decision request: 'value_features' must be {shape[0]} rows of {shape[1]} "
                                  f"numbers (the app scores with a frontier value model)")
    return features


@dataclass
class _FrontierPoint:
    """The part of a ``Frontier`` that scoring reads."""

    centroid_xy: np.ndarray


def context_from_request(request: Any) -> tuple[PlannerContext, list[Any]]:
    """The ``PlannerContext`` scoring needs (candidate ``i`` -> frontier ``i``) and the candidate
    trajectories; ``PlannerRequestError`` naming the first bad field."""
    if not isinstance(request, Mapping):
        raise PlannerRequestError("a decision request must be a JSON object")
    goal, raw = request.get("goal"), request.get("candidates")
    if not isinstance(goal, str) or not goal:
        raise PlannerRequestError("decision request: 'goal' must be a non-empty string")
    if not isinstance(raw, list) or not raw:
        raise PlannerRequestError("decision request: 'candidates' must be a non-empty list")
    candidates, frontiers, distances = [], [], []
    for i, item in enumerate(raw):
        try:
            trajectory = TopoPolarTrajectory.from_dict(item["trajectory"])
            centroid = np.asarray(item["frontier_xy"], dtype=float).reshape(2)
            length = float(item["length_m"])
            distance = item.get("frontier_distance_m")
            distance = math.inf if distance is None else float(distance)
        except (KeyError, TypeError, ValueError) as exc:
            raise PlannerRequestError(f"decision request: candidate {i}: {type(exc).__name__}: {exc}") from None
        candidates.append(CandidatePath(frontier_index=i, node_path=np.zeros(0, dtype=np.int64),
                                        length_m=length, trajectory=trajectory))
        frontiers.append(_FrontierPoint(centroid))
        distances.append(distance)
    waypoint = request.get("current_waypoint")
    try:
        waypoint = None if waypoint is None else np.asarray(waypoint, dtype=float).reshape(2)
    except (TypeError, ValueError):
        raise PlannerRequestError("decision request: 'current_waypoint' must be [x, y] or null") from None
    ctx = PlannerContext(goal=goal, step=int(request.get("step", 0)), pose=None, sem_map=None,
                         trajectory=candidates[0].trajectory, candidates=candidates, frontiers=frontiers,
                         frontier_distances=np.asarray(distances, dtype=float), current_waypoint=waypoint,
                         place=place_from_request(request))
    return ctx, [c.trajectory for c in candidates]


def place_from_request(request: Mapping[str, Any]) -> Any:
    """The request's ``MapPlace`` (``None`` when it carries none); ``PlannerRequestError`` if malformed."""
    raw = request.get("place")
    if raw is None:
        return None
    try:
        return MapPlace.from_dict(raw)
    except (TypeError, ValueError) as exc:
        raise PlannerRequestError(f"decision request: place: {type(exc).__name__}: {exc}") from None


def kept_points_from_request(request: Mapping[str, Any]) -> np.ndarray:
    """The episode's goal points so far, float (P, 2) (``"goal_points"``; none when absent)."""
    return _points_from_request(request, "goal_points")


def home_points_from_request(request: Mapping[str, Any]) -> np.ndarray:
    """The unvisited places where the memory's walks of this home saw the goal, float (P, 2)
    (``"home_points"``, sent by an evaluator in a home the memory has walked; none when absent)."""
    return _points_from_request(request, "home_points")


def _points_from_request(request: Mapping[str, Any], key: str) -> np.ndarray:
    try:
        return np.asarray(request.get(key) or [], dtype=float).reshape(-1, 2)
    except (TypeError, ValueError):
        raise PlannerRequestError(f"decision request: '{key}' must be a list of [x, y]") from None


def home_lookup_from_request(request: Any) -> tuple[str, str]:
    """``(scene, goal)`` of a ``home_goal_points`` request; ``PlannerRequestError`` when malformed."""
    scene, goal = (request.get("scene"), request.get("goal")) if isinstance(request, Mapping) else (None, None)
    if not (isinstance(scene, str) and scene and isinstance(goal, str) and goal):
        raise PlannerRequestError("home goal points request: 'scene' and 'goal' must be non-empty strings")
    return scene, goal


def retrieval_to_dict(retrieval: DecisionRetrieval) -> dict:
    """A ``DecisionRetrieval`` as plain lists and scalars (label ids as string keys)."""
    return {
        "experiences": [[_experience_to_dict(e) for e in exps] for exps in retrieval.experiences],
        "names": {str(k): v for k, v in retrieval.names.items()},
        "coarse_ms": float(retrieval.coarse_ms), "fine_ms": float(retrieval.fine_ms),
        "encode_ms": float(retrieval.encode_ms),
        "goal_points": None if retrieval.goal_points is None else np.asarray(retrieval.goal_points).tolist(),
    }


def _experience_to_dict(e: Experience) -> dict:
    return {"trajectory_id": e.trajectory_id, "group_id": int(e.group_id), "goal": e.goal,
            "success": bool(e.success), "similarity": float(e.similarity),
            "coarse_score": float(e.coarse_score), "description": e.description, "scene_hint": e.scene_hint,
            "sectors": np.asarray(e.sectors).tolist(), "node_xy": np.asarray(e.node_xy).tolist()}


def retrieval_from_dict(data: Mapping[str, Any]) -> DecisionRetrieval:
    """Inverse of ``retrieval_to_dict``."""
    experiences = [[Experience(**{**e, "sectors": np.asarray(e["sectors"], dtype=np.int16).reshape(-1, 12),
                                  "node_xy": np.asarray(e["node_xy"], dtype=float).reshape(-1, 2)})
                    for e in exps] for exps in data["experiences"]]
    names = {int(k): v for k, v in data["names"].items()}
    points = data.get("goal_points")
    return DecisionRetrieval(experiences, names, float(data["coarse_ms"]), float(data["fine_ms"]),
                             None if points is None else np.asarray(points, dtype=float).reshape(-1, 2),
                             encode_ms=float(data.get("encode_ms", 0.0)))


# -- the deployments ------------------------------------------------------------------------------
class RetrieverDeployment:
    """A replica of the retriever: ``load_retriever(settings)`` once, then one retrieval per call.

    Retrievals are serialised by a lock: Serve runs sync methods in a thread pool, the retriever
    caches per query (not thread-safe), and its work is CPU-bound Python, so threads would only
    interleave. ``max_ongoing_requests`` bounds the queue per replica; more replicas scale it.
    """

    def __init__(self, settings: Settings) -> None:
        self.retriever = load_retriever(settings)
        self.lock = threading.Lock()

    def retrieve(self, request: Mapping[str, Any]) -> dict:
        """``{"goal": str, "candidates": [trajectory dict, ...], "place": MapPlace dict or None}``
        -> ``retrieval_to_dict``."""
        try:
            goal = str(request["goal"])
            trajectories = [TopoPolarTrajectory.from_dict(t) for t in request["candidates"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise PlannerRequestError(f"retrieval request: {type(exc).__name__}: {exc}") from None
        place = place_from_request(request)
        with self.lock:
            return retrieval_to_dict(self.retriever.retrieve(trajectories, goal, place))

    def home_goal_points(self, request: Mapping[str, Any]) -> list:
        """``{"scene", "goal"}`` -> the retriever's ``home_goal_points`` as ``[[x, y], ...]``."""
        scene, goal = home_lookup_from_request(request)
        with self.lock:
            return self.retriever.home_goal_points(scene, goal).tolist()


class PlannerDeployment:
    """A replica of the planner (the app's ingress): scoring over the Retriever's answer.

    ``decide`` for handles, ``__call__`` for HTTP (POST a ``decision_request`` JSON body).
    """

    def __init__(self, retriever: Any, settings: Settings) -> None:
        self.retriever = retriever  # DeploymentHandle of the Retriever deployment
        # None: this replica retrieves itself (``serve.retriever_in_planner``): no second hop.
        self.local = load_retriever(settings) if retriever is None else None
        self.lock = threading.Lock()
        cfg = settings.scoring
        self.scorer = ScoringPlanner(None, cfg, load_value_model(cfg.value_model, settings.navigator.vocabulary, cfg))

    async def decide(self, request: Mapping[str, Any]) -> dict:
        """One decision: ``{"choice", "scores", "retrieval_ms", "coarse_ms", "encode_ms", "fine_ms",
        "planner_ms", "goal_points"}`` (milliseconds; ``retrieval_ms`` is the retriever's own
        compute time, ``coarse_ms`` + ``fine_ms`` of which ``encode_ms`` embedded the candidates;
        ``planner_ms`` this replica's whole time, the hop to the retriever included;
        ``goal_points``: the projected goal points the choice used, joined with the request's
        own, which the client sends back with its next decision: the app keeps no episode state)."""
        started = time.perf_counter()
        ctx, trajectories = context_from_request(request)
        if self.local is not None:
            with self.lock:
                retrieval = self.local.retrieve(trajectories, ctx.goal, ctx.place)
        else:
            answer = await self.retriever.retrieve.remote(
                {"goal": ctx.goal, "candidates": [c["trajectory"] for c in request["candidates"]],
                 "place": request.get("place")})
            retrieval = retrieval_from_dict(answer)
        if len(retrieval.experiences) != len(trajectories):
            raise RuntimeError(f"the retriever answered {len(retrieval.experiences)} candidates "
                               f"for {len(trajectories)}")
        if self.scorer.cfg.keep_goal_points:  # the episode's points travel with its requests
            retrieval = with_kept_points(retrieval, kept_points_from_request(request))
        points = None if retrieval.goal_points is None else np.asarray(retrieval.goal_points).tolist()
        retrieval = with_home_points(retrieval, home_points_from_request(request))
        scores = self.scorer.score(ctx, retrieval, value_features_from_request(request, self.scorer.value))
        return {"choice": int(np.argmax(scores)), "scores": [float(s) for s in scores],
                "retrieval_ms": retrieval.total_ms, "coarse_ms": retrieval.coarse_ms,
                "encode_ms": retrieval.encode_ms, "fine_ms": retrieval.fine_ms,
                "planner_ms": (time.perf_counter() - started) * 1e3, "goal_points": points}

    async def home_goal_points(self, request: Mapping[str, Any]) -> list:
        """``{"scene", "goal"}`` -> where the memory's walks of that home saw the goal, ``[[x, y],
        ...]`` map-frame metres (``Retriever.home_goal_points``): an evaluator asks once per
        episode, keeps the places it has not searched yet and sends them with each decision
        (``"home_points"``), as the in-process planner does with its own."""
        if self.local is None:
            return await self.retriever.home_goal_points.remote(request)
        scene, goal = home_lookup_from_request(request)
        with self.lock:
            return self.local.home_goal_points(scene, goal).tolist()

    async def __call__(self, http_request: Any) -> Any:
        from starlette.responses import JSONResponse

        if http_request.method != "POST":
            return JSONResponse({"error": "POST a decision request (JSON)"}, status_code=405)
        try:
            body = json.loads(await http_request.body())
            return JSONResponse(await self.decide(body))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return JSONResponse({"error": "the request body is not JSON"}, status_code=400)
        except PlannerRequestError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)


# -- deploying ------------------------------------------------------------------------------------
def app_name(settings: Settings, cfg: PlannerServeConfig) -> str:
    """``<app_name>-<hash>``: one app per configuration, so evaluation jobs (and shards of one
    job) with the same planner share it and different variants never collide. The hash covers
    the values of the app's sections (``APP_SECTIONS``), its Serve sizing and the store's table
    versions, so a store that changed since (rebuilt, re-embedded) or a refitted value model
    gets a new app instead of a stale one."""
    from dataclasses import asdict

    store = settings.retrieval.store
    versions = MemoryStore(store, read_only=True).versions() if store else {}
    value_model = settings.scoring.value_model  # a refitted model: a new app
    value_hash = hashlib.sha1(artefacts.local_copy(value_model).read_bytes()).hexdigest() if value_model else ""
    sections = {name: config.to_dict(getattr(settings, name)) for name in APP_SECTIONS}
    key = json.dumps([sections, asdict(cfg), versions, value_hash], sort_keys=True)
    return f"{cfg.app_name}-{hashlib.sha1(key.encode()).hexdigest()[:10]}"


def build_planner_app(settings: Settings, cfg: PlannerServeConfig) -> Any:
    """The Serve application: ``Planner`` (ingress) bound to a ``Retriever`` handle, or with
    ``retriever_in_planner`` the ``Planner`` alone, sized as the retriever, retrieving itself.
    Each replica is handed ``settings``."""
    from ray import serve

    if cfg.retriever_in_planner:
        alone = serve.deployment(
            PlannerDeployment, name=PLANNER, num_replicas=cfg.retriever_replicas,
            max_ongoing_requests=cfg.retriever_max_ongoing_requests,
            health_check_period_s=cfg.health_check_period_s,
            ray_actor_options={"num_cpus": cfg.retriever_num_cpus + cfg.planner_num_cpus})
        return alone.bind(None, settings)
    retriever = serve.deployment(
        RetrieverDeployment, name=RETRIEVER, num_replicas=cfg.retriever_replicas,
        max_ongoing_requests=cfg.retriever_max_ongoing_requests,
        health_check_period_s=cfg.health_check_period_s,
        ray_actor_options={"num_cpus": cfg.retriever_num_cpus})
    planner = serve.deployment(
        PlannerDeployment, name=PLANNER, num_replicas=cfg.planner_replicas,
        max_ongoing_requests=cfg.planner_max_ongoing_requests,
        health_check_period_s=cfg.health_check_period_s,
        ray_actor_options={"num_cpus": cfg.planner_num_cpus})
    return planner.bind(retriever.bind(settings), settings)


def start_serve(cfg: PlannerServeConfig) -> None:
    """Start Serve (if it is not running) with the HTTP proxy on ``cfg.host:cfg.port`` (loopback
    by default) or without a proxy when ``cfg.http`` is off. Serve's HTTP options are fixed
    when it first starts: a Serve that already runs keeps its own."""
    from ray import serve

    if cfg.http:
        serve.start(http_options={"host": cfg.host, "port": cfg.port})
    else:
        serve.start(proxy_location="Disabled")


def deploy_planner_app(settings: Settings, cfg: PlannerServeConfig) -> tuple[str, bool]:
    """Deploy the planner app for ``settings`` unless it already runs; ``(name, deployed)``.

    Waits until its replicas are up (the retriever loads the store and the encoder). A replica
    that cannot start (no store, wrong model) raises ``RuntimeError`` with its first error line.
    """
    from ray import serve

    name = app_name(settings, cfg)
    if _wait_while_deploying(name, cfg.request_timeout_s):  # e.g. another shard's job deploys it
        return name, False
    start_serve(cfg)
    route = f"{cfg.route_prefix.rstrip('/')}/{name}" if cfg.http else None
    try:
        # No per-request access log: an evaluation makes tens of decisions per episode.
        serve.run(build_planner_app(settings, cfg), name=name, route_prefix=route,
                  logging_config={"enable_access_log": False})
    except Exception as exc:  # noqa: BLE001 - Serve reports a failed replica constructor as RuntimeError
        reason = _failure_reason(_deployment_messages(name)) or _failure_reason(str(exc)) or first_line(exc)
        _delete_quietly(name)
        raise RuntimeError(f"planner Serve app {name} did not start: {reason}") from None
    return name, True


def _deployment_messages(name: str) -> str:
    """What Serve says of app ``name``'s deployments: a replica whose constructor raised leaves its
    traceback there, while ``serve.run`` raises only "Failed to update the deployments"."""
    from ray import serve

    try:
        app = serve.status().applications.get(name)
    except Exception:  # noqa: BLE001 - best effort while reporting a failed deploy
        return ""
    return "" if app is None else "\n".join(d.message for d in app.deployments.values() if d.message)


def _failure_reason(text: str) -> str:
    """The innermost error of a failed deploy's text: the last line that names a raised exception
    (a traceback ends with the one that started it all); "" if none does."""
    raised = [line for line in (line.strip() for line in text.splitlines()) if _names_an_error(line)]
    return raised[-1] if raised else ""


def _names_an_error(line: str) -> bool:
    """``SomeError: message`` (a traceback's last line), the way Python prints a raised exception."""
    head, colon, _ = line.partition(": ")
    return bool(colon) and head.split(".")[-1].endswith(("Error", "Exception")) and " " not in head


def app_status(name: str) -> str:
    """The Serve status of application ``name`` (``RUNNING``, ``DEPLOYING``, ...; "" if none)."""
    from ray import serve

    status = serve.status().applications.get(name)
    return "" if status is None else str(getattr(status.status, "value", status.status))


def _wait_while_deploying(name: str, timeout_s: float) -> bool:
    """Whether app ``name`` runs, after waiting up to ``timeout_s`` while it is being deployed."""
    deadline = time.monotonic() + timeout_s
    while app_status(name) == "DEPLOYING" and time.monotonic() < deadline:
        time.sleep(0.5)
    return app_status(name) == "RUNNING"


def _delete_quietly(name: str) -> None:
    from ray import serve

    try:
        serve.delete(name)
    except Exception:  # noqa: BLE001 - best effort after a failed deploy
        log.debug("could not delete Serve app %s", name, exc_info=True)


def delete_planner_app(name: str) -> None:
    """Delete the app (its replicas stop; Serve itself keeps running)."""
    from ray import serve

    serve.delete(name)


def http_url(name: str, cfg: PlannerServeConfig) -> str:
    """The app's HTTP endpoint (``POST`` a ``decision_request`` JSON body)."""
    return f"http://{cfg.host}:{cfg.port}{cfg.route_prefix.rstrip('/')}/{name}"


def replica_actor_names(name: str, deployment: str) -> list[str]:
    """Names of the live replica actors of ``deployment`` in app ``name`` (namespace ``serve``),
    e.g. for fault injection: ``ray.kill(ray.get_actor(n, namespace="serve"))``."""
    import ray

    prefix = f"SERVE_REPLICA::{name}#{deployment}#"
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a.get("namespace") == "serve" and a["name"].startswith(prefix))


# -- the client -----------------------------------------------------------------------------------
class RemotePlanner(RetrievalTimings):
    """``planners.base.Planner`` that decides through the Planner deployment of app ``app``.

    Per episode it keeps ``retrieval_ms`` (the retriever's compute time per decision, as the
    in-process planner reports it, and its split: ``RetrievalTimings``), ``serve_ms`` (request
    round trips), ``serve_overhead_ms`` (round trip minus retrieval: the Serve hops, the wire
    format and scoring) and ``serve_retries``.
    Failed requests (a replica died, a timeout) are retried with exponential backoff for up to
    ``cfg.request_retry_s``; then ``ServeUnavailableError``. Malformed requests are not retried.
    ``home``: the scoring section when the app prices known-home places (``retrieval.home_goals``):
    at an episode's first decision the client asks where the memory's walks of its home saw the
    goal, and sends those it has not searched yet with every decision (it holds the map).
    """

    name = "trajrag"

    def __init__(self, app: str, cfg: PlannerServeConfig, handle: Any = None, wants_place: bool = False,
                 value: Any = None, home: ScoringConfig | None = None) -> None:
        self.app, self.cfg, self._handle = app, cfg, handle
        self.wants_place = wants_place  # the app's retriever projects the goal (sends ctx.place)
        self.value = value  # the app's frontier value model: its features come from this side's map
        self.home = home
        self.goal_points: list | None = None  # the episode's projected goal points, from the app
        self.home_points: np.ndarray | None = None  # where this home's walks saw the goal, not yet visited
        self.goal = ""
        self.reset_timings()
        self.last_answer: dict | None = None

    def reset(self, goal: str, seed: int) -> None:
        self.goal = goal
        self.reset_timings()
        self.goal_points = None
        self.home_points = None

    def reset_timings(self) -> None:
        super().reset_timings()
        self.serve_ms: list[float] = []
        self.serve_overhead_ms: list[float] = []  # round trip minus the retriever's compute time
        self.retries = 0

    def episode_stats(self) -> dict:
        """Per-episode counters for the evaluation records (``agent.evaluate.episode_record``)."""
        return {**super().episode_stats(), "serve_ms": [round(t, 3) for t in self.serve_ms],
                "serve_overhead_ms": [round(t, 3) for t in self.serve_overhead_ms],
                "serve_retries": self.retries}

    def choose(self, ctx: PlannerContext) -> int:
        payload = {**decision_request(ctx, self.value), "goal_points": self.goal_points}
        if self.home is not None:
            payload["home_points"] = self._unvisited_home_points(ctx).tolist()
        answer = self.request(payload)
        self.goal_points = answer.get("goal_points") or self.goal_points
        choice = int(answer["choice"])
        if not 0 <= choice < len(ctx.candidates):
            raise RuntimeError(f"the planner app answered choice {choice} for {len(ctx.candidates)} candidates")
        self.last_answer = answer
        self.add_timings(float(answer["retrieval_ms"]), float(answer.get("coarse_ms", 0.0)),
                         float(answer.get("encode_ms", 0.0)))
        self.serve_overhead_ms.append(self.serve_ms[-1] - self.retrieval_ms[-1])
        return choice

    def _unvisited_home_points(self, ctx: PlannerContext) -> np.ndarray:
        """As ``ScoringPlanner._unvisited_home_points``, the places asked of the app."""
        if self.home_points is None:  # the episode's first decision
            found, _ms = self._call("home_goal_points", {"scene": ctx.trajectory.scene_id, "goal": ctx.goal})
            self.home_points = np.asarray(found, dtype=float).reshape(-1, 2)
        self.home_points = unvisited_home_points(self.home_points, ctx, self.home)
        return self.home_points

    def request(self, payload: dict) -> dict:
        """Send one decision request and return the answer (retrying as the class says)."""
        answer, ms = self._call("decide", payload)
        self.serve_ms.append(ms)
        return answer

    def _call(self, method: str, payload: dict) -> tuple[Any, float]:
        """``method(payload)`` on the app's ingress, retried as the class says: (the answer, the
        round trip of the try that got it, ms)."""
        deadline = time.monotonic() + self.cfg.request_retry_s
        attempt = 0
        while True:
            started = time.perf_counter()
            try:
                answer = getattr(self.handle(), method).remote(payload).result(timeout_s=self.cfg.request_timeout_s)
                return answer, (time.perf_counter() - started) * 1e3
            except Exception as exc:  # noqa: BLE001 - sorted by is_transient below
                if not is_transient(exc):
                    raise
                wait = min(self.cfg.retry_backoff_s * 2 ** attempt, MAX_BACKOFF_S)
                if time.monotonic() + wait > deadline:
                    raise ServeUnavailableError(
                        f"planner app {self.app}: no answer within {self.cfg.request_retry_s:.0f} s "
                        f"({attempt + 1} tries): {first_line(exc)}") from None
                log.warning("planner app %s: request failed (%s), retrying in %.1f s",
                            self.app, first_line(exc), wait)
                attempt += 1
                self.retries += 1
                time.sleep(wait)

    def handle(self) -> Any:
        if self._handle is None:
            from ray import serve

            self._handle = serve.get_app_handle(self.app)
        return self._handle


MAX_BACKOFF_S = 5.0  # longest wait between two tries of one request


def is_transient(exc: BaseException) -> bool:
    """Whether a failed request may succeed when sent again: a replica died or is restarting
    (also when the Planner saw it happen to the Retriever it called), a timeout, Serve's
    backpressure. Errors raised by the deployments' own code (bad request, a bug) are not."""
    from ray.exceptions import RayActorError, RayTaskError, TaskCancelledError, WorkerCrashedError
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError

    system = (RayActorError, WorkerCrashedError, TaskCancelledError, TimeoutError, BackPressureError,
              DeploymentUnavailableError, ReplicaUnavailableError)
    seen = 0
    while exc is not None and seen < 8:  # a Planner-side error wraps the Retriever's
        if isinstance(exc, PlannerRequestError):
            return False
        if isinstance(exc, system):
            return True
        if not isinstance(exc, RayTaskError):
            return False
        exc, seen = getattr(exc, "cause", None), seen + 1
    return False
