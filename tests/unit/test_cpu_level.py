"""The CPU level: read from the CPU's flags, lowered by NMT_CPU_LEVEL, and what it decides
(the precision `auto` picks, the caps handed to oneDNN and ATen)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt_cli import cpu_level
from nmt_cli.core.precision import resolve_precision
from nmt_cli.errors import UsageError

ZEN1 = "fpu sse sse2 avx avx2 fma bmi2"  # AVX2-only
SKYLAKE_SP = ZEN1 + " avx512f avx512bw avx512vl avx512dq avx512cd"
CASCADE_LAKE = SKYLAKE_SP + " avx512_vnni"
ZEN4 = CASCADE_LAKE + " avx512_bf16 avx512_vbmi"
SAPPHIRE_RAPIDS = ZEN4 + " amx_tile amx_bf16 amx_int8 avx_vnni"


@pytest.mark.parametrize(
    ("flags", "level"),
    [
        ("fpu sse sse2 avx", "generic"),
        ("fpu avx2", "generic"),  # AVX2 without FMA: no CPU nmt's loops are written for
        (ZEN1, "avx2"),
        (SKYLAKE_SP, "avx512"),
        (CASCADE_LAKE, "avx512_vnni"),
        (ZEN4, "avx512_bf16"),
        (SAPPHIRE_RAPIDS, "amx"),
        ("avx2 fma avx512_bf16 amx_tile amx_bf16", "avx2"),  # a level needs every one below
    ],
)
def test_the_level_is_the_highest_whose_flags_and_those_below_are_all_there(
    flags: str, level: str
) -> None:
    assert cpu_level.detected_level(frozenset(flags.split())) == level


def test_flags_are_read_from_cpuinfo_and_none_where_it_cannot_be_read(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: {ZEN4}\n\nflags\t: x\n")
    assert cpu_level.cpu_flags(info) == frozenset(ZEN4.split())
    assert cpu_level.cpu_flags(tmp_path / "missing") == frozenset()


def test_the_setting_lowers_the_level_and_never_raises_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cpu_level, "detected_level", lambda flags=None: "avx512_vnni")
    monkeypatch.delenv(cpu_level.ENV, raising=False)
    assert cpu_level.cpu_level() == "avx512_vnni"
    monkeypatch.setenv(cpu_level.ENV, "AVX2")
    assert cpu_level.cpu_level() == "avx2" and not cpu_level.at_least("avx512")
    monkeypatch.setenv(cpu_level.ENV, "amx")
    assert cpu_level.cpu_level() == "avx512_vnni" and not cpu_level.has_bf16_units()
    monkeypatch.setenv(cpu_level.ENV, "avx3")
    with pytest.raises(UsageError, match=r"NMT_CPU_LEVEL='avx3': use one of generic, avx2"):
        cpu_level.cpu_level()


@pytest.mark.parametrize(
    ("level", "onednn", "aten", "mkl"),
    [
        ("generic", "SSE41", "default", "SSE4_2"),
        ("avx2", "AVX2", "avx2", "AVX2"),
        ("avx512", "AVX512_CORE", "avx512", "AVX512"),
        ("avx512_vnni", "AVX512_CORE_VNNI", "avx512", "AVX512_E1"),  # MKL's name for VNNI
        ("amx", "AVX512_CORE_AMX", "avx512", "AVX512_E1"),
    ],
)
def test_each_level_caps_onednn_aten_and_mkl_by_their_own_names(
    level: str, onednn: str, aten: str, mkl: str
) -> None:
    assert cpu_level.torch_environment(level) == {
        "ONEDNN_MAX_CPU_ISA": onednn,
        "ATEN_CPU_CAPABILITY": aten,
        "MKL_ENABLE_INSTRUCTIONS": mkl,
    }


@pytest.mark.slow
def test_importing_nmt_caps_torch_before_it_loads_and_a_set_variable_wins() -> None:
    """In a fresh process: `import nmt_cli` before torch gives oneDNN and ATen the cap;
    a variable the user set stays as set."""
    code = (
        "import os, nmt_cli, torch;"
        "print(os.environ['ONEDNN_MAX_CPU_ISA'], torch.backends.cpu.get_cpu_capability())"
    )
    env = {"NMT_CPU_LEVEL": "avx2", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["AVX2", "AVX2"] or out == ["AVX2", "DEFAULT"]  # DEFAULT on a CPU below AVX2
    env["ONEDNN_MAX_CPU_ISA"] = "SSE41"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "SSE41"


def test_auto_is_bf16_only_with_bf16_units(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cpu_level.ENV, raising=False)
    cpu = torch.device("cpu")
    for detected, want in (("amx", "bf16"), ("avx512_bf16", "bf16"), ("avx512_vnni", "fp32"),
                           ("avx2", "fp32"), ("generic", "fp32")):  # fmt: skip
        monkeypatch.setattr(cpu_level, "detected_level", lambda flags=None, d=detected: d)
        assert resolve_precision("auto", cpu, "train.precision") == want, detected
        assert resolve_precision("fp32", cpu, "train.precision") == "fp32"
        assert resolve_precision("bf16", cpu, "train.precision") == "bf16"  # asked: obeyed


def test_bf16_without_bf16_units_is_told_how_much_slower_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(cpu_level.ENV, raising=False)
    cpu = torch.device("cpu")
    monkeypatch.setattr(cpu_level, "_bf16_slowdown", lambda: 7.25)
    monkeypatch.setattr(cpu_level, "detected_level", lambda flags=None: "avx2")
    text = cpu_level.bf16_emulation_warning("bf16", cpu, "train.precision")
    assert text is not None
    assert text.startswith("train.precision bf16: this CPU (avx2) has no bf16 units")
    assert "emulated" in text and "took 7.2x the time of fp32" in text and '"auto"' in text
    assert cpu_level.bf16_emulation_warning("fp32", cpu, "train.precision") is None
    monkeypatch.setattr(cpu_level, "detected_level", lambda flags=None: "avx512_bf16")
    assert cpu_level.bf16_emulation_warning("bf16", cpu, "train.precision") is None


def test_the_slowdown_is_a_ratio_of_two_measured_products() -> None:
    ratio = cpu_level._bf16_slowdown(size=64, repeats=1)
    assert 0.0 < ratio < 1e4
