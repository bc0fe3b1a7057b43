"""Contrastive training of f_E (paper Eq. 7) on Ray Train.

``train_encoder(store, out_dir, cfg)`` is the one implementation behind ``trajrag encoder train``
and ``jobs/train_encoder.py``:

1. read the store's chunks, hold out whole scenes for evaluation (``data.split_scenes``);
2. run the frozen node encoder once over every distinct node of the training chunks (cached in
   ``<out>/node_cache.safetensors``) and put the result in the Ray object store;
3. ``TorchTrainer`` with ``workers`` workers (gloo on CPU, NCCL on GPUs when the cluster has them):
   each epoch draws anchor-positive pairs (same group, else same goal), each worker encodes its
   share, z of all workers are gathered (gradient through the local part) so every anchor sees
   the other workers' pairs as negatives, and the InfoNCE loss with cosine similarity and
   temperature tau is minimised with AdamW (the node encoder stays frozen: it is not in the model);
4. rank 0 writes a checkpoint every epoch (weights, optimizer state and history, safetensors +
   JSON) and logs to W&B (offline by default); after a worker dies the worker group restarts from
   the last checkpoint (``FailureConfig(max_failures)``);
5. the last checkpoint becomes ``<out>/model.safetensors`` + ``<out>/encoder.json``, and the
   per-epoch history goes to ``<out>/train.json``.

Ray Train V2 resumes a run that has the same name and storage path, so every call gets a new
run name (``encoder-<time>-<random>``); a resumed run is a restart within one call.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from trajrag import artefacts
from trajrag import config as config_mod
from trajrag.encoder import EncoderConfig, EncoderError, torch_device
from trajrag.encoder.data import (
    ChunkRecord,
    EncodedSet,
    crop_sequence,
    encode_records,
    pairable_chunks,
    read_records,
    sample_pairs,
    split_scenes,
    worker_batches,
)
from trajrag.encoder.node_encoder import NodeEncoder
from trajrag.ray_cluster import ensure_ray, finish_wandb, import_wandb

NODE_CACHE = "node_cache.safetensors"
TRAIN_LOG = "train.json"
_CKPT_WEIGHTS = "model.safetensors"
_CKPT_OPTIM = "optimizer.safetensors"
_CKPT_STATE = "state.json"
# Keeps the dropout seeds apart from the crop generator, which (seed, epoch, rank) alone seeds.
_DROPOUT_STREAM = 1


@dataclass
class TrainResult:
    """What one training call produced. history: one dict per epoch (loss, pairs, seconds,
    pairs_per_s, ...); resumes: the epoch of the checkpoint each restart resumed from."""

    model_dir: str
    encoder_version: str
    epochs: int
    history: list[dict]
    resumes: list[int]
    run_path: str
    seconds: float
    train_chunks: int
    train_scenes: list[str] = field(default_factory=list)
    held_out_scenes: list[str] = field(default_factory=list)


# -- the loss -------------------------------------------------------------------------------------
def gather(t, rank: int, world: int, keep_grad: bool):
    """All workers' ``t`` concatenated in rank order; with ``keep_grad`` this worker's slice is
    the original tensor, so the gradient flows through the local part."""
    import torch
    import torch.distributed as dist

    if world == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.detach().contiguous())
    if keep_grad:
        parts[rank] = t
    return torch.cat(parts)


def info_nce(za, zp, ga, gp, tau: float, rank: int = 0, world: int = 1, goal_a=None, goal_p=None):
    """Symmetric InfoNCE (Eq. 7) over the pairs (za[i], zp[i]) of all workers.

    za, zp: (B, Z) unit rows of this worker (a dot product is the cosine similarity); ga, gp:
    (B,) their group ids. Every worker gathers all workers' pairs and computes the same loss over
    all of them (each anchor against every positive, each positive against every anchor), with
    the gradient flowing through its own rows only: summed over workers that is the exact
    full-batch gradient (the scheme of OpenCLIP's gathered loss). A loss over the local anchors
    alone is not: it drops the terms that push this worker's rows away from the other workers'
    anchors (with 2 DistributedDataParallel workers it stayed at chance here). Candidates of a
    row's anchor or positive group other than its own partner are masked out, so negatives all
    come from other groups (paper: "negatives are randomly drawn from different groups"). Equal
    B on every worker is required.

    goal_a, goal_p: (B,) goal codes, given only with ``encoder.train.mask_same_goal``: a row whose
    pair is a same-goal pair (different groups, one goal) then also leaves out the candidates with
    that goal. Otherwise the other same-goal chunks are its negatives, and the only way to tell the
    drawn partner from them is to memorise the draw (the goal half of z is the same for all).
    """
    import torch
    import torch.nn.functional as F

    Za, Zp = gather(za, rank, world, True), gather(zp, rank, world, True)
    Ga, Gp = gather(ga, rank, world, False), gather(gp, rank, world, False)
    n = len(Za)
    target = torch.arange(n, device=za.device)
    own = torch.eye(n, dtype=torch.bool, device=za.device)

    mask_goals = goal_a is not None
    if mask_goals:
        Ka, Kp = gather(goal_a, rank, world, False), gather(goal_p, rank, world, False)
        goal_pair = (Ga != Gp) & (Ka == Kp)

    def masked(logits, groups, goals):
        same = (groups[None, :] == Ga[:, None]) | (groups[None, :] == Gp[:, None])
        if mask_goals:
            same |= goal_pair[:, None] & (goals[None, :] == Ka[:, None])
        return logits.masked_fill(same & ~own, float("-inf"))

    loss_a = F.cross_entropy(masked(Za @ Zp.T / tau, Gp, Kp if mask_goals else None), target)
    loss_p = F.cross_entropy(masked(Zp @ Za.T / tau, Ga, Ka if mask_goals else None), target)
    return 0.5 * (loss_a + loss_p)


# -- the Ray Train worker -------------------------------------------------------------------------
def _maybe_fail(fault: Mapping[str, Any] | None, epoch: int, rank: int) -> None:
    """Fault injection for tests: the worker of ``fault['rank']`` dies (``os._exit``) at the start
    of ``fault['epoch']``, once (a marker file remembers it), after ``delay_s`` seconds so that
    the controller has registered the previous epoch's checkpoint."""
    if not fault or epoch != int(fault["epoch"]) or rank != int(fault["rank"]):
        return
    marker = Path(fault["marker"])
    if marker.exists():
        return
    marker.write_text(f"rank {rank} killed at epoch {epoch}\n")
    time.sleep(float(fault.get("delay_s", 0.0)))
    os._exit(1)


def _restore(checkpoint, model, opt) -> dict:
    """Load weights, optimizer and training state from a Ray checkpoint; returns the state."""
    from trajrag.encoder.model import load_state, load_weights, restore_optimizer

    with checkpoint.as_directory() as folder:
        folder = Path(folder)
        state = json.loads((folder / _CKPT_STATE).read_text())
        load_weights(model, folder / _CKPT_WEIGHTS)
        restore_optimizer(opt, load_state(folder / _CKPT_OPTIM), state["optimizer"])
    return state


def _report(metrics: dict, state: dict, model, opt, rank: int) -> None:
    """Every worker reports (a barrier); rank 0 attaches the checkpoint."""
    import ray.train

    from trajrag.encoder.model import optimizer_tensors, save_state, unwrap

    if rank != 0:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory(prefix="trajrag-encoder-ckpt-") as folder:
        folder = Path(folder)
        save_state(folder / _CKPT_WEIGHTS, unwrap(model).state_dict())
        tensors, groups = optimizer_tensors(opt)
        save_state(folder / _CKPT_OPTIM, tensors)
        (folder / _CKPT_STATE).write_text(json.dumps(dict(state, optimizer=groups)))
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(str(folder)))


