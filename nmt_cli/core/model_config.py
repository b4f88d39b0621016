"""The Transformer's configuration: the knobs of the paper's Table 3, without torch.

Kept apart from the model itself so that reading a recipe (and `nmt --help`, `nmt score`,
`nmt prepare --list`) does not load PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nmt_cli.core.settings import SettingError, at_least, fraction, one_of

PositionKind = Literal["sinusoidal", "learned"]
# The feed-forward's nonlinearity: the paper's ReLU (section 3.3), or SiLU (swish) and
# exact GELU, which models trained elsewhere (OPUS-MT, fairseq) use.
Activation = Literal["relu", "silu", "gelu"]
ACTIVATIONS: tuple[Activation, ...] = ("relu", "silu", "gelu")


@dataclass(frozen=True)
class ModelConfig:
    """Every knob of the paper's Table 3 plus the vocabulary the model is built for.

    `d_k` and `d_v` default to d_model / n_heads but can be set on their own (row B changes
    d_k alone). Vocabulary sizes are filled in from the data when the model is built.
    """

    encoder_layers: int = 6
    decoder_layers: int = 6
    d_model: int = 512
    d_ff: int = 2048
    n_heads: int = 8
    d_k: int | None = None
    d_v: int | None = None
    dropout: float = 0.1
    attention_dropout: float = 0.0
    relu_dropout: float = 0.0
    positions: PositionKind = "sinusoidal"
    max_positions: int = 1024
    src_vocab_size: int = 0
    tgt_vocab_size: int = 0
    pad_id: int = 0
    share_embeddings: bool = True
    joint_vocab: bool = True  # one vocabulary for both sides; filled in from the data
    activation: Activation = "relu"
    # A learned bias on the pre-softmax projection: not the paper's (section 3.4 ties the
    # projection to the embedding and adds nothing), but Marian's models have one.
    output_bias: bool = False
    # Restricted self-attention (Table 1): a query sees keys less than this many positions
    # away, the decoder's only earlier ones (core/local_attention.py); 0 is full attention.
    attention_window: int = 0
    # x + Dropout(Sublayer(LayerNorm(x))), a final norm per stack (fairseq's normalize_before)
    pre_norm: bool = False

    def __post_init__(self) -> None:
        at_least("model", self, 1, "encoder_layers", "decoder_layers", "d_model", "d_ff")
        at_least("model", self, 1, "n_heads")
        for name in ("d_k", "d_v"):
            if getattr(self, name) is not None:
                at_least("model", self, 1, name)
        at_least("model", self, 2, "max_positions")  # one token and its end-of-sentence
        at_least("model", self, 0, "src_vocab_size", "tgt_vocab_size", "pad_id")
        if (self.d_k is None or self.d_v is None) and self.d_model % self.n_heads:
            raise SettingError(
                "model.n_heads",
                f"({self.n_heads}) must divide model.d_model ({self.d_model}) unless "
                "model.d_k and model.d_v are set",
            )
        fraction("model", self, "dropout", "attention_dropout", "relu_dropout")
        sizes = (self.src_vocab_size, self.tgt_vocab_size)
        if self.joint_vocab and all(sizes) and sizes[0] != sizes[1]:
            raise ValueError(
                f"a joint vocabulary has one size, got {self.src_vocab_size} source and "
                f"{self.tgt_vocab_size} target pieces"
            )
        one_of("model", self, "positions", ("sinusoidal", "learned"))
        one_of("model", self, "activation", ACTIVATIONS)
        at_least("model", self, 0, "attention_window")

    @property
    def head_dim_k(self) -> int:
        return self.d_k if self.d_k is not None else self.d_model // self.n_heads

    @property
    def head_dim_v(self) -> int:
        return self.d_v if self.d_v is not None else self.d_model // self.n_heads

    @property
    def three_way_tying(self) -> bool:
        """Section 3.4: "we share the same weight matrix between the two embedding layers
        and the pre-softmax linear transformation". That needs one vocabulary for both
        sides: with two SentencePiece models, source piece 10 and target piece 10 are
        different strings, so the source gets its own matrix and only the target embedding
        and the output projection stay tied (whatever the two sizes)."""
        return self.share_embeddings and self.joint_vocab
