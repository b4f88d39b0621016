"""The Penn Treebank as a parsing corpus: the paper's section 6.3 and a sample for one CPU.

Two presets, each a fixed split of WSJ files by their number (wsj_SSNN.mrg, SS the
section):

- `ptb`: the whole Wall Street Journal part, from a local copy of the licensed treebank
  (LDC99T42; `--from DIR`, any folder holding the wsj_*.mrg files, such as
  treebank_3/parsed/mrg/wsj with its section folders 00-24). The standard split:
  sections 02-21 train (39,832 sentences), 22 dev (1,700), 23 test (2,416); 00, 01 and 24
  unused. The paper: "about 40K training sentences", "a vocabulary of 16K tokens".
- `ptb-sample`: the 5% sample NLTK's data repository publishes
  (packages/corpora/treebank.zip: wsj_0001-wsj_0199, 3,914 sentences; "(C) LDC 1995 ...
  made available under fair use ... for non-commercial use only"), downloaded and checked
  against its SHA-256 like the Multi30k files, or read offline from a copy of the zip or
  of its unpacked folder with `--from PATH`. Its files are split by number, in order, so
  that whole articles stay together: wsj_0001-0159 train (3,396 sentences), 0160-0179
  dev (273), 0180-0199 test (245). Sentences stay in order (no shuffling), as in the
  WSJ split.

Each sentence is a pair: the source is its words (traces left out), the target is its
tree, kept whole as EVALB's gold trees are (`(TOP (S (NP-SBJ ...) ...))`, one a line,
traces and function tags in place) in the data directory's raw text of dev and test, so
that the raw target text is the gold file `nmt score --trees` and `nmt run` score
against. What the model learns is its linearization (`trees/linearize.py`:
`(S (NP XX XX )NP ... )S`, or with `--tree-leaves words` `(S (NP The dog )NP ... )S`),
which the clean stage makes of every target (`target_form`); the manifest records the
leaves (`source.tree_leaves`), and training takes them from there into the model's recipe.

The vocabulary: one joint SentencePiece BPE model, as for translation, with every
bracket token of the training trees (and `XX`, where it is the leaf) given to
SentencePiece as whole words (`VocabInputs.whole_words`). Without that each of them
becomes two pieces, `▁(` and `NP`: SentencePiece never merges punctuation with letters,
so targets would be twice as long and a model could emit half a bracket. Words are cut
into BPE pieces as in translation; the paper's "vocabulary of 16K tokens" is the preset's
size. A tree's words are never chosen by the model (XX leaves, or word leaves forced by
the tree constraint), so pieces of rare words cost nothing at scoring time.

A mirror (or the test suite's small zip) stands in for NLTK's through two environment
variables: NMT_PTB_SAMPLE_URL, the zip's URL (`file:///...` works), and
NMT_PTB_SAMPLE_SHA256, its checksum when it is not the official file.
"""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nmt_cli.data_dir import sha256_file
from nmt_cli.engines.prepare.download import fetch
from nmt_cli.engines.prepare.multi30k import cache_folder
from nmt_cli.errors import NmtError
from nmt_cli.trees.linearize import LEAVES, evaluation_tree, linearize, source_words
from nmt_cli.trees.tree import PLACEHOLDER_TAG, Tree, read_tree, read_trees

SAMPLE_URL = (
    "https://raw.githubusercontent.com/nltk/nltk_data/gh-pages/packages/corpora/treebank.zip"
)
SAMPLE_SHA256 = "9da92d76c3666cfb6cddeaed0f7e86b344cce0f0928a286d439e555f19c37399"
URL_ENV = "NMT_PTB_SAMPLE_URL"
SHA256_ENV = "NMT_PTB_SAMPLE_SHA256"
SRC, TGT = "en", "tree"  # the data directory's two sides: English words, their trees
_FILE = re.compile(r"(?:^|/)wsj_(\d{4})\.mrg$")


@dataclass(frozen=True)
class TreebankPreset:
    """A named split of WSJ files by number (inclusive ranges) and its vocabulary size."""

    name: str
    splits: tuple[tuple[str, int, int], ...]  # (split, first file number, last)
    vocab_size: int
    sentences: tuple[int, int, int]  # train, valid, test, for `nmt prepare --list`
    downloads: bool  # False: only from a local copy (--from)
    note: str

    def split_of(self, number: int) -> str:
        """The split a file belongs to, '' for a file the preset leaves out."""
        return next((name for name, lo, hi in self.splits if lo <= number <= hi), "")


PTB = TreebankPreset(
    "ptb",
    (("train", 200, 2199), ("valid", 2200, 2299), ("test", 2300, 2399)),
    16_000, (39_832, 1_700, 2_416), False,
    "WSJ sections 02-21 / 22 / 23 from a licensed copy: --from DIR (LDC99T42); paper "
    "section 6.3, 16K vocabulary",
)  # fmt: skip
PTB_SAMPLE = TreebankPreset(
    "ptb-sample",
    (("train", 1, 159), ("valid", 160, 179), ("test", 180, 199)),
    4_000, (3_396, 273, 245), True,
    "NLTK's 5% WSJ sample, files wsj_0001-0159 / 0160-0179 / 0180-0199; downloaded and "
    "checked (SHA-256), or --from ZIP/DIR offline",
)  # fmt: skip
TREEBANKS: dict[str, TreebankPreset] = {p.name: p for p in (PTB, PTB_SAMPLE)}


