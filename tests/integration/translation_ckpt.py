"""Tiny checkpoints for the translate/average/score tests, built in tmp_path.

A SentencePiece model trained on a few hundred generated lines and a small Transformer,
either with random weights or trained for a few seconds to copy its input (so that a
translation can be checked exactly, through tokenization and detokenization).
"""

from __future__ import annotations

import dataclasses
import random
import tempfile
from collections.abc import Callable
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
# Sentences outside that pool's order that the reverser's tests decode (alignments,
# attention pictures, the page): the reverser is trained until it reverses them all.
ALIGN_UNSEEN = [*sentences(30, seed=11), "red dog sat", "the cat", "the big red dog sat"]


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
    batch: int = 32,
    until: list[str] | None = None,
) -> Path:
    """A model trained to copy `pool` (or to reverse its words), to be decoded exactly by
    the tests. The default pool, COPY_POOL, is learned by heart: such a model may write a
    word it does not attend to, as it knows the sentence. Trained on a large random pool,
    it has to copy, and its cross-attention points at the word it writes. A separate
    target vocabulary is copied through; `seed` gives another model of the same data;
    `pre_norm` a model with pre-norm layers.

    `until` names sentences outside the pool that the model must translate exactly: after
    `steps`, training goes on in rounds of `steps // 4` updates at the final learning rate's
    tail until it does, at most four rounds, and fails loudly otherwise. How many updates
    reach a given sentence depends on the float summation order of the CPU level the
    tests run at; what the model must then do does not."""
    torch.manual_seed(seed)
    cfg = dataclasses.replace(tiny_config(vocab, d_model=64), pre_norm=pre_norm)
    model = Transformer(cfg)
    sources = COPY_POOL if pool is None else pool
    targets = [reverse_words(line) if reverse else line for line in sources]
    pairs = list(zip(vocab.src.encode(sources), vocab.tgt.encode(targets), strict=True))
    opt = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.98))
    rng = random.Random(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # Constant, then a linear decay to 0 over the last 30%.
        _train(
            model,
            opt,
            rng.sample,
            pairs,
            batch,
            steps,
            lambda s: min(1.0, (steps - s) / (0.3 * steps)),
        )
        done, extra = steps, steps // 4
        for _ in range(4 if until else 0):
            if _translates(model, cfg, vocab, until or [], reverse):
                break
            # A tenth of the rate, decayed to 0 again.
            _train(model, opt, rng.sample, pairs, batch, extra, lambda s: 0.1 * (extra - s) / extra)
            done += extra
        if until and not _translates(model, cfg, vocab, until, reverse):
            raise AssertionError(f"the test model did not learn its task in {done} updates")
    finally:
        torch.set_num_threads(threads)
    return save_checkpoint(Checkpoint(cfg, vocab, model_state(model), done), path)


LEARNING_RATE = 5e-3


def _train(
    model: Transformer,
    opt: torch.optim.Optimizer,
    sample: Callable[[list, int], list],
    pairs: list[tuple[list[int], list[int]]],
    size: int,
    steps: int,
    rate: Callable[[int], float],
) -> None:
    """`steps` Adam updates on batches of `size` pairs drawn by `sample`, the learning rate
    LEARNING_RATE times `rate(update)`."""
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = LEARNING_RATE * rate(step)
        batch = sample(pairs, size)
        width = max(max(len(x), len(y)) for x, y in batch) + 1
        src = torch.full((size, width), PAD_ID)
        tgt_in = torch.full((size, width), PAD_ID)
        tgt_out = torch.full((size, width), PAD_ID)
        for i, (x, y) in enumerate(batch):
            src[i, : len(x) + 1] = torch.tensor([*x, EOS_ID])
            tgt_in[i, : len(y) + 1] = torch.tensor([BOS_ID, *y])
            tgt_out[i, : len(y) + 1] = torch.tensor([*y, EOS_ID])
        logits = model(src, tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()


def _translates(
    model: Transformer, cfg: ModelConfig, vocab: VocabPair, lines: list[str], reverse: bool
) -> bool:
    """Whether the model, decoded as the tests decode it (fp32, the default beam), gives
    each line's copy or reversal."""
    from nmt_cli.config import DecodeConfig
    from nmt_cli.engines.translate.translator import Translator

    with tempfile.TemporaryDirectory() as tmp:
        path = save_checkpoint(Checkpoint(cfg, vocab, model_state(model), 0), Path(tmp) / "m.pt")
        with Translator.load(path, DecodeConfig(precision="fp32")) as translator:
            got = [result.text for result in translator.translate(lines)]
    return got == [reverse_words(line) if reverse else line for line in lines]
