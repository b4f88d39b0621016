"""The training engine on a tiny model and tiny data: resume, checkpoints, lock, faults."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sacrebleu
import torch

from nmt_cli.config import RecipeConfig, TrainConfig
from nmt_cli.core import objective as objective_module
from nmt_cli.core.batching import plan_epoch
from nmt_cli.core.checkpoint import Checkpoint, load_checkpoint
from nmt_cli.core.schedule import paper_learning_rate
from nmt_cli.core.search import greedy_search
from nmt_cli.core.vocab import EOS_ID, PAD_ID, train_sentencepiece
from nmt_cli.cpu_level import has_bf16_units
from nmt_cli.engines.train import TrainOptions, train
from nmt_cli.engines.train.events import (
    CheckpointSaved,
    Notice,
    StepDone,
    TrainEvent,
    TrainStarted,
)
from nmt_cli.engines.train.feed import derive_split
from nmt_cli.engines.train.run_dir import RunDir, RunDirLocked
from nmt_cli.errors import NmtError
from tests.fixtures.train_data import make_data_dir, pairs, tiny_recipe, with_model


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path).model


def wmt_like_lengths(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Subword lengths shaped like WMT14 EN-DE: long-tailed, about 27 tokens a sentence,
    the German side a little longer and loosely correlated with the English one."""
    rng = np.random.default_rng(seed)
    src = np.clip(rng.lognormal(3.1, 0.55, n).round(), 1, 250).astype(np.int64)
    tgt = np.clip((src * rng.normal(1.1, 0.2, n)).round(), 1, 250).astype(np.int64)
    return src, tgt


@pytest.mark.parametrize("world", [1, 8])
def test_updates_hold_the_papers_25000_real_tokens_a_side(world: int) -> None:
    """Section 5.1: "approximately 25000 source tokens and 25000 target tokens" per
    update, counted without padding, on any number of devices."""
    src, tgt = wmt_like_lengths(100_000)
    split = derive_split(TrainConfig(batch_tokens=25000), world, src, tgt)
    assert world * split.accum * split.max_tokens > 25000  # padding is paid on top
    plan = plan_epoch(src, tgt, split.max_tokens, 0, 0, world, split.accum)
    real = np.array([plan.update_real_tokens(u) for u in range(plan.updates - 1)])
    mean_src, mean_tgt = real.mean(axis=0)
    assert 0.95 * 25000 <= max(mean_src, mean_tgt) <= 1.05 * 25000
    assert min(mean_src, mean_tgt) >= 0.85 * 25000


def test_split_respects_the_per_pass_memory_cap() -> None:
    src, tgt = wmt_like_lengths(20_000)
    for world in (1, 2, 8):
        split = derive_split(TrainConfig(batch_tokens=25000, max_tokens=4096), world, src, tgt)
        assert split.max_tokens <= 4096
        padded = 25000 / world / split.real_fraction
        assert padded <= split.accum * split.max_tokens < padded + split.accum


def greedy_dev_bleu(ckpt: Checkpoint, recipe: RecipeConfig, n: int) -> float:
    """sacreBLEU of the checkpoint's greedy translations of the first `n` dev pairs that
    make_data_dir wrote (`pairs(12, seed=2)`), against their raw targets: validation's
    figure, computed here from the text."""
    dev = pairs(12, seed=2)[:n]
    ids = ckpt.vocab.src.encode([s for s, _ in dev])
    src = torch.full((n, max(map(len, ids)) + 1), PAD_ID)
    for row, x in enumerate(ids):
        src[row, : len(x) + 1] = torch.tensor([*x, EOS_ID])
    decode = recipe.decode
    results = greedy_search(ckpt.build_model(), src, decode.max_len_a, decode.max_len_b)
    hyps = [ckpt.vocab.tgt.decode(r[0].tokens) for r in results]
    return float(sacrebleu.corpus_bleu(hyps, [[t for _, t in dev]]).score)


