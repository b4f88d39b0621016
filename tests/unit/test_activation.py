"""The two model settings beyond the paper: the feed-forward's activation and a bias on
the output projection (models trained elsewhere use them), through training, the
reference decoder step and the CPU backend's compiled step."""

from __future__ import annotations

import copy
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from decode_models import backend_decoder, random_model, wrap

from nmt_cli.backends.cpu.support import unsupported
from nmt_cli.config import ConfigError, recipe_from_dict
from nmt_cli.core.model_config import ModelConfig
from nmt_cli.core.objective import TrainingObjective
from nmt_cli.core.search import beam_search
from nmt_cli.core.settings import SettingError
from nmt_cli.core.transformer import Transformer
from nmt_cli.core.vocab import VocabPair


def _sources() -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, 50, (3, 7), generator=g)
    src[:, -1] = 3
    src[2, 4:] = 0
    src[2, 3] = 3
    return src


def _with_bias(model: Transformer, seed: int = 1) -> Transformer:
    """A random output bias large enough to change which tokens win."""
    assert model.output_bias is not None
    with torch.no_grad():
        model.output_bias.copy_(torch.randn(model.cfg.tgt_vocab_size, generator=_gen(seed)))
    return model


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_the_activation_is_a_checked_recipe_setting() -> None:
    assert ModelConfig().activation == "relu" and not ModelConfig().output_bias
    recipe = recipe_from_dict({"model": {"activation": "silu", "output_bias": True}})
    assert recipe.model.activation == "silu" and recipe.model.output_bias
    with pytest.raises(SettingError, match="model.activation must be one of 'relu', 'silu'"):
        ModelConfig(activation="swish")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="model.activation"):
        recipe_from_dict({"model": {"activation": "tanh"}})


@pytest.mark.parametrize(("name", "function"), [("silu", F.silu), ("gelu", F.gelu)])
def test_the_feed_forward_applies_the_activation(name: str, function: object) -> None:
    model = random_model(activation=name)
    ffn = model.encoder[0].ffn
    x = torch.randn(2, 5, 32, generator=_gen(0))
    want = ffn.w2(function(ffn.w1(x)))  # type: ignore[operator]
    torch.testing.assert_close(ffn(x), want)
    assert not torch.allclose(want, ffn.w2(F.relu(ffn.w1(x))))
    step = x[:, 0] + want[:, 0]  # the step adds the residual
    torch.testing.assert_close(ffn.step(x[:, 0], x[:, 0]), step)


@pytest.mark.parametrize("overrides", [{"activation": "silu"}, {"output_bias": True}])
def test_the_decoder_step_equals_teacher_forcing(overrides: dict[str, object]) -> None:
    """The incremental step and the whole-sequence forward are one model."""
    model = random_model(**overrides)
    if model.output_bias is not None:
        _with_bias(model)
    src = _sources()
    tgt_in = torch.tensor([[2, 9, 14, 5], [2, 7, 7, 30], [2, 40, 6, 8]])
    with torch.no_grad():
        forced = torch.log_softmax(model(src, tgt_in), -1)
        mask = model.source_mask(src)
        memory = model.encode(src, mask)
        cache = model.new_cache()
        for position in range(tgt_in.size(1)):
            step, _ = model.decode_step(tgt_in[:, position], memory, mask, cache)
            torch.testing.assert_close(step, forced[:, position], atol=1e-5, rtol=1e-5)


def test_the_output_bias_is_trained_and_the_fused_loss_steps_aside() -> None:
    """The fused loss projects through the tied matrix alone, so a model with a bias
    takes the unfused form: same losses whichever is asked for, and a gradient reaches
    the bias."""
    model = _with_bias(random_model(output_bias=True)).train()
    src = _sources()
    tgt_in = torch.tensor([[2, 9, 14, 5], [2, 7, 7, 30], [2, 40, 6, 8]])
    tgt_out = torch.tensor([[9, 14, 5, 3], [7, 7, 30, 3], [40, 6, 3, 0]])
    losses = []
    for fused in (False, True):
        model.zero_grad()
        objective = TrainingObjective(model, 0.1, 0, fused_projection=fused)
        loss, _ = objective(src, tgt_in, tgt_out, tokens=11)
        loss.backward()
        assert model.output_bias is not None and model.output_bias.grad is not None
        assert model.output_bias.grad.abs().sum() > 0
        losses.append(loss.detach())
    assert torch.equal(losses[0], losses[1])


