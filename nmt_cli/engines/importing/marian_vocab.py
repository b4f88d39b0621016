"""MarianTokenizer's vocabulary in nmt's ids: the SentencePiece models renumbered.

MarianTokenizer cuts text with source.spm / target.spm and numbers the pieces by
vocab.json (one table for both sides unless `separate_vocabs`); a piece the table lacks
is <unk>. nmt numbers pieces by their SentencePiece position, so each SentencePiece model
is rewritten with its pieces in the model's order (spm_proto.py), nmt's pad, unk, <s>,
</s> first, and each nmt id keeps the row of the imported embedding it stands for
(huggingface_marian.py gathers them):

- source: the source.spm pieces, each with its vocab.json row (<unk>'s where absent);
- target: every id of the decoder's table, so the output distribution is the original's
  over the same entries; target.spm pieces the table lacks are dropped (they could never
  be output; encoding target text for fine-tuning then splits them).

Marian starts decoding from <pad>; the imported <s> then stands for that <pad> row, and
huggingface_marian.py gives it an output bias BOS_BIAS_GAP lower (common.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nmt_cli.core.vocab import BOS_ID, PAD_ID
from nmt_cli.engines.importing.common import BOS_BIAS_GAP, ImportRefused, read_json
from nmt_cli.engines.importing.spm_proto import (
    CONTROL,
    UNKNOWN,
    UNUSED,
    Piece,
    ProtoError,
    SentencePieceModel,
)

WHERE = "--from huggingface"


def refuse(message: str) -> ImportRefused:
    return ImportRefused(f"{WHERE}: {message}")


@dataclass(frozen=True)
class SideVocab:
    """One side's vocabulary in nmt's ids, and the imported row of each id."""

    proto: bytes
    rows: list[int]  # nmt id -> row of the imported embedding (and of final_logits_bias)


@dataclass(frozen=True)
class MarianIds:
    """The decoder's special ids (config.json, generation_config.json) and their text,
    by which the source side finds its own (its table may number them otherwise)."""

    pad: int
    eos: int
    unk: int
    start: int  # decoder_start_token_id
    text: dict[int, str]  # the decoder table's id -> piece


def read_table(path: Path) -> dict[str, int]:
    table = read_json(path, "MarianTokenizer's piece -> id table")
    if not all(isinstance(v, int) for v in table.values()):
        raise refuse(f"{path}: ids must be integers")
    ids = sorted(table.values())
    if ids != list(range(len(ids))):
        raise refuse(f"{path}: ids are not 0..{len(ids) - 1}, each once")
    return {str(k): int(v) for k, v in table.items()}


def read_spm(path: Path) -> SentencePieceModel:
    try:
        return SentencePieceModel.parse(path.read_bytes())
    except FileNotFoundError:
        raise refuse(f"{path}: missing (MarianTokenizer's SentencePiece model)") from None
    except (ProtoError, UnicodeDecodeError) as exc:
        raise refuse(f"{path}: not a SentencePiece model ({exc})") from None


def special_ids(
    config: dict[str, Any],
    tokenizer: dict[str, Any],
    generation: dict[str, Any],
    encoder_vocab: dict[str, int],
    decoder_vocab: dict[str, int],
) -> MarianIds:
    def one(name: str, value: Any) -> int:
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if not isinstance(value, int) or isinstance(value, bool):
            raise refuse(f"{name} must be one token id, got {value!r}")
        return value

    pad = one("pad_token_id", config.get("pad_token_id"))
    eos = one("eos_token_id", config.get("eos_token_id"))
    start = one(
        "decoder_start_token_id",
        generation.get("decoder_start_token_id", config.get("decoder_start_token_id", pad)),
    )
    unk_piece = _token_text(tokenizer.get("unk_token", "<unk>"))
    if unk_piece not in decoder_vocab:
        raise refuse(f"the unknown token {unk_piece!r} is not in the vocabulary")
    unk = decoder_vocab[unk_piece]
    for name, value in (("pad", pad), ("eos", eos), ("decoder start", start)):
        if not 0 <= value < len(decoder_vocab):
            raise refuse(f"the {name} id {value} is outside the vocabulary")
    if len({pad, eos, unk}) != 3:
        raise refuse(f"pad {pad}, eos {eos} and unk {unk} must be three different ids")
    text = {i: piece for piece, i in decoder_vocab.items()}
    for i in (pad, eos, unk):
        if text[i] not in encoder_vocab:
            raise refuse(f"the special token {text[i]!r} is not in the source vocabulary")
    return MarianIds(pad, eos, unk, start, text)


def _token_text(token: Any) -> str:
    """A tokenizer_config.json token: a string, or an AddedToken's dict with "content"."""
    return str(token.get("content", "")) if isinstance(token, dict) else str(token)


