"""`export_model`: check the output, load the checkpoint, convert, publish the directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nmt_cli.core.checkpoint import load_checkpoint
from nmt_cli.engines.export import ctranslate2 as ct2
from nmt_cli.engines.export import huggingface as hf
from nmt_cli.engines.export.output import (
    check_full_attention,
    check_output_dir,
    check_sentencepiece,
    staged_dir,
    write_json,
)
from nmt_cli.version import __version__

ExportTarget = Literal["ctranslate2", "huggingface"]
TARGETS: tuple[ExportTarget, ...] = ("ctranslate2", "huggingface")
MANIFEST = "nmt-export.json"


@dataclass(frozen=True)
class ExportConfig:
    checkpoint: Path
    out_dir: Path
    target: ExportTarget
    quantization: str = "float32"  # CTranslate2 weight type; transformers exports float32
    force: bool = False  # replace a non-empty OUT_DIR


@dataclass(frozen=True)
class ExportResult:
    out_dir: Path
    files: list[str]
    shared_vocab: bool  # one vocabulary (and embedding matrix) for both sides


def export_model(cfg: ExportConfig) -> ExportResult:
    """Everything a user can get wrong is checked before the conversion starts: the
    output path, the library, the checkpoint; the model then appears at OUT_DIR whole."""
    if cfg.target not in TARGETS:
        raise ValueError(f"unknown export target {cfg.target!r}")
    ct2.check_quantization(cfg.target, cfg.quantization)
    check_output_dir(cfg.out_dir, cfg.force)
    if cfg.target == "ctranslate2":
        ct2.import_ctranslate2()
        ckpt = load_checkpoint(cfg.checkpoint)
        check_sentencepiece(ckpt.vocab, cfg.target)
        check_full_attention(ckpt.model_config, cfg.target)
        ct2.check_exportable(ckpt.model_config)
    else:
        hf.import_transformers()
        ckpt = load_checkpoint(cfg.checkpoint)
        check_sentencepiece(ckpt.vocab, cfg.target)
        check_full_attention(ckpt.model_config, cfg.target)
        hf.check_exportable(ckpt.model_config)
    with staged_dir(cfg.out_dir) as stage:
        if cfg.target == "ctranslate2":
            ct2.export_ctranslate2(ckpt, stage, cfg.quantization)
        else:
            hf.export_huggingface(ckpt, stage)
        write_json(
            stage / MANIFEST,
            {
                "exported_by": f"nmt {__version__}",
                "target": cfg.target,
                "quantization": cfg.quantization,
                "checkpoint": cfg.checkpoint.name,
                "step": ckpt.step,
                "joint_vocabulary": ckpt.vocab.joint,
            },
        )
        files = sorted(p.name for p in stage.iterdir())
    return ExportResult(cfg.out_dir, files, ckpt.model_config.three_way_tying)
