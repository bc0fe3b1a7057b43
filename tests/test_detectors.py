"""The GroundingDINO + SAM adapter's contract, on randomly initialised tiny models (nothing downloaded).

Random weights give arbitrary boxes, so the box -> mask -> map chain is tested with scripted
networks instead: a detector that reports a known box for a known phrase and a SAM that fills the
box. The processors (image resizing, text prompt, box post-processing, mask upsampling) are the
real transformers ones throughout.
"""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import (
    BertConfig,
    BertTokenizer,
    GroundingDinoConfig,
    GroundingDinoForObjectDetection,
    GroundingDinoImageProcessorPil,
    GroundingDinoProcessor,
    ResNetConfig,
    SamConfig,
    SamImageProcessorPil,
    SamModel,
    SamProcessor,
)

from trajrag import config
from trajrag.cli import main
from trajrag.mapping.semantic_map import SemanticMapper
from trajrag.perception import ObjectSegmenter, OracleSegmenter, PerceptionConfig
from trajrag.perception.factory import make_segmenter
from trajrag.perception.grounded_sam import (
    DetectorWeightsError,
    GroundedSamModels,
    GroundedSamSegmenter,
    category_of_phrase,
    text_prompt,
)
from trajrag.world.frames import Pose2D
from trajrag.world.interface import CameraIntrinsics

VOCAB = ("chair", "sofa", "tv_monitor", "dining-table")
WORDS = ["chair", "sofa", "tv", "monitor", "dining", "table", "-", "."]
H, W = 480, 640
INTR = CameraIntrinsics(width=W, height=H, hfov=math.radians(79), camera_height=0.88, min_depth=0.5, max_depth=5.0)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models gain nothing from threads, and on a busy 2-core machine torch's spinning
    threads make a 15 ms frame take a second or more."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def perception() -> PerceptionConfig:
    return dataclasses.replace(config.load("perception"), segmenter="grounded-sam", device="cpu")


def _with(cfg: PerceptionConfig, **changes) -> PerceptionConfig:
    return dataclasses.replace(cfg, grounded_sam=dataclasses.replace(cfg.grounded_sam, **changes))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> BertTokenizer:
    """A BERT WordPiece tokenizer over the vocabulary's words, from a vocab file (offline)."""
    path = tmp_path_factory.mktemp("tokenizer") / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    return BertTokenizer(vocab=str(path))


def _tiny_detector(tokenizer: BertTokenizer) -> tuple[GroundingDinoForObjectDetection, GroundingDinoProcessor]:
    """GroundingDINO with a 4-stage ResNet of 8-16 channels, a 1-layer BERT and 20 queries (random)."""
    torch.manual_seed(0)
    backbone = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1],
                            layer_type="basic", out_features=["stage2", "stage3", "stage4"])
    text = BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=64)
    # d_model 32: the input projections use GroupNorm(32, d_model); 2 decoder layers: the box heads
    # of layers 1+ are tied to layer 0's.
    cfg = GroundingDinoConfig(backbone_config=backbone, text_config=text, num_queries=20, d_model=32,
                              encoder_layers=1, decoder_layers=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                              encoder_attention_heads=2, decoder_attention_heads=2, num_feature_levels=3,
                              encoder_n_points=1, decoder_n_points=1, max_text_len=32)
    images = GroundingDinoImageProcessorPil(size={"shortest_edge": 120, "longest_edge": 160})
    processor = GroundingDinoProcessor(image_processor=images, tokenizer=tokenizer)
    return GroundingDinoForObjectDetection(cfg).eval(), processor


def _tiny_sam() -> tuple[SamModel, SamProcessor]:
    """SAM with a 1-layer 16-wide ViT on 64x64 inputs (random)."""
    torch.manual_seed(0)
    cfg = SamConfig(
        vision_config=dict(hidden_size=16, output_channels=16, num_hidden_layers=1, num_attention_heads=2,
                           image_size=64, patch_size=16, window_size=2, global_attn_indexes=[0],
                           num_pos_feats=8, mlp_dim=32),
        prompt_encoder_config=dict(hidden_size=16, image_size=64, patch_size=16, mask_input_channels=4),
        mask_decoder_config=dict(hidden_size=16, mlp_dim=32, num_hidden_layers=1, num_attention_heads=2,
                                 iou_head_hidden_dim=16),
    )
    images = SamImageProcessorPil(size={"longest_edge": 64}, pad_size={"height": 64, "width": 64},
                                  mask_size={"longest_edge": 16}, mask_pad_size={"height": 16, "width": 16})
    return SamModel(cfg).eval(), SamProcessor(images)