def _specials(names: dict[int, str]) -> list[Piece]:
    """nmt's ids 0..3 (pad, unk, <s>, </s>), named as the imported tables name them."""
    return [
        Piece(names[0], 0.0, CONTROL),
        Piece(names[1], 0.0, UNKNOWN),
        Piece(names[2], 0.0, CONTROL),
        Piece(names[3], 0.0, CONTROL),
    ]


def target_side(
    spm: SentencePieceModel, table: dict[str, int], ids: MarianIds, notes: list[str]
) -> SideVocab:
    """Every id of the decoder's table, in its order after nmt's four specials."""
    text = ids.text
    own_start = ids.start != ids.pad
    bos_text = text[ids.start] if own_start else "<s>"
    if not own_start and bos_text in table:
        raise refuse(f"the decoder starts from pad, yet {bos_text!r} is a token of its own")
    special = {ids.pad: PAD_ID, ids.unk: 1, ids.start: BOS_ID, ids.eos: 3}
    rows = [ids.pad, ids.unk, ids.start, ids.eos]
    pieces = _specials({0: text[ids.pad], 1: text[ids.unk], 2: bos_text, 3: text[ids.eos]})
    known = spm.index()
    unused = 0
    for marian_id in range(len(text)):
        if marian_id in special:
            continue
        piece = known.get(text[marian_id])
        if piece is None or piece.kind in (CONTROL, UNKNOWN):
            unused += 1
            piece = Piece(text[marian_id], 0.0, UNUSED)
        pieces.append(piece)
        rows.append(marian_id)
    table_pieces = set(table)
    dropped = [p for p in spm.pieces if p.kind not in (CONTROL, UNKNOWN)]
    dropped = [p for p in dropped if p.text not in table_pieces]
    if not own_start:
        notes.append(
            f"Marian starts decoding from {text[ids.pad]!r}; nmt's <s> is a copy of it "
            f"whose output bias is {BOS_BIAS_GAP:g} lower (probability ~1e-13 of it)"
        )
    if unused:
        notes.append(
            f"{unused} output tokens are not pieces of target.spm: kept (decoded as their "
            "text), never produced when encoding target text"
        )
    if dropped:
        notes.append(
            f"{len(dropped)} pieces of target.spm are not in the vocabulary and can never "
            "be output: dropped, so encoding target text for fine-tuning splits them"
        )
    return SideVocab(spm.with_pieces(pieces), rows)


def source_side(
    spm: SentencePieceModel, table: dict[str, int], ids: MarianIds, notes: list[str]
) -> SideVocab:
    """The source.spm pieces after nmt's four specials, each with its table row."""
    bos_text = ids.text[ids.start] if ids.start != ids.pad else "<s>"
    names = {0: ids.text[ids.pad], 1: ids.text[ids.unk], 2: bos_text, 3: ids.text[ids.eos]}
    pieces = _specials(names)
    pad, unk, eos = (table[names[i]] for i in (0, 1, 3))
    rows = [pad, unk, table.get(bos_text, pad), eos]  # <s> never enters the encoder
    taken = set(names.values())
    absent = 0
    for piece in spm.pieces:
        if piece.kind in (CONTROL, UNKNOWN) or piece.text in taken:
            continue
        pieces.append(piece)
        row = table.get(piece.text)
        absent += row is None
        rows.append(unk if row is None else row)
    if absent:
        notes.append(
            f"{absent} pieces of source.spm are not in vocab.json: they read as "
            "<unk>, as MarianTokenizer reads them"
        )
    return SideVocab(spm.with_pieces(pieces), rows)
