"""Agents by name, as the command line names them, and the factories that make them.

Each factory takes the run's ``Settings`` (``trajrag.config``) and a seed and returns an object
with ``reset(episode, scene)`` and ``act(obs)``: the oracle, or the navigator deciding with one
planner. The names, and which agents read a memory or a value model, are in ``agent/names.py``.
"""

from __future__ import annotations

from typing import Any, Callable

from trajrag.agent.navigator import Navigator, make_navigator
from trajrag.agent.oracle import OracleAgent
from trajrag.agent.privileged import FrontierOraclePlanner
from trajrag.config import Settings
from trajrag.planners.frontier import NearestFrontierPlanner, RandomFrontierPlanner
from trajrag.planners.frontier_value import FrontierValuePlanner, ValueModelError, load_value_model
from trajrag.planners.embodied_rag import make_embodied_rag_planner
from trajrag.planners.graphrag import GraphRAGPlanner, shared_scene_graph
from trajrag.planners.llm import make_llm_planner
from trajrag.planners.navprobe import make_navprobe_planner
from trajrag.planners.scoring import make_scoring_planner

def make_oracle(settings: Settings, seed: int = 0) -> OracleAgent:
    """The privileged shortest-walk oracle (needs no seed)."""
    return OracleAgent(settings.oracle, settings.sim, settings.episodes)


def make_frontier_agent(settings: Settings, seed: int = 0) -> Navigator:
    """The navigator with the nearest-frontier planner (``navigator.frontier_hysteresis_m``)."""
    return make_navigator(NearestFrontierPlanner(settings.navigator.frontier_hysteresis_m), settings, seed)


def make_random_agent(settings: Settings, seed: int = 0) -> Navigator:
    """The navigator picking a random frontier."""
    return make_navigator(RandomFrontierPlanner(), settings, seed)


def make_frontier_oracle_agent(settings: Settings, seed: int = 0) -> Navigator:
    """``--planner frontier-oracle``: the navigator of every other planner, ranking with privilege."""
    planner = FrontierOraclePlanner(settings.audit, settings.episodes, settings.navigator.frontier_hysteresis_m)
    navigator = make_navigator(planner, settings, seed)
    navigator.episode_observer = planner.see_episode
    return navigator


def make_trajrag_agent(settings: Settings, seed: int = 0) -> Navigator:
    """The navigator with the retrieval-scoring planner (store and model from ``retrieval.*``)."""
    return make_navigator(make_scoring_planner(settings), settings, seed)


def make_graphrag_agent(settings: Settings, seed: int = 0) -> Navigator:
    """The navigator with the GraphRAG planner over ``retrieval.store``."""
    cfg = settings.graphrag
    return make_navigator(GraphRAGPlanner(shared_scene_graph(settings.retrieval.store, cfg.min_support), cfg),
                          settings, seed)


def make_value_agent(settings: Settings, seed: int = 0) -> Navigator:
    """The navigator with ``FrontierValuePlanner`` (model from ``scoring.value_model``)."""
    scoring = settings.scoring
    if not scoring.value_model:
        raise ValueModelError("the value planner needs a model: --set scoring.value_model=VALUE.json "
                              "(written by `trajrag value fit`)")
    planner = FrontierValuePlanner(load_value_model(scoring.value_model, settings.navigator.vocabulary, scoring),
                                   settings.navigator.frontier_hysteresis_m, scoring.w_experience)
    return make_navigator(planner, settings, seed)


def make_llm_agent(settings: Settings, seed: int = 0) -> Navigator:
    """The navigator with the LLM planner (``configs/llm.yaml``)."""
    return make_navigator(make_llm_planner(settings), settings, seed)


def make_embodied_rag_agent(settings: Settings, seed: int = 0) -> Navigator:
    """The navigator with the Embodied-RAG planner (semantic forest of ``retrieval.store``)."""
    return make_navigator(make_embodied_rag_planner(settings), settings, seed)


def make_navprobe_agent(settings: Settings, seed: int = 0) -> Navigator:
    """The navigator with the NavProbe planner (agenda, episode index, ``retrieval.store``)."""
    return make_navigator(make_navprobe_planner(settings), settings, seed)


AGENTS: dict[str, Callable[[Settings, int], Any]] = {
    "oracle": make_oracle,
    "frontier": make_frontier_agent,
    "random": make_random_agent,
    "frontier-oracle": make_frontier_oracle_agent,
    "trajrag": make_trajrag_agent,
    "graphrag": make_graphrag_agent,
    "value": make_value_agent,
    "llm": make_llm_agent,
    "embodied-rag": make_embodied_rag_agent,
    "navprobe": make_navprobe_agent,
}


def make_agent(name: str, settings: Settings, seed: int = 0):
    """A fresh agent called ``name``; ``KeyError`` listing the known names otherwise."""
    try:
        factory = AGENTS[name]
    except KeyError:
        raise KeyError(f"unknown agent {name!r}; known: {sorted(AGENTS)}") from None
    return factory(settings, seed)
