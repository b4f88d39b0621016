"""Linear layers re-laid-out once for decoding on a CPU: fp32, packed bf16, int8.

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
- fp32 on CPUs with AVX2 and up: `Fp32Linear` keeps the weight as it is and, given the
  compiled module, in its layout too: products of up to 32 rows (a beam-4 step of up to
  8 sentences) run on the module's AVX2 kernel, where MKL's blocking costs more than the
  arithmetic (1.2-2.1x faster than MKL's at 4 rows on AVX2, 1.1-1.2x at 16; on a
  Sapphire Rapids, MKL's AVX-512 products made a one-sentence step a third slower);
  more rows take PyTorch's product, then the bias, ReLU and residual in one pass
  (BENCHMARKS.md), or, on CPUs not Intel's, oneDNN's packed product with them fused
  (`Fp32OnednnLinear`: MKL's products are slower there). Its sums run in order of K,
  so an fp32 model decodes within float32's rounding of PyTorch's product, not bit for
  bit (without the compiled module, or below AVX2, it decodes on PyTorch's products,
  exactly).
- int8 (`--precision int8`): `Int8Linear` holds symmetric per-output-channel int8
  weights and quantizes its input per call (dynamic quantization, as CTranslate2 and
  PyTorch's `quantize_dynamic` do): per row in the compiled module's kernel (AVX-512
  VNNI; else AVX-512BW with 7-bit weights, or AVX2 with 7-bit weights and activations)
  where the module is loaded, else per call through PyTorch's own quantized kernels
  (fbgemm or oneDNN). Everything else stays float32.

Both are core/step_linear.py's `StepLinear`s, so the model's own decoder step calls
them with its ReLU and residual adds fused. They are this backend's implementations of
the `linear` operation (`implementations`, among which the planner chooses,
backends/plan.py): `DecodeLinears` makes each of a Transformer's linear layers as one of
them, empty, when the model is built, and each takes its weight into its own form as
the checkpoint loads. The model never holds the float weights it does not multiply with
(an int8 model's float32 ones), and nothing is swapped into it afterwards. A model built
with them decodes only: it has no gradients, and its packed weights are not parameters,
so it is never trained or saved.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Self, cast

import torch
from torch import Tensor

from nmt_cli.backends.plan import Implementation, Target
from nmt_cli.core.step_linear import StepLinear
from nmt_cli.cpu_level import cpu_flags, cpu_level, cpuinfo_field
from nmt_cli.errors import NmtError


class DecodeLinear(StepLinear):
    """A decode-only linear layer, in_features -> out_features, that keeps its weight
    only in its kernel's form, made once by `load`. `kernel` is the compiled module
    (backends/cpu/build.py) where the planner chose its kernel for this layer's kind."""

    # What the slot cache (backends/cpu/slot_cache.py) keeps keys and values in beside
    # these products: bf16 where the products already round their inputs as coarsely or
    # more (bf16, int8), so the cache's rounding adds no error of another order.
    cache_dtype: torch.dtype = torch.bfloat16

    def __init__(
        self, in_features: int, out_features: int, kernel: ModuleType | None = None
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.kernel = kernel

    @classmethod
    def of(cls, weight: Tensor, bias: Tensor | None, kernel: ModuleType | None = None) -> Self:
        """The layer holding `weight` (out_features, in_features) and `bias`."""
        layer = cls(weight.size(1), weight.size(0), kernel)
        layer.load(weight, bias)
        return layer

    def load(self, weight: Tensor, bias: Tensor | None) -> None:
        """Take `weight` and `bias` into this layer's form (they are not kept)."""
        raise NotImplementedError

    def _load_from_state_dict(
        self,
        state_dict: Mapping[str, Tensor],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        """An `nn.Linear`'s entries (`weight`, `bias`) taken as the model loads, as
        PyTorch's own quantized Linear takes them; what is missing or of another shape
        is reported as `load_state_dict` reports it."""
        names = [prefix + "weight", prefix + "bias"]
        missing = [name for name in names if name not in state_dict]
        if missing:
            missing_keys += missing
            return
        weight, bias = (state_dict[name] for name in names)
        shape = (self.out_features, self.in_features)
        if weight.shape != shape:
            error_msgs.append(f"{names[0]}: {tuple(weight.shape)} for a layer of {shape}")
            return
        self.load(weight, bias)

    def shape_free_rows(self) -> float:
        """Up to how many rows a product builds no kernel for a new shape."""
        raise NotImplementedError


class Fp32Linear(DecodeLinear):
    """y = x W^T + b in float32: the compiled module's AVX2 kernel up to its rows
    (`kernel.fp32_kernel_rows()`, csrc/fp32_linear.cpp), PyTorch's product above them,
    the ReLU and the residual add fused into the kernel's store."""

    weight: Tensor
    bias: Tensor | None
    rows: Tensor  # the weight in the kernel's layout
    cache_dtype = torch.float32  # the products round nothing: neither may the cache

    def load(self, weight: Tensor, bias: Tensor | None) -> None:
        assert self.kernel is not None, "Fp32Linear is the module's layer"
        self.weight = weight.detach().float().contiguous()
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.rows = self.kernel.pack_fp32(self.weight)

    def _rows(self, x: Tensor, residual: Tensor | None, relu: bool) -> Tensor:
        assert self.kernel is not None
        return cast(
            Tensor, self.kernel.rows_linear(x, self.weight, self.rows, self.bias, residual, relu)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self._rows(x, None, False)

    def relu(self, x: Tensor) -> Tensor:
        return self._rows(x, None, True)

    def add(self, x: Tensor, residual: Tensor) -> Tensor:
        return self._rows(x, residual, False)

    def shape_free_rows(self) -> float:
        """Neither the kernel nor PyTorch's float32 product builds a kernel per shape."""
        return math.inf


class Fp32OnednnLinear(Fp32Linear):
    """Fp32Linear whose products above the kernel's rows are oneDNN's, on the weight
    reordered once into oneDNN's layout in place of the plain one (no more memory, but
    for a tied output projection: the embedding keeps its own). For CPUs not made by
    Intel, for which MKL's products are not tuned: on a Zen 1 EPYC (AVX2) oneDNN's
    packed products of 128-512 rows at a decoder step's shapes ran 1.04-1.31x MKL's
    (BENCHMARKS.md). Its sums split K its own way: within float32's rounding of
    PyTorch's product, as the kernel's are."""

    def load(self, weight: Tensor, bias: Tensor | None) -> None:
        super().load(weight, bias)
        self.weight = torch.ops.mkldnn._reorder_linear_weight(self.weight)

    def shape_free_rows(self) -> float:
        """oneDNN builds a kernel per shape above the module kernel's rows."""
        assert self.kernel is not None
        return float(self.kernel.fp32_kernel_rows())


class PackedLinear(DecodeLinear):
    """y = x W^T + b with W reordered once into oneDNN's layout (bf16, CPU), and given
    `kernel` into the compiled module's too, whose AVX-512 BF16 kernel takes products
    of few rows."""

    bias: Tensor | None
    packed: Tensor  # the weight in oneDNN's layout
    rows: Tensor | None  # the weight in the compiled kernel's layout

    def __init__(
        self, in_features: int, out_features: int, kernel: ModuleType | None = None
    ) -> None:
        # The module's kernel reads bf16 pairs: a layer of odd width stays on oneDNN's.
        super().__init__(in_features, out_features, kernel if in_features % 2 == 0 else None)

    def load(self, weight: Tensor, bias: Tensor | None) -> None:
        weight = weight.detach().to(torch.bfloat16)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)
        self.rows = None if self.kernel is None else self.kernel.pack_bf16(weight)

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


class Int8Linear(DecodeLinear):
    """y ~ x W^T + b with int8 weights (one scale per output row) and int8 activations,
    accumulated in int32, returned in float32.

    With the compiled module (`kernel`, on a CPU with AVX2 or more) each input row is
    quantized with its own scale (csrc/int8_linear.cpp: to 8 bits with AVX-512, to 7 on
    AVX2, whose multiplies are the bound there; the weights are 7 bits without VNNI,
    whose 16-bit pair sums would saturate with 8): a sentence's result does not depend on
    the rest of its batch, and there is no fixed cost a call (BENCHMARKS.md). Otherwise
    PyTorch's dynamic quantized kernel, which quantizes the whole input with one scale."""

    bias: Tensor | None
    rows: Tensor  # with `kernel`: the int8 weight in its layout, scales, column sums
    scale: Tensor
    column_sum: Tensor
    packed: Tensor  # without: PyTorch's packed quantized weight
    reduce_range: bool  # without: 7-bit activations

    def load(self, weight: Tensor, bias: Tensor | None) -> None:
        weight = weight.detach().float()
        self.bias = None if bias is None else bias.detach().float().contiguous()
        if self.kernel is not None:
            self.rows, self.scale, self.column_sum = self.kernel.pack_int8(weight)
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


def cpu_has_vnni(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU multiplies bytes into 32-bit sums (AVX-512 VNNI or AVX-VNNI), read
    from the kernel's flags; False where they cannot be read (the safe answer: 7-bit
    activations lose a little precision, 8-bit ones without VNNI may overflow). The
    hardware's answer whatever NMT_CPU_LEVEL says: PyTorch's int8 engine reads the CPU
    itself."""
    return bool({"avx512_vnni", "avx_vnni"} & cpu_flags(cpuinfo))


def mkl_tuned(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether MKL's float32 products are the fast ones here: on Intel's CPUs. Elsewhere
    (AMD's) oneDNN's packed products beat them (`Fp32OnednnLinear`). Where the maker cannot
    be read, MKL's, which PyTorch calls anyway."""
    vendor = cpuinfo_field("vendor_id", cpuinfo)
    return vendor in ("", "GenuineIntel")


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


@dataclass(frozen=True)
class DecodeLinears:
    """`Operations.linear` for decoding on a CPU: each linear layer of the model being
    built as a `layer` (on `kernel`'s products where given), empty until it loads."""

    layer: type[DecodeLinear]
    kernel: ModuleType | None = None

    def __call__(self, in_features: int, out_features: int) -> DecodeLinear:
        return self.layer(in_features, out_features, self.kernel)

    def of(self, weight: Tensor, bias: Tensor | None) -> DecodeLinear:
        """A layer of this kind holding `weight` and `bias` (the tied output projection)."""
        return self.layer.of(weight, bias, self.kernel)


def implementations() -> list[Implementation]:
    """The linear layers of a model decoding on a CPU, fastest first: in bf16 the module's
    kernel (with oneDNN's for many rows), then oneDNN's alone; in int8 the module's
    kernel (its VNNI route, else its AVX-512BW or AVX2 one with 7-bit weights), then
    PyTorch's quantized kernels; in fp32, where the level in force is AVX2, the module's
    kernel for few rows (with oneDNN's products for more on CPUs not Intel's, MKL's on
    Intel's), and otherwise core's reference, PyTorch's own product, which builds no kernel
    per shape and is exact."""

    def onednn_refuses(target: Target) -> str | None:
        if packed_bf16_available():
            return None
        return "oneDNN cannot pack bf16 weights on this CPU (it needs AVX-512 or AVX-NE-CONVERT)"

    def module_refuses(available: str, level: str) -> Callable[[Target], str | None]:
        def refuses(target: Target) -> str | None:
            if target.kernel is None:
                return target.no_kernel
            if not getattr(target.kernel, available)():
                return f"it needs the CPU level {level}, and {cpu_level()} is in force"
            return None

        return refuses

    def module_bf16_refuses(target: Target) -> str | None:  # oneDNN's for many rows
        module = module_refuses("bf16_kernel_available", "avx512_bf16")
        return module(target) or onednn_refuses(target)

    def quantized(target: Target) -> DecodeLinears:
        if not int8_available():  # int8 has no reference to fall back to
            raise NmtError("--precision int8: this PyTorch build has no quantized CPU kernels")
        return DecodeLinears(Int8Linear)

    def module_onednn_fp32_refuses(target: Target) -> str | None:
        module = module_refuses("fp32_kernel_available", "avx2")(target)
        if module is not None:
            return module
        if not torch.backends.mkldnn.is_available():
            return "this PyTorch build has no oneDNN"
        return "MKL's products are the faster on Intel's CPUs" if mkl_tuned() else None

    bits = "8-bit" if cpu_has_vnni() else "7-bit"
    engine = torch.backends.quantized.engine
    return [
        Implementation(
            "linear",
            "the module's AVX2 fp32 kernel for few rows, oneDNN's packed fp32 for more",
            module_onednn_fp32_refuses,
            lambda target: DecodeLinears(Fp32OnednnLinear, target.kernel),
            "cpu", training=False, precision="fp32",
        ),
        Implementation(
            "linear",
            "the module's AVX2 fp32 kernel for few rows, PyTorch's product for more",
            module_refuses("fp32_kernel_available", "avx2"),
            lambda target: DecodeLinears(Fp32Linear, target.kernel),
            "cpu", training=False, precision="fp32",
        ),
        Implementation(
            "linear",
            "the module's AVX-512 BF16 kernel for few rows, oneDNN's packed bf16 for more",
            module_bf16_refuses,
            lambda target: DecodeLinears(PackedLinear, target.kernel),
            "cpu", training=False, precision="bf16",
        ),
        Implementation(
            "linear",
            "oneDNN's packed bf16 (weights packed once)",
            onednn_refuses,
            lambda target: DecodeLinears(PackedLinear),
            "cpu", training=False, precision="bf16",
        ),
        Implementation(
            "linear",
            "the module's AVX-512 VNNI kernel (a scale per row)",
            module_refuses("int8_vnni_available", "avx512_vnni"),
            lambda target: DecodeLinears(Int8Linear, target.kernel),
            "cpu", training=False, precision="int8",
        ),
        Implementation(
            "linear",
            "the module's AVX-512BW or AVX2 kernel "
            "(a scale per row, 7-bit weights; 7-bit activations on AVX2)",
            module_refuses("int8_kernel_available", "avx2"),
            lambda target: DecodeLinears(Int8Linear, target.kernel),
            "cpu", training=False, precision="int8",
        ),
        Implementation(
            "linear",
            f"PyTorch's quantized kernels ({engine}; one scale per call, {bits} activations)",
            lambda target: None,
            quantized,
            "cpu", training=False, precision="int8",
        ),
    ]  # fmt: skip