@pytest.fixture(scope="module")
def tiny_models(tokenizer) -> GroundedSamModels:
    detector, detector_processor = _tiny_detector(tokenizer)
    sam, sam_processor = _tiny_sam()
    return GroundedSamModels(detector, detector_processor, sam, sam_processor)


def _frame(h: int = H, w: int = W, rgb: bool = True, depth_shape: tuple[int, int] | None = None) -> SimpleNamespace:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8) if rgb else None
    depth = np.full(depth_shape or (h, w), 3.0, dtype=np.float32)
    return SimpleNamespace(rgb=image, depth=depth, instance=None, category=None, pose=Pose2D(0.0, 0.0, 0.0))


# -- prompt and phrase labels ------------------------------------------------------------------------
def test_prompt_follows_grounding_dino_convention():
    assert text_prompt(("chair", "tv_monitor", "Potted_Plant")) == "chair . tv monitor . potted plant ."


@pytest.mark.parametrize("phrase,name", [
    ("chair", "chair"),
    ("tv monitor", "tv_monitor"),
    ("dining - table", "dining-table"),  # BERT decodes the hyphen as its own token
    ("sofa [SEP]", "sofa"),
    ("monitor", "tv_monitor"),  # a token under text_threshold dropped out
    ("chair sofa", "chair"),  # two names merged: the first one spelt
    ("table", "dining-table"),
    ("lamp", None),
    ("", None),
])
def test_phrase_labels_map_back_to_vocabulary(phrase, name):
    expected = None if name is None else VOCAB.index(name)
    assert category_of_phrase(phrase, VOCAB) == expected


def test_exact_name_beats_a_longer_name_sharing_its_word():
    assert category_of_phrase("table", ("dining-table", "table")) == 1


