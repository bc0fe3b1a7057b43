"""Perception as in the field: the detector-like error model, evidence in the map, the depth-edge
guard and verification before STOP."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest

from trajrag import config
from trajrag.agent.episode_runner import run_episode
from trajrag.agent.registry import make_frontier_agent
from trajrag.agent.verification import GoalVerifier, Verdict
from trajrag.bench.robustness import read_curves, recovered_share, robustness_report
from trajrag.mapping.semantic_map import SemanticMapper
from trajrag.perception.oracle import OracleSegmenter
from trajrag.world.datasets import load_episodes, load_scenes
from trajrag.world.frames import Pose2D
from trajrag.world.sim import GridSimulator
from test_mapping import INTR, wall_ahead_depth

CALIBRATED = config.preset_overrides(["perception_calibrated"])
UNVERIFIED = CALIBRATED + config.preset_overrides(["perception_unverified"])
FAST = ["sim.width=160", "sim.height=120"]


def _frame(h: int = 120, w: int = 160) -> SimpleNamespace:
    """Four chairs (scene id 0) and a sofa (id 1) as 16x16 squares at 2 m."""
    category = np.full((h, w), -1, dtype=np.int16)
    instance = np.zeros((h, w), dtype=np.int32)
    for inst, (cat, r, c) in enumerate([(0, 10, 10), (0, 10, 50), (0, 10, 90), (0, 60, 10), (1, 60, 60)], 1):
        category[r:r + 16, c:c + 16] = cat
        instance[r:r + 16, c:c + 16] = inst
    return SimpleNamespace(depth=np.full((h, w), 2.0, dtype=np.float32), instance=instance, category=category,
                           rgb=None, pose=None)


# -- the error model -------------------------------------------------------------------------------
def test_a_non_oracle_profile_with_its_errors_switched_off_is_refused():
    with pytest.raises(config.ConfigError, match="non-oracle profile must make errors"):
        config.load("perception", CALIBRATED + ["perception.error_scale=0"])
    exact = config.load("perception", CALIBRATED + ["perception.error_scale=0", "perception.profile=oracle"])
    assert not exact.has_errors


def test_the_calibrated_profile_makes_detector_errors_with_low_scores_for_its_mistakes():
    cfg = config.load("perception", CALIBRATED)
    oracle = OracleSegmenter(("chair", "sofa"), ("chair", "sofa"), config.load("perception"), seed=0)
    exact_masks, exact_scores = oracle.segment_with_scores(_frame())
    assert set(np.unique(exact_scores)) == {0.0, 1.0}
    noisy = OracleSegmenter(("chair", "sofa"), ("chair", "sofa"), cfg, seed=0)
    differs = 0
    for _ in range(30):
        masks, scores = noisy.segment_with_scores(_frame())
        differs += not np.array_equal(masks, exact_masks)
        assert scores.dtype == np.float32 and ((scores > 0) == masks.any(axis=0)).all()
        assert (scores[masks.any(axis=0)] >= cfg.confidence_floor - 1e-6).all()
    assert differs >= 20, "the calibrated profile must make errors in most frames"
    again = OracleSegmenter(("chair", "sofa"), ("chair", "sofa"), cfg, seed=0)
    noisy.reset(0)
    assert all(np.array_equal(again.segment(_frame()), noisy.segment(_frame())) for _ in range(5)), "seeded"


def test_far_and_small_objects_are_missed_more_than_near_large_ones():
    cfg = dataclasses.replace(config.load("perception", CALIBRATED), confusion_rate=0.0, false_positives_per_frame=0.0,
                              bleed_px=0)
    seg = OracleSegmenter(("chair",), ("chair", "sofa"), cfg, seed=1)
    near, far = _frame(), _frame()
    far.depth[:] = 4.8
    rate_near = np.mean([seg.segment(near)[0, 10:26, 10:26].any() for _ in range(200)])
    rate_far = np.mean([seg.segment(far)[0, 10:26, 10:26].any() for _ in range(200)])
    assert rate_far < rate_near - 0.15


# -- the map: evidence and the depth-edge guard ----------------------------------------------------
def _object_ahead(pixels: slice) -> tuple[np.ndarray, np.ndarray]:
    """Depth of an object 2 m ahead in the middle columns before a wall at 4 m, and a chair mask
    covering the object and ``pixels`` more columns each side (spilling onto the wall)."""
    depth = wall_ahead_depth(4.0)
    depth = np.minimum(depth, wall_ahead_depth(2.0, columns=slice(280, 360)))
    mask = np.zeros((2, INTR.height, INTR.width), dtype=bool)
    mask[0, 150:330, pixels] = True
    return depth, mask


@pytest.mark.parametrize("guard_m", [0.0, 0.3])
def test_a_mask_crossing_a_depth_edge_marks_no_cell_behind_it_with_the_guard(guard_m):
    cfg = dataclasses.replace(config.load("mapping"), mask_depth_edge_m=guard_m, object_erosion_px=0)
    mapper = SemanticMapper(cfg, INTR, ("chair", "bed"))
    mapper.reset(Pose2D(0.0, 0.0, 0.0))
    depth, mask = _object_ahead(slice(264, 376))  # 16 px of spill each side
    mapper.update(depth, mask, Pose2D(0.0, 0.0, 0.0))
    xy = mapper.map.to_xy(np.argwhere(mapper.map.object_channel("chair")))
    assert len(xy) and (xy[:, 0] > 1.9).all()
    behind = int((xy[:, 0] > 3.0).sum())
    assert (behind == 0) if guard_m else (behind > 0), behind


def test_evidence_commits_after_enough_views_and_a_detection_not_seen_again_is_dropped():
    cfg = config.load("mapping", CALIBRATED)
    mapper = SemanticMapper(cfg, INTR, ("chair", "bed"))
    pose = Pose2D(0.0, 0.0, 0.0)
    mapper.reset(pose)
    depth, mask = _object_ahead(slice(280, 360))
    scores = np.where(mask[0], 0.9, 0.0).astype(np.float32)
    mapper.update(depth, mask, pose, scores)
    assert not mapper.map.object_channel("chair").any(), "one detection at 0.9 is under evidence_commit 1.5"
    mapper.update(depth, mask, pose, scores)
    committed = mapper.map.object_channel("chair").copy()
    assert committed.any()
    for _ in range(5):  # seen again, never detected: under a third of its views
        mapper.update(depth, np.zeros_like(mask), pose, np.zeros_like(scores))
    assert not mapper.map.object_channel("chair").any()


# -- verification before STOP ----------------------------------------------------------------------
def test_the_verifier_confirms_a_goal_seen_again_and_rejects_one_that_is_not():
    verifier = GoalVerifier(views=4, min_share=0.5, radius_m=0.5, half_fov_rad=math.radians(39.5))
    target, pose = np.array([1.0, 0.0]), Pose2D(0.0, 0.0, 0.0)
    for seen in (target[None], None, target[None]):
        assert verifier.look(pose, target, seen)[0] == Verdict.LOOKING
    assert verifier.look(pose, target, None)[0] == Verdict.CONFIRMED  # 2 of 4
    for _ in range(3):
        assert verifier.look(pose, target, None)[0] == Verdict.LOOKING
    assert verifier.look(pose, target, target[None])[0] == Verdict.REJECTED  # 1 of 4
    behind = Pose2D(0.0, 0.0, math.pi)  # facing away: it turns first and counts nothing
    verdict, action = verifier.look(behind, target, target[None])
    assert verdict == Verdict.LOOKING and verifier.current.frames == 0


class _SofaOnEveryChair(OracleSegmenter):
    """A detector whose false positive is the goal: every chair far from the agent reads 'sofa'
    (from closer than 1.5 m it sees the chair for what it is)."""

    def segment_with_scores(self, obs):
        masks, scores = super().segment_with_scores(obs)
        vocabulary = self.vocabulary
        chair, sofa = vocabulary.index("chair"), vocabulary.index("sofa")
        far = masks[chair] & (obs.depth > 1.5)
        masks[sofa] |= far
        return masks, np.where(far, 0.9, scores).astype(np.float32)


@pytest.mark.slow
def test_a_false_positive_goal_is_dropped_after_verification_and_not_walked_to_again():
    scenes = load_scenes("procedural:val:3", config.settings())
    scene = next(s for s in scenes if "chair" in s.present_categories() and "sofa" not in s.present_categories()) \
        if any("sofa" not in s.present_categories() for s in scenes) else None
    if scene is None:  # every home has a sofa: take the sofas out of the first one
        scene = dataclasses.replace(scenes[0])
        sofa = scene.category_id("sofa")
        scene.category_map = np.where(scene.category_map == sofa, -1, scene.category_map).astype(np.int16)
        scene.instance_category = np.where(scene.instance_category == sofa, -1, scene.instance_category)
    chair_episode = load_episodes("generated:1", [scene], config.settings(["episodes.goal_categories=[chair]"]))[0]
    episode = dataclasses.replace(chair_episode, object_category="sofa", episode_id="fp-sofa")
    overrides = FAST + ["navigator.verify_views=4", "mapping.evidence_commit=1.0"]
    sim_cfg = config.load("sim", overrides)
    outcomes = {}
    for verify in (0, 4):
        agent = make_frontier_agent(config.settings(overrides + [f"navigator.verify_views={verify}"]))
        builder = agent.builder
        original_reset = builder.reset

        def reset(episode, scene, seed, original_reset=original_reset, builder=builder):
            original_reset(episode, scene, seed)
            builder.segmenter = _SofaOnEveryChair(builder.vocabulary, scene.categories, builder.perception_cfg, seed)

        builder.reset = reset
        result = run_episode(GridSimulator(sim_cfg), agent, episode, scene, config.load("episodes"), max_steps=250)
        outcomes[verify] = (result, agent.stats)
    unverified, verified = outcomes[0], outcomes[4]
    assert unverified[1].stop_reason.startswith("goal") and unverified[0].actions[-1] == 0, \
        "without verification the agent stops at the false sofa"
    assert verified[1].goals_rejected >= 1, "verification must drop the false goal"
    assert not verified[1].stop_reason.startswith("goal"), "every sofa here is a chair: no goal STOP may be verified"
    assert len(verified[0].actions) > len(unverified[0].actions)


# -- robustness curves -----------------------------------------------------------------------------
def test_robustness_curves_read_eval_folders_and_say_what_verification_recovers(tmp_path):
    import json

    for level, runs in {0: {"frontier": 0.9, "frontier-unverified": 0.95},
                        1: {"frontier": 0.75, "frontier-unverified": 0.15}}.items():
        for label, sr in runs.items():
            folder = tmp_path / f"level-{level}" / label
            folder.mkdir(parents=True)
            (folder / "summary.json").write_text(json.dumps({"sr": sr, "spl": sr / 2, "episodes": 50}))
    curves = read_curves(tmp_path)
    assert curves["levels"] == [0.0, 1.0] and curves["runs"]["frontier-unverified"]["sr"] == [0.95, 0.15]
    assert recovered_share(curves, "frontier", 1.0) == pytest.approx(0.75)
    report = robustness_report(tmp_path)
    assert (tmp_path / "curves.png").stat().st_size > 10_000 and report["recovered_share"]["frontier"]["1.0"] == \
        pytest.approx(0.75)
    with pytest.raises(ValueError, match="no level-"):
        read_curves(tmp_path / "level-0")


@pytest.mark.slow
def test_every_eval_record_and_summary_names_its_perception_profile(tmp_path):
    from trajrag.agent.evaluate import evaluate_agent

    settings = config.settings(FAST + CALIBRATED)
    scenes = load_scenes("procedural:val:1", config.settings())
    episodes = load_episodes("generated:1", scenes, settings)
    summary = evaluate_agent("frontier", lambda: make_frontier_agent(settings), GridSimulator(settings.sim),
                             episodes, scenes, tmp_path, settings.episodes, progress=False)
    assert summary["perception_profile"] == "calibrated" and summary["goals_rejected"] >= 0
    assert '"perception_profile": "calibrated"' in (tmp_path / "frontier" / "episodes.jsonl").read_text()