def _wandb_run(cfg: EncoderConfig, config: Mapping[str, Any], resumed_from: int):
    """A W&B run on rank 0 (``cfg.train.wandb_mode``; offline writes under the run folder)."""
    if cfg.train.wandb_mode == "disabled":
        return None
    # W&B reads the mode from the environment; the argument alone still asks for an API key.
    os.environ["WANDB_MODE"] = cfg.train.wandb_mode
    os.environ.setdefault("WANDB_SILENT", "true")
    folder = Path(config["wandb_dir"])
    folder.mkdir(parents=True, exist_ok=True)
    wandb = import_wandb(folder)
    name = config["run_name"] + ("" if resumed_from < 0 else f"-resumed-e{resumed_from}")
    return wandb.init(project=cfg.train.wandb_project, name=name, dir=str(folder),
                      config=config["cfg"], job_type="train-encoder")


def _epoch(model, opt, data: EncodedSet, batches, cfg: EncoderConfig, rank: int, world: int,
           device, rng: np.random.Generator) -> tuple[float, int]:
    """One pass over this worker's batches; returns (summed loss x pairs, pairs). A positive
    that is its own anchor (``positive_fallback: crop`` or ``goal_or_crop``) is replaced by a
    crop of it."""
    import torch

    from trajrag.encoder.model import pad_sequences, unwrap

    max_nodes = unwrap(model).max_nodes
    model.train()
    total, count = 0.0, 0
    for a, p in batches:
        index = np.concatenate([a, p])
        sequences = data.sequences(index)
        for k in np.flatnonzero(a == p):
            sequences[len(a) + k] = crop_sequence(sequences[len(a) + k], rng, cfg.train.crop_min_fraction)
        nodes, mask = pad_sequences(sequences, max_nodes)
        z = model(torch.from_numpy(nodes).to(device), torch.from_numpy(mask).to(device),
                  torch.from_numpy(data.goal_vectors(index)).to(device))
        groups = torch.from_numpy(data.group[index]).to(device)
        goal = torch.from_numpy(data.goal_code[index]).to(device) if cfg.train.mask_same_goal else None
        loss = info_nce(z[: len(a)], z[len(a):], groups[: len(a)], groups[len(a):],
                        cfg.train.tau, rank, world,
                        goal_a=None if goal is None else goal[: len(a)],
                        goal_p=None if goal is None else goal[len(a):])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total += float(loss.detach()) * len(a)
        count += len(a)
    return total, count