def test_the_backend_declares_relu_only_and_any_output_bias() -> None:
    assert unsupported(ModelConfig(activation="silu"), "fp32") == ["model.activation='silu'"]
    assert unsupported(ModelConfig(activation="gelu"), "int8") == ["model.activation='gelu'"]
    assert unsupported(ModelConfig(output_bias=True), "bf16") == []


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_the_compiled_step_decodes_an_output_bias_as_the_python_step(
    kernel: ModuleType, precision: str
) -> None:
    """The bias travels with the projection into the packed layers and the compiled
    step; without it the winners change (so the bias is really applied)."""
    model = _with_bias(random_model(output_bias=True))
    compiled = wrap(copy.deepcopy(model), precision, kernel, compiled=True)
    python = wrap(copy.deepcopy(model), precision, kernel, compiled=False)
    assert compiled.step is not None
    src = _sources()
    got = beam_search(compiled, src, 3, max_len_b=8)
    want = beam_search(python, src, 3, max_len_b=8)
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]
    for a, b in zip(got, want, strict=True):
        for x, y in zip(a, b, strict=True):
            assert x.log_prob == pytest.approx(y.log_prob, abs=1e-3 if precision != "fp32" else 0)
    if precision == "fp32":
        reference = beam_search(model, src, 3, max_len_b=8)
        assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in reference]
        no_bias = copy.deepcopy(model)
        assert no_bias.output_bias is not None
        with torch.no_grad():
            no_bias.output_bias.zero_()
        other = beam_search(no_bias, src, 3, max_len_b=8)
        assert [[h.tokens for h in s] for s in other] != [[h.tokens for h in s] for s in got]


def test_a_silu_model_falls_back_with_one_notice_and_keeps_its_activation(
    kernel: ModuleType,
) -> None:
    model = random_model(activation="silu")
    told: list[str] = []
    decoder = backend_decoder(model, "fp32", told.append)
    assert told == ["the compiled step does not implement model.activation='silu'"]
    src = _sources()
    got = beam_search(decoder, src, 3, max_len_b=8)
    want = beam_search(model, src, 3, max_len_b=8)
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]


def test_a_checkpoint_says_the_version_that_can_read_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files of the paper's model stay version 1, readable by older nmt; a file with a
    setting version 1 could not say is version 2, which such a reader refuses instead
    of building a ReLU model without the bias. The origin travels with the file."""
    from nmt_cli.core import checkpoint as ckpt_module
    from nmt_cli.core.checkpoint import Checkpoint, load_checkpoint, model_state, save_checkpoint

    vocab = _vocab()
    plain, silu = random_model(), random_model(activation="silu", output_bias=True)
    for name, model in (("plain", plain), ("silu", silu)):
        ckpt = Checkpoint(model.cfg, vocab, model_state(model), origin={"from": name})
        save_checkpoint(ckpt, tmp_path / f"{name}.pt")
    raw = {n: torch.load(tmp_path / f"{n}.pt", weights_only=True) for n in ("plain", "silu")}
    assert raw["plain"]["version"] == 1 and raw["silu"]["version"] == 2
    back = load_checkpoint(tmp_path / "silu.pt")
    assert back.model_config.activation == "silu" and back.model_config.output_bias
    assert torch.equal(back.model["output_bias"], silu.state_dict()["output_bias"])
    assert back.origin == {"from": "silu"}
    older = dict(raw["plain"])
    del older["origin"]  # a file written before origins were recorded
    assert ckpt_module.checkpoint_from_dict(older).origin is None
    monkeypatch.setattr(ckpt_module, "FORMAT_VERSION", 1)  # an nmt that reads version 1
    with pytest.raises(ckpt_module.CheckpointError, match="format version 2 .* upgrade nmt"):
        ckpt_module.checkpoint_from_dict(raw["silu"])
    assert ckpt_module.checkpoint_from_dict(raw["plain"]).model_config == plain.cfg


def _vocab() -> VocabPair:
    from nmt_cli.core.vocab import train_sentencepiece

    words = [f"w{i} x{i % 7} y{i % 5}" for i in range(300)]
    proto = train_sentencepiece(words, vocab_size=50)
    return VocabPair.from_protos(proto, proto)
