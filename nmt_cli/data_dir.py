"""The data directory contract between `nmt prepare` (writer) and its readers.

    manifest.json              written last, atomically: its presence means "complete"
    spm.model                  joint vocabulary (or spm.src.model + spm.tgt.model)
    {split}.src.bin/.idx       token stores (see core/data.py), split in train/valid/test
    {split}.tgt.bin/.idx
    {split}.src.txt/.tgt.txt   raw text of valid and test, for BLEU against real references

The manifest records settings, per-split counts, the vocabulary files and a checksum of
every file, so a reader can refuse a directory that is missing pieces or was changed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nmt_cli.core.data import TokenStore
from nmt_cli.core.vocab import VocabPair
from nmt_cli.errors import NmtError

MANIFEST = "manifest.json"
DATA_FORMAT = "nmt-data"
DATA_VERSION = 1


@dataclass(frozen=True)
class PreparedData:
    root: Path
    manifest: dict[str, Any]
    vocab: VocabPair

    @property
    def src_lang(self) -> str:
        return str(self.manifest["src"])

    @property
    def tgt_lang(self) -> str:
        return str(self.manifest["tgt"])

    @property
    def splits(self) -> list[str]:
        return list(self.manifest["splits"])

    def split(self, name: str) -> tuple[TokenStore, TokenStore]:
        """(source, target) token stores of a split."""
        if name not in self.manifest["splits"]:
            raise NmtError(f"{self.root}: no '{name}' split (have: {', '.join(self.splits)})")
        try:
            src, tgt = TokenStore(self.root / f"{name}.src"), TokenStore(self.root / f"{name}.tgt")
        except (OSError, ValueError) as exc:
            raise NmtError(
                f"{self.root}: split '{name}' is unreadable ({exc}); rerun nmt prepare with --force"
            ) from None
        expected = self.manifest["splits"][name].get("pairs")
        if expected is not None and not len(src) == len(tgt) == expected:
            raise NmtError(
                f"{self.root}: split '{name}' holds {len(src)} source and {len(tgt)} target "
                f"sentences, the manifest says {expected}; rerun nmt prepare with --force"
            )
        return src, tgt

    def changed_files(self) -> list[str]:
        """Files whose SHA-256 no longer matches the manifest (missing ones included).

        Reads every file once; `open_data_dir` does not call it because training should not
        hash gigabytes at every start, but `nmt prepare` does before calling a directory
        up to date.
        """
        changed = []
        for name, digest in sorted(self.manifest.get("files", {}).items()):
            path = self.root / name
            if not path.is_file() or sha256_file(path) != digest:
                changed.append(name)
        return changed

    def raw_text(self, name: str, side: str) -> Path:
        """The untokenized text of a dev/test split, side 'src' or 'tgt'."""
        return self.root / f"{name}.{side}.txt"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def open_data_dir(path: str | Path) -> PreparedData:
    """Open a prepared data directory, refusing one that is incomplete or inconsistent."""
    root = Path(path)
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise NmtError(
            f"{root}: not a prepared data directory (no {MANIFEST}); run `nmt prepare` first"
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise NmtError(f"{manifest_path}: unreadable manifest ({exc})") from None
    if manifest.get("format") != DATA_FORMAT or manifest.get("version", 0) > DATA_VERSION:
        raise NmtError(f"{manifest_path}: not an nmt data manifest of version <= {DATA_VERSION}")
    for name in manifest.get("files", {}):
        if not (root / name).is_file():
            raise NmtError(
                f"{root}: {name} is listed in the manifest but missing; rerun nmt prepare"
            )
    vocab_info = manifest["vocab"]
    try:
        src_proto = (root / vocab_info["src_model"]).read_bytes()
        tgt_proto = (root / vocab_info["tgt_model"]).read_bytes()
    except OSError as exc:
        raise NmtError(f"{root}: vocabulary missing ({exc})") from None
    return PreparedData(
        root=root, manifest=manifest, vocab=VocabPair.from_protos(src_proto, tgt_proto)
    )
