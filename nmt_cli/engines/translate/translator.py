"""`nmt translate`: raw text in, detokenized translations out, one line per line.

A `Translator` takes a chunk of lines (see `translate_stream.py` for how chunks are read
and written): sentences are sorted by length into batches (little padding), decoded with
batched beam search, and put back in input order. Empty lines give empty lines without
touching the model; inputs longer than the model's positions are truncated and counted,
never dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from nmt_cli.config import CPU_BATCH_SENTENCES, GPU_BATCH_SENTENCES, DecodeConfig
from nmt_cli.core.batching import pad_sources
from nmt_cli.core.checkpoint import Checkpoint

from nmt_cli.core.cpus import usable_cpus
from nmt_cli.core.ensemble import Ensemble
from nmt_cli.core.precision import DecodePrecision, resolve_decode_precision
from nmt_cli.core.search import Hypothesis, beam_search, greedy_search
from nmt_cli.core.transformer import Transformer
from nmt_cli.core.vocab import VocabPair
from nmt_cli.engines.alignment import format_alignment, hard_alignment
from nmt_cli.engines.attention_views import (
    CrossAttentionOf,
    SourceAttention,
    check_layer,
    decoder_layers,
    default_layer,
)
from nmt_cli.engines.decode_workers import DecodePool
from nmt_cli.engines.models import ModelPaths, beam_advance, build_decoder, load_checkpoints
from nmt_cli.errors import NmtError, UsageError


@dataclass(frozen=True)
class TranslatedHypothesis:
    text: str
    score: float  # log-probability / length penalty
    log_prob: float
    length: int  # subword tokens, without EOS
    alignment: str | None = None  # Moses "i-j" source-target word pairs, when asked for
    attention: SourceAttention | None = None  # only when asked for


@dataclass(frozen=True)
class Translation:
    source: str
    hypotheses: list[TranslatedHypothesis]  # best first; empty for an empty line
    truncated: bool = False

    @property
    def text(self) -> str:
        return self.hypotheses[0].text if self.hypotheses else ""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"--device {name!r}: not a device (use cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise NmtError(f"--device {name}: no CUDA device is available; use --device cpu")
    return device


class Translator:
    """A model (or an ensemble) and its vocabularies, ready to translate chunks of lines.

    With `alignment_layer` (1-based; 0: the default layer), every hypothesis also gets
    its word alignment from that decoder layer's cross-attention, averaged over heads (and
    over an ensemble's members), recorded by the search that produced it (beam 1 then runs
    as a one-beam beam search, the same output as greedy). `translate(..., attention=True)`
    records the same way: that layer, or the default one (attention_views.default_layer).
    """

    def __init__(
        self,
        model: Transformer | Ensemble,
        vocab: VocabPair,
        cfg: DecodeConfig,
        workers: int = 1,
        alignment_layer: int | None = None,
        precision: DecodePrecision | None = None,
    ) -> None:
        self.model, self.vocab, self.cfg = model, vocab, cfg
        # What the model computes in, for reports: its dtype unless built as int8.
        self.precision = precision or str(self.dtype).removeprefix("torch.")
        self.max_source = model.max_positions - 1  # room for the source's EOS
        self.device = next(model.parameters()).device
        on_cpu = self.device.type == "cpu"
        self.workers = workers if on_cpu else 1
        self.batch_sentences = cfg.batch_sentences or (
            CPU_BATCH_SENTENCES if on_cpu else GPU_BATCH_SENTENCES
        )
        self._pool: DecodePool | None = None
        self.advance = beam_advance(model)  # beam search's, compiled with the step
        self.aligner: CrossAttentionOf | None = None
        if alignment_layer is not None:
            layers = decoder_layers(model)
            wanted = alignment_layer or default_layer(layers)
            layer = check_layer(wanted, layers, "--alignment-layer", "decoder")
            self.aligner = CrossAttentionOf(model, layer)

    @classmethod
    def from_checkpoint(
        cls,
        ckpt: Checkpoint | Sequence[Checkpoint],
        cfg: DecodeConfig,
        workers: int = 1,
        alignment_layer: int | None = None,
        names: Sequence[str] | None = None,
        on_compile: Callable[[], None] = lambda: None,
        on_fallback: Callable[[str], None] = lambda reason: None,
    ) -> Translator:
        """Build the model (several checkpoints: their ensemble) on the configured device
        in the configured precision (log-softmax stays in float32 inside the model).
        `on_compile` and `on_fallback` report on the compiled decoder step (build_decoder)."""
        ckpts = [ckpt] if isinstance(ckpt, Checkpoint) else list(ckpt)
        names = list(names) if names is not None else [f"model {i + 1}" for i in range(len(ckpts))]
        device = resolve_device(cfg.device)
        precision = resolve_decode_precision(cfg.precision, device, "--precision")
        model, vocab = build_decoder(
            ckpts, names, device, precision, cfg.compiled_step, on_compile, on_fallback
        )
        return cls(model, vocab, cfg, workers, alignment_layer, precision)

    @classmethod
    def load(
        cls,
        paths: ModelPaths,
        cfg: DecodeConfig,
        workers: int = 1,
        alignment_layer: int | None = None,
        on_compile: Callable[[], None] = lambda: None,
        on_fallback: Callable[[str], None] = lambda reason: None,
    ) -> Translator:
        """One checkpoint file, or several to decode as an ensemble."""
        ckpts, names = load_checkpoints(paths)
        return cls.from_checkpoint(
            ckpts, cfg, workers, alignment_layer, names, on_compile, on_fallback
        )

    def _workers(self) -> DecodePool:
        """The pool that decodes `workers` batches at once, made on first use (forked
        worker processes, which then share the model built so far: decode_workers.py)."""
        if self._pool is None:
            self._pool = DecodePool(self, self.workers)
        return self._pool

    def close(self, wait: bool = True) -> None:
        """Stop the worker processes or threads, if any were started; `wait=False` after
        an interruption (see DecodePool.close)."""
        if self._pool is not None:
            self._pool.close(wait)
            self._pool = None

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def translate(self, lines: Sequence[str], attention: bool = False) -> list[Translation]:
        """Translate `lines`, keeping their order; with `attention`, every hypothesis
        carries its source attention, recorded by the search that produced it."""
        ids = self.vocab.src.encode(list(lines)) if lines else []
        truncated = [len(x) > self.max_source for x in ids]
        ids = [x[: self.max_source] for x in ids]
        hyps: list[list[Hypothesis]] = [[] for _ in lines]
        order = sorted((i for i, x in enumerate(ids) if x), key=lambda i: -len(ids[i]))
        batches = list(self._batches(order, ids))

        rows = [[ids[i] for i in batch] for batch in batches]
        if self.workers > 1 and len(batches) > 1:
            # Batches decoded side by side, one worker each: on small CPUs this beats
            # spreading every small matrix product over all cores (see set_threads).
            decoded = self._workers().map(rows, attention)
        else:
            decoded = [self.decode_rows(batch, attention) for batch in rows]
        for batch, results in zip(batches, decoded, strict=True):
            for i, result in zip(batch, results, strict=True):
                hyps[i] = result
        return [
            Translation(
                source=line,
                hypotheses=[self._detok(h, ids[i], attention) for h in hyps[i]],
                truncated=truncated[i],
            )
            for i, line in enumerate(lines)
        ]

    def decode_rows(self, rows: list[list[int]], attention: bool = False) -> list[list[Hypothesis]]:
        """One batch of source token ids -> each sentence's hypotheses, recording the
        alignment layer's attention when alignments are on, or the default layer's with
        `attention`."""
        view = self.aligner
        if attention and view is None:
            view = CrossAttentionOf(self.model, default_layer(decoder_layers(self.model)) - 1)
        return self._search(self.source_tensor(rows), view)

    def _batches(self, order: list[int], ids: list[list[int]]) -> Iterator[list[int]]:
        """Consecutive runs of the length-sorted sentences, capped in sentences and, when
        batch_tokens is set, in padded source tokens."""
        cfg = self.cfg
        batch: list[int] = []
        longest = 0
        for i in order:
            length = len(ids[i]) + 1
            width = max(longest, length)
            too_many = len(batch) >= self.batch_sentences
            too_big = cfg.batch_tokens > 0 and width * (len(batch) + 1) > cfg.batch_tokens
            if batch and (too_many or too_big):
                yield batch
                batch, width = [], length
            batch.append(i)
            longest = width
        if batch:
            yield batch

    def source_tensor(self, rows: list[list[int]]) -> Tensor:
        """Source ids -> (B, width) ids + EOS, right-padded, on the model's device."""
        # Widths in steps of 8 (masked padding): few distinct shapes for oneDNN to build
        # kernels for, as with the batch sizes in search.batch_bucket.
        return pad_sources(rows, multiple=8).to(self.device)

    def _search(self, src: Tensor, view: CrossAttentionOf | None = None) -> list[list[Hypothesis]]:
        """Without a view, the plain search; with one, beam search recording its weights."""
        cfg = self.cfg
        if cfg.beam_size == 1 and view is None:
            return greedy_search(self.model, src, cfg.max_len_a, cfg.max_len_b, cfg.length_penalty)
        return beam_search(
            self.model if view is None else view,
            src,
            beam_size=cfg.beam_size,
            length_penalty=cfg.length_penalty,
            max_len_a=cfg.max_len_a,
            max_len_b=cfg.max_len_b,
            nbest=cfg.nbest,
            need_weights=view is not None,
            advance=self.advance,
        )

    def _detok(
        self, hyp: Hypothesis, src_ids: list[int], attention: bool = False
    ) -> TranslatedHypothesis:
        text = self.vocab.tgt.decode(hyp.tokens)
        # One output line per input line, whatever the vocabulary can produce.
        text = " ".join(text.splitlines()) if ("\n" in text or "\r" in text) else text
        alignment, source_attention = None, None
        if hyp.attention is not None:
            cross = np.stack([step[0].float().cpu().numpy() for step in hyp.attention])
            src_pieces, tgt_pieces = (
                self.vocab.src.pieces(src_ids),
                self.vocab.tgt.pieces(hyp.tokens),
            )
            if self.aligner is not None:
                alignment = format_alignment(hard_alignment(cross, src_pieces, tgt_pieces))
            if attention:
                source_attention = SourceAttention.of(cross, src_pieces, tgt_pieces)
        return TranslatedHypothesis(
            text, hyp.score, hyp.log_prob, len(hyp.tokens), alignment, source_attention
        )


