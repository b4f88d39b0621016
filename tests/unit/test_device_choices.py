"""Every GPU choice of the training step forced on the CPU, through `train()`: the GPU's
path (compiled model, fused chunked loss, padded widths, prefetch, fp16 with a gradient
scaler) trains like the CPU's plain path, and a compiler that fails falls back to it.

Compilation here is dynamo's graph capture (the "eager" backend: the model traced with
dynamic shapes, run as captured); test_gpu_step.py traces it through AOTAutograd too.
Inductor's C++ code generation for even this 1-layer model takes minutes on a busy
2-core machine (19-28 kernels at ~3 s each, measured), so the inductor run of the same
test runs with NMT_TEST_INDUCTOR=1, which CI's `.ci/run` sets (it passes at the same
tolerance); on a GPU inductor generates Triton instead, which no CPU test reaches.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from nmt_cli.config import ConfigError, RecipeConfig, TrainConfig, load_recipe, recipe_from_dict
from nmt_cli.core.batching import Batch
from nmt_cli.core.checkpoint import load_checkpoint
from nmt_cli.core.objective import TrainingObjective
from nmt_cli.core.transformer import ModelConfig, Transformer
from nmt_cli.engines.train import TrainOptions, train
from nmt_cli.engines.train import build as build_module
from nmt_cli.engines.train import loop as loop_module
from nmt_cli.engines.train.device_choices import announcement, choose
from nmt_cli.engines.train.events import Notice, StepDone, TrainEvent
from nmt_cli.engines.train.report import one_line
from nmt_cli.engines.train.step import Updater
from tests.fixtures.train_data import batch_of, tiny_recipe, with_model

CPU, GPU = torch.device("cpu"), torch.device("cuda")
TINY = ModelConfig(
    encoder_layers=1,
    decoder_layers=1,
    d_model=16,
    d_ff=32,
    n_heads=2,
    dropout=0.1,
    src_vocab_size=30,
    tgt_vocab_size=30,
    max_positions=32,
)
FORCED = {
    "compile": True,
    "fused_projection": True,
    "shape_multiple": 8,
    "prefetch": True,
    "attention_backend": "math",
}


@pytest.fixture(scope="module", autouse=True)
def _forget_compiled_code() -> Iterator[None]:
    """Leave no compiled code behind for other modules' compile tests to trip over."""
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _cheap(monkeypatch: pytest.MonkeyPatch) -> None:
    """No matmul-rate measurement (a second per run, minutes in fp16 on a CPU), and the
    tracing backend instead of inductor's code generation."""
    monkeypatch.setattr(loop_module, "matmul_rate", lambda *_: 1e9)
    monkeypatch.setattr(build_module, "COMPILE_BACKEND", "eager")


def _recipe(data: Path, run: Path, **train_settings: Any) -> RecipeConfig:
    """4 updates of a 1-layer d_model 16 model without dropout (a compiled graph draws
    its masks with other random numbers than eager mode, so the losses could not be
    compared with dropout on), at a quarter of the paper's learning rate (Adam's first
    steps are nearly lr * sign(gradient), which would magnify fp16's rounding into
    whole steps). Every run pads widths to 8, so that all cut the same
    batches (the cut counts the padding); that padding changes no batch's loss is
    test_gpu_step.py's test_bucketed_padding_gives_the_unbucketed_loss_and_update."""
    settings = {"max_steps": 4, "save_interval_steps": 0, "shape_multiple": 8, "lr_scale": 0.25}
    recipe = tiny_recipe(data, run, **{**settings, **train_settings})
    return with_model(recipe, d_model=16, d_ff=32, n_heads=2, dropout=0.0)


def _train(
    recipe: RecipeConfig, threads: list[set[str]] | None = None
) -> tuple[list[StepDone], list[Notice]]:
    """Train; with `threads`, the names of the threads that training started and that
    are alive at each update (as a profiler sees them)."""
    events: list[TrainEvent] = []
    before = set(threading.enumerate())

    def on_event(event: TrainEvent) -> None:
        events.append(event)
        if threads is not None and isinstance(event, StepDone):
            threads.append({t.name for t in set(threading.enumerate()) - before})

    result = train(recipe, TrainOptions(), on_event)
    assert result.steps == recipe.train.max_steps
    return (
        [e for e in events if isinstance(e, StepDone)],
        [e for e in events if isinstance(e, Notice)],
    )


def _losses(steps: list[StepDone]) -> list[float]:
    return [s.loss for s in steps]


def _batch_threads(alive: list[set[str]]) -> list[list[str]]:
    """At each update, the feed's worker threads that prepare batches ahead."""
    return [sorted(n for n in names if n.startswith("nmt-batches")) for names in alive]


@dataclasses.dataclass
class PlainRun:
    losses: list[float]
    threads: list[set[str]]  # the threads it started, alive at each of its updates


