"""``trajrag bench perception``: what the object detector costs per frame.

``detector_latency``: milliseconds per frame of ``segment`` for the detector named by ``--detector``
(``oracle`` by default, or ``grounded-sam``) on frames of the grid simulator at the configured
camera size (``sim.width`` x ``sim.height``, 640x480 by default), the agent turning in place in
the benchmark home (``trajrag.bench.sim.bench_scene``). grounded-sam runs on ``perception.device``
(``--set perception.device=cuda`` on a GPU) with the weights of ``perception.grounded_sam.*_path``;
with those unset it stops with the one missing-weights error (exit status 2), since GroundingDINO's
tokenizer cannot be built offline without a checkpoint. The first frames are not timed (model
warm-up, CUDA kernel selection).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from trajrag.config import Settings
from trajrag.bench.mapping import ms_summary
from trajrag.bench.robustness import robustness_report
from trajrag.bench.sim import bench_scene
from trajrag.perception.factory import make_segmenter
from trajrag.world.frames import Pose2D
from trajrag.world.interface import Action, Observations
from trajrag.world.sim import GridSimulator, SimConfig

_FULL_FRAMES = 30
_QUICK_FRAMES = 5
_WARMUP_FRAMES = 2
_VOCABULARY = ("chair", "sofa", "plant", "bed", "toilet", "tv_monitor")  # habitat-lab HM3D goals


def run(args: argparse.Namespace, settings: Settings) -> dict:
    """Run the benchmark; returns the detector's milliseconds per frame (mean, p50, p95), or with
    ``--curves DIR`` the robustness curves of ``jobs/perception_curves.sh DIR`` (and DIR/curves.png)."""
    if getattr(args, "curves", None):
        return robustness_report(args.curves)
    return detector_latency(args, settings)


def detector_latency(args: argparse.Namespace, settings: Settings) -> dict:
    """``segment`` wall time per frame of ``args.detector`` (default ``perception.segmenter``)."""
    cfg = settings.perception
    detector = getattr(args, "detector", None) or cfg.segmenter
    cfg = dataclasses.replace(cfg, segmenter=detector)
    n_frames = _QUICK_FRAMES if getattr(args, "quick", False) else _FULL_FRAMES
    scene = bench_scene(settings.procedural)
    # Built before any frame is rendered: missing weights fail at once.
    segmenter = make_segmenter(_VOCABULARY, scene.categories, cfg, seed=0)
    frames = _turning_frames(scene, settings.sim, n_frames + _WARMUP_FRAMES, with_rgb=detector != "oracle")
    seconds = []
    for i, obs in enumerate(frames):
        t0 = time.perf_counter()
        segmenter.segment(obs)
        if i >= _WARMUP_FRAMES:
            seconds.append(time.perf_counter() - t0)
    depth = frames[0].depth
    result = {
        "detector": detector,
        "device": str(getattr(segmenter, "device", "cpu")),
        "frame": f"{depth.shape[1]}x{depth.shape[0]}",
        "vocabulary": len(_VOCABULARY),
        "segment_ms": ms_summary(seconds),
    }
    if detector == "grounded-sam":
        import torch

        result["weights"] = {"grounding_dino": cfg.grounded_sam.grounding_dino_path, "sam": cfg.grounded_sam.sam_path}
        result["torch_threads"] = torch.get_num_threads()
    return result


def _turning_frames(scene, sim_cfg: SimConfig, n: int, with_rgb: bool) -> list[Observations]:
    """``n`` frames of the agent turning left from the middle of the home's free space (rendered
    up front, so that rendering is not timed)."""
    if with_rgb and "rgb" not in sim_cfg.sensors:
        sim_cfg = dataclasses.replace(sim_cfg, sensors=[*sim_cfg.sensors, "rgb"])
    sim = GridSimulator(sim_cfg)
    cells = np.argwhere(scene.traversable)
    obs = sim.reset(scene, Pose2D(*scene.to_xy(cells[len(cells) // 2]), 0.0))
    frames = [obs]
    while len(frames) < n:
        frames.append(sim.step(Action.TURN_LEFT))
    return frames
