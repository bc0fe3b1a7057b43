"""Oracle semantics from the simulator's instance/category images, with a configurable noise model.

With every noise knob at zero (``configs/perception.yaml``) the masks are exactly the rendered
category pixels. The knobs imitate what an open-vocabulary detector (GroundingDINO + MobileSAM)
gets wrong, each drawn independently per frame so that, like a real detector, an object can
flicker in and out of view:

* ``miss_rate``: each visible instance is dropped from the frame with this probability;
* ``confusion_rate``: each kept instance is relabelled, with this probability, with one of its
  confusable categories (``confusable`` table, by name; only names in the vocabulary count);
* ``erosion_px``: masks lose this many pixels at every instance boundary (square window), like
  the loose edges of a box-prompted SAM mask read conservatively;
* ``false_positives_per_frame``: a Poisson number of disk-shaped blobs per frame, each labelled
  with a uniformly drawn vocabulary category.

Randomness comes from one ``numpy.random.Generator`` seeded at construction / ``reset``: the same
seed and the same frames give the same masks.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage as ndi
from skimage.draw import disk

from trajrag.perception.base import check_masks
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
        if not vocabulary:
            raise ValueError("OracleSegmenter: the vocabulary is empty")
        if len(set(vocabulary)) != len(vocabulary):
            raise ValueError(f"OracleSegmenter: the vocabulary has duplicate names: {list(vocabulary)}")
        validate_config(cfg)
        self._vocabulary = tuple(vocabulary)
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
        label = self._vocab_labels(obs)
        cfg = self._cfg
        noisy = cfg.miss_rate > 0 or cfg.confusion_rate > 0 or cfg.erosion_px > 0
        if noisy:
            label = self._instance_noise(label, obs.instance)
        masks = label[None, :, :] == np.arange(len(self._vocabulary), dtype=np.int16)[:, None, None]
        if cfg.false_positives_per_frame > 0:
            self._add_false_positives(masks)
        return check_masks(masks, len(self._vocabulary), label.shape, "OracleSegmenter")

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

    def _instance_noise(self, label: np.ndarray, instance: np.ndarray) -> np.ndarray:
        """Miss, confuse and erode whole instances; returns the new vocabulary-label image."""
        cfg = self._cfg
        inst = np.where(label >= 0, np.asarray(instance, dtype=np.int64), 0)
        if inst.min() < 0:
            raise ValueError("OracleSegmenter: negative instance ids in the instance image")
        counts = np.bincount(inst.ravel())
        ids = np.flatnonzero(counts[1:]) + 1  # sorted: the draws below are in a fixed order
        inst_label = np.full(counts.size, -1, dtype=np.int16)
        inst_label[inst.ravel()] = label.ravel()  # one category per instance: any pixel will do
        new_label = inst_label.copy()
        missed = self._rng.random(ids.size) < cfg.miss_rate
        confused = self._rng.random(ids.size) < cfg.confusion_rate
        for i, inst_id in enumerate(ids):
            options = self._confusable[inst_label[inst_id]]
            if confused[i] and options.size:
                new_label[inst_id] = options[self._rng.integers(options.size)]
        new_label[ids[missed]] = -1
        new_label[0] = -1
        out = new_label[inst]
        # Pixels labelled but without an instance id carry no instance to drop: keep them as is.
        out = np.where((inst == 0) & (label >= 0), label, out)
        if cfg.erosion_px > 0:
            out = self._erode(out, np.where(out >= 0, inst, 0))
        return out

    def _erode(self, label: np.ndarray, inst: np.ndarray) -> np.ndarray:
        """Keep a pixel only if its whole (2e+1)^2 window belongs to the same instance."""
        size = 2 * self._cfg.erosion_px + 1
        low = ndi.minimum_filter(inst, size=size, mode="nearest")
        same = low == ndi.maximum_filter(inst, size=size, mode="nearest")
        return np.where(same & (inst > 0), label, np.where(inst == 0, label, -1)).astype(np.int16)

    def _add_false_positives(self, masks: np.ndarray) -> None:
        """Paint a Poisson number of random disks, each into a random category's mask."""
        _, h, w = masks.shape
        lo, hi = self._cfg.false_positive_radius_px
        for _ in range(self._rng.poisson(self._cfg.false_positives_per_frame)):
            centre = (self._rng.integers(h), self._rng.integers(w))
            radius = int(self._rng.integers(lo, hi + 1))
            category = int(self._rng.integers(len(self._vocabulary)))
            rr, cc = disk(centre, radius, shape=(h, w))
            masks[category, rr, cc] = True
