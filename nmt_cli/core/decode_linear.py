"""Linear layers re-laid-out once for decoding on a CPU: packed bf16 and dynamic int8.

A trained model's `nn.Linear` layers are right for training, where weights change every
step. Decoding calls the same few matrices thousands of times with a handful of rows
(sentences x beams), and there the per-call work around the arithmetic dominates:

- bf16: `F.linear` hands oneDNN a plain row-major weight, which it reorders into its
  blocked layout on every call. `PackedLinear` reorders once (the same prepacking
  PyTorch's compiler applies when it freezes weights) and calls the packed kernel, with
  bit-identical results: 1.5-2.5x faster at beam-search shapes (BENCHMARKS.md). Given
  the compiled module (core/compiled_step.py) on a CPU with AVX-512 BF16, it also keeps
  the weight in that module's layout, and products of up to 128 rows (a decoder step of
  up to 32 sentences at beam 4) run there: oneDNN's fixed cost of ~15 us a call is most
  of a product of a few rows, the module's kernel has none (3-5x faster at 4 rows,
  1.1-1.4x at 128; from 256 rows on they are even).
- int8 (`--precision int8`): `Int8Linear` holds symmetric per-output-channel int8
  weights and quantizes its input per call (dynamic quantization, as CTranslate2 and
  PyTorch's `quantize_dynamic` do): per row in the compiled module's VNNI kernel where
  there is one, else per call through PyTorch's own quantized kernels (fbgemm or
  oneDNN). Everything else stays float32.

`specialise_linears` swaps every linear layer of a Transformer, and its tied output
projection, for one of these. The result decodes only: it has no gradients, and its
packed weights are not parameters, so it is never trained or saved.
"""

from __future__ import annotations

import warnings
from types import ModuleType
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt_cli.errors import NmtError

LinearKind = Literal["packed-bf16", "int8"]


class PackedLinear(nn.Module):
    """y = x W^T + b with W reordered once into oneDNN's layout (bf16, CPU), and into
    the compiled module's for products of few rows when `kernel` is given and the CPU
    has AVX-512 BF16."""

    def __init__(
        self, weight: Tensor, bias: Tensor | None, kernel: ModuleType | None = None
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        weight = weight.detach().to(torch.bfloat16)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)
        self.kernel: ModuleType | None = None
        self.rows: Tensor | None = None  # the weight in the compiled kernel's layout
        if kernel is not None and kernel.bf16_kernel_available() and self.in_features % 2 == 0:
            self.kernel, self.rows = kernel, kernel.pack_bf16(weight)

    def _module(self, x: Tensor, residual: Tensor | None, relu: bool) -> Tensor:
        """The compiled module's choice: its kernel for few rows, oneDNN's for more."""
        assert self.kernel is not None
        n = self.out_features
        return cast(
            Tensor,
            self.kernel.packed_linear(x, self.packed, self.rows, n, self.bias, residual, relu),
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.kernel is not None:
            return self._module(x, None, False)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def relu(self, x: Tensor) -> Tensor:
        """max(0, x W^T + b), the ReLU applied by the product's own kernel."""
        if self.kernel is not None:
            return self._module(x, None, True)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "relu", [], "")

    def add(self, x: Tensor, residual: Tensor) -> Tensor:
        """residual + x W^T + b, the sum taken by the product's own kernel (before its
        result is rounded to bf16, so one rounding instead of two)."""
        if self.kernel is not None:
            return self._module(x, residual, False)
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self.packed, self.bias, "add")


