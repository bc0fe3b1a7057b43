"""The agents the command line names and what each of them reads: a light module, so commands
check names and decide which stages to run without importing the agents
(``agent/registry.py`` makes them)."""

from __future__ import annotations

AGENT_NAMES = ("oracle", "frontier", "random", "frontier-oracle", "trajrag", "graphrag", "value", "llm",
               "embodied-rag", "navprobe")
# The agents that read a memory (retrieval.store and its encoder) and those that score frontiers
# with a value model (scoring.value_model, when set).
RETRIEVING_AGENTS = ("trajrag", "llm", "graphrag", "embodied-rag", "navprobe")
VALUE_AGENTS = ("trajrag", "llm", "value")
