"""Every attention weight of one translated sentence, from the search that translates it.

    record_attention(translator, sentence) -> AttentionMaps

The encoder runs once with its weights written out, beam search records each step's
decoder weights with back-pointers, and the best hypothesis brings back the weights of the
steps that produced it: the pictures show the forward pass that chose the translation, not
a second pass over it. Arrays are float32 numpy, (layers, heads, rows, columns); rows
attend to columns and each row sums to one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from nmt_cli.config import DecodeConfig
from nmt_cli.core.batching import pad_sources
from nmt_cli.core.ensemble import Ensemble
from nmt_cli.core.eval_mode import evaluating
from nmt_cli.core.transformer import Transformer
from nmt_cli.core.vocab import VocabPair
from nmt_cli.engines.translate.alignment import MERGE_NOTE, merge_words, word_labels
from nmt_cli.engines.translate.translator import Translator
from nmt_cli.engines.translate.views import EveryAttention
from nmt_cli.errors import NmtError

BOS, EOS = "<s>", "</s>"


@dataclass(frozen=True)
class AttentionMaps:
    """The attention of one sentence and its translation.

    `target` labels the rows of decoder self- and cross-attention: the token produced at
    each step (the last one `</s>`). `decoder_inputs` labels the columns of decoder
    self-attention: what the decoder was fed (`<s>`, then the tokens produced so far).
    """

    source_text: str
    translation: str
    source: list[str]  # encoder tokens, `</s>` last
    target: list[str]
    decoder_inputs: list[str]
    encoder: np.ndarray  # (encoder layers, heads, source, source)
    decoder: np.ndarray  # (decoder layers, heads, target, decoder inputs), causal
    cross: np.ndarray  # (decoder layers, heads, target, source)
    words: bool = False  # pieces merged into words (see MERGE_NOTE)

    @property
    def unit_note(self) -> str:
        """What a token is, for every legend."""
        return MERGE_NOTE if self.words else "SentencePiece pieces (▁ starts a word)"

    def merged(self) -> AttentionMaps:
        """The same maps over words instead of pieces."""
        if self.words:
            return self
        return dataclasses.replace(
            self,
            source=word_labels(self.source),
            target=word_labels(self.target),
            decoder_inputs=word_labels(self.decoder_inputs),
            encoder=merge_words(self.encoder, self.source, self.source),
            decoder=merge_words(self.decoder, self.target, self.decoder_inputs),
            cross=merge_words(self.cross, self.target, self.source),
            words=True,
        )


def record_attention(translator: Translator, sentence: str) -> AttentionMaps:
    """Translate `sentence` (beam search as the translator is configured, best hypothesis)
    and return its attention maps."""
    ids = translator.vocab.src.encode([sentence])[0][: translator.max_source]
    if not ids:
        raise NmtError("the sentence is empty: give some text to translate")
    return _maps(translator, ids, sentence)


def attention_of(
    model: Transformer,
    vocab: VocabPair,
    ids: Sequence[int],
    cfg: DecodeConfig,
    source_text: str | None = None,
) -> AttentionMaps:
    """The attention maps of source `ids` (without EOS) and their best translation, by a
    model being trained: in eval mode for the call, and restored after."""
    with evaluating(model):
        return _maps(Translator(model, vocab, cfg), [int(i) for i in ids], source_text)


def _maps(translator: Translator, ids: list[int], source_text: str | None) -> AttentionMaps:
    """Search as the translator does, through a view that records every weight."""
    model, vocab = translator.model, translator.vocab
    if isinstance(model, Ensemble):
        raise NmtError("attention maps are drawn for one model, not an ensemble")
    view = EveryAttention(model)
    src = pad_sources([ids]).to(translator.device)  # one sentence: no padding at all
    best = translator.search(src, view, nbest=1)[0][0]
    assert best.attention is not None
    n_src, n_tgt, layers = len(ids) + 1, len(best.tokens) + 1, view.model.cfg.decoder_layers
    encoder = torch.stack([w[0, :, :n_src, :n_src] for w in view.encoder]).float()
    decoder = torch.zeros(layers, encoder.size(1), n_tgt, n_tgt)
    cross = torch.zeros(layers, encoder.size(1), n_tgt, n_src)
    for t, step in enumerate(best.attention):
        for layer in range(layers):
            decoder[layer, :, t, : t + 1] = step[layer][:, 0].float().cpu()
            cross[layer, :, t] = step[layers + layer][:, 0, :n_src].float().cpu()
    pieces = vocab.tgt.pieces(best.tokens)
    return AttentionMaps(
        source_text=vocab.src.decode(ids) if source_text is None else source_text,
        translation=vocab.tgt.decode(best.tokens),
        source=[*vocab.src.pieces(ids), EOS],
        target=[*pieces, EOS],
        decoder_inputs=[BOS, *pieces],
        encoder=encoder.cpu().numpy(),
        decoder=decoder.numpy(),
        cross=cross.numpy(),
    )