# -- random tiny models -----------------------------------------------------------------------------
@pytest.mark.slow
def test_masks_are_bool_per_category_at_the_depth_size(perception, tiny_models):
    seg = GroundedSamSegmenter(VOCAB, _with(perception, box_threshold=0.0, text_threshold=0.0), tiny_models)
    assert isinstance(seg, ObjectSegmenter)
    assert seg.device.type == "cpu"
    masks, scores = seg.segment_with_scores(_frame())
    assert masks.shape == (len(VOCAB), H, W) and masks.dtype == np.bool_
    assert scores.shape == (H, W) and scores.dtype == np.float32
    assert np.array_equal(scores > 0, masks.any(axis=0)), "a score exactly where some box painted"
    assert scores.max() <= 1.0
    assert np.array_equal(seg.segment(_frame()), masks), "segment is segment_with_scores' masks"
    half = seg.segment(_frame(depth_shape=(H // 2, W // 2)))
    assert half.shape == (len(VOCAB), H // 2, W // 2), "masks follow the depth image, not the rgb one"


def test_box_threshold_above_one_detects_nothing(perception, tiny_models):
    seg = GroundedSamSegmenter(VOCAB, _with(perception, box_threshold=1.01, text_threshold=0.0), tiny_models)
    assert len(seg.detect(_frame().rgb)) == 0
    masks, scores = seg.segment_with_scores(_frame())
    assert masks.shape == (len(VOCAB), H, W) and not masks.any()
    assert not scores.any()


def test_at_most_max_detections_best_first(perception, tiny_models):
    seg = GroundedSamSegmenter(VOCAB, _with(perception, box_threshold=0.0, text_threshold=0.0, max_detections=3),
                               tiny_models)
    found = seg.detect(_frame().rgb)
    assert len(found) == 3, "20 queries pass a zero threshold: the 3 best are kept"
    assert np.all(np.diff(found.scores) <= 0)
    assert found.boxes.shape == (3, 4) and found.labels.dtype == np.int64
    assert np.all((found.boxes >= 0) & (found.boxes <= [W, H, W, H]))


def test_frame_without_rgb_says_to_add_the_sensor(perception, tiny_models):
    seg = GroundedSamSegmenter(VOCAB, perception, tiny_models)
    with pytest.raises(ValueError, match=r"rgb to sim\.sensors"):
        seg.segment(_frame(rgb=False))


# -- weights ----------------------------------------------------------------------------------------
def test_missing_weights_name_the_setting_and_path(perception, tmp_path):
    cfg = _with(perception, grounding_dino_path="", sam_path=str(tmp_path / "nowhere"))
    with pytest.raises(DetectorWeightsError) as info:
        GroundedSamSegmenter(VOCAB, cfg)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "perception.grounded_sam.grounding_dino_path is empty" in message
    assert "perception.grounded_sam.sam_path" in message and str(tmp_path / "nowhere") in message
    with pytest.raises(DetectorWeightsError, match="grounding_dino_path"):
        make_segmenter((), (), cfg, seed=0)  # checked before anything else, even the vocabulary


def test_folder_without_weights_names_the_setting(perception, tiny_models, tmp_path):
    dino, sam = tmp_path / "grounding-dino", tmp_path / "sam"
    tiny_models.detector.config.save_pretrained(dino)  # config.json only
    tiny_models.sam.config.save_pretrained(sam)
    cfg = _with(perception, grounding_dino_path=str(dino), sam_path=str(sam))
    with pytest.raises(DetectorWeightsError, match=r"perception\.grounded_sam\.grounding_dino_path = .*grounding-dino"):
        GroundedSamSegmenter(VOCAB, cfg)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is there")
def test_cuda_without_a_gpu_is_a_clear_error(perception, tiny_models):
    with pytest.raises(ValueError, match="no CUDA GPU"):
        GroundedSamSegmenter(VOCAB, dataclasses.replace(perception, device="cuda"), tiny_models)
    assert GroundedSamSegmenter(VOCAB, dataclasses.replace(perception, device="auto"), tiny_models).device.type == "cpu"


@pytest.mark.slow
def test_checkpoints_load_from_local_folders(perception, tiny_models, tmp_path):
    dino, sam = tmp_path / "grounding-dino", tmp_path / "sam"
    tiny_models.detector.save_pretrained(dino)
    tiny_models.detector_processor.save_pretrained(dino)
    tiny_models.sam.save_pretrained(sam)
    tiny_models.sam_processor.save_pretrained(sam)
    assert (dino / "model.safetensors").is_file() and (sam / "model.safetensors").is_file()
    cfg = _with(perception, grounding_dino_path=str(dino), sam_path=str(sam), box_threshold=0.0, text_threshold=0.0)
    loaded = make_segmenter(VOCAB, (), cfg, seed=0)
    in_memory = GroundedSamSegmenter(VOCAB, cfg, tiny_models)
    assert isinstance(loaded, GroundedSamSegmenter)
    assert np.array_equal(loaded.segment(_frame()), in_memory.segment(_frame())), "same weights, same masks"


def test_factory_builds_the_oracle_without_weights(perception):
    seg = make_segmenter(("chair",), ("chair", "bed"), dataclasses.replace(perception, segmenter="oracle"), seed=0)
    assert isinstance(seg, OracleSegmenter)


# -- box -> mask -> depth -> map cells, with scripted networks -----------------------------------------
class _ScriptedDetector(torch.nn.Module):
    """Reports fixed boxes: each ``(phrase, (cx, cy, w, h) in [0, 1], score)`` scores ``score`` on
    the phrase's tokens of the prompt and nothing elsewhere (GroundingDINO's output layout)."""

    def __init__(self, tokenizer: BertTokenizer, script: list[tuple[str, tuple[float, ...], float]]) -> None:
        super().__init__()
        self.token_ids = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(phrase)) for phrase, _, _ in script]
        self.boxes = torch.tensor([box for _, box, _ in script], dtype=torch.float32)
        self.logits = torch.logit(torch.tensor([score for _, _, score in script]))

    def forward(self, input_ids: torch.Tensor, **_) -> SimpleNamespace:
        logits = torch.full((1, len(self.token_ids), input_ids.shape[1]), -20.0)
        for q, ids in enumerate(self.token_ids):
            logits[0, q, torch.isin(input_ids[0], torch.tensor(ids))] = self.logits[q]
        return SimpleNamespace(logits=logits, pred_boxes=self.boxes[None])


class _BoxFillingSam(torch.nn.Module):
    """SAM's output layout with each box filled: low-res logits (4 px of the padded input per
    cell) +10 inside the prompt box, -10 outside."""

    def forward(self, pixel_values: torch.Tensor, input_boxes: torch.Tensor, multimask_output: bool) -> SimpleNamespace:
        size = pixel_values.shape[-1] // 4
        centres = torch.arange(size, dtype=torch.float32) * 4 + 2
        masks = []
        for x0, y0, x1, y1 in input_boxes[0].tolist():
            inside = ((centres >= y0) & (centres < y1))[:, None] & ((centres >= x0) & (centres < x1))[None, :]
            masks.append(torch.where(inside, 10.0, -10.0))
        return SimpleNamespace(pred_masks=torch.stack(masks)[None, :, None], iou_scores=torch.ones(1, len(masks), 1))


def _scene_depth(rows: slice, cols: slice, object_m: float, wall_m: float) -> np.ndarray:
    """Z-depth: a wall ``wall_m`` ahead above the floor line, the floor below, and an object
    (its front face) ``object_m`` ahead in ``rows`` x ``cols``."""
    y_r = (INTR.height / 2.0 - np.arange(INTR.height) - 0.5) / INTR.focal
    with np.errstate(divide="ignore"):
        floor = np.where(y_r < 0, INTR.camera_height / -y_r, np.inf)[:, None].repeat(INTR.width, 1)
    depth = np.minimum(floor, wall_m)
    depth[rows, cols] = object_m
    return np.clip(depth, INTR.min_depth, INTR.max_depth).astype(np.float32)


def test_known_box_marks_the_objects_map_cells(perception, tokenizer):
    rows, cols = slice(200, 300), slice(280, 360)  # the sofa's pixels: 100 x 80 px, 2 m ahead
    box = ((cols.start + cols.stop) / 2 / W, (rows.start + rows.stop) / 2 / H,
           (cols.stop - cols.start) / W, (rows.stop - rows.start) / H)
    script = [("sofa", box, 0.8), ("chair", (0.2, 0.2, 0.1, 0.1), 0.2)]  # the chair is under box_threshold
    _, detector_processor = _tiny_detector(tokenizer)
    models = GroundedSamModels(_ScriptedDetector(tokenizer, script), detector_processor, _BoxFillingSam(),
                               SamProcessor(SamImageProcessorPil()))
    seg = GroundedSamSegmenter(VOCAB, _with(perception, box_threshold=0.35, text_threshold=0.25), models)
    rgb = np.full((H, W, 3), 90, dtype=np.uint8)
    rgb[rows, cols] = (200, 40, 40)
    depth = _scene_depth(rows, cols, object_m=2.0, wall_m=4.0)
    obs = SimpleNamespace(rgb=rgb, depth=depth, instance=None, category=None, pose=Pose2D(1.0, -2.0, 0.0))

    masks, scores = seg.segment_with_scores(obs)
    truth = np.zeros((H, W), dtype=bool)
    truth[rows, cols] = True
    sofa = masks[VOCAB.index("sofa")]
    assert (sofa & truth).sum() / (sofa | truth).sum() > 0.95, "SAM's box mask is the box, in pixels"
    assert not np.delete(masks, VOCAB.index("sofa"), axis=0).any(), "the chair scored under the threshold"
    assert np.allclose(scores[sofa], 0.8, atol=1e-5) and not scores[~sofa].any()

    mapping = config.load("mapping")
    mapper = SemanticMapper(mapping, INTR, VOCAB)
    mapper.reset(obs.pose)
    assert mapper.update(depth, masks, obs.pose)
    cells = np.argwhere(mapper.map.object_channel("sofa"))
    assert len(cells) > 0 and not mapper.map.object_channel("chair").any()
    xy = mapper.map.to_xy(cells)
    # The front face 2 m ahead of (1, -2) facing +x, 80 px wide at f = 388 px: 0.41 m across y.
    half_width = (cols.stop - cols.start) / 2 / INTR.focal * 2.0
    cell = mapping.cell_size_m
    assert np.all(np.abs(xy[:, 0] - 3.0) <= 1.5 * cell), "the object's cells are 2 m ahead"
    assert np.all(np.abs(xy[:, 1] + 2.0) <= half_width + 1.5 * cell), "and no wider than the object"
    assert np.ptp(xy[:, 1]) >= half_width, "and span most of its width"


# -- the bench ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_bench_times_the_oracle_and_stops_on_missing_weights(capsys):
    assert main(["bench", "perception", "--quick", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["detector"] == "oracle" and report["frame"] == "640x480"
    assert report["segment_ms"]["calls"] == 5 and report["segment_ms"]["mean_ms"] > 0
    assert main(["bench", "perception", "--quick", "--detector", "grounded-sam"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "perception.grounded_sam.grounding_dino_path" in err