def _seed_epoch(seed: int, epoch: int, rank: int) -> np.random.Generator:
    """Seed this worker's dropout (torch's global generator) for ``epoch`` and return its crop
    generator. Both come from (seed, epoch, rank), not from the worker process: two runs of one
    config train the same weights, and a run resumed from a checkpoint after a lost worker trains
    the weights the uninterrupted run would have."""
    import torch

    torch.manual_seed(int(np.random.SeedSequence([seed, epoch, rank, _DROPOUT_STREAM]).generate_state(1)[0]))
    return np.random.default_rng([seed, epoch, rank])


def train_loop_per_worker(config: dict) -> dict:
    """The Ray Train worker function (``config``: cfg dict, data ref, run name, folders, fault)."""
    import ray
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    from trajrag.encoder.model import build_model

    cfg = config_mod.from_dict(EncoderConfig, config["cfg"])
    data = config["data"]
    data = ray.get(data) if isinstance(data, ray.ObjectRef) else data
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    norm = tuple(np.asarray(v, np.float32) for v in config["input_norm"])
    model = ray.train.torch.prepare_model(build_model(cfg.model, data.dim, cfg.train.seed, norm,
                                                      start=cfg.train.init_model))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                            lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    state: dict = {"epoch": -1, "history": [], "resumes": []}
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        state = _restore(checkpoint, model, opt)
        state["resumes"] = state["resumes"] + [state["epoch"]]
    run = _wandb_run(cfg, config, state["epoch"] if checkpoint else -1) if rank == 0 else None
    try:  # a failed epoch (or Ray Train stopping the worker) still finishes the W&B run
        for epoch in range(state["epoch"] + 1, cfg.train.epochs):
            _maybe_fail(config.get("fault"), epoch, rank)
            anchors, positives = sample_pairs(data.group, data.goal_code,
                                              np.random.default_rng([cfg.train.seed, epoch]),
                                              cfg.train.positive_fallback)
            batches = worker_batches(anchors, positives, cfg.train.batch_size, rank, world)
            start = time.perf_counter()
            crop_rng = _seed_epoch(cfg.train.seed, epoch, rank)
            total, count = _epoch(model, opt, data, batches, cfg, rank, world, device, crop_rng)
            seconds = time.perf_counter() - start
            if world > 1:
                # On the worker's device: NCCL (GPU workers) reduces device tensors only.
                sums = torch.tensor([total, count], dtype=torch.float64, device=device)
                dist.all_reduce(sums)
                total, count = float(sums[0]), int(sums[1])
            metrics = {"epoch": epoch, "loss": total / max(count, 1), "pairs": count,
                       "seconds": seconds, "pairs_per_s": count / max(seconds, 1e-9),
                       "workers": world, "resumed_from": state["resumes"][-1] if state["resumes"] else -1}
            state = {"epoch": epoch, "history": state["history"] + [metrics], "resumes": state["resumes"]}
            if run is not None:
                run.log(metrics, step=epoch)
            _report(metrics, state, model, opt, rank)
    finally:
        finish_wandb(run)
    # The device it trained on ("cpu", "cuda:0"): what `bench encoder` timed, said with the figure.
    return {"history": state["history"], "resumes": state["resumes"], "device": str(device)}


