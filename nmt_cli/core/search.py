"""Greedy and batched beam search over the model's incremental-decoding interface only.

Search sees the model through `Searchable` (core/searchable.py): `source_mask`,
`encode`, `new_cache`, `decode_step`, `advance`, `decode_advance`, `slots`,
`finish_sentence`, the cache's `reorder` and `reserve`, and `max_positions`. It knows
nothing of layers or kernels, so anything with that interface is searched the same way:
one Transformer, a backend's wrapper of one, an `Ensemble` of them (core/ensemble.py,
Sockeye's design: the ensemble is a model, search has no ensemble case), or a scripted
stub in the tests.

Beam search is the paper's (section 6.1, as in tensor2tensor): a GNMT length penalty
`lp(Y) = ((5 + |Y|) / 6) ** alpha`, where |Y| counts the output tokens including the
end-of-sentence token, a maximum output length of `a * source length + b` tokens, finished
hypotheses set aside, and a sentence's search stopped as soon as no open beam can beat
them. The stopping bound is exact: log-probabilities only decrease as a hypothesis grows,
so the best score an open beam with log-probability L can still reach is
L / max(lp over the lengths it can still reach), the largest penalty, not the next one.

A beam of width K holds the K best candidates of each step. A candidate that ends with
EOS is set aside and its slot closes (the beam narrows, as in OpenNMT-py and Marian),
so beam 1 is exactly greedy decoding, and a sentence is finished when it has `nbest`
finished hypotheses that no open beam can beat, or no open beam is left.

Speed: everything is batched over sentences x beams in one (N*K, V) step, the encoder
runs once per batch, the first step runs on one row per sentence (all beams are equal
then) and only then expands the cache to K rows, candidates come from one `topk` over
the flattened (N, K*V) scores (no full-vocabulary sort; core/beam_advance.py), and
finished sentences leave the batch so late steps only pay for the sentences still open;
the model may finish a one-sentence batch in one call (core/open_sentence.py). A closed
slot (running score -inf) can offer no candidate, so a model may leave its row out of
a step's computation (the CPU backend's compiled step does, backends/cpu/decoder.py).

Attention for pictures and alignments: with `need_weights`, beam search asks the model for
each step's attention weights and keeps them with a back-pointer per row, and every
returned hypothesis carries the weights of the very steps that produced its tokens. Without
it (every normal translation) nothing is recorded and the loop is the one above.
A constraint (core/constraints.py) is searched the same way: the model is wrapped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

from nmt_cli.core.beam_advance import (
    Advance,
    decode_then_advance,
    force_eos,
    mask_specials,
    with_ends,
)
from nmt_cli.core.constraints import ConstraintState, constrain
from nmt_cli.core.open_sentence import Ended, OpenSentence
from nmt_cli.core.search_trace import Trace
from nmt_cli.core.searchable import Searchable
from nmt_cli.core.vocab import BOS_ID, EOS_ID, PAD_ID


@dataclass
class Hypothesis:
    tokens: list[int]  # target subword ids, without BOS/EOS
    score: float  # log-probability divided by the GNMT length penalty ((5+|Y|)/6)^alpha
    log_prob: float  # total log-probability (including EOS)
    # With need_weights: for each output token and the final EOS (len(tokens) + 1 steps),
    # this hypothesis's row of every tensor the model's decode_step returned at that step.
    attention: list[list[Tensor]] | None = None


LengthT = TypeVar("LengthT", float, Tensor)


def length_penalty_value(length: LengthT, alpha: float) -> LengthT:
    """GNMT: lp(Y) = ((5 + |Y|) / 6) ** alpha, |Y| including the end-of-sentence token;
    of a number or, elementwise, of a tensor of lengths."""
    return ((5.0 + length) / 6.0) ** alpha


def max_output_lengths(
    src: Tensor, max_len_a: float, max_len_b: int, max_positions: int | None
) -> Tensor:
    """Per sentence, the most output tokens before EOS is forced: a * |source| + b.

    |source| counts real tokens without the trailing EOS. The decoder cannot go past its
    positions, so the EOS itself must still fit: at most max_positions - 1 tokens before it.
    """
    src_len = (src != PAD_ID).sum(1) - 1
    limit = torch.floor(src_len.double() * max_len_a + max_len_b).long().clamp(min=0)
    if max_positions is not None:
        limit = limit.clamp(max=max_positions - 1)
    return limit


@torch.inference_mode()
def greedy_search(
    model: Searchable,
    src: Tensor,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    length_penalty: float = 0.6,
    constraint: ConstraintState | None = None,
) -> list[list[Hypothesis]]:
    """Argmax decoding: the same output as beam_search with beam_size=1, written on its
    own (one row per sentence, no candidate bookkeeping) because it is the cheapest search
    and training uses it for validation BLEU. `length_penalty` only affects the scores.
    `constraint`: one row per sentence, searched as core/constraints.py says."""
    n = src.size(0)
    device = src.device
    alpha = length_penalty
    limit = max_output_lengths(src, max_len_a, max_len_b, model.max_positions)
    if constraint is not None:
        model, limit = constrain(model, constraint, limit)
    src_mask = model.source_mask(src)
    memory = model.encode(src, src_mask)
    cache = model.new_cache()
    cache.reserve(int(limit.max()) + 1)
    first_limit = int(limit.min())  # no row reaches its limit before this step
    alive = torch.arange(n, device=device)  # original sentence of each row
    tokens = torch.full((n,), BOS_ID, dtype=torch.long, device=device)
    log_prob = torch.zeros(n, dtype=torch.float32, device=device)
    history = tokens.new_empty((n, 0))
    results: list[list[Hypothesis]] = [[] for _ in range(n)]
    step = 0
    while alive.numel():
        lprobs, _ = model.decode_step(tokens, memory, src_mask, cache)
        mask_specials(lprobs)
        forcing = step >= first_limit and bool((at_limit := limit[alive] <= step).any())
        if forcing:
            force_eos(lprobs, at_limit.nonzero().squeeze(1))
        best_lp, tokens = lprobs.max(dim=-1)
        if forcing:  # even if the model gives EOS no probability at all
            tokens = tokens.masked_fill(at_limit, EOS_ID)
        log_prob = log_prob + best_lp
        ended = tokens == EOS_ID
        if bool(ended.any()):
            lp = length_penalty_value(step + 1.0, alpha)
            ended_rows = ended.nonzero().squeeze(1)
            ids_list = history.index_select(0, ended_rows).tolist()
            sents = alive[ended_rows].tolist()
            logps = log_prob[ended_rows].tolist()
            for sent, ids, logp in zip(sents, ids_list, logps, strict=True):
                results[sent] = [Hypothesis(ids, logp / lp, logp)]
            keep = (~ended).nonzero().squeeze(1)
            cache.reorder(keep, cross=True)
            src_mask = src_mask.index_select(0, keep)
            alive, tokens, log_prob = alive[keep], tokens[keep], log_prob[keep]
            history = history.index_select(0, keep)
        history = torch.cat([history, tokens[:, None]], dim=1)
        step += 1
    return results


@torch.inference_mode()
def beam_search(
    model: Searchable,
    src: Tensor,
    beam_size: int = 4,
    length_penalty: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    nbest: int = 1,
    need_weights: bool = False,
    constraint: ConstraintState | None = None,
) -> list[list[Hypothesis]]:
    """Decode a batch: src (B, S) right-padded with 0, each row ids + [EOS].

    Returns, per sentence, its `nbest` best finished hypotheses, best first (fewer only if
    the beam closed before finding that many). With `need_weights`, each hypothesis also
    carries the attention weights of the steps that produced it (`Hypothesis.attention`);
    beam 1 then gives greedy search's output with its weights. The model chooses each
    step's candidates (`Searchable.advance`) and the sentence slots kept (`slots`).
    `constraint`: one row per sentence, searched as core/constraints.py says.
    """
    if beam_size < 1:
        raise ValueError(f"beam size must be at least 1, got {beam_size}")
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest must be between 1 and the beam size {beam_size}, got {nbest}")
    limits = (max_len_a, max_len_b)
    search = _BeamSearch(model, src, beam_size, length_penalty, limits, nbest, constraint)
    if need_weights:
        search.trace = Trace()
    return search.run()


class _BeamSearch:
    """The state of one batched beam search; rows are (sentence, beam) pairs, N*K of them."""

    def __init__(
        self,
        model: Searchable,
        src: Tensor,
        beam: int,
        alpha: float,
        limits: tuple[float, int],
        nbest: int,
        constraint: ConstraintState | None,
    ) -> None:
        self.limit = max_output_lengths(src, *limits, model.max_positions)
        if constraint is not None:
            model, self.limit = constrain(model, constraint, self.limit)
        self.model, self.src, self.k, self.alpha, self.nbest = model, src, beam, alpha, nbest
        # Largest penalty a hypothesis of each sentence can reach (EOS at the length limit).
        self.lp_at_limit = length_penalty_value(self.limit.double() + 1.0, alpha)
        n = src.size(0)
        self.finished: list[list[Hypothesis]] = [[] for _ in range(n)]
        # Score of each sentence's nbest-th finished hypothesis; -inf until it has nbest.
        self.kth_best = torch.full((n,), -math.inf, dtype=torch.float64, device=src.device)
        self.results: list[list[Hypothesis]] = [[] for _ in range(n)]
        self.trace: Trace | None = None
        self.ends: dict[int, tuple[int, int]] = {}  # id(hypothesis) -> its (step, row)
        self.any_finished = False

    def decode_step(
        self, tokens: Tensor, memory: Any, src_mask: Tensor, cache: Any
    ) -> tuple[Tensor, None]:
        """The model's step, its attention weights recorded when tracing."""
        if self.trace is None:
            lprobs, _ = self.model.decode_step(tokens, memory, src_mask, cache)
        else:
            lprobs, weights = self.model.decode_step(
                tokens, memory, src_mask, cache, need_weights=True
            )
            self.trace.add(weights)
        return lprobs, None

    def advance(self, lprobs: Tensor, cum: Tensor, history: Tensor, k: int) -> Advance:
        return self.model.advance(lprobs, cum, history, k)

    def decode_advance(self, *step: Any) -> Advance:
        """The reference step (decode_then_advance) through the two above."""
        return decode_then_advance(self, *step)

    def run(self) -> list[list[Hypothesis]]:
        model, src, k = self.model, self.src, self.k
        n, device = src.size(0), src.device
        src_mask = model.source_mask(src)
        memory = model.encode(src, src_mask)
        cache = model.new_cache()
        cache.reserve(int(self.limit.max()) + 1)
        # A batch of one sentence may be searched by the model in one call (below).
        finish = model.finish_sentence if self.trace is None else None
        if finish is not None and n == 1:
            beams = self._first_beams()
            if self._hand_over(finish, 0, beams, 0, memory, src_mask, cache):
                return self._results()

        # Step 0: one row per sentence, since every beam starts from the same BOS.
        bos = torch.full((n,), BOS_ID, dtype=torch.long, device=device)
        lprobs, _ = self.decode_step(bos, memory, src_mask, cache)
        mask_specials(lprobs)
        zero_limit = self.limit <= 0
        if bool(zero_limit.any()):
            force_eos(lprobs, zero_limit.nonzero().squeeze(1))
        width = min(k, lprobs.size(1))
        top_lp, top_tok = lprobs.topk(width, dim=1)  # (N, width)
        if width < k:
            pad = k - width
            top_lp = torch.cat([top_lp, top_lp.new_full((n, pad), -math.inf)], 1)
            top_tok = torch.cat([top_tok, top_tok.new_full((n, pad), EOS_ID)], 1)
        expand = torch.arange(n, device=device).repeat_interleave(k)
        cache.reorder(expand, cross=True)
        src_mask = src_mask.index_select(0, expand)
        sent_ids = torch.arange(n, device=device)  # original sentence of each active one
        first = with_ends(top_lp, top_tok, expand, top_tok.reshape(-1, 1))
        self._settle(first, sent_ids, 0)
        cum, history, tokens = first.cum, first.history, top_tok.reshape(-1)
        open_set = _OpenSentences(self, sent_ids, k)
        step = 1
        while True:
            if finish is not None and sent_ids.numel() == 1:
                beams = (tokens, cum, history)
                if self._hand_over(finish, int(sent_ids[0]), beams, step, memory, src_mask, cache):
                    break
                finish = None
            # Until some hypothesis has finished no sentence can be done (its nbest-th
            # score is still -inf), so the bound is only computed from then on.
            done = self._done(cum, open_set, step) if self.any_finished else None
            if done is not None and bool(done.any()):
                if bool(done.all()):
                    break
                # A finished sentence's slots close; it leaves the batch once the open
                # ones fit fewer slots (Searchable.slots), until then it is filler.
                cum = cum.masked_fill(done[:, None], -math.inf)
                n_open = int((~done).sum())
                target = model.slots(n_open, k)
                if target < sent_ids.numel():
                    filler = done.nonzero().squeeze(1)[: target - n_open]
                    keep = torch.cat([(~done).nonzero().squeeze(1), filler]).sort().values
                    rows = (keep[:, None] * k + torch.arange(k, device=device)).reshape(-1)
                    cache.reorder(rows, cross=True)
                    src_mask = src_mask.index_select(0, rows)
                    sent_ids, cum = sent_ids[keep], cum[keep]
                    history, tokens = history[rows], tokens[rows]
                    open_set = _OpenSentences(self, sent_ids, k)
                    if self.trace is not None:
                        self.trace.keep(rows)
            at_limit = None
            if step >= open_set.first_limit:
                at_limit = (self.limit[sent_ids] <= step).repeat_interleave(k)
            # Recording, the reference step through this search's own decode_step.
            stepper = model.decode_advance if self.trace is None else self.decode_advance
            chosen = stepper(tokens, memory, src_mask, cache, cum.view(-1), history, k, at_limit)
            self._settle(chosen, sent_ids, step)
            # Beams reorder within their sentence: the cross-attention keys stay valid.
            cache.reorder(chosen.origin, cross=False)
            cum, history, tokens = chosen.cum, chosen.history, chosen.tokens.view(-1)
            step += 1
        return self._results()

    def _results(self) -> list[list[Hypothesis]]:
        """Each sentence's `nbest` best finished hypotheses, best first."""
        for sent, hyps in enumerate(self.finished):
            hyps.sort(key=lambda h: h.score, reverse=True)
            self.results[sent] = hyps[: self.nbest]
            if self.trace is not None:
                for hyp in self.results[sent]:
                    hyp.attention = self.trace.path(*self.ends[id(hyp)])
        return self.results

    def _first_beams(self) -> tuple[Tensor, Tensor, Tensor]:
        """A sentence's beams before its first step, as a step after it leaves them: every
        beam's token BOS, the first beam open (score 0) and the others closed (-inf), so
        that the first step's candidates are the first beam's, as step 0 takes them from
        one row; no tokens yet."""
        device, k = self.src.device, self.k
        tokens = torch.full((k,), BOS_ID, dtype=torch.long, device=device)
        cum = torch.full((k,), -math.inf, device=device)
        cum[0] = 0.0
        return tokens, cum, torch.empty((k, 0), dtype=torch.long, device=device)

    def _hand_over(self, finish: Any, sent: int, beams: tuple[Tensor, ...], step: int,
                   *model_state: Any) -> bool:  # fmt: skip
        """A one-sentence batch (its beams' tokens, running scores, histories) to the model's
        `finish_sentence`; its hypotheses set aside as _settle's. False: no such route."""
        tokens, cum, history = beams
        state = OpenSentence(
            tokens, cum.view(-1), history, step, self.k, self.nbest, self.alpha,
            int(self.limit[sent]), float(self.lp_at_limit[sent]),
            [hyp.score for hyp in self.finished[sent]], self.any_finished,
        )  # fmt: skip
        ended: list[Ended] | None = finish(state, *model_state)
        if ended is None:
            return False
        for ids, log_prob, at in ended:
            lp = length_penalty_value(at + 1.0, self.alpha)
            self._add(sent, Hypothesis(ids, log_prob / lp, log_prob))
        return True

    def _settle(self, chosen: Advance, sent_ids: Tensor, step: int) -> None:
        """Set aside the chosen candidates that end with EOS as finished hypotheses.
        `chosen.origin` gives each candidate's row in this step's model call (for the
        attention trace)."""
        if chosen.any_ended:
            self.any_finished = True
            lp = length_penalty_value(step + 1.0, self.alpha)
            where = chosen.ended.nonzero()  # (F, 2): sentence row, beam slot
            rows = where[:, 0] * self.k + where[:, 1]
            ids_list = chosen.history.index_select(0, rows)[:, :-1].tolist()
            sents = sent_ids[where[:, 0]].tolist()
            calls = chosen.origin[rows].tolist() if self.trace is not None else [0] * len(sents)
            for sent, ids, logp, call in zip(
                sents, ids_list, chosen.top_lp[chosen.ended].tolist(), calls, strict=True
            ):
                hyp = Hypothesis(ids, logp / lp, logp)
                if self.trace is not None:
                    self.ends[id(hyp)] = (step, call)
                self._add(sent, hyp)
        if self.trace is not None:
            self.trace.from_rows = chosen.origin

    def _add(self, sent: int, hyp: Hypothesis) -> None:
        hyps = self.finished[sent]
        hyps.append(hyp)
        if len(hyps) >= self.nbest:
            hyps.sort(key=lambda h: h.score, reverse=True)
            del hyps[self.nbest :]  # a hypothesis below the nbest-th can never come back
            self.kth_best[sent] = hyps[-1].score

    def _done(self, cum: Tensor, open_set: _OpenSentences, step: int) -> Tensor:
        """A sentence is done when no open beam can beat its nbest-th finished hypothesis:
        an open beam's best reachable score is its log-prob over the largest penalty it
        can still reach, at the next step or at the length limit, whichever is larger
        (lp grows with length for alpha > 0, shrinks for alpha < 0)."""
        best_open = cum.max(dim=1).values  # (N,) -inf when every slot is closed
        lp_next = length_penalty_value(step + 1.0, self.alpha)
        bound = best_open / open_set.lp_at_limit.clamp(min=lp_next)
        return self.kth_best[open_set.sent_ids] >= bound


class _OpenSentences:
    """What the beam loop needs of the sentences in the batch, computed once each time
    the batch changes rather than at every step."""

    def __init__(self, search: _BeamSearch, sent_ids: Tensor, k: int) -> None:
        self.sent_ids = sent_ids
        self.lp_at_limit = search.lp_at_limit[sent_ids]
        # The first step at which some sentence must end (its length limit).
        self.first_limit = int(search.limit[sent_ids].min())