@pytest.fixture(scope="module")
def plain_run(data: Path, tmp_path_factory: pytest.TempPathFactory) -> PlainRun:
    """The CPU's own path: eager, unfused, unpadded, no prefetch, fp32."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop_module, "matmul_rate", lambda *_: 1e9)
        threads: list[set[str]] = []
        steps, _ = _train(_recipe(data, tmp_path_factory.mktemp("plain")), threads)
    assert not any(s.skipped for s in steps)
    return PlainRun(_losses(steps), threads)


@pytest.fixture(scope="module")
def plain(plain_run: PlainRun) -> list[float]:
    return plain_run.losses


def test_the_cpu_path_collates_in_the_training_thread(plain_run: PlainRun) -> None:
    """No worker thread for the batches on a CPU: its torch operations would give the
    process a second OpenMP pool, and libgomp's threads then sleep at every barrier."""
    assert _batch_threads(plain_run.threads) == [[]] * 4


def _metrics(run: Path) -> list[dict[str, Any]]:
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend",
    [
        "eager",
        pytest.param(
            "inductor",
            marks=pytest.mark.skipif(
                os.environ.get("NMT_TEST_INDUCTOR") != "1",
                reason="inductor's C++ code generation takes minutes; NMT_TEST_INDUCTOR=1",
            ),
        ),
    ],
)
def test_every_gpu_choice_forced_on_a_cpu_trains_like_the_plain_path(
    data: Path,
    tmp_path: Path,
    plain: list[float],
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
) -> None:
    """Compiled, fused chunked loss, widths padded to 8, next batches prepared ahead (no
    page-locked memory on a CPU): each update's loss is the plain path's to 1e-5.
    Compiled with dynamo's graph capture ("eager"), or with inductor on request. Seen
    from outside: the choices announced, a worker thread preparing batches at every
    update, the compilation recorded. That the widths padded and the fused loss change
    no loss is tested where they are made (test_gpu_step.py, test_fused_loss.py)."""
    monkeypatch.setattr(build_module, "COMPILE_BACKEND", backend)
    threads: list[set[str]] = []
    steps, notices = _train(_recipe(data, tmp_path, **FORCED), threads)
    assert not any(s.skipped for s in steps)
    assert _losses(steps) == pytest.approx(plain, rel=1e-5)
    assert _batch_threads(threads) == [["nmt-batches_0"]] * 4  # preparing the next batches
    said = [n.text for n in notices]
    assert (
        "CPU training with GPU choices forced by the recipe: torch.compile on (dynamic "
        "shapes); attention kernels: math; output projection fused into the chunked loss; "
        "batch widths padded to multiples of 8; next batches prepared ahead"
    ) in said
    assert any(t.startswith("torch.compile: the first update took") for t in said), said
    compile_records = [r for r in _metrics(tmp_path) if r["type"] == "compile"]
    assert [r["step"] for r in compile_records] == [1]
    assert "fallback" not in compile_records[0]


