"""What every exporter shares: the optional library, the output directory, the vocabulary.

The export libraries are optional extras, imported only when an export runs (through
`nmt_cli.optional`), so nmt works without them and says what to install when they are
missing. The output directory is
checked before any work starts, and the export is built in a staging directory beside it
and renamed into place at the end: a failed or killed export never leaves a half-written
model where a user (or a server watching the directory) would load it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nmt_cli.core.model_config import ModelConfig
from nmt_cli.core.vocab import Vocab, VocabPair
from nmt_cli.errors import NmtError


def check_output_dir(out_dir: Path, force: bool) -> None:
    """Refuse an output that is a file, or a non-empty directory unless `force`."""
    if out_dir.exists() or out_dir.is_symlink():
        if not out_dir.is_dir():
            raise NmtError(f"{out_dir}: exists and is not a directory; choose another OUT_DIR")
        if any(out_dir.iterdir()) and not force:
            raise NmtError(
                f"{out_dir}: directory is not empty; choose another OUT_DIR or pass --force "
                "to replace it"
            )
    parent = out_dir.absolute().parent
    if parent.exists() and not parent.is_dir():
        raise NmtError(f"{parent}: is not a directory, so {out_dir} cannot be created")


@contextlib.contextmanager
def staged_dir(out_dir: Path) -> Iterator[Path]:
    """A fresh directory beside `out_dir` that replaces it only when the block succeeds."""
    out_dir.absolute().parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.absolute().parent))
    stage.chmod(0o755)  # mkdtemp makes 0700; a model directory is shared like any other
    try:
        yield stage
        old: Path | None = None
        if out_dir.exists():
            old = stage.with_name(stage.name + ".old")
            out_dir.rename(old)
        stage.rename(out_dir)
        if old is not None:
            shutil.rmtree(old)
    finally:
        if stage.exists():
            shutil.rmtree(stage)


def check_sentencepiece(vocab: VocabPair, target: str) -> None:
    """Both exports hand the tokenizer over as SentencePiece models; a model that reads
    text with Moses and BPE (imported from fairseq) has none."""
    if {vocab.src.kind, vocab.tgt.kind} != {"sentencepiece"}:
        raise NmtError(
            f"--to {target}: this model reads text with Moses and BPE (imported from "
            "fairseq), and the export writes SentencePiece models; it cannot be exported"
        )


def check_full_attention(cfg: ModelConfig, target: str) -> None:
    """Refuse a model with restricted self-attention: neither target has a window, so the
    exported model would attend everywhere and translate differently without a word."""
    if cfg.attention_window:
        raise NmtError(
            f"--to {target}: it has no restricted self-attention (this model has "
            f"model.attention_window {cfg.attention_window}); export a model with full attention"
        )


def write_sentencepiece(out_dir: Path, src: Vocab, tgt: Vocab) -> list[str]:
    """source.spm and target.spm (the same model twice for a joint vocabulary): the names
    Marian, OPUS-MT and CTranslate2's examples use, so existing scripts find them."""
    (out_dir / "source.spm").write_bytes(src.model_proto)
    (out_dir / "target.spm").write_bytes(tgt.model_proto)
    return ["source.spm", "target.spm"]


def all_pieces(vocab: Vocab) -> list[str]:
    """Every piece in id order: id i of the model is line/entry i of an exported vocabulary."""
    return vocab.pieces(range(len(vocab)))


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
