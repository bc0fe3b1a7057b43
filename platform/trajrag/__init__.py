"""TrajRAG: retrieval of geometric-semantic trajectory experience for zero-shot ObjectNav.

The package is split into one folder per stage (see DESIGN.md); dependencies point one way:
world -> perception -> mapping -> topo -> memory -> encoder -> retrieval -> planners -> agent
-> distributed. The core imports without Ray, LanceDB, torch or habitat.
"""

__version__ = "0.1.0"
