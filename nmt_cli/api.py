"""The Python API: translate with nmt from Python, without Typer, rich or the shell.

    from nmt_cli import Translator

    translator = Translator.load("model.pt", beam_size=4, nbest=2)   # ["a.pt", "b.pt"]: ensemble
    for result in translator.translate(["The cat sat on the mat."]):
        print(result.text, [(h.text, h.score) for h in result.hypotheses])

`nmt translate` builds its translator with `Translator.load` and decodes with the same
engine object (`Translator.engine`), so the command and the API cannot drift apart: same
loading and ensemble checks, thread layout, batching, search and detokenization.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from nmt_cli.config import DecodeConfig
from nmt_cli.engines.models import ModelPaths
from nmt_cli.engines.translate import Translation, set_threads
from nmt_cli.engines.translate import Translator as Engine


class Translator:
    """One checkpoint, or an ensemble of several, with its decoding settings."""

    def __init__(self, engine: Engine, threads: int) -> None:
        self.engine = engine
        self.threads = threads

    @classmethod
    def load(
        cls,
        models: ModelPaths,
        config: DecodeConfig | None = None,
        alignment_layer: int | None = None,
        on_compile: Callable[[], None] = lambda: None,
        on_fallback: Callable[[str], None] | None = None,
        **options: Any,
    ) -> Translator:
        """Load `models` (one path, or several to average at every step as an ensemble).

        `options` are DecodeConfig fields and override `config`: beam_size, length_penalty,
        max_len_a, max_len_b, nbest, batch_sentences, batch_tokens, precision ("auto",
        "fp32", "bf16", "fp16", "int8"), device, threads, workers, buffer_lines. Sets torch's CPU
        thread count the way `nmt translate` does (see engines.translate.set_threads).
        `alignment_layer` (1-based; 0: the penultimate) gives every hypothesis its word
        alignment, as `nmt translate --alignment`.
        On a CPU the decoder step is compiled C++ unless `compiled_step=False`: the first
        load on a machine builds it (about 30 s; `on_compile` is called before), and where
        it cannot be built `on_fallback` gets the reason (default: a warning) and decoding
        stays in Python (the same fp32 results; bf16 and int8, without the module's kernels,
        may differ in a few lines).
        Raises NmtError for an unusable checkpoint or models that cannot be ensembled.
        """
        cfg = config or DecodeConfig()
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(DecodeConfig)})
        if unknown:
            raise TypeError(f"unknown decoding option(s): {', '.join(unknown)}")
        cfg = dataclasses.replace(cfg, **options)
        threads, workers = set_threads(cfg.threads, cfg.workers)
        if on_fallback is None:
            on_fallback = _warn_fallback
        engine = Engine.load(models, cfg, workers, alignment_layer, on_compile, on_fallback)
        return cls(engine, threads)

    def close(self, wait: bool = True) -> None:
        """Stop the decoding workers (processes on Linux) started for multi-batch inputs;
        also done on garbage collection and at exit, and by `with Translator.load(...)`.
        `wait=False` does not wait for batches they are still decoding."""
        self.engine.close(wait)

    def __enter__(self) -> Translator:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(wait=exc_type is None)

    @property
    def config(self) -> DecodeConfig:
        return self.engine.cfg

    @property
    def device(self) -> torch.device:
        return self.engine.device

    @property
    def dtype(self) -> torch.dtype:
        return self.engine.dtype

    @property
    def precision(self) -> str:
        """fp32, bf16, fp16 or int8: what the model computes in."""
        return self.engine.precision

    @property
    def workers(self) -> int:
        return self.engine.workers

    @property
    def max_source(self) -> int:
        """Longest source in subword tokens; longer inputs are truncated (and flagged)."""
        return self.engine.max_source

    def translate(self, texts: str | Iterable[str], attention: bool = False) -> list[Translation]:
        """Translations of `texts` in their order (a single string counts as one text).

        Each Translation has `.text` (the best), `.hypotheses` (the nbest, best first, with
        score, log_prob, length and, with `attention=True`, their source attention: one
        decoder layer's cross-attention averaged over heads, recorded by the search) and
        `.truncated`. Reads an iterator in chunks of `buffer_lines`, like the command.
        """
        return list(self.translate_iter(texts, attention))

    def translate_iter(
        self, texts: str | Iterable[str], attention: bool = False
    ) -> Iterator[Translation]:
        """Like `translate`, but yields results chunk by chunk, in bounded memory."""
        chunk: list[str] = []
        for text in [texts] if isinstance(texts, str) else texts:
            chunk.append(text)
            if len(chunk) >= self.config.buffer_lines:
                yield from self.engine.translate(chunk, attention)
                chunk = []
        if chunk:
            yield from self.engine.translate(chunk, attention)


def _warn_fallback(reason: str) -> None:
    warnings.warn(
        f"nmt: decoding with the Python step, the compiled one is unavailable: {reason}",
        RuntimeWarning,
        stacklevel=3,
    )
