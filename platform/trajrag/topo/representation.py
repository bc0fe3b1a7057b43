"""Node representations of the paper's ablation (Tab. 1), as transforms of sector vectors.

* ``tps_gs``: topo-polar sectors with geometry and semantics (the full model): unchanged.
* ``tps_s``: semantics only: the object labels in their sectors, every non-object label
  (free, obstacle, unknown) made ``unknown``, so the free/wall layout around a node is gone.
* ``tps_g``: geometry only: every object label becomes ``obstacle`` (what an occupancy map
  sees), so only the free/wall/unknown layout is left.
* ``tna``: textual neighbour aggregation: the same labels as ``tps_gs`` but without their order
  (the node encoder writes them as a sorted bag of words; matching sorts each row).

The encoder applies it to node texts (``encoder.node_encoder``), the retriever to everything it
matches, so a variant is one switch.
"""

from __future__ import annotations

import numpy as np

from trajrag.topo.labels import OBSTACLE, UNKNOWN

TPS_GS, TPS_S, TPS_G, TNA = "tps_gs", "tps_s", "tps_g", "tna"
REPRESENTATIONS = (TPS_GS, TPS_S, TPS_G, TNA)


def represent(sectors: np.ndarray, representation: str) -> np.ndarray:
    """Sector labels int (K, 12) as ``representation`` keeps them (a new array for sorted /
    replaced labels; ``tna`` rows sorted so order-free comparisons line up)."""
    sectors = np.asarray(sectors)
    if representation == TPS_GS:
        return sectors
    if representation == TPS_S:
        return np.where(sectors >= 0, sectors, UNKNOWN).astype(sectors.dtype)
    if representation == TPS_G:
        return np.where(sectors >= 0, OBSTACLE, sectors).astype(sectors.dtype)
    if representation == TNA:
        return np.sort(sectors, axis=-1)
    raise ValueError(f"unknown node representation {representation!r}; known: {REPRESENTATIONS}")