# -- the driver -----------------------------------------------------------------------------------
def _use_gpu(setting: str) -> bool:
    import ray

    value = setting.strip().lower()
    if value not in ("auto", "true", "false"):
        raise EncoderError(f"encoder.train.use_gpu is {setting!r}; use auto, true or false")
    if value == "auto":
        return ray.cluster_resources().get("GPU", 0) > 0
    return value == "true"


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    """Environment variables set for the block (Ray Train propagates some to its workers)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_trainer(data: EncodedSet | Any, cfg: EncoderConfig, storage: str, run_name: str, *,
                workers: int, wandb_dir: str, fault: Mapping[str, Any] | None = None):
    """Fit a ``TorchTrainer`` on an ``EncodedSet`` (or its object ref); returns the Ray Result.

    A failed run (workers died more than ``max_failures`` times, a bad config) raises
    ``EncoderError`` with Ray's message.
    """
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from trajrag.encoder.model import input_norm

    if workers < 1:
        raise EncoderError(f"encoder training needs at least 1 worker, got {workers}")
    local = ray.get(data) if isinstance(data, ray.ObjectRef) else data
    norm = input_norm(local.node_emb, np.bincount(local.node_idx, minlength=len(local.node_emb)))
    loop_config = {"cfg": config_mod.to_dict(cfg), "run_name": run_name, "wandb_dir": wandb_dir,
                   "data": data if isinstance(data, ray.ObjectRef) else ray.put(data),
                   "input_norm": [v.tolist() for v in norm],
                   "fault": dict(fault) if fault else None}
    trainer = TorchTrainer(
        train_loop_per_worker, train_loop_config=loop_config,
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=_use_gpu(cfg.train.use_gpu)),
        run_config=RunConfig(
            name=run_name, storage_path=storage,
            failure_config=FailureConfig(max_failures=cfg.train.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.train.checkpoints_to_keep)))
    with _env(RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=str(cfg.train.health_check_interval_s)):
        try:
            result = trainer.fit()
        except Exception as exc:  # noqa: BLE001 - Ray wraps worker errors in several types
            raise EncoderError(f"encoder training run {run_name} failed: {_ray_error(exc)}") from exc
    if getattr(result, "error", None) is not None or result.checkpoint is None:
        raise EncoderError(f"encoder training run {run_name} failed: {result.error}")
    return result


def _check_pairs(records: list[ChunkRecord], cfg: EncoderConfig, workers: int, scenes: int) -> None:
    """Refuse, before Ray starts, a training set whose epochs may give a worker no pair."""
    pairable = pairable_chunks(np.array([r.group_id for r in records]), np.array([r.goal for r in records]),
                               cfg.train.positive_fallback)
    if pairable < workers:
        raise EncoderError(
            f"the {len(records)} training chunks of {scenes} scene(s) hold {pairable} that pair in every epoch "
            f"(a chunk pairs with another of its summary group, else as encoder.train.positive_fallback="
            f"{cfg.train.positive_fallback} says), fewer than the {workers} worker(s): collect more walks with "
            "`trajrag corpus build`, or train with fewer --workers")


def _ray_error(exc: Exception) -> str:
    """The line of a Ray Train failure that says what went wrong: the worker's own exception line
    where Ray quotes its traceback, else Ray's first line."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    raised = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b.*:", line)]
    return (raised[-1] if raised else lines[0] if lines else type(exc).__name__)[:500]


def _storage(cfg: EncoderConfig, out_dir: str | Path) -> str:
    """Ray Train's storage: ``encoder.train.storage_path`` or ``<out>/runs``; with an object-store
    ``--out`` the checkpoints go there too, where every node (and a resubmitted job) finds them."""
    path = cfg.train.storage_path or artefacts.join(out_dir, "runs")
    return path if artefacts.is_uri(path) else str(Path(path).resolve())


