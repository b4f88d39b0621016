"""A corpus's input files as numbered blocks of lines, for translation on many machines.

The files are read as one corpus, in order, as `cat` would join them, and cut into blocks
of `block_lines` lines (`chunks.chunked`, the one home of chunking): a block is exactly a
chunk that `nmt translate` reads from the same text, so its sentences are sorted and
batched the same way and its translations are the same bytes. Lines are decoded by the
text policy of `text_io` on the machine that reads them, so a bad line still stops with
`file:line` (its line in its own file) before any block after it is sent anywhere.

What identifies the corpus for `--resume` (`fingerprint`) is each file's path, size and
modification time: a file changed since the stopped run would make its blocks a mix.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nmt_cli.engines.translate.chunks import chunked
from nmt_cli.text_io import STDIN, LineDecoder, StreamDecoder, display_name, raw_lines


@dataclass(frozen=True)
class Block:
    """`lines` of the corpus from line `first_line` (1-based, counted over all inputs)."""

    index: int
    first_line: int
    lines: list[str]


@dataclass
class Corpus:
    """The input files (`-`: stdin) read as one text; `line_counts` fills as they are read."""

    inputs: Sequence[Path]
    decoder: LineDecoder = field(default_factory=LineDecoder)
    line_counts: list[int] = field(default_factory=list)

    def lines(self) -> Iterator[str]:
        """Every line, decoded, in input order."""
        self.line_counts.clear()
        for path in self.inputs:
            stream = StreamDecoder(display_name(path), self.decoder)
            self.line_counts.append(0)
            for raw in raw_lines(path):
                yield stream(raw)
                self.line_counts[-1] = stream.lineno

    def blocks(self, block_lines: int) -> Iterator[Block]:
        """The corpus in blocks of `block_lines` lines (the last one shorter)."""
        first = 1
        for index, lines in enumerate(chunked(self.lines(), block_lines)):
            yield Block(index, first, lines)
            first += len(lines)

    @property
    def resumable(self) -> bool:
        """Whether a second reading gives the same text: not for stdin."""
        return all(str(path) != STDIN for path in self.inputs)

    def fingerprint(self) -> list[dict[str, Any]]:
        """What identifies the input files: their paths, sizes and modification times."""
        return [_file_identity(path) for path in self.inputs]


def _file_identity(path: Path) -> dict[str, Any]:
    if str(path) == STDIN:
        return {"path": STDIN}
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def files_identity(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """`fingerprint` of files that are not text inputs (the checkpoints)."""
    return [_file_identity(path) for path in paths]
