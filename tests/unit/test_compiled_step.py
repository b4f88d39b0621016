"""The compiled (C++) decoder step is the Python step, bit for bit: every precision the
CPU decodes in, padded sources, beam reorders, sentences leaving the batch, ensembles;
and where it cannot be built, decoding falls back to the Python step and says why."""

from __future__ import annotations

import copy
from types import ModuleType

import pytest
import torch
from reverser import reverse_batch
from torch import Tensor

from nmt_cli.core import compiled_step
from nmt_cli.core.compiled_step import CompileError, attach_compiled_steps, load_kernel
from nmt_cli.core.decode_linear import specialise_linears
from nmt_cli.core.ensemble import Ensemble
from nmt_cli.core.search import beam_search
from nmt_cli.core.transformer import ModelConfig, Transformer

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="session")
def kernel() -> ModuleType:
    """Built once per PyTorch version and source (tens of seconds the first time)."""
    return load_kernel()


def _model(precision: str, seed: int = 0, **overrides: object) -> Transformer:
    torch.manual_seed(seed)
    settings: dict[str, object] = dict(
        encoder_layers=1,
        decoder_layers=2,
        d_model=32,
        d_ff=64,
        n_heads=4,
        dropout=0.0,
        src_vocab_size=50,
        tgt_vocab_size=50,
        max_positions=40,
    )
    settings.update(overrides)
    model = Transformer(ModelConfig(**settings)).eval()  # type: ignore[arg-type]
    if precision == "bf16":
        model = model.to(torch.bfloat16)
        specialise_linears(model, "packed-bf16")
    elif precision == "int8":
        specialise_linears(model, "int8")
    return model


def _sources() -> Tensor:
    g = torch.Generator().manual_seed(5)
    src = torch.randint(4, 50, (4, 9), generator=g)
    src[:, -1] = 3
    src[1, 6:] = 0
    src[1, 5] = 3
    src[3, 2:] = 0
    src[3, 1] = 3
    return src


def _same_hypotheses(a: list, b: list) -> None:
    assert [[h.tokens for h in s] for s in a] == [[h.tokens for h in s] for s in b]
    assert [[(h.score, h.log_prob) for h in s] for s in a] == [
        [(h.score, h.log_prob) for h in s] for s in b
    ]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_each_step_and_its_cache_equal_the_python_step(kernel: ModuleType, precision: str) -> None:
    model = _model(precision)
    src = _sources()
    python, compiled = model.new_cache(), model.new_cache()
    mask = model.source_mask(src)
    with torch.inference_mode():
        memory = model.encode(src, mask)
        tokens = torch.tensor([2, 7, 9, 11])
        step = compiled_step.CompiledStep(model, kernel)
        for position in range(6):
            expected, _ = model.decode_step(tokens, memory, mask, python)
            model.compiled_step = step if position > 0 else None  # the first step is Python's
            got, _ = model.decode_step(tokens, memory, mask, compiled)
            model.compiled_step = None
            assert got.dtype == torch.float32
            assert torch.equal(got, expected)
            for a, b in zip(python.layers, compiled.layers, strict=True):
                assert torch.equal(a.self_k, b.self_k) and torch.equal(a.self_v, b.self_v)
            assert python.length == compiled.length == position + 1
            tokens = got.argmax(-1)
            if position in (1, 2):  # two reorders in a row compose, then are applied once
                order = torch.tensor([3, 0, 0, 2])
                python.reorder(order, cross=False)
                compiled.reorder(order, cross=False)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("beam", [1, 4])
def test_beam_search_is_unchanged(kernel: ModuleType, precision: str, beam: int) -> None:
    model = _model(precision)
    src = _sources()
    expected = beam_search(model, src, beam, max_len_b=12, nbest=beam)
    attach_compiled_steps([model])
    assert model.compiled_step is not None
    _same_hypotheses(beam_search(model, src, beam, max_len_b=12, nbest=beam), expected)


def test_sentences_that_finish_leave_the_batch_the_same_way(
    kernel: ModuleType, reverser: Transformer
) -> None:
    """A trained model ends its sentences at different steps: the batch shrinks and the
    cross-attention cache is reordered between compiled steps."""
    model = copy.deepcopy(reverser).eval()
    src = reverse_batch(12, torch.Generator().manual_seed(1))[0]
    expected = beam_search(model, src, 4)
    attach_compiled_steps([model])
    _same_hypotheses(beam_search(model, src, 4), expected)


def test_separate_key_and_value_sizes_and_learned_positions(kernel: ModuleType) -> None:
    model = _model("fp32", d_k=6, d_v=10, positions="learned")
    src = _sources()
    expected = beam_search(model, src, 3, max_len_b=10)
    attach_compiled_steps([model])
    _same_hypotheses(beam_search(model, src, 3, max_len_b=10), expected)


def test_an_ensemble_of_compiled_members_decodes_as_before(kernel: ModuleType) -> None:
    members = [_model("bf16", seed=1), _model("bf16", seed=2)]
    src = _sources()
    expected = beam_search(Ensemble(members).eval(), src, 4, max_len_b=10)
    attach_compiled_steps(members)
    _same_hypotheses(beam_search(Ensemble(members).eval(), src, 4, max_len_b=10), expected)


def test_attention_weights_are_recorded_by_the_python_step(kernel: ModuleType) -> None:
    model = _model("bf16")
    src = _sources()
    expected = beam_search(model, src, 2, max_len_b=8, need_weights=True)
    attach_compiled_steps([model])
    got = beam_search(model, src, 2, max_len_b=8, need_weights=True)
    _same_hypotheses(got, expected)
    for a, b in zip(got, expected, strict=True):
        assert a[0].attention is not None and b[0].attention is not None
        assert all(
            torch.equal(x, y)
            for step_a, step_b in zip(a[0].attention, b[0].attention, strict=True)
            for x, y in zip(step_a, step_b, strict=True)
        )


def test_a_build_that_fails_keeps_the_python_step(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> ModuleType:
        raise CompileError("no c++ on PATH")

    monkeypatch.setattr(compiled_step, "load_kernel", broken)
    monkeypatch.setattr(compiled_step, "is_built", lambda: False)
    model = _model("fp32")
    told: list[str] = []
    with pytest.raises(CompileError, match="no c\\+\\+"):
        attach_compiled_steps([model], on_compile=lambda: told.append("compiling"))
    assert told == ["compiling"]
    assert model.compiled_step is None


def test_the_build_is_cached_per_source_and_torch_version(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    directory = compiled_step.build_directory()
    assert directory.parent == tmp_path
    assert torch.__version__ not in directory.name  # hashed with the source text
    assert not compiled_step.is_built()
