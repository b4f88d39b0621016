"""The named corpora `nmt prepare` knows: the paper's WMT 2014 tasks, the built-in demo, and
the Penn Treebank of its section 6.3 (engines/prepare/treebank.py).

Section 5.1 of the paper trains on "the standard WMT 2014 English-German dataset consisting
of about 4.5 million sentence pairs" with a byte-pair vocabulary of about 37,000 tokens, and
on "the significantly larger WMT 2014 English-French dataset consisting of 36M sentences"
with 32,000 word pieces; it reports BLEU on newstest2014 (section 6.1) and tunes on the
newstest2013 development set (section 6.2). Each preset carries those settings, and where
`datasets` finds the data.
"""

from __future__ import annotations

from dataclasses import dataclass

from nmt_cli.engines.prepare.demo_corpus import DEMO_SPLITS
from nmt_cli.engines.prepare.multi30k import MULTI30K
from nmt_cli.engines.prepare.treebank import SRC, TGT, TREEBANKS

DEMO = "demo"
DEMO_VOCAB_SIZE = 1000


@dataclass(frozen=True)
class Preset:
    """A named corpus: where `datasets` finds it and the paper's settings for it."""

    name: str
    hf_path: str
    hf_name: str
    src: str
    tgt: str
    vocab_size: int
    train_pairs: int
    valid: str
    test: str
    note: str
    character_coverage: float = 0.9999

    def direction(self) -> str:
        return f"{self.src}->{self.tgt}"


_HELD_OUT = "valid newstest2013, test newstest2014 (full). "


def _wmt14(src: str, tgt: str) -> Preset:
    other = tgt if src == "en" else src
    if other == "de":
        return Preset(
            f"wmt14-{src}-{tgt}", "wmt/wmt14", "de-en", src, tgt, 37_000, 4_508_785,
            "3,000", "3,003",
            _HELD_OUT + "Paper: shared BPE of about 37,000 tokens; 4.5M pairs",
        )  # fmt: skip
    return Preset(
        f"wmt14-{src}-{tgt}", "wmt/wmt14", "fr-en", src, tgt, 32_000, 40_836_715,
        "3,000", "3,003",
        _HELD_OUT + "Paper: 32,000 word pieces, 36M pairs. The Hub has 40.8M: the default cleaning "
        "(1-250 words a side, length ratio <= 1.5: Moses clean-corpus-n, as fairseq's WMT14 "
        "en-fr script) drops the overlong and misaligned pairs to come near the paper's 36M; "
        "--dedup also drops exact repeats",
    )  # fmt: skip


_PAIRS = (("en", "de"), ("de", "en"), ("en", "fr"), ("fr", "en"))
PRESETS: dict[str, Preset] = {p.name: p for p in (_wmt14(a, b) for a, b in _PAIRS)}


def preset_names() -> list[str]:
    return [DEMO, *MULTI30K, *PRESETS, *TREEBANKS]


def list_presets() -> list[dict[str, str]]:
    """Rows for `nmt prepare --list`."""
    rows = [
        {
            "name": DEMO,
            "direction": "en->de",
            "source": "built in",
            "train": f"{DEMO_SPLITS['train']:,}",
            "valid / test": f"{DEMO_SPLITS['valid']} / {DEMO_SPLITS['test']}",
            "vocabulary": f"BPE {DEMO_VOCAB_SIZE:,}",
            "note": "a generated English-like to German-like pair (also --src de --tgt en); "
            "the quickstart corpus",
        }
    ]
    for m in MULTI30K.values():
        rows.append(
            {
                "name": m.name,
                "direction": m.direction(),
                "source": "multi30k/dataset",
                "train": "29,000",
                "valid / test": "1,014 / 1,000",
                "vocabulary": f"BPE {m.vocab_size:,}",
                "note": f"{m.note}; downloaded and checked (SHA-256), or --from DIR offline",
            }
        )
    for p in PRESETS.values():
        rows.append(
            {
                "name": p.name,
                "direction": p.direction(),
                "source": f"{p.hf_path} {p.hf_name}",
                "train": f"{p.train_pairs:,}",
                "valid / test": f"{p.valid} / {p.test}",
                "vocabulary": f"BPE {p.vocab_size:,}",
                "note": p.note,
            }
        )
    for t in TREEBANKS.values():
        train, valid, test = t.sentences
        rows.append(
            {
                "name": t.name,
                "direction": f"{SRC}->{TGT}",
                "source": "nltk/nltk_data" if t.downloads else "local copy (--from)",
                "train": f"{train:,}",
                "valid / test": f"{valid:,} / {test:,}",
                "vocabulary": f"BPE {t.vocab_size:,}",
                "note": t.note,
            }
        )
    assert [r["name"] for r in rows] == preset_names()
    return rows


def default_vocab_size(preset: str, local: int) -> int:
    """The vocabulary size a preset asks for; `local` for local data (no preset)."""
    if preset == DEMO:
        return DEMO_VOCAB_SIZE
    if preset in MULTI30K:
        return MULTI30K[preset].vocab_size
    if preset in PRESETS:
        return PRESETS[preset].vocab_size
    if preset in TREEBANKS:
        return TREEBANKS[preset].vocab_size
    return local


def default_direction(preset: str) -> tuple[str, str] | None:
    """(src, tgt) of a preset as it is published; None for local data."""
    if preset == DEMO:
        return ("en", "de")
    if preset in MULTI30K:
        return (MULTI30K[preset].src, MULTI30K[preset].tgt)
    if preset in PRESETS:
        return (PRESETS[preset].src, PRESETS[preset].tgt)
    if preset in TREEBANKS:
        return (SRC, TGT)
    return None


def default_max_len_ratio(preset: str) -> float:
    """The length-ratio filter a preset asks for (Moses' 9 for captions; none for trees,
    whose linearization is about three tokens a word), else 1.5."""
    if preset in TREEBANKS:
        return 0.0
    return MULTI30K[preset].max_len_ratio if preset in MULTI30K else 1.5
