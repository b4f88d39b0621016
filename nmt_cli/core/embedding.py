"""The embeddings of section 3.4 and the positional encodings of section 3.5.

Token embeddings are scaled by sqrt(d_model) and summed with the positions, then dropout
(section 5.4); positions are the paper's sinusoids or, as in its Table 3 (E), learned.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt_cli.core.dropout import Dropout, KeepMask
from nmt_cli.core.model_config import ModelConfig


def sinusoidal_positions(max_positions: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same), section 3.5."""
    pos = torch.arange(max_positions, dtype=torch.float64).unsqueeze(1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = pos / torch.pow(10000.0, two_i / d_model)
    table = torch.zeros(max_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class Embedding(nn.Module):
    """Token embedding times sqrt(d_model), plus positions, then dropout (section 3.4, 5.4)."""

    def __init__(self, tokens: nn.Embedding, cfg: ModelConfig, keep_mask: KeepMask | None) -> None:
        super().__init__()
        self.tokens = tokens
        self.scale = math.sqrt(cfg.d_model)
        self.dropout = Dropout(cfg.dropout, keep_mask)
        self.learned: nn.Embedding | None = None
        if cfg.positions == "learned":
            self.learned = nn.Embedding(cfg.max_positions, cfg.d_model)
            nn.init.normal_(self.learned.weight, std=cfg.d_model**-0.5)
        else:
            self.register_buffer(
                "table", sinusoidal_positions(cfg.max_positions, cfg.d_model), persistent=False
            )

    def positions(self, start: int, length: int) -> Tensor:
        if self.learned is not None:
            return self.learned.weight[start : start + length]
        table = self.get_buffer("table")
        return table[start : start + length]

    def forward(self, ids: Tensor, start: int = 0) -> Tensor:
        x = self.tokens(ids) * self.scale + self.positions(start, ids.size(1))
        return self.dropout(_autocast_stream(x))

    def step(self, ids: Tensor, position: int) -> Tensor:
        """`forward` for one position per row, ids (B,) -> (B, D); inference only."""
        x = F.embedding(ids, self.tokens.weight) * self.scale + self.positions(position, 1)
        return _autocast_stream(x)


def _autocast_stream(x: Tensor) -> Tensor:
    """Under autocast, start the residual stream in the low precision: otherwise every
    residual add promotes it back to fp32 and each linear layer casts its input again."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return x.to(torch.get_autocast_dtype(device))
    return x