def test_checkpoints_rotation_metrics_and_schedule(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = tiny_recipe(
        data, tmp_path / "run", save_interval_steps=2, max_steps=7, validate_bleu_sentences=5
    )
    # A model this young writes empty lines (BLEU 0 whatever it is scored against), so
    # what each validation scores is recorded too: the first 5 dev lines, raw.
    scored: list[tuple[list[str], list[list[str]]]] = []
    corpus_bleu = sacrebleu.corpus_bleu

    def recording(hyps: list[str], refs: list[list[str]], **kw: object) -> object:
        scored.append((list(hyps), [list(r) for r in refs]))
        return corpus_bleu(hyps, refs, **kw)

    monkeypatch.setattr(sacrebleu, "corpus_bleu", recording)
    events: list[TrainEvent] = []
    result = train(recipe, on_event=events.append)
    monkeypatch.undo()
    raw_dev = [tgt for _, tgt in pairs(12, seed=2)[:5]]
    assert [(len(hyps), refs) for hyps, refs in scored] == [(5, [raw_dev])] * 4  # steps 2-7
    run = RunDir(tmp_path / "run")
    assert result.steps == 7 and result.stopped_by == "max_steps"
    # keep_last = 2 of the step checkpoints 2, 4, 6, 7 (the final one)
    assert [p.name for p in run.step_checkpoints()] == ["step_00000006.pt", "step_00000007.pt"]
    assert result.last_checkpoint == run.step_path(7)
    last = load_checkpoint(run.last)
    assert last.kind == "train" and last.step == 7 and last.train_state is not None
    assert last.train_state["step"] == 7
    step7 = load_checkpoint(run.step_path(7))
    assert step7.kind == "inference" and "dev_loss" in step7.meta
    assert step7.meta["dev_bleu"] == pytest.approx(greedy_dev_bleu(step7, recipe, 5))
    assert step7.meta["dev_ppl"] > 1.0
    assert all(torch.equal(v, last.model[k]) for k, v in step7.model.items())
    records = [json.loads(line) for line in run.metrics.read_text().splitlines()]
    valid = [r for r in records if r["type"] == "valid"]
    assert [r["step"] for r in valid] == [2, 4, 6, 7]
    best = min(valid, key=lambda r: r["dev_loss"])
    assert load_checkpoint(run.best).meta["dev_loss"] == pytest.approx(best["dev_loss"])
    assert (run.root / "config.json").is_file() and (run.root / "spm.model").is_file()
    assert not run.lock_file.exists()
    # Equation (3) at every step, d_model 32 and warm-up 4.
    lrs = [e.lr for e in events if isinstance(e, StepDone)]
    assert lrs == pytest.approx([paper_learning_rate(s, 32, 4) for s in range(1, 8)])
    # Every train record (one per step here) carries that step's gradient norm.
    norms = [e.grad_norm for e in events if isinstance(e, StepDone)]
    logged = [r["grad_norm"] for r in records if r["type"] == "train"]
    assert logged == pytest.approx(norms) and all(n > 0 for n in norms)


def test_interrupted_and_resumed_run_ends_with_the_same_weights(data: Path, tmp_path: Path) -> None:
    full = train(tiny_recipe(data, tmp_path / "full", max_steps=8))

    def interrupt_at_step_3(event: TrainEvent) -> None:
        if isinstance(event, StepDone) and event.step == 3:
            os.kill(os.getpid(), signal.SIGINT)  # handled: save last.pt, stop cleanly

    recipe = tiny_recipe(data, tmp_path / "cut", max_steps=8)
    first = train(recipe, on_event=interrupt_at_step_3)
    assert first.stopped_by == "signal" and first.steps == 3 and first.signal == signal.SIGINT
    resumed = train(recipe)
    assert resumed.steps == 8
    a, b = (
        weights(full.run_dir / "checkpoints/last.pt"),
        weights(resumed.run_dir / "checkpoints/last.pt"),
    )
    for key, value in a.items():
        torch.testing.assert_close(b[key], value, rtol=1e-6, atol=1e-7)
    steps = [
        json.loads(x)["step"] for x in RunDir(resumed.run_dir).metrics.read_text().splitlines()
    ]
    assert len([s for s in steps if s == 3]) == 1  # no duplicated records after resume


def test_resume_refuses_a_changed_model_or_vocabulary(data: Path, tmp_path: Path) -> None:
    recipe = tiny_recipe(data, tmp_path / "run", max_steps=1, save_interval_steps=0)
    train(recipe)
    with pytest.raises(NmtError, match=r"model\.d_ff: 64 vs 128"):
        train(with_model(recipe, d_ff=128))
    other = make_data_dir(tmp_path / "other")
    lines = [" ".join(w[::-1] for w in src.split()) for src, _ in pairs(300, seed=4)]
    (other / "spm.model").write_bytes(train_sentencepiece(lines, vocab_size=40))
    with pytest.raises(NmtError, match=r"the source vocabulary \(SentencePiece model\) differs"):
        train(tiny_recipe(other, tmp_path / "run", max_steps=1))


def test_live_lock_refuses_and_stale_lock_is_taken_over(data: Path, tmp_path: Path) -> None:
    recipe = tiny_recipe(data, tmp_path / "run", max_steps=1, save_interval_steps=0)
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        run.lock_file.write_text(f"{live.pid} {os.uname().nodename}\n")
        with pytest.raises(RunDirLocked, match=f"pid {live.pid}"):
            train(recipe)
    finally:
        live.kill()
        live.wait()
    # Now that process is dead: its lock is stale and is taken over, and the temporary
    # file its kill left mid-write is cleaned up.
    (run.root / "checkpoints").mkdir()
    torn = run.root / "checkpoints" / ".last.pt.abc123.tmp"
    torn.write_bytes(b"half a checkpoint")
    assert train(recipe).steps == 1
    assert not torn.exists()
    assert not run.lock_file.exists()


def test_repeated_non_finite_updates_stop_with_a_clear_error(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = objective_module.label_smoothed_sums

    def nan_loss(*args: object) -> tuple[torch.Tensor, torch.Tensor]:
        loss, nll = real(*args)  # type: ignore[arg-type]
        return loss * float("nan"), nll

    monkeypatch.setattr(objective_module, "label_smoothed_sums", nan_loss)
    recipe = tiny_recipe(data, tmp_path / "run", max_steps=50)
    with pytest.raises(NmtError, match="3 updates in a row had non-finite"):
        train(recipe, TrainOptions(max_nonfinite=3))


def test_out_of_memory_names_the_batch_and_what_to_lower(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def oom(*args: object) -> None:
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 9 GB")

    monkeypatch.setattr(objective_module, "label_smoothed_sums", oom)
    with pytest.raises(NmtError, match=r"sentences x .* lower train\.max_tokens"):
        train(tiny_recipe(data, tmp_path / "run"))


def test_no_gpu_is_a_clear_error(data: Path, tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(NmtError, match="--gpus 0"):
        train(tiny_recipe(data, tmp_path / "run"), TrainOptions(gpus=1))


def test_stops_on_max_epochs_and_on_max_time(data: Path, tmp_path: Path) -> None:
    events: list[TrainEvent] = []
    by_epochs = train(
        tiny_recipe(data, tmp_path / "epochs", max_steps=0, max_epochs=2, save_interval_steps=0),
        on_event=events.append,
    )
    started = next(e for e in events if isinstance(e, TrainStarted))
    assert by_epochs.stopped_by == "max_epochs"
    assert by_epochs.steps == 2 * started.updates_per_epoch
    by_time = train(tiny_recipe(data, tmp_path / "time", max_steps=0, max_time_minutes=1e-6))
    assert by_time.stopped_by == "max_time" and by_time.steps == 1


def test_bf16_training_runs_on_the_cpu(data: Path, tmp_path: Path) -> None:
    if not has_bf16_units():
        pytest.skip("this CPU has no native bf16")
    events: list[TrainEvent] = []
    result = train(tiny_recipe(data, tmp_path / "run", precision="auto"), on_event=events.append)
    assert next(e for e in events if isinstance(e, TrainStarted)).precision == "bf16"
    assert result.steps == 6 and result.skipped_updates == 0
    assert result.final_dev_loss is not None and math.isfinite(result.final_dev_loss)


def test_a_cpu_without_bf16_units_trains_auto_in_fp32_and_is_told_about_bf16(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the AVX2 level `auto` is fp32; bf16 asked for is obeyed, with one warning that
    comes before the layout probe and the first update, and in train.log."""
    from nmt_cli import cpu_level

    monkeypatch.setenv("NMT_CPU_LEVEL", "avx2")
    monkeypatch.setattr(cpu_level, "_bf16_slowdown", lambda: 6.0)
    events: list[TrainEvent] = []
    recipe = tiny_recipe(data, tmp_path / "auto", max_steps=1, precision="auto")
    auto = train(recipe, on_event=events.append)
    assert next(e for e in events if isinstance(e, TrainStarted)).precision == "fp32"
    assert not any(isinstance(e, Notice) and "emulated" in e.text for e in events)
    assert auto.steps == 1
    events.clear()
    train(
        tiny_recipe(data, tmp_path / "bf16", precision="bf16", max_steps=1), on_event=events.append
    )
    said = [e for e in events if isinstance(e, Notice) and "emulated" in e.text]
    assert len(said) == 1 and said[0].warning
    assert said[0].text.startswith("train.precision bf16: this CPU (avx2) has no bf16 units")
    assert "6.0x the time of fp32" in said[0].text
    assert events.index(said[0]) < events.index(
        next(e for e in events if isinstance(e, TrainStarted))
    )
    assert next(e for e in events if isinstance(e, TrainStarted)).precision == "bf16"
    log = (tmp_path / "bf16" / "train.log").read_text()
    assert log.count("warning: train.precision bf16: this CPU (avx2)") == 1


def test_without_the_compiled_module_training_keeps_pytorchs_kernels_and_says_so(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nmt_cli.backends import plan
    from nmt_cli.backends.cpu import training as cpu_kernels
    from nmt_cli.backends.cpu.build import CompileError
    from nmt_cli.core.attention import attention
    from nmt_cli.core.dropout import scaled_keep_mask
    from nmt_cli.core.losses import smoothed_loss_sweep
    from nmt_cli.core.operations import Operations

    def no_compiler(on_compile: Any = None) -> Any:
        raise CompileError("no C++ compiler (c++) on PATH")

    monkeypatch.setattr(cpu_kernels, "prepare_kernel", no_compiler)
    drawn: list[tuple[int, ...]] = []
    swept: list[bool] = []

    def counted_mask(like: torch.Tensor, p: float) -> torch.Tensor:
        drawn.append(tuple(like.shape))
        return scaled_keep_mask(like, p)

    def counted_sweep(*args: Any) -> Any:
        swept.append(args[4])  # want_grad: training's sweeps, then validation's
        return smoothed_loss_sweep(*args)

    attended: list[bool] = []

    def counted_attention(*args: Any) -> Any:
        attended.append(args[4])  # causal: the decoder's self-attention, else not
        return attention(*args)

    references = Operations(
        attention=counted_attention, keep_mask=counted_mask, loss_sweep=counted_sweep
    )
    monkeypatch.setattr(plan, "REFERENCE", references)  # what the planner starts from
    events: list[TrainEvent] = []
    recipe = tiny_recipe(data, tmp_path / "run")
    result = train(recipe, on_event=events.append)
    notices = [e.text for e in events if isinstance(e, Notice)]
    message = (
        "dropout masks, the loss and attention from PyTorch's operations: "
        "no C++ compiler (c++) on PATH"
    )
    assert message in notices
    assert result.steps == 6
    # The reference swept every loss: each training batch's (want_grad), three updates of
    # as many batches each, then at each of the two saves (steps 3 and 6) every
    # validation batch's, in that order.
    saves = [e for e in events if isinstance(e, CheckpointSaved)]
    assert [e.step for e in saves] == [3, 6]
    training, validation = swept.count(True) // 2, swept.count(False) // 2
    assert training >= 3 and training % 3 == 0 and validation >= 1
    assert swept == ([True] * training + [False] * validation) * 2
    # It attended in every forward pass, training's and validation's alike: the encoder's
    # self-attention in each layer, then in each decoder layer its causal self-attention
    # and its cross-attention.
    model = recipe.model
    assert attended == (
        [False] * model.encoder_layers + [True, False] * model.decoder_layers
    ) * len(swept)
    # And it drew the masks of the paper's dropout sites in training's passes only: the
    # two embedding sums, each encoder sub-layer's output (2), each decoder one's (3).
    sites = 2 + 2 * model.encoder_layers + 3 * model.decoder_layers
    assert len(drawn) == sites * swept.count(True)


def test_training_on_a_cpu_takes_its_kernels_from_the_compiled_module(
    kernel: Any, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the module built, the plan a CPU run trains with, as `nmt train --verbose`
    shows it and train.log always records it, takes attention, the dropout masks and
    residual adds, the loss's sweep and the feed-forward's bias and ReLU from the module
    (the blocks of a window and the linear layers stay PyTorch's: training's matmuls are
    oneDNN's), and no notice says PyTorch's operations stand in. And the model is built
    from that plan: its first update's loss is not the one PyTorch's masks give on the
    same batch and weights."""
    from nmt_cli.backends.cpu import training as cpu_kernels
    from nmt_cli.backends.cpu.build import CompileError

    events: list[TrainEvent] = []
    result = train(tiny_recipe(data, tmp_path / "run"), on_event=events.append)
    assert result.steps == 6
    first = next(e for e in events if isinstance(e, StepDone)).loss

    def no_compiler(on_compile: Any = None) -> Any:
        raise CompileError("no C++ compiler (c++) on PATH")

    monkeypatch.setattr(cpu_kernels, "prepare_kernel", no_compiler)
    reference: list[TrainEvent] = []
    train(tiny_recipe(data, tmp_path / "reference", max_steps=1), on_event=reference.append)
    other = next(e for e in reference if isinstance(e, StepDone)).loss
    assert other != first and abs(other - first) < 0.5  # dropout's noise, no more
    notices = [e for e in events if isinstance(e, Notice)]
    plan = [e.text for e in notices if e.text.startswith("plan: ")]
    assert plan == [
        "plan: attention: the module's kernel (padding masks; the reference for others)",
        "plan: biased_attention: the module's kernel, adding the projections' biases as it "
        "reads q, k and v",
        "plan: blocks: PyTorch's fused kernels",
        "plan: keep_mask: the module's counter-based generator",
        "plan: dropout_add: the module's, its mask drawn as it adds and again backward, never "
        "stored",
        "plan: loss_sweep: the module's sweep",
        "plan: linear: core's reference (PyTorch operations)",
        "plan: dense_relu: the module's bias and ReLU around PyTorch's product",
    ]
    assert all(e.detail for e in notices if e.text in plan)  # --verbose's
    logged = (tmp_path / "run" / "train.log").read_text().splitlines()
    assert [line.split("  ", 1)[1] for line in logged if "  plan: " in line] == plan
    assert not any("PyTorch's operations" in e.text for e in notices)


def test_tensorboard_missing_is_a_notice_only_when_asked_for(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed
    for setting, warned in ((True, True), ("auto", False)):
        events: list[TrainEvent] = []
        run = tmp_path / str(setting)
        recipe = tiny_recipe(data, run, max_steps=1, tensorboard=setting)
        assert train(recipe, on_event=events.append).steps == 1
        notices = [e.text for e in events if isinstance(e, Notice)]
        assert any("tensorboard is not installed" in n for n in notices) == warned
        assert not (run / "tensorboard").exists()


def test_a_resumed_run_opens_its_data_and_checkpoint_once(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`train()` builds one plan (data directory, model configuration, checkpoint to
    resume) and the rank trains from it, reading neither again."""
    from nmt_cli.engines.train import loop, plan

    recipe = tiny_recipe(data, tmp_path / "run", max_steps=2, save_interval_steps=0)
    train(recipe)
    opened: list[str] = []

    def counting(name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            opened.append(name)
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(loop, "open_data_dir", counting("data", loop.open_data_dir))
    monkeypatch.setattr(plan, "load_checkpoint", counting("last.pt", plan.load_checkpoint))
    longer = dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, max_steps=4))
    assert train(longer).steps == 4
    assert opened == ["data", "last.pt"]
