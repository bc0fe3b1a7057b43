"""Oracle semantics from the simulator's instance/category images, with a detector-like error model.

With every error off (``configs/perception.yaml``, profile ``oracle``) the masks are exactly the
rendered category pixels, each with score 1. The errors imitate what an open-vocabulary detector
(GroundingDINO + SAM) gets wrong, drawn independently per frame so that, like a real detector, an
object flickers in and out of view (profiles: ``configs/presets/perception_*.yaml``):

* misses: a visible instance is detected with probability ``(1 - miss_rate)``, halved every
  ``miss_halving_m`` metres of its mean depth and scaled down when its apparent size is under
  ``min_size_px`` (far and small objects are missed most);
* confusions: a detected instance is relabelled, with probability ``confusion_rate``, with one of
  its confusable categories (``confusable`` table, by name: sofa / chair / bed, tv / picture);
* false positives: a Poisson number (``false_positives_per_frame``) of disk-shaped blobs on
  whatever is there (background or another object), each labelled with a random category;
* mask edges: ``erosion_px`` pixels lost at every outline, ``bleed_px`` pixels spilled past it
  onto what lies behind (``mapping.mask_depth_edge_m`` is the map's guard against the spill);
* scores: each detection's score grows with how detectable it was, from ``confidence_floor``;
  relabelled and spurious detections score low.

``segment_with_scores`` returns the masks and a per-pixel score image; the semantic map weighs its
evidence by the scores (``mapping.evidence_*``). Randomness comes from one generator seeded at
construction / ``reset`` (per episode): the same seed and frames give the same masks.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage as ndi
from skimage.draw import disk

from trajrag.perception.base import check_masks, check_vocabulary
from trajrag.perception.config import PerceptionConfig, validate_config
from trajrag.world.interface import Observations


class OracleSegmenter:
    """Masks for ``vocabulary`` from the simulator's category image (scene ids mapped by name).

    Scene categories that are not in the vocabulary are ignored; vocabulary names that the scene
    lacks simply never appear.
    """

    def __init__(
        self,
        vocabulary: tuple[str, ...],
        scene_categories: tuple[str, ...],
        cfg: PerceptionConfig,
        seed: int,
    ) -> None:
        self._vocabulary = check_vocabulary(vocabulary, "OracleSegmenter")
        validate_config(cfg)
        self._cfg = cfg
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        self._confusable = self._confusion_table(cfg.confusable)
        self.set_scene_categories(scene_categories)

    @property
    def vocabulary(self) -> tuple[str, ...]:
        return self._vocabulary

    def reset(self, seed: int | None = None) -> None:
        """Restart the noise stream (from ``seed``, or from the constructor's seed)."""
        self._seed = self._seed if seed is None else seed
        self._rng = np.random.default_rng(self._seed)

    def set_scene_categories(self, scene_categories: tuple[str, ...]) -> None:
        """Use a new scene's category tuple (its ids index the observations' category image)."""
        self._scene_categories = tuple(scene_categories)
        index = {name: k for k, name in enumerate(self._vocabulary)}
        # lut[scene_id + 1] = vocabulary index, -1 for "none" and for names outside the vocabulary.
        self._lut = np.array([-1] + [index.get(name, -1) for name in scene_categories], dtype=np.int16)

    def _confusion_table(self, confusable: dict[str, list[str]]) -> list[np.ndarray]:
        index = {name: k for k, name in enumerate(self._vocabulary)}
        table = []
        for name in self._vocabulary:
            options = [index[o] for o in confusable.get(name, []) if o in index and o != name]
            table.append(np.array(options, dtype=np.int16))
        return table

    # -- per frame ------------------------------------------------------------------------------
    def segment(self, obs: Observations) -> np.ndarray:
        """Bool ``(len(vocabulary), H, W)`` masks for one frame."""
        return self.segment_with_scores(obs)[0]

    def segment_with_scores(self, obs: Observations) -> tuple[np.ndarray, np.ndarray]:
        """``(masks, scores)``: bool ``(len(vocabulary), H, W)`` masks and float32 ``(H, W)`` the
        score of the detection painting each pixel (the highest where several do), 0 elsewhere."""
        label = self._vocab_labels(obs)
        cfg = self._cfg
        if cfg.has_errors:
            label, scores = self._instance_errors(label, obs)
        else:
            scores = (label >= 0).astype(np.float32)
        masks = label[None, :, :] == np.arange(len(self._vocabulary), dtype=np.int16)[:, None, None]
        if cfg.scaled("false_positives_per_frame") > 0:
            self._add_false_positives(masks, scores)
        return check_masks(masks, len(self._vocabulary), label.shape, "OracleSegmenter"), scores

    def _vocab_labels(self, obs: Observations) -> np.ndarray:
        """int16 (H, W): vocabulary index per pixel, -1 where none."""
        category = np.asarray(obs.category)
        if category.shape != np.asarray(obs.instance).shape:
            raise ValueError(
                f"OracleSegmenter: category image {category.shape} and instance image "
                f"{np.asarray(obs.instance).shape} differ in shape"
            )
        if category.size and (category.min() < -1 or category.max() >= len(self._scene_categories)):
            raise ValueError(
                f"OracleSegmenter: category ids span [{category.min()}, {category.max()}] but the scene has "
                f"{len(self._scene_categories)} categories {list(self._scene_categories)}; "
                "call set_scene_categories() with the current scene's categories"
            )
        return self._lut[category.astype(np.int32) + 1]

    def _instance_errors(self, label: np.ndarray, obs: Observations) -> tuple[np.ndarray, np.ndarray]:
        """Miss, confuse, score, erode and bleed whole instances; returns the new vocabulary-label
        image and its score image."""
        cfg = self._cfg
        inst = np.where(label >= 0, np.asarray(obs.instance, dtype=np.int64), 0)
        if inst.min() < 0:
            raise ValueError("OracleSegmenter: negative instance ids in the instance image")
        counts = np.bincount(inst.ravel())
        ids = np.flatnonzero(counts[1:]) + 1  # sorted: the draws below are in a fixed order
        inst_label = np.full(counts.size, -1, dtype=np.int16)
        inst_label[inst.ravel()] = label.ravel()  # one category per instance: any pixel will do
        depth = np.bincount(inst.ravel(), weights=np.asarray(obs.depth, dtype=np.float64).ravel())
        detectability = self._detectability(counts[ids], depth[ids] / counts[ids], label.size)
        detected = self._rng.random(ids.size) < detectability
        confused = self._rng.random(ids.size) < cfg.scaled("confusion_rate")
        score = np.zeros(counts.size, dtype=np.float32)
        floor = cfg.confidence_floor
        score[ids] = floor + (1.0 - floor) * detectability * self._rng.uniform(0.8, 1.0, ids.size)
        new_label = inst_label.copy()
        for i, inst_id in enumerate(ids):
            options = self._confusable[inst_label[inst_id]]
            if confused[i] and options.size:
                new_label[inst_id] = options[self._rng.integers(options.size)]
                score[inst_id] = floor + (score[inst_id] - floor) * cfg.confusion_confidence
        new_label[ids[~detected]] = -1
        new_label[0] = -1
        out = new_label[inst]
        # Pixels labelled but without an instance id carry no instance to drop: keep them as is.
        unowned = (inst == 0) & (label >= 0)
        out = np.where(unowned, label, out)
        scores = np.where(unowned, 1.0, np.where(out >= 0, score[inst], 0.0)).astype(np.float32)
        if cfg.erosion_px > 0:
            out = self._erode(out, np.where(out >= 0, inst, 0))
            scores = np.where(out >= 0, scores, 0.0).astype(np.float32)
        bleed = int(round(cfg.scaled("bleed_px")))
        if bleed > 0:
            out, scores = self._bleed(out, scores, bleed)
        return out, scores

    def _detectability(self, pixels: np.ndarray, mean_depth_m: np.ndarray, frame_pixels: int) -> np.ndarray:
        """Per instance, the probability a detector reports it: ``1 - miss_rate``, halved every
        ``miss_halving_m`` metres, times apparent size / ``min_size_px`` where smaller (sizes
        measured as at 640x480)."""
        cfg = self._cfg
        p = np.full(pixels.shape, 1.0 - cfg.scaled("miss_rate"))
        if cfg.miss_halving_m > 0:
            p *= 0.5 ** (mean_depth_m / cfg.miss_halving_m)
        if cfg.min_size_px > 0:
            size_px = np.sqrt(pixels * (640.0 * 480.0) / frame_pixels)
            p *= np.minimum(size_px / cfg.min_size_px, 1.0)
        return p

    @staticmethod
    def _bleed(label: np.ndarray, scores: np.ndarray, pixels: int) -> tuple[np.ndarray, np.ndarray]:
        """Spread every mask ``pixels`` past its outline onto unlabelled pixels (whatever depth)."""
        size = 2 * pixels + 1
        grown = ndi.maximum_filter(label.astype(np.int32) + 1, size=size, mode="constant") - 1
        spill = (label < 0) & (grown >= 0)
        out = np.where(spill, grown, label).astype(np.int16)
        spread = ndi.maximum_filter(scores, size=size, mode="constant")
        return out, np.where(spill, spread, scores).astype(np.float32)

    def _erode(self, label: np.ndarray, inst: np.ndarray) -> np.ndarray:
        """Keep a pixel only if its whole (2e+1)^2 window belongs to the same instance."""
        size = 2 * self._cfg.erosion_px + 1
        low = ndi.minimum_filter(inst, size=size, mode="nearest")
        same = low == ndi.maximum_filter(inst, size=size, mode="nearest")
        return np.where(same & (inst > 0), label, np.where(inst == 0, label, -1)).astype(np.int16)

    def _add_false_positives(self, masks: np.ndarray, scores: np.ndarray) -> None:
        """Paint a Poisson number of random disks, each into a random category's mask, with a
        low score (``false_positive_confidence``)."""
        _, h, w = masks.shape
        lo, hi = self._cfg.false_positive_radius_px
        score_lo, score_hi = self._cfg.false_positive_confidence
        for _ in range(self._rng.poisson(self._cfg.scaled("false_positives_per_frame"))):
            centre = (self._rng.integers(h), self._rng.integers(w))
            radius = int(self._rng.integers(lo, hi + 1))
            category = int(self._rng.integers(len(self._vocabulary)))
            rr, cc = disk(centre, radius, shape=(h, w))
            masks[category, rr, cc] = True
            scores[rr, cc] = np.maximum(scores[rr, cc], self._rng.uniform(score_lo, score_hi))
