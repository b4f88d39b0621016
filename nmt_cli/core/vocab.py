"""Vocabularies that travel inside every checkpoint: SentencePiece, or Moses + BPE.

A `Vocab` is built from the serialized SentencePiece model (its protobuf bytes), so a
checkpoint needs no file beside it and there is never a dictionary-size mismatch.
Special ids are fixed for every model nmt trains: pad 0, unk 1, bos 2, eos 3.

A model imported from fairseq's WMT releases reads text the way it was trained: Moses
tokenization, subword-nmt BPE, then a word list. Its bytes are a description of that
pipeline (nmt_cli/moses_bpe.py), which the checkpoint carries where a SentencePiece model
would be; the bytes say which kind they are, and are what two vocabularies are compared
by. `Vocab` asks either processor the same four things.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import sentencepiece as spm

from nmt_cli.moses_bpe import MAGIC as MOSES_BPE  # the first bytes of a Moses + BPE vocabulary
from nmt_cli.moses_bpe import MosesBpe

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


@dataclass(frozen=True)
class Vocab:
    """One SentencePiece model, loaded from its serialized bytes."""

    model_proto: bytes
    processor: Any = field(compare=False, repr=False)  # SentencePiece's, or a MosesBpe

    @classmethod
    def from_proto(cls, model_proto: bytes) -> Vocab:
        if model_proto.startswith(MOSES_BPE):
            return cls(model_proto=bytes(model_proto), processor=MosesBpe(model_proto))
        proc = spm.SentencePieceProcessor()
        proc.LoadFromSerializedProto(model_proto)
        return cls(model_proto=bytes(model_proto), processor=proc)

    def __len__(self) -> int:
        return int(self.processor.GetPieceSize())

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Raw text -> ids, without bos/eos (the caller adds what its side needs). One
        text goes to SentencePiece on its own: its list form starts a pool of threads a
        call, which took a one-line translation's text 0.3 ms instead of 0.05."""
        if len(texts) == 1 and isinstance(self.processor, spm.SentencePieceProcessor):
            return [list(self.processor.Encode(texts[0], out_type=int))]
        return [list(ids) for ids in self.processor.Encode(list(texts), out_type=int)]

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> detokenized text; special ids are dropped."""
        return str(self.processor.Decode([i for i in ids if i > EOS_ID]))

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """Ids -> SentencePiece pieces ("▁" starts a word), as attention pictures and word
        alignments need them."""
        return [str(self.processor.IdToPiece(i)) for i in ids]

    @property
    def kind(self) -> str:
        """The kind of text processing: sentencepiece, or moses-bpe (from fairseq)."""
        return "moses-bpe" if self.model_proto.startswith(MOSES_BPE) else "sentencepiece"


@dataclass(frozen=True)
class VocabPair:
    """Source and target vocabularies; one object twice when the vocabulary is joint."""

    src: Vocab
    tgt: Vocab

    @property
    def joint(self) -> bool:
        return self.src.model_proto == self.tgt.model_proto

    @classmethod
    def from_protos(cls, src: bytes, tgt: bytes) -> VocabPair:
        src_vocab = Vocab.from_proto(src)
        return cls(src_vocab, src_vocab if src == tgt else Vocab.from_proto(tgt))


def train_sentencepiece(
    lines: Iterable[str],
    vocab_size: int,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
    max_sentences: int = 2_000_000,
    seed_sentencepiece_size: int = 1_000_000,
    whole_words: Sequence[str] = (),
) -> bytes:
    """Train a SentencePiece model on `lines` and return its serialized bytes.

    SentencePiece itself samples at most `max_sentences` of the lines it is given
    (`input_sentence_size`), so callers should pass a bounded sample for large corpora.
    `whole_words` are words that must be one piece each wherever they stand as a word
    (a tree's `(NP`, which BPE would cut into `▁(` and `NP`): user-defined symbols that
    carry the word-start mark `▁`, so the mark does not become a piece of its own.
    Raises RuntimeError from SentencePiece when the data cannot support `vocab_size`.
    """
    buffer = io.BytesIO()

    def sentences() -> Iterator[str]:
        for line in lines:
            line = line.strip()
            if line:
                yield line

    spm.SentencePieceTrainer.Train(
        sentence_iterator=sentences(),
        model_writer=buffer,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        input_sentence_size=max_sentences,
        shuffle_input_sentence=True,
        seed_sentencepiece_size=seed_sentencepiece_size,
        user_defined_symbols=["\u2581" + word for word in whole_words],
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        num_threads=2,
        minloglevel=2,
    )
    return buffer.getvalue()
