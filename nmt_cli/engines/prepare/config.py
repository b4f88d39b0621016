"""Everything `nmt prepare` can be told, checked once, and the part of it that shapes the output.

`PrepareConfig.settings()` is what the state file and the manifest record: a rerun with
other settings is refused, while options that cannot change the bytes written (where the
`datasets` cache is, how many processes encode, --force) are left out of it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nmt_cli.engines.prepare.cleaning import CleanRules
from nmt_cli.engines.prepare.presets import default_direction, default_vocab_size
from nmt_cli.engines.prepare.sources import SourceRequest
from nmt_cli.errors import UsageError
from nmt_cli.text_io import BAD_UTF8_CHOICES
from nmt_cli.trees.linearize import LEAVES

if TYPE_CHECKING:  # the recipe config imports torch; prepare itself needs none of it
    from nmt_cli.config import DataConfig

LOCAL_VOCAB_SIZE = 8000


@dataclass(frozen=True)
class PrepareConfig:
    """Everything `nmt prepare` can be told; `settings()` is the part that shapes the output."""

    out: str
    preset: str = ""  # "demo", "wmt14-en-de", ...
    source: str = ""  # --from: a directory of text, Parquet/JSON files or a saved dataset
    files: tuple[tuple[str, str, str], ...] = ()  # explicit (split, source, target) paths
    src: str = ""  # empty with a preset: the preset's direction
    tgt: str = ""
    vocab_size: int = 0  # 0 = the preset's size (8,000 for local data)
    joint_vocab: bool = True  # the paper's shared source-target vocabulary (section 5.1)
    max_len: int = 250
    max_len_ratio: float = 1.5  # the CLI passes the preset's (9 for Multi30k)
    dedup: bool = False
    normalize_punctuation: bool = False
    max_pairs: int = 0  # 0 = all training pairs
    sample_max_pairs: bool = False  # a seeded sample of max_pairs instead of the first ones
    valid_split: str = ""
    test_split: str = ""
    seed: int = 1
    on_bad_utf8: str = "error"
    tree_leaves: str = "xx"  # a treebank's targets: XX (the paper's) or the word at each leaf
    vocab_sample_lines: int = 1_000_000  # lines SentencePiece trains on, at most
    vocab_from: str = ""  # a checkpoint whose own vocabulary encodes the corpus (fine-tuning)
    cache_dir: str = ""  # datasets cache; does not change the result
    workers: int = 0  # encoding processes, 0 = one per core; does not change the result
    force: bool = False

    def __post_init__(self) -> None:
        """Option values, refused as usage errors (exit code 2) before any work."""
        if self.vocab_size < 0 or 0 < self.vocab_size < 8:
            raise UsageError(
                f"--vocab-size must be at least 8 (0 = the preset's), got {self.vocab_size}"
            )
        if self.max_len < 0:
            raise UsageError(f"--max-len must be >= 0 (0 = no limit), got {self.max_len}")
        if not math.isfinite(self.max_len_ratio) or (
            self.max_len_ratio and self.max_len_ratio < 1.0
        ):
            raise UsageError(f"--max-len-ratio must be >= 1 (0 = none), got {self.max_len_ratio}")
        if self.max_pairs < 0:
            raise UsageError(f"--max-pairs must be >= 0, got {self.max_pairs}")
        if self.on_bad_utf8 not in BAD_UTF8_CHOICES:
            raise UsageError(f"--on-bad-utf8 must be one of {', '.join(BAD_UTF8_CHOICES)}")
        if self.vocab_sample_lines < 1000:
            raise UsageError(f"--vocab-sample-lines must be >= 1000, got {self.vocab_sample_lines}")
        if not 0 <= self.seed < 2**32:
            raise UsageError(f"--seed must be in [0, 2**32), got {self.seed}")
        if self.tree_leaves not in LEAVES:
            raise UsageError(f"--tree-leaves must be one of {', '.join(LEAVES)}")
        if self.workers < 0:
            raise UsageError(f"--workers must be >= 0 (0 = one per CPU), got {self.workers}")

    def effective_vocab_size(self) -> int:
        return self.vocab_size or default_vocab_size(self.preset, LOCAL_VOCAB_SIZE)

    def direction(self) -> tuple[str, str]:
        """(src, tgt) as the output will have them: a preset fills in what is not given."""
        default = default_direction(self.preset)
        if default is None:
            return self.src, self.tgt
        return self.src or default[0], self.tgt or default[1]

    def source_request(self) -> SourceRequest:
        """The options that name the corpus (every SourceRequest field has its namesake here)."""
        names = [f.name for f in dataclasses.fields(SourceRequest)]
        return SourceRequest(**{name: getattr(self, name) for name in names})

    def clean_rules(self) -> CleanRules:
        return CleanRules(self.max_len, self.max_len_ratio, self.dedup, self.normalize_punctuation)

    def settings(self) -> dict[str, Any]:
        """The settings that decide the output, in a canonical, comparable form."""
        # split choices are checked against the files actually chosen (state.py's
        # refuse_other_heldout): `--test-split test_2016_flickr` and no option pick the same
        # file in Multi30k
        skip = {"out", "cache_dir", "workers", "force", "vocab_size", "source", "files"}
        skip |= {"valid_split", "test_split", "vocab_from", "tree_leaves"}
        out = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip
        }
        out["source"] = str(Path(self.source).resolve()) if self.source else ""
        if self.vocab_from:  # only then: directories made before it was a setting still match
            out["vocab_from"] = str(Path(self.vocab_from).resolve())
        if self.tree_leaves != "xx":  # the same
            out["tree_leaves"] = self.tree_leaves
        out["files"] = [
            [s, str(Path(a).resolve()), str(Path(b).resolve())] for s, a, b in self.files
        ]
        out["vocab_size"] = self.effective_vocab_size()
        out["src"], out["tgt"] = self.direction()
        return out


def prepare_from_data_config(
    data: DataConfig, workers: int = 0, force: bool = False, cache_dir: str = ""
) -> PrepareConfig:
    """The prepare settings a recipe's [data] section describes (used by `nmt run`)."""
    return PrepareConfig(
        out=data.dir,
        preset=data.preset,
        source=data.source_dir,
        src=data.src,
        tgt=data.tgt,
        vocab_size=data.vocab_size,
        joint_vocab=data.joint_vocab,
        max_len=data.max_len,
        max_len_ratio=data.max_len_ratio,
        dedup=data.dedup,
        normalize_punctuation=data.normalize_punctuation,
        max_pairs=data.max_pairs,
        sample_max_pairs=data.sample_max_pairs,
        valid_split=data.valid_split,
        test_split=data.test_split,
        seed=data.seed,
        on_bad_utf8=data.on_bad_utf8,
        tree_leaves=data.tree_leaves,
        cache_dir=cache_dir or data.cache_dir,
        workers=workers,
        force=force,
    )
