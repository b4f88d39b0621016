"""The checkpoint format: one self-contained file, loaded only with `weights_only=True`.

A checkpoint is a plain dictionary of tensors, numbers, strings and bytes:

    format        "nmt-checkpoint"
    version       the lowest format version that can hold this file (`format_version`); a
                  file from a later version than FORMAT_VERSION is refused with a clear error
    kind          "train" (with optimizer, schedule, RNG and data position) or "inference"
    nmt_version   the package version that wrote it
    model_config  the ModelConfig as a dict, so the model rebuilds without the recipe
    vocab         {"src": bytes, "tgt": bytes}: the SentencePiece models themselves, or
                  (version 2) a Moses + BPE description (core/vocab.py's MosesBpeVocab)
    model         the weights (state dict)
    step          optimizer updates so far
    recipe        the resolved recipe as a dict (or None)
    train_state   optimizer/RNG/data position, training checkpoints only
    meta          free-form numbers and strings (dev loss, averaged from, ...)
    origin        where the weights came from, plain data or None (version 2): an import
                  (`{"imported_from": "huggingface-marian", ...}`), or the checkpoint a
                  fine-tuning run started from (`{"init_from": path, "origin": ...}`)

Nothing in it is pickled code, so `torch.load(..., weights_only=True)` can load it and a
file crafted to run code on load is refused.
"""

from __future__ import annotations

import dataclasses
import pickle
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from nmt_cli.core.files import writing
from nmt_cli.core.operations import REFERENCE, Operations
from nmt_cli.core.transformer import ModelConfig, Transformer
from nmt_cli.core.vocab import VocabPair
from nmt_cli.errors import NmtError
from nmt_cli.version import __version__

FORMAT_NAME = "nmt-checkpoint"
FORMAT_VERSION = 2  # the latest this nmt reads
# Model settings version 1 could not say, with the value every version 1 file meant: a
# version 1 reader would drop them from `model_config` and build another model.
_SINCE_VERSION_2 = dict(activation="relu", output_bias=False, attention_window=0, pre_norm=False)

CheckpointKind = Literal["train", "inference"]


class CheckpointError(NmtError):
    """A checkpoint that cannot be used: missing, corrupt, unsafe or from a later version."""


@dataclass
class Checkpoint:
    model_config: ModelConfig
    vocab: VocabPair
    model: dict[str, Tensor]
    step: int = 0
    kind: CheckpointKind = "inference"
    recipe: dict[str, Any] | None = None
    train_state: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, Any] | None = None

    def build_model(self, operations: Operations = REFERENCE) -> Transformer:
        """The Transformer with these weights (`build_transformer`)."""
        return build_transformer(self.model_config, self.model, operations)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": format_version(self.model_config, self.vocab),
            "kind": self.kind,
            "nmt_version": __version__,
            "model_config": dataclasses.asdict(self.model_config),
            "vocab": {"src": self.vocab.src.model_proto, "tgt": self.vocab.tgt.model_proto},
            "model": self.model,
            "step": int(self.step),
            "recipe": self.recipe,
            "train_state": self.train_state,
            "meta": self.meta,
            "origin": self.origin,
        }


def format_version(cfg: ModelConfig, vocab: VocabPair) -> int:
    """The version a file of this model is written with: the lowest that describes it, so
    that an older nmt still reads every checkpoint it can compute, and refuses (rather
    than misreads) one it cannot. An `origin` alone needs no new version: older readers
    skip a key they do not know, and the weights mean the same."""
    newer = any(getattr(cfg, name) != old for name, old in _SINCE_VERSION_2.items())
    texts = {vocab.src.kind, vocab.tgt.kind} != {"sentencepiece"}
    return 2 if newer or texts else 1


def build_transformer(
    cfg: ModelConfig, weights: dict[str, Tensor], operations: Operations = REFERENCE
) -> Transformer:
    """The Transformer with `weights`, in eval mode on the CPU, its operations as planned
    (by default the references; a planned linear layer keeps its weight in its own form,
    made as it loads)."""
    model = Transformer(cfg, operations)
    model.load_state_dict(weights)
    return model.eval()


