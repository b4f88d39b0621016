"""Dev-set figures at each checkpoint: loss and perplexity, optionally greedy BLEU.

The dev loss is the plain per-token NLL (perplexity = exp of it), comparable with the
paper's Table 3 perplexities, plus the label-smoothed loss the optimiser sees. BLEU on
the first M dev sentences with greedy decoding is a cheap signal that translation
improves; the final figure comes from beam search on the averaged model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from nmt_cli.config import DecodeConfig, RecipeConfig
from nmt_cli.core.batching import Batch, collate, length_grouped_batches, pad_sources
from nmt_cli.core.data import TokenStore
from nmt_cli.core.eval_mode import evaluating
from nmt_cli.core.losses import LossSweep, label_smoothed_sums, smoothed_loss_sweep
from nmt_cli.core.precision import autocast
from nmt_cli.core.transformer import Transformer
from nmt_cli.core.vocab import PAD_ID, VocabPair
from nmt_cli.data_dir import PreparedData
from nmt_cli.engines.train.distributed import DistContext
from nmt_cli.engines.train.events import BatchSplit
from nmt_cli.engines.translate.translator import Translator


@dataclass(frozen=True)
class DevFigures:
    loss: float  # label-smoothed, per target token
    nll: float  # per target token
    bleu: float | None

    @property
    def ppl(self) -> float:
        return math.exp(min(self.nll, 100.0))


class DevSet:
    """The dev split, collated once (dev sets are small) in a fixed length order; with
    several ranks, each holds every `world`-th batch from its `rank` on, and the ranks'
    sums add up to the whole set's."""

    def __init__(
        self,
        src: TokenStore,
        tgt: TokenStore,
        max_tokens: int,
        multiple: int = 1,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        self.src, self.tgt = src, tgt
        order = length_grouped_batches(
            src.lengths, tgt.lengths, max_tokens, seed=0, epoch=0, shuffle=False, multiple=multiple
        )
        self.batches: list[Batch] = [collate(src, tgt, idx, multiple) for idx in order[rank::world]]

    def __len__(self) -> int:
        return len(self.src)

    def sample(self, longest: int = 30) -> list[int]:
        """The source ids of the dev sentence whose attention TensorBoard shows at every
        validation: the first of at most `longest` tokens (small enough to read), else
        the shortest."""
        lengths = self.src.lengths
        fits = np.flatnonzero(lengths <= longest)
        index = int(fits[0]) if fits.size else int(np.argmin(lengths))
        return [int(i) for i in self.src[index]]


@torch.no_grad()
def dev_loss(
    model: nn.Module,
    dev: DevSet,
    label_smoothing: float,
    precision: str,
    device: torch.device,
    all_sum: Callable[[list[float]], list[float]] = list,
    loss_sweep: LossSweep = smoothed_loss_sweep,
) -> tuple[float, float]:
    """(smoothed loss, nll) per target token over the whole dev set; `all_sum` adds the
    sums of every rank's share (DistContext.all_sum); `loss_sweep` as training's."""

    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    nll_sum = torch.zeros((), dtype=torch.float64, device=device)
    tokens = 0
    with evaluating(model):
        for batch in dev.batches:
            b = batch.to(device)
            with autocast(precision, device):
                logits = model(b.src, b.tgt_in)
                loss, nll = label_smoothed_sums(
                    logits, b.tgt_out, label_smoothing, PAD_ID, loss_sweep
                )
            loss_sum += loss.double()
            nll_sum += nll.double()
            tokens += b.tgt_tokens
    summed, nll_summed, total = all_sum([float(loss_sum), float(nll_sum), float(tokens)])
    return summed / max(total, 1.0), nll_summed / max(total, 1.0)


@torch.no_grad()
def greedy_bleu(
    model: Transformer,
    dev: DevSet,
    vocab: VocabPair,
    sentences: int,
    references: Path | None,
    max_len_a: float,
    max_len_b: int,
    precision: str,
    device: torch.device,
    batch_size: int = 64,
) -> float:
    """sacreBLEU of greedy translations of the first `sentences` dev sentences.

    References are the raw dev text when the data directory has it (true detokenized
    BLEU), otherwise the decoded dev target ids. The translator's search decodes the dev
    token ids as they are stored, in dev order and in the training precision, so the
    figure does not depend on re-encoding the raw text or on translate's batching.
    """
    import sacrebleu

    n = min(sentences, len(dev))
    if references is not None and references.is_file():
        with open(references, encoding="utf-8") as fh:
            refs = [line.rstrip("\n") for _, line in zip(range(n), fh, strict=False)]
    else:
        refs = [vocab.tgt.decode(dev.tgt[i].tolist()) for i in range(n)]
    translator = Translator(
        model, vocab, DecodeConfig(beam_size=1, max_len_a=max_len_a, max_len_b=max_len_b)
    )
    hyps: list[str] = []
    with evaluating(model):
        for lo in range(0, n, batch_size):
            src = pad_sources([dev.src[i] for i in range(lo, min(n, lo + batch_size))])
            src = src.to(device)
            with autocast(precision, device):
                results = translator.search(src)
            hyps.extend(vocab.tgt.decode(r[0].tokens) for r in results)
    return float(sacrebleu.corpus_bleu(hyps, [refs[: len(hyps)]]).score)


class Validator:
    """The dev figures of the model being trained, as each step checkpoint records them."""

    def __init__(
        self,
        model: Transformer,
        data: PreparedData,
        recipe: RecipeConfig,
        precision: str,
        device: torch.device,
        split: BatchSplit,
        multiple: int = 1,
        ctx: DistContext | None = None,
        loss_sweep: LossSweep = smoothed_loss_sweep,
    ) -> None:
        self.model, self.data, self.recipe = model, data, recipe
        self.loss_sweep = loss_sweep
        self.precision, self.device = precision, device
        self.ctx = ctx or DistContext(0, 1, 0, device)
        self.dev = DevSet(
            *data.split("valid"),
            max_tokens=split.max_tokens,
            multiple=multiple,
            rank=self.ctx.rank,
            world=self.ctx.world,
        )

    def __call__(self) -> DevFigures:
        """Every rank calls it at once: each computes its share of the dev loss (greedy
        BLEU is rank 0's alone; the other ranks get None for it)."""
        tc, decode = self.recipe.train, self.recipe.decode
        loss, nll = dev_loss(
            self.model,
            self.dev,
            tc.label_smoothing,
            self.precision,
            self.device,
            self.ctx.all_sum,
            self.loss_sweep,
        )
        bleu = None
        if tc.validate_bleu_sentences > 0 and self.ctx.is_main:
            bleu = greedy_bleu(
                self.model,
                self.dev,
                self.data.vocab,
                tc.validate_bleu_sentences,
                self.data.raw_text("valid", "tgt"),
                decode.max_len_a,
                decode.max_len_b,
                self.precision,
                self.device,
            )
        return DevFigures(loss, nll, bleu)
