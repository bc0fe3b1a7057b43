"""Agents by name, as the command line names them.

Each entry maps a name to ``"module:factory"``; a factory takes the loaded sim config and the
command-line overrides and returns an object with ``reset(episode, scene)`` and ``act(obs)``.
Modules are imported only when their agent is asked for, so the core stays light.
"""

from __future__ import annotations

import importlib
from typing import Sequence

AGENTS: dict[str, str] = {
    "oracle": "trajrag.agent.registry:make_oracle",
    "frontier": "trajrag.agent.navigator:make_frontier_agent",
    "random": "trajrag.agent.navigator:make_random_agent",
    "frontier-oracle": "trajrag.agent.privileged:make_frontier_oracle_agent",
    "trajrag": "trajrag.planners.scoring:make_trajrag_agent",
    "graphrag": "trajrag.planners.graphrag:make_graphrag_agent",
    "value": "trajrag.planners.frontier_value:make_value_agent",
    "llm": "trajrag.planners.llm:make_llm_agent",
    "embodied-rag": "trajrag.planners.embodied_rag:make_embodied_rag_agent",
    "navprobe": "trajrag.planners.navprobe:make_navprobe_agent",
}

# The agents that read a memory (retrieval.store and its encoder) and those that score frontiers
# with a value model (scoring.value_model, when set).
RETRIEVING_AGENTS = ("trajrag", "llm", "graphrag", "embodied-rag", "navprobe")
VALUE_AGENTS = ("trajrag", "llm", "value")


def make_agent(name: str, sim_cfg, overrides: Sequence[str] = (), seed: int = 0):
    """A fresh agent called ``name``; ``KeyError`` listing the known names otherwise."""
    try:
        module_name, factory = AGENTS[name].split(":")
    except KeyError:
        raise KeyError(f"unknown agent {name!r}; known: {sorted(AGENTS)}") from None
    return getattr(importlib.import_module(module_name), factory)(sim_cfg, overrides, seed)


def make_oracle(sim_cfg, overrides: Sequence[str] = (), seed: int = 0):
    """The privileged shortest-walk oracle (needs no seed)."""
    from trajrag import config
    from trajrag.agent.oracle import OracleAgent

    return OracleAgent(config.load("oracle", overrides), sim_cfg, config.load("episodes", overrides))
