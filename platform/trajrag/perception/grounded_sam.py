"""GroundingDINO (boxes for the vocabulary as a text prompt) + SAM (a mask per box), transformers classes.

The paper's detector pair, behind ``ObjectSegmenter``. Each frame:

1. **Detect**: GroundingDINO scores its queries against the prompt ``"chair . tv monitor ."``; a box
   is kept when its best token scores above ``box_threshold``, and its phrase is made of the tokens
   above ``text_threshold`` (``GroundingDinoProcessor.post_process_grounded_object_detection``).
   The phrase is mapped back to a vocabulary index (``category_of_phrase``); unmatched phrases are
   dropped; the ``max_detections`` best boxes are kept.
2. **Segment**: one SAM call with every kept box as a prompt (the image is embedded once), one
   mask per box (``multimask_output=False``: the single mask SAM gives for an unambiguous box).
3. **Paint**: a box's mask goes into its category's channel; the score image holds, per pixel, the
   best score of the boxes whose mask covers it.

Only the transformers classes are used (``GroundingDinoForObjectDetection``, ``SamModel``): they
run on CPU torch without torchvision, and any SAM-architecture checkpoint (SAM, SlimSAM, MobileSAM
converted to the HF SAM format) loads in ``SamModel``. Weights come from local folders only
(``perception.grounded_sam.*_path``); nothing is downloaded. This module imports torch, so it is
imported only when the grounded-sam segmenter is chosen (``perception.factory``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import GroundingDinoForObjectDetection, GroundingDinoProcessor, SamModel, SamProcessor

from trajrag.config import ConfigError
from trajrag.perception.base import check_masks, check_vocabulary
from trajrag.perception.config import GroundedSamConfig, PerceptionConfig, validate_config
from trajrag.world.interface import Observations

_SETTING = "perception.grounded_sam"
# Tokens GroundingDINO's post-processing can leave in a phrase ([SEP] after the last name, the
# " . " separators): they name no category.
_SPECIAL_TOKEN = re.compile(r"\[[a-z]+\]")
_NOT_A_WORD = re.compile(r"[^a-z0-9]+")


class DetectorWeightsError(ConfigError):
    """A detector checkpoint folder is unset or unusable (a ``ValueError``; the CLI prints one line)."""


@dataclass(frozen=True)
class GroundedSamModels:
    """The two networks and their processors (loaded from folders, or built in memory for tests)."""

    detector: GroundingDinoForObjectDetection
    detector_processor: GroundingDinoProcessor
    sam: SamModel
    sam_processor: SamProcessor


@dataclass(frozen=True)
class Detections:
    """Boxes of one frame, best score first.

    boxes: float32 (N, 4) ``x0, y0, x1, y1`` in pixels of the RGB image (clipped to it).
    labels: int64 (N,) vocabulary index of each box.
    scores: float32 (N,) GroundingDINO box confidence in [0, 1].
    """

    boxes: np.ndarray
    labels: np.ndarray
    scores: np.ndarray

    @classmethod
    def none(cls) -> "Detections":
        return cls(np.zeros((0, 4), np.float32), np.zeros(0, np.int64), np.zeros(0, np.float32))

    def __len__(self) -> int:
        return int(self.labels.size)


# -- prompt and phrases ----------------------------------------------------------------------------
def text_prompt(vocabulary: tuple[str, ...]) -> str:
    """GroundingDINO's prompt convention: lower-case names joined by ``" . "``, ending with ``"."``;
    underscores become spaces (``tv_monitor`` -> ``tv monitor``)."""
    return " . ".join(name.replace("_", " ").lower().strip() for name in vocabulary) + " ."


def _words(text: str) -> tuple[str, ...]:
    """Lower-case alphanumeric words, without special tokens: ``"dining - table [SEP]"`` and
    ``"dining-table"`` both give ``("dining", "table")``."""
    return tuple(_NOT_A_WORD.sub(" ", _SPECIAL_TOKEN.sub(" ", text.lower())).split())


def category_of_phrase(phrase: str, vocabulary: tuple[str, ...]) -> int | None:
    """Vocabulary index that a detected phrase names, or None.

    An exact match (after ``_words``) wins. Otherwise the phrase holds part of one or more names:
    tokens under ``text_threshold`` drop out (``"tv"`` for ``tv_monitor``) and neighbouring names
    can merge (``"chair sofa"``). The name with the largest share of its words in the phrase wins;
    ties go to the name whose first word comes first in the phrase (the first phrase the tokens
    spell). A phrase sharing no word with any name is None.
    """
    words = _words(phrase)
    if not words:
        return None
    names = [_words(name) for name in vocabulary]
    if words in names:
        return names.index(words)
    best, best_key = None, None
    for k, name in enumerate(names):
        shared = [w for w in name if w in words]
        if not shared:
            continue
        key = (len(shared) / len(name), -words.index(shared[0]))
        if best_key is None or key > best_key:
            best, best_key = k, key
    return best


# -- weights ---------------------------------------------------------------------------------------
def check_weight_paths(cfg: GroundedSamConfig) -> tuple[Path, Path]:
    """The (GroundingDINO, SAM) checkpoint folders; one ``DetectorWeightsError`` naming every unset
    or unusable setting and its path (a folder needs ``config.json``)."""
    problems, folders = [], []
    for key in ("grounding_dino_path", "sam_path"):
        value = str(getattr(cfg, key) or "").strip()
        folders.append(Path(value).expanduser())
        if not value:
            problems.append(f"{_SETTING}.{key} is empty")
        elif not (folders[-1] / "config.json").is_file():
            problems.append(f"{_SETTING}.{key} = {value!r} is not a checkpoint folder (no config.json in it)")
    if problems:
        raise DetectorWeightsError(
            "the grounded-sam segmenter needs local Hugging Face checkpoints (never downloaded): "
            + "; ".join(problems)
            + f". Set them with --set {_SETTING}.grounding_dino_path=DIR --set {_SETTING}.sam_path=DIR "
            "(folders written by save_pretrained, e.g. IDEA-Research/grounding-dino-tiny and a SAM / "
            "SlimSAM checkpoint), or use perception.segmenter=oracle"
        )
    return folders[0], folders[1]


def load_models(cfg: GroundedSamConfig) -> GroundedSamModels:
    """Both checkpoints from their local folders (safetensors preferred, no network)."""
    dino_path, sam_path = check_weight_paths(cfg)
    return GroundedSamModels(
        detector=_load(GroundingDinoForObjectDetection, dino_path, "grounding_dino_path", weights=True),
        detector_processor=_load(GroundingDinoProcessor, dino_path, "grounding_dino_path"),
        sam=_load(SamModel, sam_path, "sam_path", weights=True),
        sam_processor=_load(SamProcessor, sam_path, "sam_path"),
    )


def _load(cls: type, folder: Path, key: str, weights: bool = False):
    """``cls.from_pretrained(folder)`` offline; a ``DetectorWeightsError`` naming the setting if the
    folder lacks what ``cls`` needs (weights, tokenizer or processor files)."""
    options: dict = {"local_files_only": True}
    if weights and any(folder.glob("*.safetensors")):
        # Never unpickle a .bin lying beside the safetensors; without any, transformers reads the
        # .bin of an older checkpoint.
        options["use_safetensors"] = True
    try:
        return cls.from_pretrained(folder, **options)
    except (OSError, ValueError) as exc:
        raise DetectorWeightsError(
            f"{_SETTING}.{key} = {str(folder)!r}: {cls.__name__} could not load from it ({exc})"
        ) from exc


def resolve_device(device: str) -> torch.device:
    """``perception.device`` as a torch device: ``auto`` is cuda when torch sees one, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ValueError(f"perception.device must be cpu, cuda, cuda:N or auto, got {device!r}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"perception.device is {device!r} but torch sees no CUDA GPU: use cpu or auto")
    return resolved


# -- the segmenter ---------------------------------------------------------------------------------
class GroundedSamSegmenter:
    """``ObjectSegmenter`` over GroundingDINO + SAM for a fixed vocabulary.

    Built from ``cfg`` (``cfg.grounded_sam`` folders, ``cfg.device``); ``models`` passes networks
    already built (random weights in tests) instead of loading the folders. Deterministic:
    ``reset`` has nothing to re-seed.
    """

    def __init__(
        self,
        vocabulary: tuple[str, ...],
        cfg: PerceptionConfig,
        models: GroundedSamModels | None = None,
    ) -> None:
        if models is None:
            check_weight_paths(cfg.grounded_sam)  # the one clear error, before anything else
        _check_settings(vocabulary, cfg)
        self._vocabulary = tuple(vocabulary)
        self._cfg = cfg.grounded_sam
        self.device = resolve_device(cfg.device)
        models = models if models is not None else load_models(cfg.grounded_sam)
        self._detector = models.detector.to(self.device).eval()
        self._detector_processor = models.detector_processor
        self._sam = models.sam.to(self.device).eval()
        self._sam_processor = models.sam_processor
        self.prompt = text_prompt(self._vocabulary)
        self._phrase_labels: dict[str, int | None] = {}

    @property
    def vocabulary(self) -> tuple[str, ...]:
        return self._vocabulary

    def reset(self, seed: int | None = None) -> None:
        """Nothing to do: the networks are deterministic and keep no state between frames."""

    # -- per frame ------------------------------------------------------------------------------
    def segment(self, obs: Observations) -> np.ndarray:
        """Bool ``(len(vocabulary), H, W)`` masks at the depth image's size."""
        return self.segment_with_scores(obs)[0]

    def segment_with_scores(self, obs: Observations) -> tuple[np.ndarray, np.ndarray]:
        """Masks as ``segment``, and float32 ``(H, W)`` scores: per pixel, the best detection score
        (GroundingDINO box confidence, [0, 1]) of the boxes whose mask covers it, 0 elsewhere."""
        rgb = self._rgb(obs)
        masks, scores = self.masks_from_detections(rgb, self.detect(rgb))
        depth_shape = np.asarray(obs.depth).shape[:2]
        masks, scores = _nearest_resize(masks, depth_shape), _nearest_resize(scores, depth_shape)
        return check_masks(masks, len(self._vocabulary), depth_shape, "GroundedSamSegmenter"), scores

    def _rgb(self, obs: Observations) -> np.ndarray:
        if obs.rgb is None:
            raise ValueError(
                "GroundedSamSegmenter needs colour frames but this observation has no rgb: "
                "add rgb to sim.sensors (e.g. --set 'sim.sensors=[depth,semantic,rgb]')"
            )
        rgb = np.asarray(obs.rgb)
        if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
            raise ValueError(f"GroundedSamSegmenter: rgb must be uint8 (H, W, 3), got {rgb.dtype} {rgb.shape}")
        return rgb

    @torch.inference_mode()
    def detect(self, rgb: np.ndarray) -> Detections:
        """GroundingDINO boxes for the vocabulary in a uint8 ``(H, W, 3)`` image, best first."""
        h, w = rgb.shape[:2]
        inputs = self._detector_processor(images=rgb, text=self.prompt, return_tensors="pt").to(self.device)
        outputs = self._detector(**inputs)
        found = self._detector_processor.post_process_grounded_object_detection(
            outputs,
            inputs["input_ids"],
            threshold=self._cfg.box_threshold,
            text_threshold=self._cfg.text_threshold,
            target_sizes=[(h, w)],
        )[0]
        labels = [self._label(phrase) for phrase in found["text_labels"]]
        keep = [i for i, label in enumerate(labels) if label is not None]
        if not keep:
            return Detections.none()
        scores = found["scores"].float().cpu().numpy()[keep]
        boxes = found["boxes"].float().cpu().numpy()[keep]
        order = np.argsort(-scores, kind="stable")[: self._cfg.max_detections]
        boxes = np.clip(boxes[order], 0.0, [w, h, w, h]).astype(np.float32)
        return Detections(boxes, np.asarray(labels, dtype=np.int64)[keep][order], scores[order].astype(np.float32))

    def _label(self, phrase: str) -> int | None:
        if phrase not in self._phrase_labels:
            self._phrase_labels[phrase] = category_of_phrase(phrase, self._vocabulary)
        return self._phrase_labels[phrase]

    def masks_from_detections(self, rgb: np.ndarray, detections: Detections) -> tuple[np.ndarray, np.ndarray]:
        """Category masks bool ``(C, H, W)`` and per-pixel scores float32 ``(H, W)`` at the RGB
        image's size: SAM's mask of each box painted into its category."""
        h, w = rgb.shape[:2]
        masks = np.zeros((len(self._vocabulary), h, w), dtype=bool)
        scores = np.zeros((h, w), dtype=np.float32)
        if not len(detections):
            return masks, scores
        for box_mask, label, score in zip(self.box_masks(rgb, detections.boxes), detections.labels, detections.scores):
            masks[label] |= box_mask
            np.maximum(scores, np.where(box_mask, score, 0.0), out=scores)
        return masks, scores

    @torch.inference_mode()
    def box_masks(self, rgb: np.ndarray, boxes: np.ndarray) -> np.ndarray:
        """Bool ``(N, H, W)``: SAM's mask for each box (``x0, y0, x1, y1`` pixels), one SAM call."""
        inputs = self._sam_processor(images=rgb, input_boxes=[boxes.tolist()], return_tensors="pt").to(self.device)
        outputs = self._sam(
            pixel_values=inputs["pixel_values"], input_boxes=inputs["input_boxes"], multimask_output=False
        )
        masks = self._sam_processor.post_process_masks(
            outputs.pred_masks.cpu(), inputs["original_sizes"].cpu(), inputs["reshaped_input_sizes"].cpu()
        )[0]  # (N, 1, H, W) bool
        return masks[:, 0].numpy().astype(bool, copy=False)


def _check_settings(vocabulary: tuple[str, ...], cfg: PerceptionConfig) -> None:
    """``ValueError`` naming the setting if the vocabulary or a detector setting is unusable."""
    check_vocabulary(vocabulary, "GroundedSamSegmenter")
    validate_config(cfg)
    gs = cfg.grounded_sam
    # Thresholds above 1 are allowed: they switch detection off (no sigmoid score exceeds them).
    for key in ("box_threshold", "text_threshold"):
        if getattr(gs, key) < 0:
            raise ValueError(f"{_SETTING}.{key} must be >= 0, got {getattr(gs, key)}")
    if gs.max_detections < 1:
        raise ValueError(f"{_SETTING}.max_detections must be >= 1, got {gs.max_detections}")


def _nearest_resize(image: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """``image`` (..., h, w) at ``shape`` by nearest neighbour (a no-op when the sizes agree): the
    depth camera may be smaller than the colour one."""
    h, w = image.shape[-2:]
    if (h, w) == tuple(shape):
        return image
    rows = ((np.arange(shape[0]) + 0.5) * h / shape[0]).astype(np.int64)
    cols = ((np.arange(shape[1]) + 0.5) * w / shape[1]).astype(np.int64)
    return image[..., rows[:, None], cols[None, :]]
