"""The manifest stage: settings, counts, versions and checksums, written last and atomically.

Its presence is what makes a data directory complete (see `nmt_cli/data_dir.py`): readers
refuse a directory without one, and the checksums let `nmt prepare` notice a file changed
since. Nothing in it depends on time or on how the run was interrupted and resumed, so an
interrupted run gives the same bytes as an uninterrupted one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from nmt_cli.core.files import atomic_write_text
from nmt_cli.data_dir import DATA_FORMAT, DATA_VERSION, MANIFEST, sha256_file
from nmt_cli.engines.prepare.cleaning import Cleaned
from nmt_cli.engines.prepare.layout import SPLITS, Layout
from nmt_cli.engines.prepare.progress import Progress, step
from nmt_cli.engines.prepare.vocabulary import Vocabulary
from nmt_cli.version import __version__

VERSIONED = ("sentencepiece", "sacremoses", "datasets", "numpy")


@dataclass(frozen=True)
class ManifestInputs:
    """What the earlier stages recorded, and the settings the directory was made with."""

    settings: dict[str, Any]
    cleaned: Cleaned
    vocabulary: Vocabulary
    binarized: dict[str, dict[str, int]]  # split -> token counts


def write_manifest(inputs: ManifestInputs, layout: Layout, progress: Progress) -> dict[str, Any]:
    """Checksum every output file, then write the manifest; return it."""
    cleaned, vocabulary = inputs.cleaned, inputs.vocabulary
    names = list(vocabulary.files)
    for split in cleaned.splits:
        names += layout.output_files(split)
    with step(progress, "manifest", "checksums", len(names)) as work:
        files = {}
        for name in sorted(names):
            files[name] = sha256_file(layout.out / name)
            work.advance(1)
        manifest = {
            "format": DATA_FORMAT,
            "version": DATA_VERSION,
            "src": cleaned.src,
            "tgt": cleaned.tgt,
            "source": cleaned.source,
            "settings": inputs.settings,
            "splits": {s: dict(inputs.binarized[s]) for s in SPLITS if s in inputs.binarized},
            "cleaning": {
                "train": cleaned.splits["train"],
                "bad_utf8_replaced": cleaned.bad_utf8_replaced,
                "held_out_filtered": False,
            },
            "vocab": {
                "src_model": vocabulary.src_model,
                "tgt_model": vocabulary.tgt_model,
                "joint": vocabulary.joint,
                "size": inputs.settings["vocab_size"],
                # a model's own (--vocab-from) may be any SentencePiece model
                "type": "sentencepiece" if "vocab_from" in inputs.settings else "sentencepiece-bpe",
                "sample_pairs": vocabulary.sample_pairs,
                "character_coverage": cleaned.character_coverage,
            },
            "versions": _versions(),
            "files": files,
        }
        atomic_write_text(layout.out / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return manifest


def _versions() -> dict[str, str]:
    out = {"nmt": __version__}
    for package in VERSIONED:
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "absent"
    return out
