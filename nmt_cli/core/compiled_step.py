"""The decoder step as one C++ call on CPUs, compiled on first use for this machine.

At a few rows (one sentence, beam 4) a decoder step is a few hundred operator calls of a
few microseconds each, and calling each one from Python costs about as much again: the
interpreter, argument parsing and the dispatcher's Python binding. `csrc/decoder_step.cpp`
makes the same ATen calls in the same order as the Python step
(`Transformer.decode_step`), so its outputs are bit-identical, from one C++ call a step;
the projection of the encoder output into the cross-attention cache (before the first
step), steps that record attention, and the search stay in Python. The same module holds
kernels that the Python side uses too: bf16 and int8 products for the few rows of a step
(`csrc/bf16_linear.cpp`, `csrc/int8_linear.cpp`, through core/decode_linear.py's layers),
attention over the SlotCache (`csrc/attention.cpp`) and beam search's bookkeeping with
its one-pass candidate selection (`csrc/beam_topk.cpp`).

The source is built with PyTorch's extension builder (a C++ compiler and ninja) once per
source text, source directory and PyTorch version, into a per-user cache
(`TORCH_EXTENSIONS_DIR` if set); where that fails, decoding keeps the Python step and the
caller is told why.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sysconfig
import time
from collections.abc import Callable
from functools import cache
from operator import attrgetter
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import torch
from torch import Tensor, nn

from nmt_cli.core.cache import SlotCache, StepCache
from nmt_cli.core.decode_linear import Int8Linear, PackedLinear, module_of
from nmt_cli.core.search import BeamAdvance, kernel_advance, torch_advance
from nmt_cli.core.transformer import DecoderLayer, Transformer

_CSRC = Path(__file__).with_name("csrc")
_NAMES = ("decoder_step", "bf16_linear", "int8_linear", "beam_topk", "log_softmax", "attention")
SOURCES = [_CSRC / f"{name}.cpp" for name in _NAMES]
HEADERS = [_CSRC / f"{name}.h" for name in (*_NAMES[1:], "tiles", "simd_exp")]


STALE_LOCK_SECONDS = 600


class CompileError(RuntimeError):
    """The step could not be built or loaded here; the message says why."""


@cache
def _module_name() -> str:
    """One name per source text, PyTorch version and source directory, so a changed
    source or a new PyTorch never loads a stale build, and two installations do not
    rebuild in turn (the builder's ninja file names the sources by their paths)."""
    digest = hashlib.sha256(torch.__version__.encode())
    digest.update(str(_CSRC.resolve()).encode())
    for path in SOURCES + HEADERS:
        digest.update(path.read_bytes())
    return f"nmt_decoder_step_{digest.hexdigest()[:16]}"


def build_directory() -> Path:
    base = os.environ.get("TORCH_EXTENSIONS_DIR")
    if base:
        return Path(base) / _module_name()
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache_home / "nmt" / "extensions" / _module_name()


def is_built() -> bool:
    """Whether loading will be quick (the library is already compiled for this source)."""
    return (build_directory() / f"{_module_name()}.so").is_file()


@cache
def load_kernel() -> ModuleType:
    """The compiled module, built on the first call of the process if need be (once per
    process: loading an extension is process-wide anyway)."""
    check_tools()
    from torch.utils.cpp_extension import load

    directory = build_directory()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _clear_stale_lock(directory / "lock")
        return load(
            name=_module_name(),
            sources=[str(path) for path in SOURCES],
            extra_cflags=["-O3"],
            build_directory=str(directory),
            verbose=False,
        )
    except Exception as exc:  # unwritable cache, a compiler error, a missing header, a bad .so
        first = str(exc).strip().splitlines()
        raise CompileError(first[0] if first else type(exc).__name__) from exc


def _clear_stale_lock(lock: Path) -> None:
    """PyTorch's builder holds `lock` while it compiles and others wait for it to go;
    a build killed outright (not interrupted: that releases it) leaves it behind, and
    every later run would wait forever. A build takes well under a minute."""
    with contextlib.suppress(FileNotFoundError):
        if time.time() - lock.stat().st_mtime > STALE_LOCK_SECONDS:
            lock.unlink()


def check_tools() -> None:
    """Raise CompileError unless a build can start: a C++ compiler, and ninja.

    PyTorch's builder runs `ninja` from PATH. The ninja wheel (a dependency) installs it
    among this Python's scripts, which are not on PATH when `nmt` is run from a virtual
    environment that is not activated: that directory is added for the build."""
    if shutil.which("c++") is None:
        raise CompileError("no C++ compiler (c++) on PATH")
    if shutil.which("ninja") is not None:
        return
    scripts = sysconfig.get_path("scripts")
    if not (Path(scripts) / "ninja").is_file():
        raise CompileError("ninja is not installed (pip install ninja)")
    os.environ["PATH"] = os.pathsep.join([scripts, os.environ.get("PATH", "")])


def _linear_spec(layer: nn.Module) -> tuple[Any, ...]:
    """How the C++ step calls a linear layer: what core/decode_linear.py made of it."""
    if isinstance(layer, PackedLinear):
        return ("packed", layer.packed, layer.bias, layer.rows, layer.out_features)
    if isinstance(layer, Int8Linear):
        if layer.kernel is not None:
            rows = (layer.rows, layer.scale, layer.column_sum, layer.bias, layer.out_features)
            return ("int8-rows", *rows)
        weight, bias = torch.ops.quantized.linear_unpack(layer.packed)
        return ("int8", weight, bias, layer.reduce_range)
    if isinstance(layer, nn.Linear):
        return ("plain", layer.weight, layer.bias)
    raise TypeError(f"no compiled form of {type(layer).__name__}")


def _norm_spec(norm: nn.LayerNorm) -> tuple[Tensor, Tensor]:
    return (norm.weight, norm.bias)


class CompiledStep:
    """`Transformer.decode_step` without attention weights as one call into the compiled
    module (the cross-attention cache filled first). Holds references to the model's
    weights (and their packed forms), not copies."""

    def __init__(self, model: Transformer, kernel: ModuleType) -> None:
        embed = model.tgt_embed
        positions = embed.learned.weight if embed.learned is not None else embed.get_buffer("table")
        decoder = [cast(DecoderLayer, layer) for layer in model.decoder]
        layers = [
            (
                *(_linear_spec(m) for m in (d.self_attn.qkv, d.self_attn.out)),
                *(_linear_spec(m) for m in (d.cross_attn.q, d.cross_attn.out)),
                *(_linear_spec(m) for m in (d.ffn.w1, d.ffn.w2)),
                *(_norm_spec(n) for n in (d.norm1, d.norm2, d.norm3)),
            )
            for d in decoder
        ]
        first, projection = decoder[0], model.projection
        # Beam search's bookkeeping from the same module (core/csrc/beam_topk.cpp).
        self.advance: BeamAdvance = kernel_advance(kernel)
        self.kernel = kernel.DecoderStep(
            {
                "heads": first.self_attn.h,
                "d_k": first.self_attn.d_k,
                "d_v": first.self_attn.d_v,
                "eps": first.norm1.eps,
                "embed_scale": embed.scale,
                "tokens": embed.tokens.weight,
                "positions": positions,
                "projection": (
                    _linear_spec(projection)
                    if projection is not None
                    else ("plain", model.output_weight, None)
                ),
                "layers": layers,
            }
        )

    def __call__(self, tokens: Tensor, cache: StepCache) -> Tensor:
        """(B,) newest tokens -> log-probabilities (B, V); the cache advances one position."""
        if isinstance(cache, SlotCache):
            slots = cache.prepare(tokens.size(0))
            state = [t for layer in cache.layers for t in _SLOT_STATE(layer)]
            lprobs = self.kernel.step_slots(tokens, cache.length, state, slots, cache.table.sources)
            cache.length += 1
            return cast(Tensor, lprobs)
        state = [t for layer in cache.layers for t in _PREFIX_STATE(layer)]
        out = self.kernel.step(tokens, cache.length, state)
        for i, layer in enumerate(cache.layers):
            layer.self_k, layer.self_v, layer.pending = out[2 * i + 1], out[2 * i + 2], None
        cache.length += 1
        return out[0]


# What the C++ step reads of each layer's cache, in its order (csrc/decoder_step.cpp).
_PREFIX_STATE = attrgetter("self_k", "self_v", "pending", "cross_k", "cross_v", "cross_bias")
_SLOT_STATE = attrgetter("self_k", "self_v", "cross_k", "cross_v", "cross_bias")


def prepare_kernel(on_compile: Callable[[], None] = lambda: None) -> ModuleType:
    """The compiled module; `on_compile` is called first when it has to be built (tens of
    seconds). Raises CompileError where it cannot be built here."""
    if not is_built():
        check_tools()
        on_compile()
    return load_kernel()


def attach_compiled_steps(models: list[Transformer], kernel: ModuleType) -> None:
    """Give each CPU model the compiled step (`Transformer.compiled_step`). Its linear
    layers should be specialised with the same `kernel` first (specialise_linears), so
    the Python step, used for steps that record attention, computes the same.
    Models whose output projection runs on the module's kernels (bf16, int8) also get
    its attention kernel, and with it the SlotCache (core/cache.py); fp32 models keep
    PyTorch's attention, whose arithmetic their outputs are promised to match."""
    for model in models:
        model.compiled_step = CompiledStep(model, kernel)
        if module_of(model.projection) is not None and kernel.attention_kernel_available():
            model.attention_kernel = kernel


def beam_advance(model: nn.Module) -> BeamAdvance:
    """The bookkeeping beam search should use with `model` (a Transformer or an ensemble
    of them): the compiled one when the model decodes with the compiled step, so that
    recording attention (the Python step) ranks candidates the same way."""
    for module in model.modules():
        if isinstance(module, Transformer) and module.compiled_step is not None:
            step = module.compiled_step
            if isinstance(step, CompiledStep):
                return step.advance
    return torch_advance
