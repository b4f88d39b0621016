"""Tiny checkpoints for the translate/average/score tests, built in tmp_path.

A SentencePiece model trained on a few hundred generated lines and a small Transformer,
either with random weights or trained for a few seconds to copy its input (so that a
translation can be checked exactly, through tokenization and detokenization).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import torch
import torch.nn.functional as F

from nmt_cli.core.checkpoint import Checkpoint, model_state, save_checkpoint
from nmt_cli.core.transformer import ModelConfig, Transformer
from nmt_cli.core.vocab import BOS_ID, EOS_ID, PAD_ID, VocabPair, train_sentencepiece

WORDS = [
    *("the", "a", "cat", "dog", "sat", "ran", "on", "under"),
    *("mat", "tree", "red", "big", "small", "house", "blue", "green"),
]


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    # No word twice in a sentence: the copy model learns these exactly in a few seconds.
    return [" ".join(rng.sample(WORDS, rng.randint(2, 6))) for _ in range(n)]


def tiny_vocab() -> VocabPair:
    proto = train_sentencepiece(sentences(400), vocab_size=48)
    return VocabPair.from_protos(proto, proto)


def separate_vocab() -> VocabPair:
    """Source and target SentencePiece models of different sizes (no shared matrix)."""
    src = train_sentencepiece(sentences(400), vocab_size=48)
    tgt = train_sentencepiece(sentences(400, seed=1), vocab_size=44)
    return VocabPair.from_protos(src, tgt)


def tiny_config(
    vocab: VocabPair, max_positions: int = 40, d_model: int = 32, n_heads: int = 2
) -> ModelConfig:
    return ModelConfig(
        encoder_layers=1,
        decoder_layers=1,
        d_model=d_model,
        d_ff=2 * d_model,
        n_heads=n_heads,
        dropout=0.0,
        src_vocab_size=len(vocab.src),
        tgt_vocab_size=len(vocab.tgt),
        joint_vocab=vocab.joint,
        max_positions=max_positions,
    )


def random_checkpoint(
    path: Path, vocab: VocabPair, seed: int = 0, step: int = 0, **cfg: int
) -> Path:
    torch.manual_seed(seed)
    model = Transformer(tiny_config(vocab, **cfg))
    return save_checkpoint(Checkpoint(model.cfg, vocab, model_state(model), step), path)


# The sentences the copy model learns by heart; tests translate only these.
COPY_POOL = [*sentences(40, seed=5), "the cat", "red dog", "the red cat", "a dog"]

# Too many sentences to learn by heart: a model trained on them copies (or reverses) for
# real, so the alignment tests can translate sentences it has never seen.
ALIGN_POOL = sentences(5000, seed=7)


def reverse_words(line: str) -> str:
    return " ".join(reversed(line.split()))


def copy_checkpoint(
    path: Path,
    vocab: VocabPair,
    steps: int = 200,
    reverse: bool = False,
    pool: list[str] | None = None,
    seed: int = 0,
    pre_norm: bool = False,
) -> Path:
    """A model trained to copy `pool` (or to reverse its words), to be decoded exactly by
    the tests. The default pool, COPY_POOL, is learned by heart: such a model may write a
    word it does not attend to, as it knows the sentence. Trained on a large random pool,
    it has to copy, and its cross-attention points at the word it writes. A separate
    target vocabulary is copied through; `seed` gives another model of the same data;
    `pre_norm` a model with pre-norm layers."""
    torch.manual_seed(seed)
    cfg = dataclasses.replace(tiny_config(vocab, d_model=64), pre_norm=pre_norm)
    model = Transformer(cfg)
    sources = COPY_POOL if pool is None else pool
    targets = [reverse_words(line) if reverse else line for line in sources]
    pairs = list(zip(vocab.src.encode(sources), vocab.tgt.encode(targets), strict=True))
    opt = torch.optim.Adam(model.parameters(), lr=5e-3, betas=(0.9, 0.98))
    decay = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (steps - s) / (0.3 * steps)))
    rng = random.Random(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(steps):
            batch = rng.sample(pairs, 32)
            width = max(max(len(x), len(y)) for x, y in batch) + 1
            src = torch.full((32, width), PAD_ID)
            tgt_in = torch.full((32, width), PAD_ID)
            tgt_out = torch.full((32, width), PAD_ID)
            for i, (x, y) in enumerate(batch):
                src[i, : len(x) + 1] = torch.tensor([*x, EOS_ID])
                tgt_in[i, : len(y) + 1] = torch.tensor([BOS_ID, *y])
                tgt_out[i, : len(y) + 1] = torch.tensor([*y, EOS_ID])
            logits = model(src, tgt_in)
            loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID)
            opt.zero_grad()
            loss.backward()
            opt.step()
            decay.step()
    finally:
        torch.set_num_threads(threads)
    return save_checkpoint(Checkpoint(cfg, vocab, model_state(model), steps), path)
