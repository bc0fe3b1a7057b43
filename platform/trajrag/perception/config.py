"""Perception settings (``configs/perception.yaml``): which segmenter runs, and its parameters.

Kept apart from the segmenters so that reading the settings never imports torch: the oracle
(``perception/oracle.py``) is numpy only; the GroundingDINO + SAM adapter
(``perception/grounded_sam.py``) imports torch and transformers when it is built.
"""

from __future__ import annotations

from dataclasses import dataclass

SEGMENTERS = ("oracle", "grounded-sam")


@dataclass
class GroundedSamConfig:
    """GroundingDINO (boxes from a text prompt) + SAM / MobileSAM (a mask per box), transformers classes.

    grounding_dino_path, sam_path: local folders of Hugging Face checkpoints (config.json +
    weights); never downloaded. box_threshold, text_threshold: GroundingDINO's score thresholds
    (box confidence, token-to-phrase). max_detections: boxes kept per frame, best first.
    """

    grounding_dino_path: str
    sam_path: str
    box_threshold: float
    text_threshold: float
    max_detections: int


@dataclass
class PerceptionConfig:
    """Which segmenter runs and the oracle's error model (all rates are probabilities in [0, 1]).

    profile: the name of the error profile these values are (``oracle`` for exact semantics;
    ``configs/presets/perception_*.yaml`` set the others), recorded with every run.
    segmenter: ``oracle`` (the simulator's semantics + this error model) or ``grounded-sam``.
    device: torch device of a learned segmenter (``cpu``, ``cuda``, ``auto``: cuda when present).
    grounded_sam: the GroundingDINO + SAM adapter's settings.
    miss_rate: probability that a visible instance is missing from a frame.
    false_positives_per_frame: mean number (Poisson) of spurious blobs per frame.
    false_positive_radius_px: [min, max] radius in pixels of a spurious blob (uniform integer).
    confusion_rate: probability that a detected instance is relabelled with a confusable category.
    confusable: category name -> names it may be mistaken for.
    erosion_px: pixels removed at every instance boundary (0 = exact masks).
    error_scale: multiplies miss_rate, confusion_rate, false_positives_per_frame and bleed_px (the
        x axis of the robustness curves; 1 = the profile as written; 0 = exact masks).
    miss_halving_m: metres of distance over which an instance's detection probability halves
        (0: distance does not matter). min_size_px: apparent size (square root of its pixel count,
        at 640x480) below which detection probability falls in proportion (0: size does not matter).
    bleed_px: pixels a detected mask spreads past the instance's outline, whatever lies there
        (a box-prompted mask spilling onto the wall or floor behind the object).
    confidence_floor: the lowest score a detection is reported with (the detector's box threshold).
    false_positive_confidence: [min, max] score of a spurious blob (uniform).
    confusion_confidence: factor on the part of a relabelled detection's score above the floor.
    """

    profile: str
    segmenter: str
    device: str
    grounded_sam: GroundedSamConfig
    miss_rate: float
    false_positives_per_frame: float
    false_positive_radius_px: list[int]
    confusion_rate: float
    confusable: dict[str, list[str]]
    erosion_px: int
    error_scale: float
    miss_halving_m: float
    min_size_px: float
    bleed_px: int
    confidence_floor: float
    false_positive_confidence: list[float]
    confusion_confidence: float

    def __post_init__(self) -> None:
        validate_config(self)

    def scaled(self, key: str) -> float:
        """A rate (or ``bleed_px``) times ``error_scale``; rates stay probabilities."""
        value = getattr(self, key) * self.error_scale
        return min(value, 1.0) if key in ("miss_rate", "confusion_rate") else value

    @property
    def has_errors(self) -> bool:
        """Whether any error of the model is on (else the masks are the exact oracle's)."""
        knobs = (self.miss_rate, self.confusion_rate, self.false_positives_per_frame, self.bleed_px,
                 self.miss_halving_m, self.min_size_px)
        return (self.error_scale > 0 and any(k > 0 for k in knobs)) or self.erosion_px > 0


def validate_config(cfg: PerceptionConfig) -> None:
    """``ValueError`` naming the key if a noise parameter is out of range."""
    if cfg.segmenter not in SEGMENTERS:
        raise ValueError(f"perception.segmenter must be one of {list(SEGMENTERS)}, got {cfg.segmenter!r}")
    for key in ("miss_rate", "confusion_rate"):
        value = getattr(cfg, key)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"perception.{key} must be in [0, 1], got {value}")
    if cfg.false_positives_per_frame < 0:
        raise ValueError(f"perception.false_positives_per_frame must be >= 0, got {cfg.false_positives_per_frame}")
    radius = list(cfg.false_positive_radius_px)
    if len(radius) != 2 or not 1 <= radius[0] <= radius[1]:
        raise ValueError(f"perception.false_positive_radius_px must be [min, max] with 1 <= min <= max, got {radius}")
    if cfg.erosion_px < 0:
        raise ValueError(f"perception.erosion_px must be >= 0, got {cfg.erosion_px}")
    for key in ("error_scale", "miss_halving_m", "min_size_px", "bleed_px"):
        if getattr(cfg, key) < 0:
            raise ValueError(f"perception.{key} must be >= 0, got {getattr(cfg, key)}")
    low, high = (list(cfg.false_positive_confidence) + [None, None])[:2]
    if len(cfg.false_positive_confidence) != 2 or not 0 <= low <= high <= 1 or not 0 <= cfg.confidence_floor <= 1 \
            or not 0 <= cfg.confusion_confidence <= 1:
        raise ValueError("perception: confidence_floor and confusion_confidence must be in [0, 1] and "
                         f"false_positive_confidence [min, max] within [0, 1], got {cfg.confidence_floor}, "
                         f"{cfg.confusion_confidence}, {cfg.false_positive_confidence}")
    if cfg.profile != "oracle" and cfg.segmenter == "oracle" and not cfg.has_errors:
        raise ValueError(f"perception.profile is {cfg.profile!r} but every error of the model is off "
                         f"(error_scale {cfg.error_scale}): a non-oracle profile must make errors")