class Int8Linear(nn.Module):
    """y ~ x W^T + b with int8 weights (one scale per output row) and int8 activations,
    accumulated in int32, returned in float32.

    With the compiled module (`kernel`) on a CPU with AVX-512 VNNI, each input row is
    quantized with its own scale (core/csrc/int8_linear.cpp): a sentence's result does
    not depend on the rest of its batch, and there is no fixed cost a call (3-5x faster
    at a few rows, 1.1-1.3x at hundreds). Otherwise PyTorch's dynamic quantized kernel,
    which quantizes the whole input with one scale."""

    def __init__(
        self, weight: Tensor, bias: Tensor | None, kernel: ModuleType | None = None
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        weight = weight.detach().float()
        self.bias = None if bias is None else bias.detach().float()
        self.kernel: ModuleType | None = None
        if kernel is not None and kernel.int8_kernel_available():
            self.kernel = kernel
            self.rows, self.scale, self.column_sum = kernel.pack_int8(weight)
            return
        scale = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12).double()
        zero = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():  # the quantized tensor API warns it will move
            warnings.simplefilter("ignore")
            q = torch.quantize_per_channel(weight, scale, zero, 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(q, self.bias)
        # Without VNNI, u8 x s8 products may saturate 16-bit sums: use 7-bit activations.
        self.reduce_range = "AVX512" not in torch.backends.cpu.get_cpu_capability()

    def _rows(self, x: Tensor, residual: Tensor | None, relu: bool) -> Tensor:
        assert self.kernel is not None
        return cast(
            Tensor,
            self.kernel.int8_linear(
                x, self.rows, self.scale, self.column_sum, self.out_features, self.bias,
                residual, relu,
            ),
        )  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        if self.kernel is not None:
            return self._rows(x, None, False)
        return torch.ops.quantized.linear_dynamic(x, self.packed, self.reduce_range)

    def relu(self, x: Tensor) -> Tensor:
        if self.kernel is not None:
            return self._rows(x, None, True)
        return torch.ops.quantized.linear_relu_dynamic(x, self.packed, self.reduce_range)

    def add(self, x: Tensor, residual: Tensor) -> Tensor:
        if self.kernel is not None:
            return self._rows(x, residual, False)
        return residual + self.forward(x)


def linear(layer: nn.Module, x: Tensor) -> Tensor:
    """`layer(x)` for a linear layer, plain or decode-only, without `nn.Module.__call__`'s
    hook handling: a decoder step makes twenty such calls, and at one sentence a batch
    the handling costs as much as a small product."""
    if isinstance(layer, nn.Linear):
        return F.linear(x, layer.weight, layer.bias)
    return cast(Tensor, layer.forward(x))


def linear_relu(layer: nn.Module, x: Tensor) -> Tensor:
    """max(0, layer(x)), fused into the product by the decode-only layers."""
    if isinstance(layer, PackedLinear | Int8Linear):
        return layer.relu(x)
    return F.relu(linear(layer, x))


def linear_add(layer: nn.Module, x: Tensor, residual: Tensor) -> Tensor:
    """residual + layer(x), fused into the product by the packed bf16 layer."""
    if isinstance(layer, PackedLinear | Int8Linear):
        return layer.add(x, residual)
    return residual + linear(layer, x)


def module_of(projection: nn.Module | None) -> ModuleType | None:
    """The compiled module when the output projection runs on its kernels (bf16, int8):
    the one rule for when a model may also use the module's own arithmetic where it
    differs from PyTorch's in the last bits (log-softmax, attention); fp32 models never
    do, so that they keep their exact scores (csrc/decoder_step.cpp: uses_module)."""
    return cast(ModuleType | None, getattr(projection, "kernel", None))


def log_probs(projection: nn.Module | None, logits: Tensor) -> Tensor:
    """log_softmax(logits) in float32 over the last dimension, for the logits of
    `projection`: the compiled module's three-pass version when the projection runs on
    its kernels (module_of; faster), PyTorch's otherwise."""
    kernel = module_of(projection)
    if kernel is not None and logits.dim() == 2:
        return cast(Tensor, kernel.fast_log_softmax(logits))
    return torch.log_softmax(logits, -1, dtype=torch.float32)


def int8_available() -> bool:
    """Whether this PyTorch build has a CPU engine for quantized linear layers."""
    engines = set(torch.backends.quantized.supported_engines)
    return bool(engines & {"x86", "fbgemm", "onednn", "qnnpack"})


def specialise_linears(
    model: nn.Module, kind: LinearKind, kernel: ModuleType | None = None
) -> None:
    """Replace, in place, every `nn.Linear` under `model` and the output projection of
    each Transformer in it (the tied embedding matrix) by a decode-only layer of `kind`.

    The model must already be on the CPU, in bf16 for "packed-bf16" and float32 for
    "int8" (the embeddings, norms and attention stay in that dtype). `kernel`, the
    compiled module (core/compiled_step.py), gives the layers its kernels.
    """
    if kind == "int8" and not int8_available():
        raise NmtError("--precision int8: this PyTorch build has no quantized CPU kernels")
    if kind == "packed-bf16" and not torch.backends.mkldnn.is_available():
        return  # nothing to pack into; plain bf16 linear layers still work
    from nmt_cli.core.transformer import Transformer  # the Transformer's steps import this module

    def decode_only(weight: Tensor, bias: Tensor | None) -> nn.Module:
        if kind == "packed-bf16":
            return PackedLinear(weight, bias, kernel)
        return Int8Linear(weight, bias, kernel)

    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, decode_only(child.weight, child.bias))
        if isinstance(module, Transformer):
            module.projection = decode_only(module.output_weight, None)
