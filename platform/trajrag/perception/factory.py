"""The segmenter that ``perception.segmenter`` names, built for one vocabulary.

The grounded-sam adapter is imported only in its branch: it imports torch and transformers,
which the oracle (numpy only) never needs.
"""

from __future__ import annotations

from trajrag.perception.base import ObjectSegmenter
from trajrag.perception.config import SEGMENTERS, PerceptionConfig
from trajrag.perception.oracle import OracleSegmenter


def make_segmenter(
    vocabulary: tuple[str, ...],
    scene_categories: tuple[str, ...],
    cfg: PerceptionConfig,
    seed: int,
) -> ObjectSegmenter:
    """``OracleSegmenter`` (reads the scene's category ids, noise seeded by ``seed``) or
    ``GroundedSamSegmenter`` (weights from ``cfg.grounded_sam``; needs rgb frames, ignores
    ``scene_categories`` and ``seed``)."""
    if cfg.segmenter == "oracle":
        return OracleSegmenter(vocabulary, scene_categories, cfg, seed)
    if cfg.segmenter == "grounded-sam":
        from trajrag.perception.grounded_sam import GroundedSamSegmenter

        return GroundedSamSegmenter(vocabulary, cfg)
    raise ValueError(f"perception.segmenter must be one of {list(SEGMENTERS)}, got {cfg.segmenter!r}")
