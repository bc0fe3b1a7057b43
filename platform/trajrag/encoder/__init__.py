"""The trajectory encoder f_E of the fine index (paper "Fine index", Eqs. 6-7).

* ``node_encoder.NodeEncoder``: a frozen pretrained encoder-only transformer over a node's 12
  sector labels read as words in sector order -> h_k (mean-pooled, L2-normalised), cached by
  the label tuple; the goal category name through the same model -> h_g.
* ``model.TrajectoryModel``: a decoder-only transformer (GPT-2 architecture) over the projected
  [h_1 .. h_L]; z = normalise(W h'_L concat h_g) (Eq. 6). ``model.TrajectoryEncoder`` ties the
  two together for retrieval: trajectories or store chunks in, z out.
* ``data``: chunks from the memory store, the split by scene, contrastive pairs and batches.
* ``train``: InfoNCE (Eq. 7) on Ray Train (``train_encoder``); ``evaluate``: held-out recall
  against the text baseline and the untrained model, and embeddings written back to the store.

This module holds only the config schema and the error type, so importing it costs nothing;
torch, transformers and Ray are imported by the submodules that need them.
"""

from __future__ import annotations

from dataclasses import dataclass


class EncoderError(RuntimeError):
    """The encoder cannot be built, loaded, trained or applied; the message names the file,
    store or value at fault."""


class RecallNotMeasurable(EncoderError):
    """The held-out chunks hold no query (a chunk with another chunk of its group): the store is
    too small, or the model was trained on every scene of it."""


@dataclass
class NodeEncoderConfig:
    """The frozen node encoder E_node (values and sources: ``configs/encoder.yaml``).

    model_dir: a local encoder-only transformer folder (BERT, DistilBERT, MiniLM); empty = the
        ``model`` folder inside the installed Python package ``package``.
    max_length: tokens per node text (12 sector words). text_max_length: tokens per trajectory
        description (text baseline). batch_size: texts per forward pass.
    free_word, obstacle_word, unknown_word: the words for the non-object sector labels.
    representation: what of a node the text keeps (paper Tab. 1; ``topo.representation``):
        ``tps_gs`` (geometry + semantics), ``tps_s``, ``tps_g`` or ``tna``.
    device: where the jobs that encode a whole memory run it (``auto``: the GPU when torch sees
        one; ``torch_device`` resolves it).
    """

    model_dir: str
    package: str
    max_length: int
    text_max_length: int
    batch_size: int
    free_word: str
    obstacle_word: str
    unknown_word: str
    representation: str
    device: str


POOLINGS = ("end", "end_mean")


@dataclass
class ModelConfig:
    """The decoder-only trajectory model D_traj and the output projection.

    n_layer, n_head, n_embd: GPT-2 size when trained from scratch. max_nodes: the longest node
    sequence (GPT-2 positions); longer trajectories keep their last ``max_nodes`` nodes.
    dropout: GPT-2 residual, embedding and attention dropout. out_dim: width of the projected
    h'_L; z has out_dim + node-encoder width entries. init_from: a local GPT-2 / DistilGPT2
    folder (safetensors) to start from instead of the small config; empty = from scratch.
    pooling: ``end`` (h'_L = the end token's final state, the paper) or ``end_mean`` (plus the
    mean of the nodes' final states); models saved before the option existed are ``end``.
    """

    n_layer: int
    n_head: int
    n_embd: int
    max_nodes: int
    dropout: float
    out_dim: int
    init_from: str
    pooling: str = "end"

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"encoder.model.pooling must be one of {POOLINGS}, got {self.pooling!r}")


