"""What the mapping stage needs from an object detector.

The paper runs GroundingDINO (boxes for text queries) + MobileSAM (masks in the boxes):
``perception/grounded_sam.py`` on clusters with the weights; the embedded default is the
simulator's oracle semantics with a detector-like error model (``perception/oracle.py``). Both
give one boolean mask per category of the agent's vocabulary and a score per pixel, so the
semantic map never knows which one ran.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from trajrag.world.interface import Observations


@runtime_checkable
class ObjectSegmenter(Protocol):
    """Per-frame object masks for a fixed category vocabulary.

    ``vocabulary[k]`` names the category of mask ``k``; the semantic map's object channels use
    the same order.
    """

    @property
    def vocabulary(self) -> tuple[str, ...]: ...

    def reset(self, seed: int | None = None) -> None:
        """Start a new episode (re-seeds any randomness; stateless detectors may ignore it)."""
        ...

    def segment(self, obs: Observations) -> np.ndarray:
        """Masks for one frame: bool ``(len(vocabulary), H, W)`` at the depth image's size."""
        ...

    def segment_with_scores(self, obs: Observations) -> tuple[np.ndarray, np.ndarray]:
        """``segment``'s masks and float32 ``(H, W)`` detection scores in [0, 1] (the score of the
        detection painting each pixel, 0 where none): the semantic map's evidence."""
        ...


def check_vocabulary(vocabulary: tuple[str, ...], who: str) -> tuple[str, ...]:
    """The vocabulary as a tuple; ``ValueError`` naming ``who`` if it is empty or repeats a name."""
    if not vocabulary:
        raise ValueError(f"{who}: the vocabulary is empty")
    if len(set(vocabulary)) != len(vocabulary):
        raise ValueError(f"{who}: the vocabulary has duplicate names: {list(vocabulary)}")
    return tuple(vocabulary)


def check_masks(masks: np.ndarray, n_categories: int, shape: tuple[int, int], who: str) -> np.ndarray:
    """Validate a segmenter's output; ``ValueError`` naming ``who`` if its shape or dtype is wrong."""
    masks = np.asarray(masks)
    expected = (n_categories, *shape)
    if masks.shape != expected:
        raise ValueError(f"{who}: masks have shape {masks.shape}, expected {expected} (categories, H, W)")
    if masks.dtype != np.bool_:
        raise ValueError(f"{who}: masks must be bool, got {masks.dtype}")
    return masks
