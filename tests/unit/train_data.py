"""Tiny prepared data directories and recipes for the training tests, built in tmp_path.

The data directory follows `nmt_cli/data_dir.py`'s contract (manifest, SentencePiece
model, token stores, raw dev text) without going through `nmt prepare`, so the training
tests depend on nothing but the core. The "translation" reverses the word order, which a
tiny model starts to learn within a few dozen steps.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from nmt_cli.config import DataConfig, RecipeConfig, TrainConfig
from nmt_cli.core.batching import Batch, collate
from nmt_cli.core.data import TokenStore, TokenStoreWriter
from nmt_cli.core.objective import TrainingObjective
from nmt_cli.core.transformer import ModelConfig, Transformer
from nmt_cli.core.vocab import Vocab, train_sentencepiece
from nmt_cli.engines.train.distributed import DistContext
from nmt_cli.engines.train.step import Updater

WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "ran",
    "on",
    "under",
    "mat",
    "tree",
    "red",
    "big",
    "small",
    "house",
    "blue",
    "green",
]


def pairs(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 9))]
        out.append((" ".join(words), " ".join(reversed(words))))
    return out


@lru_cache(maxsize=1)
def _proto() -> bytes:
    lines = [s for p in pairs(300, seed=99) for s in p]
    return train_sentencepiece(lines, vocab_size=40)


def write_store(prefix: Path, vocab_size: int, seqs: list[list[int]]) -> None:
    """A token store of `seqs`, written as `nmt prepare` writes one (`add_flat`)."""
    writer = TokenStoreWriter(prefix, vocab_size)
    flat = [i for seq in seqs for i in seq]
    writer.add_flat(np.array(flat, dtype=np.int64), np.array([len(s) for s in seqs]))
    writer.close()


def make_data_dir(root: Path, n_train: int = 96, n_valid: int = 12) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    proto = _proto()
    (root / "spm.model").write_bytes(proto)
    vocab = Vocab.from_proto(proto)
    splits = {"train": pairs(n_train, seed=1), "valid": pairs(n_valid, seed=2)}
    for name, items in splits.items():
        for side, col in (("src", 0), ("tgt", 1)):
            write_store(root / f"{name}.{side}", len(vocab), vocab.encode([p[col] for p in items]))
            if name != "train":
                text = "".join(p[col] + "\n" for p in items)
                (root / f"{name}.{side}.txt").write_text(text, encoding="utf-8")
    manifest = {
        "format": "nmt-data",
        "version": 1,
        "src": "en",
        "tgt": "de",
        "splits": {name: {"pairs": len(items)} for name, items in splits.items()},
        "vocab": {"src_model": "spm.model", "tgt_model": "spm.model"},
        "files": {},
    }
    (root / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return root


def tiny_recipe(data_dir: Path, run_dir: Path, **train: object) -> RecipeConfig:
    settings: dict[str, object] = {
        "run_dir": str(run_dir),
        "batch_tokens": 240,
        "max_tokens": 120,
        "warmup_steps": 4,
        "max_steps": 6,
        "save_interval_minutes": 0.0,
        "save_interval_steps": 3,
        "log_interval_steps": 1,
        "keep_last": 2,
        "precision": "fp32",
        "threads": 1,
    }
    settings.update(train)
    return RecipeConfig(
        name="tiny",
        data=DataConfig(dir=str(data_dir)),
        model=ModelConfig(
            encoder_layers=1,
            decoder_layers=1,
            d_model=32,
            d_ff=64,
            n_heads=4,
            dropout=0.1,
            max_positions=64,
        ),
        train=TrainConfig(**settings),  # type: ignore[arg-type]
    )


def with_model(recipe: RecipeConfig, **changes: object) -> RecipeConfig:
    return dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, **changes))  # type: ignore[arg-type]


def ddp_update_worker(ctx: DistContext, fused_projection: bool = False) -> float:
    """Each of 2 gloo ranks updates a DDP model on its own batch; rank 0 then updates a
    single-process copy on both batches padded into one, and returns the largest weight
    difference between the two results. `fused_projection` picks the loss form (the
    fused one uses the tied weight inside the loss, which DDP must still see)."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        encoder_layers=1,
        decoder_layers=1,
        d_model=16,
        d_ff=32,
        n_heads=2,
        dropout=0.0,
        src_vocab_size=30,
        tgt_vocab_size=30,
        max_positions=32,
    )
    model = Transformer(cfg)
    start = copy.deepcopy(model.state_dict())
    gen = torch.Generator().manual_seed(5)
    seqs = [
        (
            torch.randint(4, 30, (int(n),), generator=gen).tolist(),
            torch.randint(4, 30, (int(m),), generator=gen).tolist(),
        )
        for n, m in [(3, 5), (7, 2), (4, 4), (9, 8), (2, 6)]
    ]
    halves = [seqs[:2], seqs[2:]]  # uneven on purpose: 2 and 3 sentences
    total = sum(len(t) + 1 for _, t in seqs)

    def run(m: Transformer, examples: list[tuple[list[int], list[int]]], world: int) -> None:
        # SGD with lr 1: the weight change is the gradient itself (Adam's first step is
        # lr * sign(g), which would magnify rounding noise in near-zero gradients).
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        objective: torch.nn.Module = TrainingObjective(m, 0.1, 0, fused_projection)
        if world > 1:
            objective = torch.nn.parallel.DistributedDataParallel(objective)
        upd = Updater(objective, opt, "fp32", torch.device("cpu"), 0.0, world)
        upd.update([(batch_of(examples), 1.0)], total, 1.0, [0])

    run(model, halves[ctx.rank], world=2)
    if ctx.rank != 0:
        return 0.0
    single = Transformer(cfg)
    single.load_state_dict(start)
    run(single, seqs, world=1)
    ref = single.state_dict()
    return max(float((v - ref[k]).abs().max()) for k, v in model.state_dict().items())


def batch_of(examples: list[tuple[list[int], list[int]]]) -> Batch:
    """Collate (src ids, tgt ids) pairs through real token stores in a temporary dir."""
    with tempfile.TemporaryDirectory() as tmp:
        for side, col in (("src", 0), ("tgt", 1)):
            write_store(Path(tmp) / side, 64, [e[col] for e in examples])
        src, tgt = TokenStore(Path(tmp) / "src"), TokenStore(Path(tmp) / "tgt")
        return collate(src, tgt, np.arange(len(examples)))
