"""A tiny Transformer trained in a few seconds to reverse sequences: a trained model
whose every correct output is known, for exact decoding tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt_cli.core.transformer import ModelConfig, Transformer

EOS = 3
V = 10  # pad, unk, bos, eos and six symbols


def reverse_batch(n: int, gen: torch.Generator, max_len: int = 5) -> tuple[Tensor, ...]:
    lengths = torch.randint(2, max_len + 1, (n,), generator=gen)
    ids = torch.randint(4, V, (n, max_len + 1), generator=gen)
    pos = torch.arange(max_len + 1)[None]
    real = pos < lengths[:, None]
    rev = ids.gather(1, (lengths[:, None] - 1 - pos).clamp(min=0)).masked_fill(~real, 0)
    rows = torch.arange(n)
    src = ids.masked_fill(~real, 0)
    src[rows, lengths] = EOS
    tgt_out = rev.clone()
    tgt_out[rows, lengths] = EOS
    tgt_in = torch.cat([torch.full((n, 1), 2), rev[:, :-1]], 1)
    return src, tgt_in, tgt_out


def train_reverser() -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        encoder_layers=1,
        decoder_layers=1,
        d_model=32,
        d_ff=64,
        n_heads=2,
        dropout=0.0,
        src_vocab_size=V,
        tgt_vocab_size=V,
        max_positions=16,
    )
    model = Transformer(cfg)
    steps = 500
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.98))
    decay = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (steps - s) / (0.3 * steps)))
    gen = torch.Generator().manual_seed(1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest and deterministic
    try:
        for _ in range(steps):
            src, tgt_in, tgt_out = reverse_batch(64, gen)
            logits = model(src, tgt_in).view(-1, V)
            loss = F.cross_entropy(logits, tgt_out.view(-1), ignore_index=0)
            opt.zero_grad()
            loss.backward()
            opt.step()
            decay.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()