@dataclass(frozen=True)
class TreebankSplits:
    """A treebank read into (words, gold tree) pairs per split, and what the manifest says."""

    pairs: dict[str, list[tuple[str, str]]]
    info: dict[str, Any]
    whole_words: tuple[str, ...]  # every tree token of the training targets (brackets, XX)


def target_form(gold: str, leaves: str = "xx") -> str:
    """The target a model learns from a gold tree line: its linearization."""
    tree, _ = read_tree(gold)
    return linearize(tree, leaves) if tree is not None else ""


def read_treebank(
    preset: TreebankPreset,
    source: str,
    cache_dir: str,
    leaves: str = "xx",
    environ: Mapping[str, str] = os.environ,
) -> TreebankSplits:
    """The preset's splits, from `source` (a zip or a folder) or, for the sample, the
    verified download; `leaves` (linearize.LEAVES) is what the targets hold for words."""
    if leaves not in LEAVES:
        raise NmtError(f"tree leaves must be one of {', '.join(LEAVES)}, got {leaves!r}")
    if source:
        path = Path(source)
        if not path.exists():
            raise NmtError(f"{path}: no such file or directory")
        origin = str(path.resolve())
    elif preset.downloads:
        path = _download(cache_dir, environ)
        origin = "download"
    else:
        raise NmtError(
            f"{preset.name} is read from a local copy of the licensed Penn Treebank: pass "
            "--from DIR (a folder with the WSJ .mrg files, e.g. treebank_3/parsed/mrg/wsj), "
            "or data.source_dir in a recipe; ptb-sample is the freely available sample"
        )
    files = _files_by_split(preset, path)
    pairs: dict[str, list[tuple[str, str]]] = {}
    counts: dict[str, dict[str, int]] = {}
    tokens: set[str] = set()
    for split, members in files.items():
        pairs[split] = []
        for name, text in members:
            for tree in _trees(name, text):
                words = source_words(tree)
                if not words:
                    continue  # a tree of traces only: nothing to parse
                pairs[split].append((" ".join(words), evaluation_tree(tree).bracketed()))
                if split == "train":
                    tokens.update(linearize(tree).split())  # brackets and XX
        counts[split] = {"files": len(members), "sentences": len(pairs[split])}
    for needed in ("train", "valid"):
        if not pairs.get(needed):
            raise NmtError(
                f"{path}: no {needed} trees for {preset.name} (files "
                f"{_range_text(preset, needed)}); is it the treebank's WSJ part?"
            )
    if leaves != "xx":
        tokens.discard(PLACEHOLDER_TAG)
    info: dict[str, Any] = {"kind": "treebank", "name": preset.name, "from": origin}
    info["splits"], info["tree_leaves"] = counts, leaves
    if path.is_file():
        info["sha256"] = sha256_file(path)
    return TreebankSplits(pairs, info, tuple(sorted(tokens)))


def _range_text(preset: TreebankPreset, split: str) -> str:
    return next(f"wsj_{lo:04d}-wsj_{hi:04d}" for name, lo, hi in preset.splits if name == split)


def _download(cache_dir: str, environ: Mapping[str, str]) -> Path:
    url = environ.get(URL_ENV, "") or SAMPLE_URL
    digest = (environ.get(SHA256_ENV, "") or SAMPLE_SHA256).lower()
    folder = cache_folder(cache_dir, environ).parent / "ptb-sample"  # beside multi30k's
    hint = "check the network, or prepare from a local copy with --from treebank.zip"
    return fetch(url, folder / "treebank.zip", digest, offline_hint=hint)


def _files_by_split(preset: TreebankPreset, path: Path) -> dict[str, list[tuple[str, str]]]:
    """(name, text) of the preset's files in `path` per split, in file order."""
    found: dict[int, tuple[str, str]] = {}
    for name, read in _members(path):
        match = _FILE.search(name)
        if match is None:
            continue
        number = int(match.group(1))
        if number in found:
            raise NmtError(f"{path}: wsj_{number:04d}.mrg twice ({found[number][0]}, {name})")
        if preset.split_of(number):
            try:
                found[number] = (name, read().decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise NmtError(f"{name}: not UTF-8 text ({exc.reason})") from None
    out: dict[str, list[tuple[str, str]]] = {name: [] for name, _, _ in preset.splits}
    for number in sorted(found):
        out[preset.split_of(number)].append(found[number])
    return out


def _members(path: Path) -> Iterator[tuple[str, Any]]:
    """(name, a function that reads its bytes) of every file in a zip or under a folder."""
    if path.is_dir():
        for f in sorted(path.rglob("*.mrg")):
            yield str(f), f.read_bytes
        return
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise NmtError(f"{path}: not a zip archive of the treebank ({exc})") from None
    with archive:
        for member in sorted(archive.namelist()):
            yield member, lambda m=member: archive.read(m)


def _trees(name: str, text: str) -> list[Tree]:
    parsed = read_trees(text)
    if parsed.repairs:
        raise NmtError(
            f"{name}: not well-formed bracketed trees ({', '.join(parsed.repairs)}); "
            "is it a Penn Treebank .mrg file?"
        )
    return parsed.trees