@dataclass
class TrainConfig:
    """Contrastive training on Ray Train.

    epochs, batch_size (anchor-positive pairs per worker and step), lr, weight_decay: AdamW.
    tau: InfoNCE temperature. seed: model init, pair sampling and the scene split.
    workers: Ray Train workers (``--workers`` overrides). use_gpu: ``auto`` (a GPU in the Ray
    cluster), ``true`` or ``false``. max_failures: worker-group restarts from the last checkpoint.
    checkpoints_to_keep: Ray Train checkpoints kept. held_out_fraction, min_held_out_scenes: the
    scenes kept out of training for evaluation. health_check_interval_s: Ray Train's controller
    poll (each report waits for it). storage_path: Ray Train run folder; empty = ``<out>/runs``.
    ray_address: an existing Ray cluster; empty = the current one or a new local one.
    wandb_mode: ``offline``, ``online`` or ``disabled``. wandb_project: the W&B project.
    positive_fallback: a chunk alone in its group gets a positive with its goal (``goal``, the
    paper) or a random crop of itself (``crop``: a contiguous run of at least
    ``crop_min_fraction`` of its nodes, at least 2) or either with even odds (``goal_or_crop``).
    mask_same_goal: a same-goal pair's other same-goal chunks are not its negatives (``info_nce``).
    fold: empty = hold out ``held_out_fraction`` of the scenes; ``"I/K"`` = hold out fold I of K
    (``data.split_scenes``; ``trajrag encoder cv`` trains every fold).
    init_model: a trained encoder folder to fine-tune (its architecture, weights and input
    standardisation are the start); empty = the ``model`` section, randomly initialised.
    """

    epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    tau: float
    seed: int
    workers: int
    use_gpu: str
    max_failures: int
    checkpoints_to_keep: int
    held_out_fraction: float
    min_held_out_scenes: int
    health_check_interval_s: float
    storage_path: str
    ray_address: str
    wandb_mode: str
    wandb_project: str
    positive_fallback: str
    crop_min_fraction: float
    mask_same_goal: bool
    fold: str
    init_model: str

    def __post_init__(self) -> None:
        self.fold_index()  # validates
        if self.positive_fallback not in ("goal", "crop", "goal_or_crop"):
            raise ValueError("encoder.train.positive_fallback must be goal, crop or goal_or_crop, "
                             f"got {self.positive_fallback!r}")
        if not 0.0 < self.crop_min_fraction <= 1.0:
            raise ValueError(f"encoder.train.crop_min_fraction must be in (0, 1], got {self.crop_min_fraction}")

    def fold_index(self) -> tuple[int, int] | None:
        """``fold`` as (I, K), or None when empty."""
        if not str(self.fold).strip():
            return None
        try:
            index, folds = (int(part) for part in str(self.fold).split("/"))
        except ValueError:
            raise ValueError(f"encoder.train.fold must be I/K (e.g. 0/5), got {self.fold!r}") from None
        if not (folds >= 2 and 0 <= index < folds):
            raise ValueError(f"encoder.train.fold {self.fold!r}: need K >= 2 and 0 <= I < K")
        return index, folds


@dataclass
class EvalConfig:
    """Held-out retrieval evaluation. ks: the k of recall@k. write_batch: chunks per store commit
    when embeddings are written back. encode_batch: trajectories per model forward pass."""

    ks: list[int]
    write_batch: int
    encode_batch: int


@dataclass
class EncoderBenchConfig:
    """``trajrag bench encoder``: synthetic training throughput.

    trajectories, groups: the synthetic set. min_nodes, max_nodes: trajectory lengths.
    epochs: timed epochs per run (after one warm-up epoch). workers: worker counts to time.
    """

    trajectories: int
    groups: int
    min_nodes: int
    max_nodes: int
    epochs: int
    workers: list[int]


@dataclass
class EncoderConfig:
    """The ``encoder`` config section (``configs/encoder.yaml``)."""

    node: NodeEncoderConfig
    model: ModelConfig
    train: TrainConfig
    eval: EvalConfig
    bench: EncoderBenchConfig




def torch_device(setting: str) -> str:
    """The torch device of an ``encoder.node.device`` setting: ``auto`` is ``cuda`` when torch
    sees a GPU, else ``cpu``; anything else must be a device torch knows (``cuda:1``)."""
    import torch

    if setting.strip().lower() == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        return str(torch.device(setting))
    except RuntimeError as exc:
        raise EncoderError(f"encoder.node.device is {setting!r}: {exc}; use auto, cpu or cuda[:N]") from None