def test_fp16_with_the_gradient_scaler_trains_on_a_cpu(
    data: Path, tmp_path: Path, plain: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """fp16 autocast and torch.amp.GradScaler("cpu"), through the training engine. Users
    cannot ask for fp16 on a CPU (`resolve_precision` refuses it: no CPU multiplies in
    fp16 faster than in bf16); the test forces the resolved precision. fp16 rounds to 11
    significant bits: the losses agree with fp32's to 1e-3 (measured: 1e-5 at the first
    update, 2e-4 at the fourth)."""
    monkeypatch.setattr(loop_module, "resolve_precision", lambda *_: "fp16")
    steps, _ = _train(_recipe(data, tmp_path))
    done = [s for s in steps if not s.skipped]
    assert [s.step for s in done] == [1, 2, 3, 4]
    # An update whose scaled gradient overflows is skipped and retried on the next
    # batch, as on a GPU; so only the updates before any skip see the same batches.
    same = [s.loss for s in steps[: next((i for i, s in enumerate(steps) if s.skipped), 4)]]
    assert same and same == pytest.approx(plain[: len(same)], rel=1e-3)
    last = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert last.step == 4 and last.train_state is not None
    scaler = last.train_state["scaler"]  # the scaler's state, saved to resume with
    assert scaler is not None and 0 < scaler["scale"] <= 2.0**16


@pytest.mark.slow
def test_a_compiler_that_fails_falls_back_to_eager_mode(
    data: Path, tmp_path: Path, plain: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend that raises at the first compiled update (as inductor does without a
    C compiler or Triton): one warning naming the cause and train.compile, a record in
    train.log and metrics.jsonl, and the eager path's losses exactly (the update is
    recomputed, not stepped twice)."""

    def no_compiler(graph: Any, example_inputs: Any) -> Any:
        raise RuntimeError("no working C++ compiler found\nsecond line")

    monkeypatch.setattr(build_module, "COMPILE_BACKEND", no_compiler)
    steps, notices = _train(_recipe(data, tmp_path, compile=True))
    assert _losses(steps) == plain
    warnings = [n.text for n in notices if n.warning]
    assert len(warnings) == 1, warnings
    assert "BackendCompilerFailed: RuntimeError: no working C++ compiler found" in warnings[0]
    assert "second line" not in warnings[0] and "train.compile = false" in warnings[0]
    log = (tmp_path / "train.log").read_text(encoding="utf-8")
    assert "warning: torch.compile failed at the first update" in log
    records = [r for r in _metrics(tmp_path) if r["type"] == "compile"]
    assert len(records) == 1 and records[0]["fallback"] == "eager"
    assert records[0]["step"] == 1 and "no working C++ compiler" in records[0]["error"]


def _updater(compile_error: Exception | None) -> tuple[Updater, Transformer]:
    """An Updater whose objective's compiled forward raises `compile_error` (None: an
    eager objective), without tracing anything."""
    torch.manual_seed(0)
    model = Transformer(TINY)
    objective = TrainingObjective(model, 0.1, 0, fused_projection=True)
    if compile_error is not None:

        def compiled(*args: Any, **kwargs: Any) -> Any:
            raise compile_error

        objective._forward, objective.compiled = compiled, True
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    return Updater(objective, optimizer, "fp32", CPU, 0.0, 1), model


def _batch() -> Batch:
    gen = torch.Generator().manual_seed(3)
    pairs = [(torch.randint(4, 30, (n,), generator=gen).tolist(),) * 2 for n in (3, 7, 5)]
    return batch_of([(a, b[::-1]) for a, b in pairs])


def test_the_fallback_recomputes_the_update_once_and_steps_once() -> None:
    """Two updates after a compiler failure give the eager Updater's weights exactly: no
    gradient of the failed attempt is kept and the optimizer steps once per update."""
    batch = _batch()
    results = []
    for error in (None, RuntimeError("inductor: no Triton")):
        updater, model = _updater(error)
        for seed in (0, 1):
            updater.update([(batch, 1.0)], batch.tgt_tokens, 1.0, [seed])
        assert updater.compile_failure is error
        results.append(model.state_dict())
    for key, value in results[0].items():
        assert torch.equal(results[1][key], value), key


def test_an_error_eager_mode_raises_too_is_not_called_a_compiler_failure() -> None:
    batch = _batch()
    updater, model = _updater(RuntimeError("compiler"))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("a bug in the model")

    model.forward = broken  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="a bug in the model"):
        updater.update([(batch, 1.0)], batch.tgt_tokens, 1.0, [0])
    assert updater.compile_failure is None


def test_a_compiler_error_is_told_in_one_line() -> None:
    cause = ValueError("shapes do not match")
    assert one_line(cause) == "ValueError: shapes do not match"
    wrapped = RuntimeError("compiling failed:\n")
    wrapped.__cause__ = cause
    assert one_line(wrapped) == "RuntimeError: ValueError: shapes do not match"
    assert len(one_line(RuntimeError("x" * 1000))) == 300


# -- the settings ---------------------------------------------------------------------------


def test_auto_is_by_device_and_each_choice_can_be_forced_either_way() -> None:
    cpu = choose(TrainConfig(), CPU)
    assert (cpu.compile_model, cpu.fused_projection, cpu.shape_multiple, cpu.prefetch) == (
        False,
        False,
        1,
        False,
    )
    assert announcement(cpu, CPU) is None
    forced = choose(TrainConfig(**FORCED), CPU)  # type: ignore[arg-type]
    assert (forced.compile_model, forced.fused_projection, forced.prefetch) == (True,) * 3
    assert forced.shape_multiple == 8 and forced.attention_backend == "math"
    said = announcement(forced, CPU)
    assert said is not None and "next batches prepared ahead" in said
    off = choose(
        TrainConfig(compile=False, fused_projection=False, shape_multiple=1, prefetch=False),
        GPU,
    )
    assert (off.compile_model, off.fused_projection, off.shape_multiple, off.prefetch) == (
        False,
        False,
        1,
        False,
    )
    assert (announcement(off, GPU) or "").startswith("GPU training: torch.compile off")
    assert choose(TrainConfig(shape_multiple=16), GPU).shape_multiple == 16


def test_the_settings_load_from_toml_and_are_range_checked(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text(
        '[train]\nfused_projection = true\nshape_multiple = 8\nprefetch = "auto"\n',
        encoding="utf-8",
    )
    recipe = load_recipe(path, ["train.prefetch=true", "train.compile=true"])
    train_cfg = recipe.train
    assert (train_cfg.fused_projection, train_cfg.shape_multiple) == (True, 8)
    assert (train_cfg.prefetch, train_cfg.compile) == (True, True)
    assert recipe_from_dict(recipe.to_dict()) == recipe
    bad: list[tuple[str, Any]] = [
        ("shape_multiple", 0),
        ("shape_multiple", 129),
        ("shape_multiple", True),
        ("shape_multiple", 8.0),
        ("shape_multiple", "eight"),
        ("fused_projection", "yes"),
        ("prefetch", 1),
    ]
    for key, value in bad:
        with pytest.raises(ConfigError, match=f"train.{key}"):
            recipe_from_dict({"train": {key: value}})
        with pytest.raises(ValueError, match=f"train.{key}"):
            dataclasses.replace(TrainConfig(), **{key: value})
