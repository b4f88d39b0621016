"""Linear layers re-laid-out once for decoding on a CPU: packed bf16 and dynamic int8.

A trained model's `nn.Linear` layers are right for training, where weights change every
step. Decoding calls the same few matrices thousands of times with a handful of rows
(sentences x beams), and there the per-call work around the arithmetic dominates:

- bf16: `F.linear` hands oneDNN a plain row-major weight, which it reorders into its
  blocked layout on every call. `PackedLinear` reorders once (the same prepacking
  PyTorch's compiler applies when it freezes weights) and calls the packed kernel, with
  bit-identical results, faster at beam-search shapes (BENCHMARKS.md). Given the
  compiled module (backends/cpu/build.py) on a CPU with AVX-512 BF16, it also keeps the
  weight in that module's layout, and products of up to 128 rows (a decoder step of up
  to 32 sentences at beam 4) run there: oneDNN's fixed cost a call is most of a product
  of a few rows, the module's kernel has none, and from 256 rows on the two are even
  (BENCHMARKS.md).
- int8 (`--precision int8`): `Int8Linear` holds symmetric per-output-channel int8
  weights and quantizes its input per call (dynamic quantization, as CTranslate2 and
  PyTorch's `quantize_dynamic` do): per row in the compiled module's VNNI kernel where
  there is one, else per call through PyTorch's own quantized kernels (fbgemm or
  oneDNN). Everything else stays float32.

Both are core/step_linear.py's `StepLinear`s, so the model's own decoder step calls
them with its ReLU and residual adds fused. `specialise_linears` swaps every linear layer
of a Transformer for one of these and returns one made of the tied output projection.
The result decodes only: it has no gradients, and its packed weights are not
parameters, so it is never trained or saved.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from types import ModuleType
from typing import Literal, cast

import torch
from torch import Tensor, nn

from nmt_cli.core.step_linear import StepLinear
from nmt_cli.cpu_level import cpu_flags
from nmt_cli.errors import NmtError

LinearKind = Literal["packed-bf16", "int8"]


class PackedLinear(StepLinear):
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

    def shape_free_rows(self) -> float:
        """Up to how many rows a product builds no kernel for a new shape: the compiled
        kernel's; oneDNN builds one per shape (above them, or at every size without it)."""
        return float(self.kernel.kernel_rows()) if self.kernel is not None else 0.0

    def path(self) -> str:
        """Where its products run, in words (`nmt env`)."""
        if self.kernel is None:
            return "oneDNN bf16, weights packed once"
        rows = self.kernel.kernel_rows()
        return f"the module's AVX-512 BF16 kernel up to {rows} rows, oneDNN bf16 above"


class Int8Linear(StepLinear):
    """y ~ x W^T + b with int8 weights (one scale per output row) and int8 activations,
    accumulated in int32, returned in float32.

    With the compiled module (`kernel`) on a CPU with AVX-512 VNNI, each input row is
    quantized with its own scale (csrc/int8_linear.cpp): a sentence's result does
    not depend on the rest of its batch, and there is no fixed cost a call (faster than
    PyTorch's at every size, most at a few rows: BENCHMARKS.md). Otherwise PyTorch's
    dynamic quantized kernel, which quantizes the whole input with one scale."""

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
        # Without VNNI, PyTorch's x86 kernels multiply u8 x s8 pairs into saturating
        # 16-bit sums (vpmaddubsw), whatever the vector width: use 7-bit activations.
        self.reduce_range = not cpu_has_vnni()

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

    def shape_free_rows(self) -> float:
        """The compiled kernel takes any rows as they come; PyTorch's quantized engines
        may build a kernel per shape."""
        return math.inf if self.kernel is not None else 0.0

    def path(self) -> str:
        """Where its products run, in words (`nmt env`)."""
        if self.kernel is not None:
            return "the module's AVX-512 VNNI kernel, a scale per row"
        bits = "7-bit" if self.reduce_range else "8-bit"
        engine = torch.backends.quantized.engine
        return f"PyTorch's quantized kernels ({engine}), one scale per call, {bits} activations"


def cpu_has_vnni(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU multiplies bytes into 32-bit sums (AVX-512 VNNI or AVX-VNNI), read
    from the kernel's flags; False where they cannot be read (the safe answer: 7-bit
    activations lose a little precision, 8-bit ones without VNNI may overflow). The
    hardware's answer whatever NMT_CPU_LEVEL says: PyTorch's int8 engine reads the CPU
    itself."""
    return bool({"avx512_vnni", "avx_vnni"} & cpu_flags(cpuinfo))


def int8_available() -> bool:
    """Whether this PyTorch build has a CPU engine for quantized linear layers."""
    engines = set(torch.backends.quantized.supported_engines)
    return bool(engines & {"x86", "fbgemm", "onednn", "qnnpack"})


def packed_bf16_available() -> bool:
    """Whether oneDNN can pack bf16 weights here: it needs AVX-512 (BW, VL, DQ) or
    AVX-NE-CONVERT, which AVX2-only CPUs lack (they still run bf16, unpacked). oneDNN's own
    answer, which heeds NMT_CPU_LEVEL's cap on it (nmt_cli/cpu_level.py)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def specialise_linears(
    model: nn.Module, kind: LinearKind, kernel: ModuleType | None = None
) -> StepLinear | None:
    """Replace, in place, every `nn.Linear` under `model` (a Transformer) by a decode-only
    layer of `kind`, and return one of the tied output projection (the embedding matrix),
    None where there is nothing to pack into.

    The model must already be on the CPU, in bf16 for "packed-bf16" and float32 for
    "int8" (the embeddings, norms and attention stay in that dtype). `kernel`, the
    compiled module (backends/cpu/build.py), gives the layers its kernels.
    """
    if kind == "int8" and not int8_available():
        raise NmtError("--precision int8: this PyTorch build has no quantized CPU kernels")
    if kind == "packed-bf16" and not packed_bf16_available():
        return None  # nothing to pack into; plain bf16 linear layers still work

    def decode_only(weight: Tensor, bias: Tensor | None) -> StepLinear:
        if kind == "packed-bf16":
            return PackedLinear(weight, bias, kernel)
        return Int8Linear(weight, bias, kernel)

    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, decode_only(child.weight, child.bias))
    tokens = model.get_submodule("tgt_embed.tokens")
    assert isinstance(tokens, nn.Embedding)
    return decode_only(tokens.weight, getattr(model, "output_bias", None))