def train_encoder(store: Any, out_dir: str | Path, cfg: EncoderConfig, *, workers: int | None = None,
                  fault: Mapping[str, Any] | None = None, node_encoder: Any = None,
                  log: Callable[[str], None] | None = None) -> TrainResult:
    """Train the trajectory encoder on the chunks of ``store`` and write it to ``out_dir``.

    store: a ``MemoryStore`` or its URI. cfg: the ``encoder`` section. workers: Ray Train workers (default ``cfg.train.workers``). fault: test
    hook, see ``_maybe_fail``. node_encoder: a loaded ``NodeEncoder`` to reuse. log: progress lines.
    out_dir: a folder or an object-store URI (``trajrag.artefacts``: written locally, then uploaded).
    """
    with artefacts.output_folder(out_dir) as out:
        result = _train_into(store, out, _storage(cfg, out_dir), cfg, workers=workers, fault=fault,
                             node_encoder=node_encoder, log=log)
        result = replace(result, model_dir=str(out_dir))
        (out / TRAIN_LOG).write_text(json.dumps(asdict(result), indent=1))
    return result


def _train_into(store: Any, out: Path, storage: str, cfg: EncoderConfig, *, workers: int | None,
                fault: Mapping[str, Any] | None, node_encoder: Any,
                log: Callable[[str], None] | None) -> TrainResult:
    """``train_encoder`` with the model written to the local folder ``out`` and Ray Train's
    checkpoints under ``storage``."""
    from trajrag.encoder.model import build_model, fine_tune_start, load_weights, save_model_dir

    started = time.perf_counter()
    say = log or (lambda _msg: None)
    workers = int(workers or cfg.train.workers)
    records, names = read_records(store)
    if not records:
        raise EncoderError(f"memory store {getattr(store, 'uri', store)} holds no chunks to train on")
    train_scenes, held_out = split_scenes([r.scene for r in records], cfg.train.held_out_fraction,
                                          cfg.train.min_held_out_scenes, cfg.train.seed,
                                          cfg.train.fold_index())
    keep = set(train_scenes)
    train_records = [r for r in records if r.scene in keep]
    say(f"{len(train_records)} training chunks from {len(train_scenes)} scenes; "
        f"{len(held_out)} scenes held out")
    _check_pairs(train_records, cfg, workers, len(train_scenes))  # before minutes of node encoding
    if node_encoder is None:
        node_encoder = NodeEncoder(cfg.node, device=torch_device(cfg.node.device), cache_path=out / NODE_CACHE)
    start: dict = {}
    if cfg.train.init_model:  # checked before the node encoding, which takes minutes on a large store
        start_model, start = fine_tune_start(cfg.train.init_model, node_encoder.info())
        cfg = replace(cfg, model=start_model)
        say(f"fine-tuning {cfg.train.init_model} (encoder {start['encoder_version']})")
    t0 = time.perf_counter()
    data = encode_records(train_records, names, node_encoder)
    node_encoder.save_cache(out / NODE_CACHE)
    say(f"node encoder: {len(data.node_emb)} distinct nodes ({node_encoder.misses} encoded) "
        f"in {time.perf_counter() - t0:.1f} s")
    ensure_ray(cfg.train.ray_address, quiet=True)
    run_name = f"encoder-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    result = run_trainer(data, cfg, storage, run_name, workers=workers,
                         wandb_dir=str(out / "runs" / run_name) if artefacts.is_uri(storage)
                         else str(Path(storage) / run_name), fault=fault)
    model = build_model(cfg.model, data.dim, cfg.train.seed, start=cfg.train.init_model)
    with result.checkpoint.as_directory() as folder:
        load_weights(model, Path(folder) / _CKPT_WEIGHTS)
        state = json.loads((Path(folder) / _CKPT_STATE).read_text())
    # A fine-tuned model has also seen its start's scenes: `encoder eval` holds out neither.
    seen = list(dict.fromkeys([*start.get("train_scenes", []), *train_scenes]))
    meta = save_model_dir(out, model, cfg.model, node_encoder.info(), extra={
        "seed": cfg.train.seed, "tau": cfg.train.tau, "epochs": state["epoch"] + 1,
        "train_scenes": seen, "held_out_scenes": [s for s in held_out if s not in seen],
        "store": str(getattr(store, "uri", store)), "run": run_name,
        "fine_tuned_from": {"model": str(cfg.train.init_model),
                            "encoder_version": start["encoder_version"]} if start else None})
    seconds = time.perf_counter() - started
    out_result = TrainResult(
        model_dir=str(out), encoder_version=meta["encoder_version"], epochs=state["epoch"] + 1,
        history=state["history"], resumes=state["resumes"], run_path=str(result.path),
        seconds=seconds, train_chunks=len(train_records), train_scenes=train_scenes,
        held_out_scenes=held_out)
    say(f"trained {out_result.epochs} epochs in {seconds:.1f} s; encoder {meta['encoder_version']}")
    return out_result
