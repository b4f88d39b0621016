"""What a translation must hold, from text: a prefix and phrases, checked and encoded.

The text side of forced.py: `encode_forced` turns a prefix and phrases into target
pieces (the target SentencePiece model's), refusing what the model cannot write (an empty
phrase, a character the vocabulary lacks, more pieces than the decoder's positions);
`ForcedReader` reads them along with the lines to translate, chunk by chunk, for the
Python API (`Translator.translate(..., prefix=, constraints=)`) and for `nmt translate`
(`forced_files`: --prefix, --prefix-file, --constraints), with `file:line` in its
messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from nmt_cli.core.vocab import UNK_ID, Vocab
from nmt_cli.engines.translate.forced import ForcedIds
from nmt_cli.errors import NmtError, UsageError
from nmt_cli.text_io import LineDecoder, display_name, raw_lines


class ForcedError(NmtError):
    """A prefix or phrase the model cannot be made to write; `part` says which."""

    def __init__(self, message: str, part: str) -> None:
        super().__init__(message)
        self.part = part  # "prefix" or "constraints"


def encode_forced(vocab: Vocab, prefix: str, phrases: Sequence[str], room: int) -> ForcedIds:
    """The target pieces of `prefix` and `phrases` (text as the output would read), checked:
    no empty phrase, no character the target vocabulary lacks, and no more pieces than the
    `room` (target tokens) the model can write."""
    if any(not phrase.strip() for phrase in phrases):
        raise ForcedError(
            "an empty constraint (phrases are tab-separated, none empty)", "constraints"
        )
    prefix_ids = _pieces(vocab, prefix, "prefix") if prefix.strip() else ()
    forced = ForcedIds(prefix_ids, tuple(_pieces(vocab, p, "constraints") for p in phrases))
    if forced.tokens > room:
        raise ForcedError(
            f"the prefix and constraints take {forced.tokens} target pieces; "
            f"the model writes at most {room}",
            "constraints" if phrases else "prefix",
        )
    return forced


def _pieces(vocab: Vocab, text: str, part: str) -> tuple[int, ...]:
    ids = tuple(vocab.encode([text])[0])
    if UNK_ID in ids or not ids:
        raise ForcedError(f"{text!r} has characters the target vocabulary lacks", part)
    return ids


class ForcedReader:
    """What each line's translation must hold, read along with the lines, chunk by chunk:
    `prefix` (one text for every line, or one per line) and `constraints` (per line, its
    phrases; a text alone is one phrase). `names` gives the file each part comes from, for
    `file:line` in messages (otherwise `line N`). NmtError for a part the model cannot
    write, or for per-line parts that run out before the lines or outlast them."""

    def __init__(
        self,
        prefix: str | Iterable[str] | None,
        constraints: Iterable[str | Sequence[str]] | None,
        vocab: Vocab,
        room: int,
        names: Mapping[str, str] | None = None,
    ) -> None:
        self.every = prefix if isinstance(prefix, str) else ""
        self.prefixes = None if prefix is None or isinstance(prefix, str) else iter(prefix)
        self.phrases = None if constraints is None else iter(constraints)
        self.vocab, self.room, self.names = vocab, room, dict(names or {})
        self.lines = 0

    def take(self, lines: Sequence[str]) -> list[ForcedIds]:
        out = []
        for _ in lines:
            self.lines += 1
            prefix = self.every if self.prefixes is None else self._next(self.prefixes, "prefix")
            phrases = () if self.phrases is None else self._next(self.phrases, "constraints")
            listed = [phrases] if isinstance(phrases, str) else list(phrases)
            try:
                out.append(encode_forced(self.vocab, prefix, listed, self.room))
            except ForcedError as exc:
                name = self.names.get(exc.part)
                where = f"{name}:{self.lines}" if name else f"line {self.lines}"
                raise NmtError(f"{where}: {exc}") from None
        return out

    def finish(self) -> None:
        """After the last line: refuse per-line parts left over."""
        for part, values in (("prefix", self.prefixes), ("constraints", self.phrases)):
            if values is not None and next(values, None) is not None:
                name = self.names.get(part, part)
                raise NmtError(f"{name} has more lines than the input ({self.lines:,})")

    def _next(self, values: Iterator[Any], part: str) -> Any:
        value = next(values, None)
        if value is None:
            name = self.names.get(part, part)
            raise NmtError(f"{name} has {self.lines - 1:,} lines, the input more")
        return value


def forced_files(
    vocab: Vocab,
    room: int,
    prefix: str | None,
    prefix_file: Path | None,
    constraints: Path | None,
    decoder: LineDecoder,
) -> ForcedReader | None:
    """`nmt translate`'s --prefix TEXT, --prefix-file FILE (one prefix a line) and
    --constraints FILE (per line, its phrases separated by tabs; an empty line: none), read
    along with the input by the text policy of `decoder`; None when none is given."""
    if prefix is not None and prefix_file is not None:
        raise UsageError("--prefix and --prefix-file: give one of them")
    if prefix is None and prefix_file is None and constraints is None:
        return None
    if prefix is not None:
        try:
            encode_forced(vocab, prefix, (), room)
        except ForcedError as exc:
            raise UsageError(f"--prefix: {exc}") from None
    names = {}
    prefixes: str | Iterator[str] | None = prefix
    phrases: Iterator[list[str]] | None = None
    if prefix_file is not None:
        names["prefix"] = display_name(prefix_file)
        prefixes = _lines(prefix_file, decoder)
    if constraints is not None:
        names["constraints"] = display_name(constraints)
        phrases = (
            [p.strip() for p in line.split("\t")] if line else []
            for line in _lines(constraints, decoder)
        )
    return ForcedReader(prefixes, phrases, vocab, room, names)


def _lines(path: Path, decoder: LineDecoder) -> Iterator[str]:
    for n, raw in enumerate(raw_lines(path), start=1):
        yield decoder.decode(raw, path, n)
