"""Multi30k task 1: image captions in English, German and French, fetched and verified.

Elliott et al., "Multi30K: Multilingual English-German Image Descriptions" (2016), with
French added in 2017: 29,000 training pairs, 1,014 validation pairs and four test sets
(test_2016_flickr 1,000, test_2017_flickr 1,000, test_2018_flickr 1,071,
test_2017_mscoco 461). The files are the raw text of the multi30k/dataset repository
(data/task1/raw), at a pinned commit, each checked against the SHA-256 below before it
is kept in the cache; `nmt prepare multi30k-en-de` then prepares them like any local
directory of text, with test_2016_flickr as the test set unless `--test-split` names
another.

Offline: `--from DIR` reads a local copy instead (files named like the repository's:
train.en.gz, val.de.gz, test_2016_flickr.fr.gz, compressed or not). A mirror (or the
test suite's small files) stands in for the repository through two environment
variables: NMT_MULTI30K_URL, the base URL of the files (`file:///...` works), and
NMT_MULTI30K_SHA256SUMS, a `sha256sum` file with their checksums when they are not the
official files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nmt_cli.engines.prepare.download import fetch, read_checksums
from nmt_cli.errors import NmtError

COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
DEFAULT_URL = f"https://raw.githubusercontent.com/multi30k/dataset/{COMMIT}/data/task1/raw/"
URL_ENV = "NMT_MULTI30K_URL"
CHECKSUMS_ENV = "NMT_MULTI30K_SHA256SUMS"
CACHE_ENV = "NMT_CACHE_DIR"
SPLITS = (
    "train",
    "val",
    "test_2016_flickr",
    "test_2017_flickr",
    "test_2018_flickr",
    "test_2017_mscoco",
)
DEFAULT_TEST = "test_2016_flickr"

# sha256sum of every file of data/task1/raw at COMMIT, in English, German and French
SHA256: dict[str, str] = {
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.fr.gz": "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496",
    "test_2018_flickr.en.gz": "ef4f4844037d4c5dea75c9a8ed5fd78905967a26f67c255e230cc9780032654d",
    "test_2018_flickr.de.gz": "ddd0130c7d97482dc5197a02141dae8dd79f20f03586c480d675c09a32daf608",
    "test_2018_flickr.fr.gz": "fb2b83fcceb937a4f7e3e93c1c51c22aba92f1e342391e6b5ba392b16a920501",
    "test_2017_mscoco.en.gz": "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58",
    "test_2017_mscoco.de.gz": "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338",
    "test_2017_mscoco.fr.gz": "754f3072ba9f124569ba5258b32730fc1d214bbf8e0c6dfb2b74401676220db0",
}


@dataclass(frozen=True)
class Multi30kPreset:
    """A Multi30k language pair and the settings the recipes use for it."""

    name: str
    src: str
    tgt: str
    vocab_size: int = 8000
    # Moses' clean-corpus ratio: short captions often differ by 1.5x in words; keep them
    max_len_ratio: float = 9.0
    note: str = ""

    def direction(self) -> str:
        return f"{self.src}->{self.tgt}"


MULTI30K: dict[str, Multi30kPreset] = {
    p.name: p
    for p in (
        Multi30kPreset(
            "multi30k-en-de", "en", "de", note="Flickr30k captions, test_2016..2018 + mscoco"
        ),
        Multi30kPreset(
            "multi30k-en-fr", "en", "fr", note="Flickr30k captions, test_2016..2018 + mscoco"
        ),
    )
}


@dataclass(frozen=True)
class Mirror:
    """Where the files come from and the checksums they must have."""

    url: str = DEFAULT_URL
    checksums: Mapping[str, str] | None = None  # None = the official SHA256 table

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Mirror:
        url = environ.get(URL_ENV, "") or DEFAULT_URL
        table = environ.get(CHECKSUMS_ENV, "")
        return cls(
            url if url.endswith("/") else url + "/", read_checksums(Path(table)) if table else None
        )

    def checksum(self, name: str) -> str:
        table = SHA256 if self.checksums is None else self.checksums
        if name not in table:
            raise NmtError(f"no SHA-256 known for {name}; add it to ${CHECKSUMS_ENV}")
        return table[name]


def cache_folder(cache_dir: str, environ: Mapping[str, str]) -> Path:
    """--cache-dir, else $NMT_CACHE_DIR, else $XDG_CACHE_HOME/nmt or ~/.cache/nmt."""
    root = cache_dir or environ.get(CACHE_ENV, "")
    if not root:
        xdg = environ.get("XDG_CACHE_HOME", "") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "nmt")
    return Path(root) / "multi30k"


def download(src: str, tgt: str, folder: Path, mirror: Mirror) -> Path:
    """Every split of both languages in `folder`, fetched unless verified copies are there."""
    hint = "check the network, or prepare from a local copy with --from DIR"
    for split in SPLITS:
        for lang in (src, tgt):
            name = f"{split}.{lang}.gz"
            fetch(mirror.url + name, folder / name, mirror.checksum(name), offline_hint=hint)
    return folder


def fetch_multi30k(
    src: str, tgt: str, cache_dir: str, environ: Mapping[str, str] = os.environ
) -> Path:
    """The cache folder holding verified files for src-tgt (downloaded as needed)."""
    return download(src, tgt, cache_folder(cache_dir, environ), Mirror.from_env(environ))
