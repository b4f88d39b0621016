"""The checkpoint format: round trip, safe loading, clear errors."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from nmt_cli.core.checkpoint import (
    FORMAT_VERSION,
    Checkpoint,
    CheckpointError,
    checkpoint_from_dict,
    load_checkpoint,
    model_state,
    save_checkpoint,
)
from nmt_cli.core.transformer import ModelConfig, Transformer
from nmt_cli.core.vocab import VocabPair, train_sentencepiece


@pytest.fixture(scope="module")
def vocab() -> VocabPair:
    words = ["house", "tree", "dog", "cat", "runs", "small", "the", "a", "big", "green"]
    lines = [" ".join(words[(i * 7 + j) % 10] for j in range(6)) for i in range(200)]
    proto = train_sentencepiece(lines, vocab_size=40)
    return VocabPair.from_protos(proto, proto)


def _checkpoint(model: Transformer, vocab: VocabPair) -> Checkpoint:
    opt = torch.optim.Adam(model.parameters())
    model(torch.tensor([[5, 6, 3]]), torch.tensor([[2, 5]])).sum().backward()
    opt.step()
    return Checkpoint(
        model_config=model.cfg,
        vocab=vocab,
        model=model_state(model),
        step=7,
        kind="train",
        recipe={"name": "tiny"},
        train_state={"optimizer": opt.state_dict(), "rng": torch.get_rng_state()},
        meta={"dev_loss": 1.5},
    )


def test_round_trip_gives_identical_outputs(
    tmp_path: Path, tiny_model: Transformer, vocab: VocabPair
) -> None:
    path = save_checkpoint(_checkpoint(tiny_model, vocab), tmp_path / "c.pt")
    loaded = load_checkpoint(path)
    assert loaded.step == 7 and loaded.kind == "train"
    assert loaded.model_config == tiny_model.cfg
    assert loaded.vocab.joint and len(loaded.vocab.src) == 40
    assert loaded.vocab.src.encode(["the green dog"]) == vocab.src.encode(["the green dog"])
    assert loaded.train_state is not None and "optimizer" in loaded.train_state
    rebuilt = loaded.build_model()
    src, tgt = torch.tensor([[5, 9, 11, 3]]), torch.tensor([[2, 7, 8]])
    torch.testing.assert_close(rebuilt(src, tgt), tiny_model.eval()(src, tgt), rtol=0, atol=0)


class _Exploit:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch pwned-by-checkpoint",))


def test_crafted_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"format": "nmt-checkpoint", "version": 1, "payload": _Exploit()}, path)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(CheckpointError, match="refused"):
            load_checkpoint(path)
    finally:
        os.chdir(cwd)
    assert not (tmp_path / "pwned-by-checkpoint").exists()


def test_plain_pickle_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps(_Exploit()))
    with pytest.raises(CheckpointError):
        load_checkpoint(path)


def test_truncated_file_gives_clear_error(
    tmp_path: Path, tiny_model: Transformer, vocab: VocabPair
) -> None:
    path = save_checkpoint(_checkpoint(tiny_model, vocab), tmp_path / "c.pt")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_checkpoint(path)


def test_not_a_checkpoint(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(CheckpointError, match=r"not a checkpoint \(it is text;") as err:
        load_checkpoint(text)
    assert "weights_only" not in str(err.value)
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(CheckpointError, match="not an nmt checkpoint"):
        load_checkpoint(other)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing.pt")


def test_later_format_version_is_refused(
    tmp_path: Path, tiny_model: Transformer, vocab: VocabPair
) -> None:
    raw = _checkpoint(tiny_model, vocab).to_dict()
    raw["version"] = FORMAT_VERSION + 1
    path = tmp_path / "future.pt"
    torch.save(raw, path)
    with pytest.raises(CheckpointError, match="upgrade nmt"):
        load_checkpoint(path)


def test_config_survives_unknown_future_fields(
    tmp_path: Path, tiny_model: Transformer, vocab: VocabPair
) -> None:
    raw = _checkpoint(tiny_model, vocab).to_dict()
    raw["model_config"]["some_new_knob"] = 3
    path = tmp_path / "c.pt"
    torch.save(raw, path)
    assert isinstance(load_checkpoint(path).model_config, ModelConfig)


def test_a_checkpoint_from_before_the_vocabulary_decided_the_tie_loads_as_trained(
    tiny_model: Transformer, vocab: VocabPair
) -> None:
    """Format-1 files without `joint_vocab` tied the source embedding whenever the two
    vocabulary sizes matched; they must rebuild exactly that model."""
    raw = _checkpoint(tiny_model, vocab).to_dict()
    del raw["model_config"]["joint_vocab"]
    old = checkpoint_from_dict(raw)
    assert old.model_config.joint_vocab
    model = old.build_model()
    assert model.src_embed.tokens.weight is model.tgt_embed.tokens.weight
