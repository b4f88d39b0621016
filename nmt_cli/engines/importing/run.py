"""`import_model`: check the output, import, write the checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nmt_cli.core.checkpoint import save_checkpoint
from nmt_cli.core.model_config import ModelConfig
from nmt_cli.engines.importing.common import Imported
from nmt_cli.errors import UsageError
from nmt_cli.outputs import check_output_path, is_stdout

ImportSource = Literal["huggingface", "fairseq"]
SOURCES: tuple[ImportSource, ...] = ("huggingface", "fairseq")


@dataclass(frozen=True)
class ImportConfig:
    source: ImportSource
    path: Path  # a transformers model directory, or a fairseq checkpoint file
    output: Path
    src_lang: str = ""  # recorded in the checkpoint's recipe; "" = from the files, if they say
    tgt_lang: str = ""
    data_dir: Path | None = None  # fairseq: the directory of dict.SRC.txt and dict.TGT.txt


@dataclass(frozen=True)
class ImportResult:
    output: Path
    model_config: ModelConfig
    joint_vocab: bool
    notes: tuple[str, ...]


def import_model(cfg: ImportConfig) -> ImportResult:
    """What a user can get wrong about the output is checked before the import reads a
    byte of the model; the checkpoint is written atomically."""
    if cfg.source not in SOURCES:
        raise ValueError(f"unknown import source {cfg.source!r}")
    if is_stdout(cfg.output):
        raise UsageError("--output: name a checkpoint file to write (.pt), not stdout")
    check_output_path(cfg.output, inputs=[cfg.path], option="--output")
    imported = _run(cfg)
    save_checkpoint(imported.checkpoint, cfg.output)
    ckpt = imported.checkpoint
    return ImportResult(cfg.output, ckpt.model_config, ckpt.vocab.joint, imported.notes)


def _run(cfg: ImportConfig) -> Imported:
    languages = (cfg.src_lang, cfg.tgt_lang)
    if cfg.source == "huggingface":
        from nmt_cli.engines.importing.huggingface_marian import import_marian

        if cfg.data_dir is not None:
            raise UsageError("--data-dir is for --from fairseq; a MarianMT directory has its own")
        return import_marian(cfg.path, languages)
    from nmt_cli.engines.importing.fairseq import import_fairseq

    if cfg.data_dir is None:
        raise UsageError("--from fairseq needs --data-dir: the directory of its dict.*.txt")
    return import_fairseq(cfg.path, cfg.data_dir, languages)
