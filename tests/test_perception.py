"""Oracle segmentation: name mapping between scene and agent vocabularies, and the noise model."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from trajrag import config
from trajrag.perception import ObjectSegmenter, OracleSegmenter, PerceptionConfig

SCENE = ("chair", "sofa", "bed", "sink")
VOCAB = ("bed", "chair", "sofa")  # sink is not in the agent's vocabulary


@pytest.fixture(scope="module")
def exact() -> PerceptionConfig:
    return config.load("perception")


def _frame(h: int = 120, w: int = 160) -> SimpleNamespace:
    """Three chairs, one bed and one sink as 20x20 squares (instance ids 1..5)."""
    category = np.full((h, w), -1, dtype=np.int16)
    instance = np.zeros((h, w), dtype=np.int32)
    boxes = [(0, 10, 10), (0, 10, 50), (0, 10, 90), (2, 60, 10), (3, 60, 60)]  # (scene id, row, col)
    for inst, (cat, r, c) in enumerate(boxes, start=1):
        category[r : r + 20, c : c + 20] = cat
        instance[r : r + 20, c : c + 20] = inst
    depth = np.full((h, w), 2.0, dtype=np.float32)
    return SimpleNamespace(depth=depth, instance=instance, category=category, rgb=None, pose=None)


def _noisy(exact: PerceptionConfig, **changes) -> PerceptionConfig:
    return dataclasses.replace(exact, **changes)


def test_exact_oracle_maps_categories_by_name(exact):
    obs = _frame()
    seg = OracleSegmenter(VOCAB, SCENE, exact, seed=0)
    assert isinstance(seg, ObjectSegmenter)
    masks = seg.segment(obs)
    assert masks.shape == (3, 120, 160) and masks.dtype == bool
    assert np.array_equal(masks[VOCAB.index("chair")], obs.category == SCENE.index("chair"))
    assert np.array_equal(masks[VOCAB.index("bed")], obs.category == SCENE.index("bed"))
    assert not masks[VOCAB.index("sofa")].any()
    assert masks.sum() == 4 * 400, "the sink (not in the vocabulary) is in no mask"


def test_miss_rate_one_removes_everything_and_zero_keeps_everything(exact):
    obs = _frame()
    assert not OracleSegmenter(VOCAB, SCENE, _noisy(exact, miss_rate=1.0), seed=0).segment(obs).any()
    kept = OracleSegmenter(VOCAB, SCENE, _noisy(exact, miss_rate=0.0, confusion_rate=0.0), seed=0).segment(obs)
    assert kept.sum() == 4 * 400


def test_miss_rate_drops_whole_instances_at_about_the_rate(exact):
    seg = OracleSegmenter(VOCAB, SCENE, _noisy(exact, miss_rate=0.3), seed=1)
    obs = _frame()
    kept = [seg.segment(obs)[VOCAB.index("chair")].sum() for _ in range(200)]
    assert set(kept) <= {0, 400, 800, 1200}, "instances vanish whole, never partly"
    assert abs(np.mean(kept) / 1200 - 0.7) < 0.05


def test_noise_is_deterministic_per_seed(exact):
    cfg = _noisy(exact, miss_rate=0.4, confusion_rate=0.5, false_positives_per_frame=2.0, erosion_px=1)
    obs = _frame()

    def run(seed: int) -> list[np.ndarray]:
        seg = OracleSegmenter(VOCAB, SCENE, cfg, seed=seed)
        return [seg.segment(obs) for _ in range(10)]

    a, b, c = run(7), run(7), run(8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    seg = OracleSegmenter(VOCAB, SCENE, cfg, seed=7)
    first = seg.segment(obs)
    seg.reset()
    assert np.array_equal(seg.segment(obs), first), "reset() restarts the noise stream"


def test_confusion_relabels_with_a_confusable_category(exact):
    # Table: chair -> [sofa]; bed -> [sofa]. With rate 1 every chair and the bed become sofas.
    seg = OracleSegmenter(VOCAB, SCENE, _noisy(exact, confusion_rate=1.0), seed=0)
    masks = seg.segment(_frame())
    assert not masks[VOCAB.index("chair")].any() and not masks[VOCAB.index("bed")].any()
    assert masks[VOCAB.index("sofa")].sum() == 4 * 400
    # A confusable name outside the vocabulary is never produced.
    only = OracleSegmenter(("chair", "bed"), SCENE, _noisy(exact, confusion_rate=1.0), seed=0).segment(_frame())
    assert only[0].sum() == 3 * 400 and only[1].sum() == 400


def test_erosion_shrinks_each_instance(exact):
    masks = OracleSegmenter(VOCAB, SCENE, _noisy(exact, erosion_px=2), seed=0).segment(_frame())
    assert masks[VOCAB.index("bed")].sum() == 16 * 16
    assert masks[VOCAB.index("chair")].sum() == 3 * 16 * 16


def test_false_positives_paint_blobs_on_an_empty_frame(exact):
    obs = _frame()
    obs.category[:] = -1
    obs.instance[:] = 0
    seg = OracleSegmenter(VOCAB, SCENE, _noisy(exact, false_positives_per_frame=1.0), seed=3)
    frames = [seg.segment(obs) for _ in range(100)]
    with_blobs = sum(m.any() for m in frames)
    assert 50 < with_blobs < 75, "P(at least one blob) = 1 - exp(-1) = 0.63"
    assert all(m.shape == (3, 120, 160) for m in frames)


def test_bad_inputs_are_named(exact):
    with pytest.raises(ValueError, match="miss_rate"):
        OracleSegmenter(VOCAB, SCENE, _noisy(exact, miss_rate=1.5), seed=0)
    with pytest.raises(ValueError, match="duplicate"):
        OracleSegmenter(("chair", "chair"), SCENE, exact, seed=0)
    obs = _frame()
    obs.category[0, 0] = 9
    with pytest.raises(ValueError, match="scene has 4 categories"):
        OracleSegmenter(VOCAB, SCENE, exact, seed=0).segment(obs)
