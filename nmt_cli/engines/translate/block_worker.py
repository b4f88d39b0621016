"""One decoding lane of a corpus translated on Ray: a loaded `Translator` turning blocks of
lines into the bytes `nmt translate` writes for them.

Ray Data makes one `BlockTranslator` per actor and calls it with batches of blocks; the
class itself knows nothing of Ray (batches are PyArrow tables, answers plain columns),
so it is tested and used without a cluster. It loads its model the way `nmt translate`
does (`Translator.load`: the node's CPU decides what `auto` precision means and whether
the compiled step and its AVX-512 kernels run; `set_threads` gives it its threads), so
a heterogeneous cluster decodes on each machine as that machine would alone. Each block
goes through `stream.translate_stream` and `stream.format_translations`, the command's
own accounting and output formats, numbered from the block's first line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nmt_cli.config import DecodeConfig
from nmt_cli.engines.translate.corpus_parts import BlockRecord
from nmt_cli.engines.translate.stream import format_translations, translate_stream
from nmt_cli.engines.translate.translator import Translation, Translator
from nmt_cli.errors import NmtError
from nmt_cli.heap import Releaser

# The columns of a block on its way to an actor, and of its answer.
BLOCK, FIRST_LINE, LINES = "block", "first_line", "lines"
RECORD, DATA = "record", "data"


@dataclass(frozen=True)
class WorkerSpec:
    """What every actor loads: the checkpoints (paths every node can read), the decoding
    settings (`threads`: the actor's own; one batch at a time) and the output format."""

    models: tuple[str, ...]
    cfg: DecodeConfig
    as_json: bool = False
    alignment_layer: int | None = None  # 0: the default layer; None: no alignments


class BlockTranslator:
    """A Ray Data actor's callable: one Translator for the actor's life."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.notes: list[str] = []  # reported with the first block only
        # A checkpoint this node cannot load is the user's error, and is raised with the
        # first block: an error in an actor's constructor reaches the driver as the
        # actor's death, its text a remote traceback, while a block's error keeps its type.
        self.failure: NmtError | None = None
        try:
            self.translator = Translator.load(
                [Path(m) for m in spec.models],
                spec.cfg,
                spec.alignment_layer,
                on_compile=lambda text: None,  # a node's first build: its own log, not ours
                on_fallback=self.notes.append,
            )
        except NmtError as exc:
            self.failure = exc
        self.node, self.pid = _node(), os.getpid()
        self.releaser = Releaser()

    def __call__(self, batch: Any) -> dict[str, list[Any]]:
        """A PyArrow table of blocks -> their records (JSON) and output bytes."""
        if self.failure is not None:
            raise self.failure
        records: list[str] = []
        data: list[bytes] = []
        for row in batch.to_pylist():
            record, output = self.translate_block(row[BLOCK], row[FIRST_LINE], row[LINES])
            records.append(json.dumps(dataclasses.asdict(record)))
            data.append(output)
        return {RECORD: records, DATA: data}

    def translate_block(
        self, index: int, first_line: int, lines: Sequence[str]
    ) -> tuple[BlockRecord, bytes]:
        """The block's output, exactly as `nmt translate` writes these lines when they
        are one of its chunks, and what it holds."""
        out = bytearray()
        nbest, as_json = self.spec.cfg.nbest, self.spec.as_json
        alignment = self.spec.alignment_layer is not None

        def emit(results: list[Translation], first: int, seconds: float) -> None:
            number = first_line + first - 1
            out.extend(format_translations(results, number, seconds, nbest, as_json, alignment))

        stats = translate_stream(self.translator, [list(lines)], emit)
        self.releaser.after_chunk()
        t = self.translator
        notes, self.notes = self.notes, []
        record = BlockRecord.of(
            bytes(out),
            block=index,
            first_line=first_line,
            lines=stats.lines,
            sentences=stats.sentences,
            target_tokens=stats.target_tokens,
            truncated=stats.truncated,
            truncated_lines=[first_line + n - 1 for n in stats.truncated_lines],
            decode_seconds=round(stats.decode_seconds, 6),
            node=self.node,
            pid=self.pid,
            precision=str(t.precision),
            threads=t.threads,
            max_source=t.max_source,
            notes=notes,
        )
        return record, bytes(out)


def _node() -> str:
    """The machine's name and, in a Ray worker, its node's id: a test cluster, or a big
    machine, may run several nodes on one host. Ray is asked only if already loaded."""
    name = socket.gethostname()
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return f"{name}/{ray.get_runtime_context().get_node_id()[:12]}"
    return name
