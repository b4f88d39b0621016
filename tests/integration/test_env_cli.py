"""`nmt env`: the report a bug report needs, read from the code that decides each answer."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from nmt_cli import cpu_level
from nmt_cli.backends.cpu.build import CompileError, load_kernel
from nmt_cli.backends.cpu.linear import mkl_tuned
from nmt_cli.cli import app

runner = CliRunner()


def report(monkeypatch: pytest.MonkeyPatch, level: str | None) -> dict[str, dict[str, str]]:
    if level is None:
        monkeypatch.delenv(cpu_level.ENV, raising=False)
    else:
        monkeypatch.setenv(cpu_level.ENV, level)
    result = runner.invoke(app, ["env", "--json", "--build"])
    assert result.exit_code == 0, result.output
    assert result.exception is None
    data: dict[str, dict[str, str]] = json.loads(result.stdout)
    return data


@pytest.fixture
def built() -> None:
    try:
        load_kernel()
    except CompileError as exc:
        pytest.skip(f"the compiled module cannot be built here: {exc}")


def test_the_report_names_the_versions_the_cpu_and_what_auto_picks(
    monkeypatch: pytest.MonkeyPatch, built: None
) -> None:
    import torch

    data = report(monkeypatch, None)
    assert data["torch"]["version"] == torch.__version__
    cpu = data["CPU"]
    assert cpu["level in force"] == cpu_level.detected_level() == cpu["detected level"].split()[0]
    assert set(cpu["flags"].split()) == set(cpu_level.REPORTED_FLAGS) & cpu_level.cpu_flags()
    want = "bf16" if cpu_level.has_bf16_units() else "fp32"
    assert data["precision"]["auto on the CPU"] == want
    assert data["compiled CPU module"]["state"] == "built and loaded"
    assert set(data) >= {
        "decoding on the CPU in fp32",
        "decoding on the CPU in bf16",
        "decoding on the CPU in int8",
        "training on the CPU",
    }
    fp32 = data["decoding on the CPU in fp32"]
    chosen = fp32["linear"].split(" (not ")[0]  # the module's from AVX2 up, else PyTorch's
    avx2 = cpu_level.at_least("avx2")
    more = "PyTorch's product" if mkl_tuned() else "oneDNN's packed fp32"  # Intel's: MKL's
    assert chosen == (
        f"the module's AVX2 fp32 kernel for few rows, {more} for more"
        if avx2
        else "core's reference (PyTorch operations)"
    )
    assert fp32["decoder step"] == "the module's (C++, one call)"
    if avx2:
        width = "AVX-512" if cpu_level.at_least("avx512") else "AVX2"
        assert fp32["attention"] == f"the module's {width} kernel over the slot cache"
        assert fp32["log-softmax"] == "the module's passes"
        assert fp32["beam bookkeeping"] == "the module's, fused with its log-softmax"
        assert fp32["one sentence's search"] == "the module's (C++, one call for every step)"


def test_a_lowered_level_changes_every_answer_that_depends_on_it(
    monkeypatch: pytest.MonkeyPatch, built: None
) -> None:
    """NMT_CPU_LEVEL=generic: fp32 by default, bf16 said to be emulated, the training
    kernels on their plain loops and no AVX-512 kernel in decoding, whatever this CPU is."""
    data = report(monkeypatch, "generic")
    assert data["CPU"]["level in force"] == "generic"
    assert data["precision"] == {"auto on the CPU": "fp32", "bf16 on the CPU": "emulated (slow)"}
    training = data["training on the CPU"]
    assert training["loss_sweep"] == "the module's sweep"
    assert training["attention"].startswith("the module's kernel")
    assert training["vector loops"] == "none (plain loops)"
    for precision in ("bf16", "int8"):
        paths = dict(data[f"decoding on the CPU in {precision}"])
        chosen = paths.pop("linear").split(" (not ")[0]  # what runs, then what did not
        assert "AVX-512" not in " ".join([chosen, *paths.values()]), paths
        assert paths["attention"] == "PyTorch's operations over core's cache"
        assert paths["beam bookkeeping"] == "the module's"  # PyTorch's log-softmax there
        assert paths["one sentence's search"] == "search's loop (Python)"
    int8 = data["decoding on the CPU in int8"]["linear"]
    assert int8.startswith("PyTorch's quantized kernels"), int8
    assert "not the module's AVX-512 VNNI kernel (a scale per row): it needs the CPU level" in int8
    if cpu_level.at_least("avx512"):  # and back up: the cap follows the setting
        native = report(monkeypatch, None)["training on the CPU"]
        assert (
            native["vector loops"]
            == "attention_train, bias_relu, dropout_mask, smoothed_loss (AVX-512)"
        )
    if cpu_level.at_least("avx2"):  # an AVX2-only CPU: the same loops at eight lanes
        avx2 = report(monkeypatch, "avx2")["training on the CPU"]
        assert (
            avx2["vector loops"] == "attention_train, bias_relu, dropout_mask, smoothed_loss (AVX2)"
        )


def test_a_level_that_does_not_exist_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_level.ENV, "avx1024")
    result = runner.invoke(app, ["env"])
    assert result.exit_code == 2
    assert "NMT_CPU_LEVEL='avx1024': use one of generic, avx2, avx512" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_the_text_report_has_one_titled_block_per_section(
    monkeypatch: pytest.MonkeyPatch, built: None
) -> None:
    monkeypatch.delenv(cpu_level.ENV, raising=False)
    result = runner.invoke(app, ["env"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    titles = [line for line in lines if line and not line.startswith(" ")]
    assert titles[:5] == ["nmt", "torch", "CPU", "precision", "compiled CPU module"]
    assert any(line.split() == ["NMT_CPU_LEVEL", "unset"] for line in lines)