def translate_lines(
    model: Transformer | Checkpoint,
    lines: Iterable[str],
    cfg: DecodeConfig | None = None,
    vocab: VocabPair | None = None,
    workers: int = 1,
) -> list[str]:
    """Best translations of `lines`, detokenized, in input order.

    With a Checkpoint, the model is built as `nmt translate` builds it (device, precision).
    With a live model (validation BLEU during training) it is used as it is, on its own
    device and dtype, in eval mode for the call and restored afterwards. `workers` batches
    are decoded at once on a CPU: call `set_threads(cfg.threads, cfg.workers)` first and
    pass the workers it returns for the layout `nmt translate` uses.
    """
    cfg = cfg or DecodeConfig()
    if isinstance(model, Checkpoint):
        translator = Translator.from_checkpoint(model, cfg, workers)
        was_training = False
    else:
        if vocab is None:
            raise ValueError("translate_lines needs the VocabPair with a bare model")
        translator = Translator(model, vocab, cfg, workers)
        was_training = model.training
        model.eval()
    out: list[str] = []
    try:
        chunk: list[str] = []
        for line in lines:
            chunk.append(line)
            if len(chunk) >= cfg.buffer_lines:
                out.extend(t.text for t in translator.translate(chunk))
                chunk = []
        if chunk:
            out.extend(t.text for t in translator.translate(chunk))
    finally:
        translator.close()
        if was_training and not isinstance(model, Checkpoint):
            model.train()
    return out


def set_threads(threads: int, workers: int = 0) -> tuple[int, int]:
    """Spend `threads` CPU threads (0 = every CPU this process may use, within its affinity
    mask and cgroup quota: see core/cpus.py) on `workers`
    batches decoded side by side (0 = one per thread); returns (threads, workers).

    Beam search runs many small matrix products, and on small or shared CPUs splitting
    each of them over several cores costs more in synchronisation than it gains (2 threads
    on one batch were several times slower than 1 on the 2-core benchmark machine), so by
    default every thread decodes its own batch with single-threaded operations.
    """
    n = threads if threads > 0 else usable_cpus()
    w = max(1, min(workers or n, n))
    torch.set_num_threads(max(1, n // w))
    return n, w
