"""Perception: per-frame object masks for the agent's category vocabulary.

``base.ObjectSegmenter`` is the interface; ``oracle.OracleSegmenter`` reads the simulator's
semantics, with a detector-like error model; ``grounded_sam.GroundedSamSegmenter`` (torch, imported
only by ``factory.make_segmenter``) runs GroundingDINO + SAM on a cluster with the weights.
"""

from trajrag.perception.base import ObjectSegmenter, check_masks
from trajrag.perception.config import PerceptionConfig
from trajrag.perception.oracle import OracleSegmenter

__all__ = ["ObjectSegmenter", "OracleSegmenter", "PerceptionConfig", "check_masks"]
