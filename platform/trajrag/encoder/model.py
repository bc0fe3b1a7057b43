"""D_traj and f_E (paper Eq. 6): a decoder-only transformer over node embeddings, z = h'_L + h_g.

``TrajectoryModel`` projects the frozen node embeddings [h_1 .. h_L] to the GPT-2 width, runs
transformers' ``GPT2Model`` on them (``inputs_embeds``, causal attention: order-sensitive, as the
paper wants), reads h'_L at an end token (plus, by default, the mean over the nodes:
``encoder.model.pooling``), projects it to ``out_dim`` and concatenates the goal embedding h_g;
z is L2-normalised, so a dot product is the cosine similarity of Eq. 7.

A trained model lives in a folder: ``model.safetensors`` (weights; nothing else is ever loaded,
no pickle) and ``encoder.json`` (architecture, the node encoder it was trained with, the scene
split, and ``encoder_version``: a hash of both files' content that the store keeps next to every
embedding, so a mismatched encoder can be detected). ``TrajectoryEncoder`` is the model plus its
node encoder, for retrieval: trajectories or store chunks in, z out.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from trajrag import artefacts
from trajrag import config as config_mod
from trajrag.encoder import EncoderConfig, EncoderError, ModelConfig
from trajrag.encoder.node_encoder import NodeEncoder
from trajrag.topo.representation import TPS_GS

WEIGHTS = "model.safetensors"
META = "encoder.json"
FORMAT = "trajrag-trajectory-encoder/1"


def _gpt2_config(cfg: ModelConfig):
    from transformers import GPT2Config

    # One position more than nodes: the end token. No text tokens at all (inputs_embeds), so no
    # bos/eos ids (GPT-2's 50256 would not fit the 1-entry vocabulary).
    return GPT2Config(vocab_size=1, n_positions=cfg.max_nodes + 1, n_embd=cfg.n_embd,
                      n_layer=cfg.n_layer, n_head=cfg.n_head, resid_pdrop=cfg.dropout,
                      embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout, bos_token_id=None,
                      eos_token_id=None)


def _without_token_ids(gpt2_config: Mapping[str, Any]) -> dict:
    """A saved GPT-2 config without text-token ids: folders written before they were dropped
    carry GPT-2's 50256, which transformers warns about on every load (the model has no tokens)."""
    return {**dict(gpt2_config), "bos_token_id": None, "eos_token_id": None}


