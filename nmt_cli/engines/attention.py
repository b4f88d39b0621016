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
from dataclasses import dataclass

import numpy as np
import torch

from nmt_cli.core.search import beam_search
from nmt_cli.engines.alignment import MERGE_NOTE, merge_words, word_labels
from nmt_cli.engines.attention_views import EveryAttention
from nmt_cli.engines.translate import Translator
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
    vocab, cfg = translator.vocab, translator.cfg
    ids = vocab.src.encode([sentence])[0][: translator.max_source]
    if not ids:
        raise NmtError("the sentence is empty: give some text to translate")
    view = EveryAttention(translator.model)
    hyps = beam_search(
        view,
        translator.source_tensor([ids]),
        beam_size=cfg.beam_size,
        length_penalty=cfg.length_penalty,
        max_len_a=cfg.max_len_a,
        max_len_b=cfg.max_len_b,
        need_weights=True,
    )[0]
    best = hyps[0]
    assert best.attention is not None
    n_src, n_tgt, layers = len(ids) + 1, len(best.tokens) + 1, len(translator.model.decoder)
    encoder = torch.stack([w[0, :, :n_src, :n_src] for w in view.encoder])
    heads = encoder.size(1)
    decoder = torch.zeros(layers, heads, n_tgt, n_tgt)
    cross = torch.zeros(layers, heads, n_tgt, n_src)
    for t, step in enumerate(best.attention):
        for layer in range(layers):
            decoder[layer, :, t, : t + 1] = step[layer][:, 0].float()
            cross[layer, :, t] = step[layers + layer][:, 0, :n_src].float()
    pieces = vocab.tgt.pieces(best.tokens)
    return AttentionMaps(
        source_text=sentence,
        translation=vocab.tgt.decode(best.tokens),
        source=[*vocab.src.pieces(ids), EOS],
        target=[*pieces, EOS],
        decoder_inputs=[BOS, *pieces],
        encoder=encoder.float().cpu().numpy(),
        decoder=decoder.numpy(),
        cross=cross.numpy(),
    )
