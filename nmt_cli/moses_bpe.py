"""Moses tokenization and subword-nmt BPE: how fairseq's WMT models read and write text.

fairseq's published WMT models (among them those of "Scaling Neural Machine Translation")
read text with `--tokenizer moses --bpe subword_nmt`, with fairseq's defaults: sacremoses'
Moses tokenizer (aggressive dash splits, XML escaping), subword-nmt's BPE with the "@@"
separator, then a dictionary of the resulting tokens; output goes back the same way
(remove "@@ ", Moses detokenization). `MosesBpe` is that pipeline answering the four
calls core/vocab.py's `Vocab` makes of a SentencePiece processor, built from a
description that the checkpoint carries as its vocabulary:

    b"nmt-moses-bpe\\n" + JSON {"lang", "codes" (the BPE codes file), "separator",
                               "words" (every token in id order), "unk" (its id)}

It stands beside the layers (not in core) because it is no part of the paper's model,
and imports nothing of core; sacremoses and subword-nmt come through nmt_cli.optional.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

from nmt_cli.optional import require

MAGIC = b"nmt-moses-bpe\n"
PURPOSE = "a model that reads text with Moses and BPE (imported from fairseq)"


def describe(lang: str, codes: str, words: Sequence[str], unk: int, separator: str = "@@") -> bytes:
    """The description a checkpoint carries for one side's vocabulary."""
    body = {"lang": lang, "codes": codes, "separator": separator, "words": list(words)}
    return MAGIC + json.dumps({**body, "unk": unk}, ensure_ascii=False).encode("utf-8")


class MosesBpe:
    """GetPieceSize, Encode, Decode and IdToPiece over Moses + BPE + a word list."""

    def __init__(self, description: bytes) -> None:
        raw: dict[str, Any] = json.loads(description[len(MAGIC) :].decode("utf-8"))
        moses = require("sacremoses", purpose=PURPOSE)
        bpe = require("subword_nmt.apply_bpe", purpose=PURPOSE)
        self.lang = str(raw["lang"])
        self.words = [str(w) for w in raw["words"]]
        self.ids = {w: i for i, w in enumerate(self.words)}
        self.unk = int(raw["unk"])
        self.joiner = str(raw["separator"]) + " "
        self.tokenizer = moses.MosesTokenizer(self.lang)
        self.detokenizer = moses.MosesDetokenizer(self.lang)
        self.bpe = bpe.BPE(io.StringIO(raw["codes"]), separator=raw["separator"])

    def GetPieceSize(self) -> int:
        return len(self.words)

    def Encode(self, texts: list[str], out_type: type = int) -> list[list[int]]:
        out = []
        for text in texts:
            tokens = self.tokenizer.tokenize(
                text, aggressive_dash_splits=True, return_str=True, escape=True
            )
            out.append([self.ids.get(w, self.unk) for w in self.bpe.process_line(tokens).split()])
        return out

    def Decode(self, ids: Sequence[int]) -> str:
        text = (" ".join(self.words[i] for i in ids) + " ").replace(self.joiner, "").rstrip()
        return str(self.detokenizer.detokenize(text.split()))

    def IdToPiece(self, i: int) -> str:
        return self.words[i]