class TrajectoryModel(nn.Module):
    """z = normalise(W_out h'_end concat h_g) with [h'_1 .. h'_L, h'_end] = GPT2([W_in s(h_1) ..
    W_in s(h_L), e]).

    * s(h) = (h - mean) / scale standardises the frozen node embeddings with statistics of the
      training nodes (``set_input_norm``; buffers saved with the weights). Sentence-encoder
      embeddings share a large common direction (MiniLM node texts: mean cosine ~0.6), which
      otherwise drowns the differences between nodes after the input projection (the remedy of
      BERT-whitening, Su et al. 2021, diagonal form).
    * e is a learned end-of-trajectory token appended after the last node; its final hidden
      state is the paper's "final token representation" h'_L. It has no node content of its
      own, so it summarises the whole sequence through causal attention (the last-token pooling
      of decoder-only embedding models, e.g. SGPT); read at the last node instead, the
      representation starts out as that one node's.
    * With ``pooling: end_mean`` the mean of the nodes' final states is added to the end token's:
      a small GPT-2 trained from scratch on a memory's few thousand pairs forgets much of what the
      frozen node embeddings say about a place, and the mean carries it through (figures:
      docs/notes/2026-12-config-history.md, encoder ``model.pooling``).

    ``node_dim``: width of h_k and h_g. ``gpt2_config``: a ``GPT2Config`` dict to rebuild a saved
    model (else ``cfg`` or ``cfg.init_from`` decides the architecture).
    """

    def __init__(self, cfg: ModelConfig, node_dim: int, gpt2_config: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2Model

        if gpt2_config is not None:
            gpt = GPT2Model(GPT2Config.from_dict(_without_token_ids(gpt2_config)))
        elif cfg.init_from:
            gpt = _pretrained_gpt2(cfg.init_from)
        else:
            gpt = GPT2Model(_gpt2_config(cfg))
        # Token embeddings are never used (inputs_embeds): frozen, so DDP does not wait for them.
        gpt.wte.weight.requires_grad_(False)
        self.gpt = gpt
        self.node_dim = int(node_dim)
        self.max_nodes = min(cfg.max_nodes, int(gpt.config.n_positions) - 1)
        width = gpt.config.n_embd
        self.register_buffer("node_mean", torch.zeros(self.node_dim))
        self.register_buffer("node_scale", torch.ones(self.node_dim))
        self.inp = nn.Linear(self.node_dim, width)
        self.end = nn.Parameter(torch.randn(width) * gpt.config.initializer_range)
        self.pool_mean = cfg.pooling == "end_mean"
        self.out = nn.Linear(width, cfg.out_dim)

    @property
    def z_dim(self) -> int:
        return self.out.out_features + self.node_dim

    def set_input_norm(self, mean: np.ndarray, scale: np.ndarray) -> None:
        """Standardise node embeddings with this per-dimension mean and scale (node_dim each)."""
        self.node_mean.copy_(torch.as_tensor(np.asarray(mean, np.float32)))
        self.node_scale.copy_(torch.as_tensor(np.asarray(scale, np.float32)))

    def forward(self, nodes: torch.Tensor, mask: torch.Tensor, goal: torch.Tensor,
                lean: bool = False) -> torch.Tensor:
        """nodes: (B, L, node_dim) right-padded; mask: (B, L) bool, True on real nodes (each row
        has at least one); goal: (B, node_dim). Returns z: (B, z_dim), unit rows. ``lean``: in
        eval mode, GPT-2 through ``gpt2_hidden`` (the same bits, less overhead)."""
        x = self.inp((nodes - self.node_mean) / self.node_scale)
        b = len(x)
        rows = torch.arange(b, device=x.device)
        lengths = mask.long().sum(dim=1)
        x = torch.cat([x, x.new_zeros(b, 1, x.shape[-1])], dim=1)
        x[rows, lengths] = self.end.to(x.dtype)
        full = torch.cat([mask, mask.new_zeros(b, 1)], dim=1)
        full[rows, lengths] = True
        if lean and not self.training and lean_supported(self.gpt):
            hidden = gpt2_hidden(self.gpt, x)
        else:
            hidden = self.gpt(inputs_embeds=x, attention_mask=full.long()).last_hidden_state
        h_end = hidden[rows, lengths]
        if self.pool_mean:
            weights = mask.to(hidden.dtype).unsqueeze(-1)
            h_end = h_end + (hidden[:, :-1] * weights).sum(1) / weights.sum(1)
        z = torch.cat([self.out(h_end), goal.to(h_end.dtype)], dim=-1)
        return nn.functional.normalize(z, dim=-1)


def lean_supported(gpt: nn.Module) -> bool:
    """Whether ``gpt2_hidden`` computes what transformers' ``GPT2Model`` computes for ``gpt``: it
    calls torch's scaled-dot-product attention, as transformers' ``sdpa`` attention does, and
    knows no cross-attention."""
    return gpt.config._attn_implementation == "sdpa" and not gpt.config.add_cross_attention


def gpt2_hidden(gpt: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``gpt(inputs_embeds=x, attention_mask=...).last_hidden_state`` of a GPT2Model in eval
    mode at every real position of right-padded ``x`` (B, L, width), to the bit (tested),
    without transformers' per-call machinery (mask building, output capture, keyword plumbing:
    about half of a small decision's f_E time on CPU): the model's own layers and torch's causal
    attention. Padding sits after every real position, so causal attention alone keeps it out of
    them; the padded positions' own states differ from transformers' (finite, and never read:
    pooling weighs them 0)."""
    b, length, _ = x.shape
    hidden = x + gpt.wpe.weight[:length]
    for block in gpt.h:
        attn = block.attn
        q, k, v = attn.c_attn(block.ln_1(hidden)).split(attn.split_size, dim=2)
        q, k, v = (t.view(b, length, -1, attn.head_dim).transpose(1, 2) for t in (q, k, v))
        out = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.0, scale=attn.scaling,
                                                         is_causal=True)
        hidden = attn.c_proj(out.transpose(1, 2).reshape(b, length, -1).contiguous()) + hidden
        hidden = hidden + block.mlp(block.ln_2(hidden))
    return gpt.ln_f(hidden)


def input_norm(node_emb: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension mean and standard deviation of node embeddings (rows weighted by how often
    each occurs; a floor keeps constant dimensions finite)."""
    x = np.asarray(node_emb, dtype=np.float64)
    w = np.ones(len(x)) if weights is None else np.asarray(weights, dtype=np.float64)
    mean = (x * w[:, None]).sum(0) / w.sum()
    std = np.sqrt(((x - mean) ** 2 * w[:, None]).sum(0) / w.sum())
    return mean.astype(np.float32), np.maximum(std, np.finfo(np.float32).eps).astype(np.float32)


def _pretrained_gpt2(path: str):
    """GPT-2 / DistilGPT2 weights from a local folder (safetensors only)."""
    from transformers import GPT2Model

    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        raise EncoderError(f"encoder.model.init_from {folder}: needs config.json and "
                           "model.safetensors (a local GPT-2 / DistilGPT2 folder)")
    try:
        return GPT2Model.from_pretrained(str(folder), local_files_only=True, use_safetensors=True)
    except Exception as exc:  # noqa: BLE001
        raise EncoderError(f"encoder.model.init_from {folder} cannot be loaded: {exc}") from exc


def build_model(cfg: ModelConfig, node_dim: int, seed: int,
                norm: tuple[np.ndarray, np.ndarray] | None = None,
                start: str | Path = "") -> TrajectoryModel:
    """A freshly initialised model; the same ``seed`` gives the same weights (the untrained
    baseline is exactly the training run's starting point). ``norm``: (mean, scale) of the
    training nodes (``input_norm``). ``start``: a trained model folder whose architecture and
    weights (input standardisation included, so ``norm`` is ignored) replace the fresh ones;
    ``cfg`` must then be its model section (``fine_tune_start``)."""
    if start:
        model, _meta = load_model_dir(start)
        return model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TrajectoryModel(cfg, node_dim)
    if norm is not None:
        model.set_input_norm(*norm)
    return model


def fine_tune_start(model_dir: str | Path, node_info: Mapping[str, Any]) -> tuple[ModelConfig, dict]:
    """The model section and metadata of a trained folder to fine-tune (``encoder.train.init_model``).
    ``EncoderError`` when it is not a trained folder, its weights fail their hash, or it was trained
    over another node encoder (``node_info``: ``NodeEncoder.info()``), whose embeddings it would
    misread."""
    _model, meta = load_model_dir(model_dir)  # with the hash check, before any training starts
    differs = sorted(k for k in set(node_info) | set(meta["node_encoder"])
                     if k != "model_dir" and node_info.get(k) != meta["node_encoder"].get(k))
    if differs:
        there = meta["node_encoder"]
        detail = ", ".join(f"{k}: {there.get(k)!r} there, {node_info.get(k)!r} here" for k in differs)
        raise EncoderError(f"encoder.train.init_model {model_dir} was trained over another node "
                           f"encoder ({detail})")
    return config_mod.from_dict(ModelConfig, meta["model"]), meta


def untrained_model(meta: Mapping[str, Any], trained: TrajectoryModel | None = None) -> TrajectoryModel:
    """The architecture of a saved model with the initial weights of its training run (same
    seed): the "untrained encoder" baseline. The input standardisation is data, not training:
    it is copied from ``trained`` when given."""
    cfg = config_mod.from_dict(ModelConfig, meta["model"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(meta["seed"]))
        if cfg.init_from:
            model = TrajectoryModel(cfg, int(meta["node_encoder"]["dim"]))
        else:
            model = TrajectoryModel(cfg, int(meta["node_encoder"]["dim"]),
                                    gpt2_config=meta["gpt2_config"])
    if trained is not None:
        source = unwrap(trained)
        model.set_input_norm(source.node_mean.cpu().numpy(), source.node_scale.cpu().numpy())
    return model.eval()


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DistributedDataParallel wrapper (or the model itself)."""
    return getattr(model, "module", model)


# -- batches --------------------------------------------------------------------------------------
def pad_sequences(seqs: Sequence[np.ndarray], max_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded (B, L, D) float32 and (B, L) bool mask; sequences keep their last
    ``max_nodes`` nodes (h'_L is read at the end)."""
    seqs = [np.asarray(s, dtype=np.float32)[-max_nodes:] for s in seqs]
    if any(len(s) == 0 for s in seqs):
        raise EncoderError("a trajectory with no nodes cannot be encoded")
    length = max(len(s) for s in seqs)
    dim = seqs[0].shape[1]
    nodes = np.zeros((len(seqs), length, dim), dtype=np.float32)
    mask = np.zeros((len(seqs), length), dtype=bool)
    for i, s in enumerate(seqs):
        nodes[i, : len(s)] = s
        mask[i, : len(s)] = True
    return nodes, mask


def embed(model: TrajectoryModel, seqs: Sequence[np.ndarray], goals: np.ndarray,
          batch_size: int, lean: bool = True) -> np.ndarray:
    """z (N, z_dim) float32 for node-embedding sequences and goal embeddings (eval mode, no grad),
    computed on the device the model is on; ``lean``: through ``gpt2_hidden`` (the same bits;
    false: transformers' forward, the reference)."""
    model = unwrap(model)
    device = next(model.parameters()).device
    was_training = model.training
    if was_training:  # switching walks every module: ~1 ms a call, paid per retrieval otherwise
        model.eval()
    out = np.zeros((len(seqs), model.z_dim), dtype=np.float32)
    with torch.inference_mode():
        for start in range(0, len(seqs), batch_size):
            nodes, mask = pad_sequences(seqs[start:start + batch_size], model.max_nodes)
            z = model(torch.from_numpy(nodes).to(device), torch.from_numpy(mask).to(device),
                      torch.from_numpy(np.asarray(goals[start:start + batch_size], np.float32)).to(device),
                      lean=lean)
            out[start:start + len(z)] = z.float().cpu().numpy()
    if was_training:
        model.train()
    return out


# -- safetensors state ----------------------------------------------------------------------------
def save_state(path: str | Path, tensors: Mapping[str, torch.Tensor]) -> None:
    """Write tensors to a safetensors file (atomically: a temporary file, then a rename)."""
    from safetensors.torch import save_file

    tmp = Path(str(path) + ".tmp")
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp))
    os.replace(tmp, path)


def load_state(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors from a safetensors file; a missing or damaged file raises ``EncoderError`` naming it."""
    from safetensors.torch import load_file

    if not Path(path).is_file():
        raise EncoderError(f"{path} not found")
    try:
        return load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types
        raise EncoderError(f"{path} is not a readable safetensors file ({exc}); the checkpoint "
                           "is corrupted or truncated") from exc


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load a state dict saved by ``save_state`` into ``model`` (names and shapes must match)."""
    state = load_state(path)
    try:
        unwrap(model).load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise EncoderError(f"{path} does not fit this model: {str(exc).splitlines()[0]}") from exc


def optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """An optimizer state as flat tensors ``state.<param>.<name>`` plus JSON-able param groups."""
    sd = opt.state_dict()
    tensors = {f"state.{pid}.{name}": torch.as_tensor(value)
               for pid, entry in sd["state"].items() for name, value in entry.items()}
    return tensors, {"param_groups": sd["param_groups"]}


def restore_optimizer(opt: torch.optim.Optimizer, tensors: Mapping[str, torch.Tensor], groups: dict) -> None:
    """Inverse of ``optimizer_tensors``."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        _, pid, name = key.split(".", 2)
        state.setdefault(int(pid), {})[name] = value
    opt.load_state_dict({"state": state, "param_groups": groups["param_groups"]})


# -- the model folder -----------------------------------------------------------------------------
def _file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def save_model_dir(model_dir: str | Path, model: nn.Module, model_cfg: ModelConfig,
                   node_info: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> dict:
    """Write ``model.safetensors`` and ``encoder.json``; returns the metadata (with
    ``encoder_version``)."""
    folder = Path(model_dir)
    folder.mkdir(parents=True, exist_ok=True)
    inner = unwrap(model)
    save_state(folder / WEIGHTS, inner.state_dict())
    weights_sha = _file_hash(folder / WEIGHTS)
    meta = {"format": FORMAT, "model": asdict(model_cfg),
            "gpt2_config": inner.gpt.config.to_dict(), "node_encoder": dict(node_info),
            "z_dim": inner.z_dim, "weights_sha256": weights_sha, **dict(extra or {})}
    meta["encoder_version"] = hashlib.sha256(
        json.dumps(meta, sort_keys=True, default=str).encode()).hexdigest()[:16]
    tmp = folder / (META + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=True, default=str))
    os.replace(tmp, folder / META)
    return meta


def read_meta(model_dir: str | Path) -> dict:
    """``encoder.json`` of a model folder (a path or URI, ``trajrag.artefacts``); a missing or
    malformed file raises ``EncoderError``."""
    try:
        path = artefacts.local_copy(model_dir) / META
    except FileNotFoundError as exc:
        raise EncoderError(f"{exc}: not a trained encoder folder (run `trajrag encoder train`)") from None
    if not path.is_file():
        raise EncoderError(f"{path} not found: {model_dir} is not a trained encoder folder "
                           "(run `trajrag encoder train`)")
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EncoderError(f"{path} is not valid JSON ({exc})") from exc
    missing = [k for k in ("format", "model", "gpt2_config", "node_encoder", "encoder_version",
                           "weights_sha256") if k not in meta]
    if missing or meta.get("format") != FORMAT:
        raise EncoderError(f"{path}: not a {FORMAT} file (missing {missing or 'format'})")
    return meta


def load_model_dir(model_dir: str | Path, device: str = "cpu") -> tuple[TrajectoryModel, dict]:
    """The trained model (eval mode) and its metadata. The weights file must hash to the
    value in ``encoder.json``: a corrupted or swapped file raises ``EncoderError`` naming it.
    ``model_dir``: a path or URI (``trajrag.artefacts``)."""
    meta = read_meta(model_dir)
    model_dir = artefacts.local_copy(model_dir)
    weights = model_dir / WEIGHTS
    if not weights.is_file():
        raise EncoderError(f"{weights} not found")
    if _file_hash(weights) != meta["weights_sha256"]:
        raise EncoderError(f"{weights} does not match {Path(model_dir) / META} (sha256 differs): "
                           "the weights are corrupted or were replaced")
    cfg = config_mod.from_dict(ModelConfig, meta["model"])
    model = TrajectoryModel(cfg, int(meta["node_encoder"]["dim"]), gpt2_config=meta["gpt2_config"])
    load_weights(model, weights)
    return model.to(device).eval(), meta


class TrajectoryEncoder:
    """f_E for retrieval: a trained model folder plus the frozen node encoder it was trained with.

    ``cfg``: the ``encoder`` section (``eval.encode_batch``, and ``node``: the node encoder's
    settings but for the model the folder names). ``node_encoder``: an already loaded
    ``NodeEncoder`` to share (its model must be the one the folder names, by version); else it is
    loaded from the folder's record.
    """

    def __init__(self, model_dir: str | Path, cfg: EncoderConfig, device: str = "cpu", node_encoder=None) -> None:
        from dataclasses import replace

        self.model, self.meta = load_model_dir(model_dir, device)
        # The local folder (a URI's copy on this node): the node-encoding cache is kept there.
        self.folder = artefacts.local_copy(model_dir)
        self.version: str = self.meta["encoder_version"]
        self.dim: int = int(self.meta["z_dim"])
        self.device = device
        self.batch_size = int(cfg.eval.encode_batch)
        info = self.meta["node_encoder"]
        if node_encoder is None:
            # The node encoder the model was trained with; batch size etc. from the config.
            node_cfg = replace(
                cfg.node, model_dir=info["model_dir"] if not info.get("package") else "",
                package=info.get("package") or cfg.node.package,
                max_length=int(info["max_length"]), free_word=info["free_word"],
                obstacle_word=info["obstacle_word"], unknown_word=info["unknown_word"],
                representation=info.get("representation", TPS_GS))
            cache = self.folder / "node_cache.safetensors"
            node_encoder = NodeEncoder(node_cfg, device=device, cache_path=cache)
        if node_encoder.version != info["version"]:
            raise EncoderError(f"{model_dir}/{META}: trained with node encoder "
                               f"{info['version']} ({info['model_dir'] or info.get('package')}), "
                               f"got {node_encoder.version} "
                               f"({node_encoder.path})")
        self.node_encoder = node_encoder

    def encode_sectors(self, sequences: Sequence[np.ndarray], goals: Sequence[str],
                       names: Mapping[int, str], lean: bool = True) -> np.ndarray:
        """z (N, dim) for sector arrays (K_i, 12) whose category ids index ``names``."""
        return self.encode_node_embeddings([self.node_encoder.encode_nodes(s, names) for s in sequences],
                                           goals, lean=lean)

    def encode_node_embeddings(self, sequences: Sequence[np.ndarray], goals: Sequence[str],
                               lean: bool = True) -> np.ndarray:
        """z (N, dim) for node-embedding sequences (K_i, node dim) of the node encoder and goal
        names (``lean``: see ``embed``)."""
        return embed(self.model, sequences, self.node_encoder.encode_goals(goals), self.batch_size, lean=lean)

    def encode_trajectories(self, trajs: Sequence[Any]) -> np.ndarray:
        """z (N, dim) of ``TopoPolarTrajectory``-like objects (sectors, categories, goal)."""
        # Each trajectory's category ids index its own category list.
        seqs = [self.node_encoder.encode_nodes(np.asarray(t.sectors), dict(enumerate(t.categories)))
                for t in trajs]
        goals = self.node_encoder.encode_goals([t.goal for t in trajs])
        return embed(self.model, seqs, goals, self.batch_size)
