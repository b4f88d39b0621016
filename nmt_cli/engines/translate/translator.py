"""`Translator`: a model (or an ensemble) and its vocabularies, translating lines.

The one class that decodes text: `nmt translate` (through `stream.translate_file`),
`nmt attention` (`attention.record_attention`), `nmt run` (`translate_lines`), training's
validation BLEU and attention pictures, and the Python API (`from nmt_cli import
Translator`).

Lines go in chunks (`chunks.py`); in a chunk, sentences are sorted by length into batches
(little padding), decoded with batched beam search (several batches side by side on a
CPU: `workers.py`), and put back in input order. Empty lines give empty lines without
touching the model; inputs longer than the model's positions are truncated and counted,
never dropped.

Search may be constrained (core/constraints.py): a parsing model's (its recipe scores
trees) always is, so that every output is a well-formed tree with a slot per word of its
line (trees/constraint.py); a translation's is when the caller gives a target prefix or
phrases it must contain (forced.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from nmt_cli.config import CPU_BATCH_SENTENCES, GPU_BATCH_SENTENCES, DecodeConfig
from nmt_cli.core.batching import pad_sources
from nmt_cli.core.checkpoint import Checkpoint
from nmt_cli.core.constraints import ConstraintState
from nmt_cli.core.ensemble import Ensemble, Member
from nmt_cli.core.precision import DecodePrecision, resolve_decode_precision
from nmt_cli.core.search import Hypothesis, beam_search, greedy_search
from nmt_cli.core.searchable import Searchable
from nmt_cli.core.vocab import UNK_ID, VocabPair
from nmt_cli.engines.models import (
    ModelPaths,
    build_decoder,
    load_checkpoints,
)
from nmt_cli.engines.translate.alignment import format_alignment, hard_alignment
from nmt_cli.engines.translate.chunks import chunked
from nmt_cli.engines.translate.forced import ForcedIds, PhraseState
from nmt_cli.engines.translate.forced_input import ForcedReader
from nmt_cli.engines.translate.loading import (
    decode_config,
    resolve_device,
    set_threads,
    warn_fallback,
)
from nmt_cli.engines.translate.views import (
    CrossAttentionOf,
    SourceAttention,
    check_layer,
    decoder_layers,
    default_layer,
)
from nmt_cli.engines.translate.workers import DecodePool, Needs
from nmt_cli.errors import UsageError
from nmt_cli.trees.constraint import Leaves, TreeVocabulary


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


class Translator:
    """One checkpoint, or an ensemble of several, with its vocabularies and decoding settings.

    With `alignment_layer` (1-based; 0: the default layer), every hypothesis also gets
    its word alignment from that decoder layer's cross-attention, averaged over heads (and
    over an ensemble's members), recorded by the search that produced it (beam 1 then runs
    as a one-beam beam search, the same output as greedy). `translate(..., attention=True)`
    records the same way: that layer, or the default one (views.default_layer).
    The model is what search decodes: one model (a Transformer, or a backend's wrapper of
    one) or an ensemble (core.ensemble), a torch module either way.
    """

    def __init__(
        self,
        model: Member | Ensemble,
        vocab: VocabPair,
        cfg: DecodeConfig,
        workers: int = 1,
        alignment_layer: int | None = None,
        precision: DecodePrecision | None = None,
        threads: int | None = None,
    ) -> None:
        self.model, self.vocab, self.cfg = model, vocab, cfg
        # What the model computes in, for reports: its dtype unless built as int8.
        self.precision = precision or str(self.dtype).removeprefix("torch.")
        self.max_source = model.max_positions - 1  # room for the source's EOS
        self.device = _weight(model).device
        on_cpu = self.device.type == "cpu"
        self.workers = workers if on_cpu else 1
        self.threads = threads if threads is not None else torch.get_num_threads()
        self.batch_sentences = cfg.batch_sentences or (
            CPU_BATCH_SENTENCES if on_cpu else GPU_BATCH_SENTENCES
        )
        self._pool: DecodePool | None = None
        # A parsing model's tree pieces: its every output is constrained to a tree.
        self.trees: TreeVocabulary | None = None
        # How each operation runs, in words (the planner's and the backend's choices).
        self.plan: list[str] = []
        self.aligner: CrossAttentionOf | None = None
        if alignment_layer is not None:
            layers = decoder_layers(model)
            wanted = alignment_layer or default_layer(layers)
            layer = check_layer(wanted, layers, "--alignment-layer", "decoder")
            self.aligner = CrossAttentionOf(model, layer)

    @classmethod
    def load(
        cls,
        models: ModelPaths,
        config: DecodeConfig | None = None,
        alignment_layer: int | None = None,
        on_compile: Callable[[str], None] | None = None,
        on_fallback: Callable[[str], None] | None = None,
        **options: Any,
    ) -> Translator:
        """Load `models` (one path, or several to average at every step as an ensemble).

        `options` are DecodeConfig fields and override `config`: beam_size, length_penalty,
        max_len_a, max_len_b, nbest, batch_sentences, batch_tokens, precision ("auto",
        "fp32", "bf16", "fp16", "int8"), device, threads, workers, buffer_lines. Sets torch's
        CPU thread count the way `nmt translate` does (see loading.set_threads).
        `alignment_layer` (1-based; 0: the penultimate) gives every hypothesis its word
        alignment, as `nmt translate --alignment`.
        On a CPU the decoder step is compiled C++ unless `compiled_step=False`: the first
        load on a machine builds it (a minute or more; `on_compile` is told how far it has
        come, line by line, and None writes those lines on stderr), and where it cannot be
        built `on_fallback` gets the reason (default: a warning) and decoding stays in
        Python (the same fp32 results; bf16 and int8, without the module's kernels, may
        differ in a few lines).
        Raises NmtError for an unusable checkpoint or models that cannot be ensembled.
        """
        cfg = decode_config(config, options)
        threads, workers = set_threads(cfg.threads, cfg.workers)
        ckpts, names = load_checkpoints(models)
        return cls.from_checkpoint(
            ckpts,
            cfg,
            workers,
            alignment_layer,
            names,
            on_compile,
            on_fallback or warn_fallback,
            threads,
        )

    @classmethod
    def from_checkpoint(
        cls,
        ckpt: Checkpoint | Sequence[Checkpoint],
        cfg: DecodeConfig,
        workers: int = 1,
        alignment_layer: int | None = None,
        names: Sequence[str] | None = None,
        on_compile: Callable[[str], None] | None = None,
        on_fallback: Callable[[str], None] = lambda reason: None,
        threads: int | None = None,
    ) -> Translator:
        """Build the model (several checkpoints: their ensemble) on the configured device
        in the configured precision (log-softmax stays in float32 inside the model).
        `on_compile` and `on_fallback` report on the compiled decoder step (build_decoder)."""
        ckpts = [ckpt] if isinstance(ckpt, Checkpoint) else list(ckpt)
        names = list(names) if names is not None else [f"model {i + 1}" for i in range(len(ckpts))]
        device = resolve_device(cfg.device)
        precision = resolve_decode_precision(cfg.precision, device, "--precision")
        model, vocab, plan = build_decoder(
            ckpts, names, device, precision, cfg.compiled_step, on_compile, on_fallback
        )
        translator = cls(model, vocab, cfg, workers, alignment_layer, precision, threads)
        translator.plan = plan
        recipe = ckpts[0].recipe or {}
        if recipe.get("score", {}).get("metric") == "trees":
            leaves = recipe.get("data", {}).get("tree_leaves", "xx")
            translator.trees = TreeVocabulary.of(vocab.tgt, leaves)
        return translator

    @property
    def config(self) -> DecodeConfig:
        return self.cfg

    @property
    def dtype(self) -> torch.dtype:
        return _weight(self.model).dtype

    def close(self, wait: bool = True) -> None:
        """Stop the decoding workers (processes on Linux) started for multi-batch inputs;
        also done on garbage collection and at exit, and by `with Translator.load(...)`.
        `wait=False` (after an interruption) does not wait for the batches they are in."""
        if self._pool is not None:
            self._pool.close(wait)
            self._pool = None

    def __enter__(self) -> Translator:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(wait=exc_type is None)

    def translate(
        self,
        texts: str | Iterable[str],
        attention: bool = False,
        prefix: str | Iterable[str] | None = None,
        constraints: Iterable[str | Sequence[str]] | None = None,
    ) -> list[Translation]:
        """Translations of `texts` in their order (a single string counts as one text).

        Each Translation has `.text` (the best), `.hypotheses` (the nbest, best first, with
        score, log_prob, length and, with `attention=True`, their source attention: one
        decoder layer's cross-attention averaged over heads, recorded by the search) and
        `.truncated`. Reads an iterator in chunks of `buffer_lines`, like the command.
        `prefix` (one text for every line, or one per line) is where each translation
        starts; `constraints` (per line, a list of phrases, or one text) are target
        phrases each must contain (forced.py says how). NmtError names the line whose
        prefix or phrase the model cannot write.
        """
        return list(self.translate_iter(texts, attention, prefix, constraints))

    def translate_iter(
        self,
        texts: str | Iterable[str],
        attention: bool = False,
        prefix: str | Iterable[str] | None = None,
        constraints: Iterable[str | Sequence[str]] | None = None,
    ) -> Iterator[Translation]:
        """Like `translate`, but yields results chunk by chunk, in bounded memory."""
        lines: Iterable[str] = [texts] if isinstance(texts, str) else texts
        if prefix is None and constraints is None:
            for chunk in chunked(lines, self.cfg.buffer_lines):
                yield from self.translate_chunk(chunk, attention)
            return
        reader = ForcedReader(prefix, constraints, self.vocab.tgt, self.max_target)
        for chunk in chunked(lines, self.cfg.buffer_lines):
            yield from self.translate_chunk(chunk, attention, forced=reader.take(chunk))
        reader.finish()

    @property
    def max_target(self) -> int:
        """The most target tokens the decoder can write before its EOS."""
        return self.model.max_positions - 1

    def translate_chunk(
        self,
        lines: Sequence[str],
        attention: bool = False,
        pooled: bool = False,
        forced: Sequence[ForcedIds] | None = None,
    ) -> list[Translation]:
        """One chunk: `lines` sorted by length into batches together, results in their order.
        `pooled` sends even a single batch to a worker process (a server's decoding lanes
        each hand theirs to a free worker, side by side) where there are several. `forced`:
        per line, the target prefix and phrases it must hold (forced_input.py)."""
        needs = self._needs(lines, forced)
        ids = self.vocab.src.encode(list(lines)) if lines else []
        truncated = [len(x) > self.max_source for x in ids]
        ids = [x[: self.max_source] for x in ids]
        hyps: list[list[Hypothesis]] = [[] for _ in lines]
        order = sorted((i for i, x in enumerate(ids) if x), key=lambda i: -len(ids[i]))
        batches = list(length_batches(order, ids, self.batch_sentences, self.cfg.batch_tokens))

        rows = [[ids[i] for i in batch] for batch in batches]
        wants = [None if needs is None else [needs[i] for i in batch] for batch in batches]
        if self.workers > 1 and (len(batches) > 1 or (pooled and batches)):
            # Batches decoded side by side, one worker each: on small CPUs this beats
            # spreading every small matrix product over all cores (see set_threads).
            decoded = self._workers().map(rows, attention, wants)
        else:
            decoded = [
                self.decode_rows(batch, attention, want)
                for batch, want in zip(rows, wants, strict=True)
            ]
        for batch, results in zip(batches, decoded, strict=True):
            for i, result in zip(batch, results, strict=True):
                hyps[i] = result
        return [
            Translation(
                source=line,
                hypotheses=[
                    _result(
                        h,
                        ids[i],
                        self.vocab,
                        self.aligner is not None,
                        attention,
                        self._tree_text(h.tokens, line, needs[i]) if needs else None,
                    )
                    for h in hyps[i]
                ],
                truncated=truncated[i],
            )
            for i, line in enumerate(lines)
        ]

    def _needs(self, lines: Sequence[str], forced: Sequence[ForcedIds] | None) -> Needs:
        """Per line, what its output must be: a tree over its words (a parsing model), or
        what `forced` says; None: nothing."""
        if self.trees is not None:
            if forced is not None and any(f.tokens for f in forced):
                raise UsageError(
                    "this is a parsing model: its outputs are trees over the input's words, "
                    "so a prefix or constraints cannot be given"
                )
            trees, encode = self.trees, self.vocab.tgt.encode
            return [trees.leaves(line.split(), lambda w: encode([w])[0]) for line in lines]
        if forced is None or not any(f.tokens for f in forced):
            return None
        return list(forced)

    def _tree_text(self, tokens: list[int], line: str, need: Leaves | ForcedIds) -> str | None:
        """A word-leaved tree's text with the line's own words at its leaves (None: the
        pieces' text is the output)."""
        if self.trees is None or not isinstance(need, tuple):
            return None
        return self.trees.text(tokens, line.split(), need)

    def _constraint(self, needs: Needs, device: torch.device) -> ConstraintState | None:
        """The constraint state of one batch, one row per sentence (`_needs`)."""
        if needs is None:
            return None
        if self.trees is not None:
            return self.trees.start([n for n in needs if isinstance(n, tuple)], device)
        return PhraseState([n for n in needs if isinstance(n, ForcedIds)], device)

    def decode_rows(
        self, rows: list[list[int]], attention: bool = False, needs: Needs = None
    ) -> list[list[Hypothesis]]:
        """One batch of source token ids -> each sentence's hypotheses, recording the
        alignment layer's attention when alignments are on, or the default layer's with
        `attention`; `needs`, per sentence, what constrains its output (`_needs`)."""
        view = self.aligner
        if attention and view is None:
            view = CrossAttentionOf(self.model, default_layer(decoder_layers(self.model)) - 1)
        return self.search(self.source_tensor(rows), view, needs=needs)

    def search(
        self,
        src: Tensor,
        view: Searchable | None = None,
        nbest: int | None = None,
        needs: Needs = None,
    ) -> list[list[Hypothesis]]:
        """Search as configured over a (B, width) source tensor. Without a view, the plain
        search (greedy at beam 1); with one (views.py), beam search recording its weights.
        `needs`: per sentence, what constrains its output (`_needs`)."""
        cfg = self.cfg
        constraint = self._constraint(needs, src.device)
        if cfg.beam_size == 1 and view is None:
            return greedy_search(
                self.model, src, cfg.max_len_a, cfg.max_len_b, cfg.length_penalty, constraint
            )
        return beam_search(
            self.model if view is None else view,
            src,
            beam_size=cfg.beam_size,
            length_penalty=cfg.length_penalty,
            max_len_a=cfg.max_len_a,
            max_len_b=cfg.max_len_b,
            nbest=cfg.nbest if nbest is None else nbest,
            need_weights=view is not None,
            constraint=constraint,
        )

    def source_tensor(self, rows: list[list[int]]) -> Tensor:
        """Source ids -> (B, width) ids + EOS, right-padded, on the model's device."""
        # Widths in steps of 8 (masked padding): few distinct shapes for kernels that
        # are built per shape (as with the sentence slots a backend keeps).
        return pad_sources(rows, multiple=8).to(self.device)

    def start_workers(self) -> None:
        """Start the worker processes now, each decoding one short sentence, instead of at
        the first chunk of several batches. A server calls this before it starts any
        thread: the workers are forked, and a process forked while another thread holds a
        lock (the allocator's, a queue's) can wait for it forever."""
        if self.workers > 1:
            probe = self.vocab.src.encode(["a"])[0][:1] or [UNK_ID]
            self._workers().map([[probe]] * self.workers, False)

    def _workers(self) -> DecodePool:
        """The pool that decodes `workers` batches at once, made on first use (forked
        worker processes, which then share the model built so far: workers.py)."""
        if self._pool is None:
            self._pool = DecodePool(self, self.workers)
        return self._pool


def length_batches(
    order: list[int], ids: list[list[int]], sentences: int, tokens: int = 0
) -> Iterator[list[int]]:
    """Consecutive runs of the length-sorted sentences `order`, capped at `sentences` and,
    when `tokens` is set, at that many padded source tokens (EOS included)."""
    batch: list[int] = []
    longest = 0
    for i in order:
        length = len(ids[i]) + 1
        width = max(longest, length)
        too_many = len(batch) >= sentences
        too_big = tokens > 0 and width * (len(batch) + 1) > tokens
        if batch and (too_many or too_big):
            yield batch
            batch, width = [], length
        batch.append(i)
        longest = width
    if batch:
        yield batch


def _result(
    hyp: Hypothesis,
    src_ids: list[int],
    vocab: VocabPair,
    align: bool,
    attention: bool,
    text: str | None = None,
) -> TranslatedHypothesis:
    """A hypothesis as text (`text`, else its pieces decoded), with its alignment and
    source attention when asked for."""
    text = vocab.tgt.decode(hyp.tokens) if text is None else text
    # One output line per input line, whatever the vocabulary can produce.
    text = " ".join(text.splitlines()) if ("\n" in text or "\r" in text) else text
    alignment, source_attention = None, None
    if hyp.attention is not None:
        cross = np.stack([step[0].float().cpu().numpy() for step in hyp.attention])
        src_pieces, tgt_pieces = vocab.src.pieces(src_ids), vocab.tgt.pieces(hyp.tokens)
        if align:
            alignment = format_alignment(hard_alignment(cross, src_pieces, tgt_pieces))
        if attention:
            source_attention = SourceAttention.of(cross, src_pieces, tgt_pieces)
    return TranslatedHypothesis(
        text, hyp.score, hyp.log_prob, len(hyp.tokens), alignment, source_attention
    )


def _weight(model: Member | Ensemble) -> Tensor:
    """A weight of the model, for its device and dtype."""
    return next(cast(nn.Module, model).parameters())


def translate_lines(
    ckpt: Checkpoint, lines: Iterable[str], cfg: DecodeConfig | None = None, workers: int = 1
) -> list[str]:
    """Best translations of `lines`, detokenized, in input order, with the model built as
    `nmt translate` builds it (device, precision). `workers` batches are decoded at once
    on a CPU: call `set_threads(cfg.threads, cfg.workers)` first and pass the workers it
    returns for the layout `nmt translate` uses."""
    with Translator.from_checkpoint(ckpt, cfg or DecodeConfig(), workers) as translator:
        return [t.text for t in translator.translate_iter(lines)]