def model_state(model: torch.nn.Module) -> dict[str, Tensor]:
    """Weights of a (possibly DDP-wrapped) model, detached and on the CPU."""
    inner = getattr(model, "module", model)
    return {k: v.detach().cpu().clone() for k, v in inner.state_dict().items()}


def save_checkpoint(ckpt: Checkpoint, path: str | Path) -> Path:
    """Write atomically (a kill mid-write leaves the previous file intact); a symlink, FIFO
    or device is written through."""
    path = Path(path)
    with writing(path) as fh:
        torch.save(ckpt.to_dict(), fh)
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Load and validate; every way a file can be unusable becomes a CheckpointError.

    The messages never pass on PyTorch's advice to load with `weights_only=False`: for a
    file that is refused, that advice is exactly how a stranger's file runs its code.
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file")
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint file")
    _refuse_non_pytorch(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about foreign pickle protocols
            raw = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path}: refused, the file holds objects other than weights and plain data "
            f"(loading it could run code){_reason(exc)}"
        ) from None
    except Exception as exc:  # torch raises many types for a file that is not a checkpoint
        raise CheckpointError(
            f"{path}: not a readable checkpoint (truncated or not written by nmt){_reason(exc)}"
        ) from None
    return checkpoint_from_dict(raw, path)


def _refuse_non_pytorch(path: Path) -> None:
    """A file that does not start like a PyTorch file (a zip archive, or a legacy pickle)
    is named for what it is, rather than fed to the unpickler."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc.strerror})") from None
    if head.startswith(b"PK\x03\x04") or head.startswith(b"\x80"):
        return
    looks = "empty" if not head else "compressed data" if head[:2] == b"\x1f\x8b" else ""
    if not looks:
        try:
            head.decode("ascii")
            looks = "text"
        except UnicodeDecodeError:
            looks = "some other binary format"
    raise CheckpointError(
        f"{path}: not a checkpoint (it is {looks}; nmt train and nmt average-checkpoints "
        "write checkpoints as .pt files)"
    )


def _reason(exc: BaseException) -> str:
    """The useful part of a torch.load error, without its advice to drop weights_only."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    useful = [
        line
        for line in lines
        if "weights_only" not in line and "torch.load" not in line and "file an issue" not in line
    ]
    chosen = next((line for line in useful if "GLOBAL" in line), useful[0] if useful else "")
    return f": {chosen}" if chosen else ""


def checkpoint_from_dict(raw: Any, path: str | Path = "<memory>") -> Checkpoint:
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
        raise CheckpointError(f"{path}: not an nmt checkpoint")
    version = raw.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: written by checkpoint format version {version} "
            f"(nmt {raw.get('nmt_version', '?')}); this nmt {__version__} reads up to "
            f"version {FORMAT_VERSION}: upgrade nmt to load it"
        )
    try:
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        fields = {k: v for k, v in raw["model_config"].items() if k in known}
        if "joint_vocab" not in fields:
            # Format 1 files from before the tie followed the vocabulary: they tied the
            # source embedding whenever the two sizes matched, and were trained that way.
            fields["joint_vocab"] = fields.get("src_vocab_size") == fields.get("tgt_vocab_size")
        config = ModelConfig(**fields)
        vocab = VocabPair.from_protos(raw["vocab"]["src"], raw["vocab"]["tgt"])
        return Checkpoint(
            model_config=config,
            vocab=vocab,
            model=raw["model"],
            step=int(raw.get("step", 0)),
            kind=raw.get("kind", "inference"),
            recipe=raw.get("recipe"),
            train_state=raw.get("train_state"),
            meta=dict(raw.get("meta") or {}),
            origin=raw.get("origin"),
        )
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: incomplete nmt checkpoint ({exc})") from None
