"""SentencePiece models whose pieces are put in another order: the ids a model uses.

nmt's vocabulary is the SentencePiece model itself (an id is the piece's position in it,
with pad 0, unk 1, <s> 2, </s> 3), while an imported model numbers the same pieces its own
way (Marian: a vocab.json of piece -> id, </s> 0, <unk> 1, <pad> last). Rather than carry
a second table beside every vocabulary, the importer rewrites the SentencePiece model with
its pieces in the order of the imported ids. Segmentation depends on each piece's text,
score and type, never on its position, so the rewritten model splits text exactly as the
original; a piece the model numbers but the SentencePiece model lacks is added as UNUSED
(never produced when encoding, decoded as its text, as MarianTokenizer decodes it).

The model file is a protocol buffer (sentencepiece_model.proto). Only its repeated
`pieces` field (1) and the special ids of its `trainer_spec` (2) change, so this module
reads and writes the wire format itself instead of requiring the protobuf package:
every other field is copied through byte for byte.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from nmt_cli.core.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

# SentencePiece.Type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_PIECES, _TRAINER_SPEC = 1, 2  # ModelProto fields
_PIECE_TEXT, _PIECE_SCORE, _PIECE_TYPE = 1, 2, 3  # SentencePiece fields
# TrainerSpec's unk_id, bos_id, eos_id, pad_id, and the ids nmt gives them.
_SPECIAL_IDS = ((40, UNK_ID), (41, BOS_ID), (42, EOS_ID), (43, PAD_ID))
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


class ProtoError(ValueError):
    """Bytes that are not a SentencePiece model."""


@dataclass(frozen=True)
class Piece:
    text: str
    score: float = 0.0
    kind: int = NORMAL  # SentencePiece.Type


@dataclass(frozen=True)
class SentencePieceModel:
    """A model's pieces in id order, and the rest of its file as it was."""

    pieces: tuple[Piece, ...]
    rest: bytes  # every other field, wire-encoded, in the original order
    original: bytes

    @classmethod
    def parse(cls, proto: bytes) -> SentencePieceModel:
        pieces: list[Piece] = []
        rest = bytearray()
        for number, wire, value, raw in _fields(proto):
            if number == _PIECES and wire == _BYTES:
                assert isinstance(value, bytes)
                pieces.append(_parse_piece(value))
            else:
                rest += raw
        if not pieces:
            raise ProtoError("a SentencePiece model without pieces")
        return cls(tuple(pieces), bytes(rest), bytes(proto))

    def index(self) -> dict[str, Piece]:
        return {piece.text: piece for piece in self.pieces}

    def with_pieces(self, pieces: Sequence[Piece]) -> bytes:
        """This model's file with `pieces` in its place, in that order: ids 0..3 must be
        nmt's pad, unk, <s> and </s>, which the trainer spec is told. The same pieces in
        the same order give the file back byte for byte (a model nmt wrote comes home
        as the vocabulary it left, which is how nmt recognises a vocabulary)."""
        kinds = [p.kind for p in pieces[:4]]
        if kinds != [CONTROL, UNKNOWN, CONTROL, CONTROL]:
            raise ValueError(f"ids 0-3 must be pad, unk, <s>, </s>; got types {kinds}")
        if tuple(pieces) == self.pieces:
            return self.original
        out = bytearray()
        for piece in pieces:
            out += _field(_PIECES, _BYTES, _encode_piece(piece))
        for number, wire, value, raw in _fields(self.rest):
            if number == _TRAINER_SPEC and wire == _BYTES:
                assert isinstance(value, bytes)
                # A scalar field given twice takes its last value: append the new ids.
                ids = b"".join(_field(n, _VARINT, i) for n, i in _SPECIAL_IDS)
                out += _field(_TRAINER_SPEC, _BYTES, value + ids)
            else:
                out += raw
        return bytes(out)


def _parse_piece(data: bytes) -> Piece:
    text, score, kind = "", 0.0, NORMAL
    for number, wire, value, _ in _fields(data):
        if number == _PIECE_TEXT and isinstance(value, bytes):
            text = value.decode("utf-8")
        elif number == _PIECE_SCORE and wire == _FIXED32 and isinstance(value, bytes):
            score = struct.unpack("<f", value)[0]
        elif number == _PIECE_TYPE and isinstance(value, int):
            kind = value
    return Piece(text, score, kind)


def _encode_piece(piece: Piece) -> bytes:
    out = _field(_PIECE_TEXT, _BYTES, piece.text.encode("utf-8"))
    out += _field(_PIECE_SCORE, _FIXED32, struct.pack("<f", piece.score))
    if piece.kind != NORMAL:
        out += _field(_PIECE_TYPE, _VARINT, piece.kind)
    return out


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ProtoError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ProtoError("varint longer than 10 bytes")


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes, bytes]]:
    """(field number, wire type, value, the field's bytes as they were) of a message."""
    pos = 0
    while pos < len(data):
        start = pos
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        value: int | bytes
        if wire == _VARINT:
            value, pos = _varint(data, pos)
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
            value, pos = data[pos : pos + size], pos + size
        elif wire == _BYTES:
            size, pos = _varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        else:
            raise ProtoError(f"unsupported wire type {wire}")
        if pos > len(data):
            raise ProtoError("truncated field")
        yield number, wire, value, data[start:pos]


def _encode_varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int32/int64 negatives: ten bytes of two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, wire: int, value: int | bytes) -> bytes:
    tag = _encode_varint(number << 3 | wire)
    if wire == _VARINT:
        assert isinstance(value, int)
        return tag + _encode_varint(value)
    assert isinstance(value, bytes)
    if wire == _BYTES:
        return tag + _encode_varint(len(value)) + value
    return tag + value
