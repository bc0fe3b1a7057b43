"""Perception: per-frame object masks for the agent's category vocabulary.

``base.ObjectSegmenter`` is the interface (GroundingDINO + MobileSAM on a GPU cluster);
``oracle.OracleSegmenter`` reads the simulator's semantics, with an optional noise model.
"""

from trajrag.perception.base import ObjectSegmenter, check_masks
from trajrag.perception.config import PerceptionConfig
from trajrag.perception.oracle import OracleSegmenter

__all__ = ["ObjectSegmenter", "OracleSegmenter", "PerceptionConfig", "check_masks"]
