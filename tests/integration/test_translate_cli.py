"""`nmt translate` end to end: a model trained here to copy its input is translated exactly
through SentencePiece and back; streaming, odd input, n-best, JSON and errors."""

from __future__ import annotations

import gc
import io
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner
from unix_helpers import error_line, no_escape

from nmt_cli.backends.cpu.linear import Fp32OnednnLinear, mkl_tuned
from nmt_cli.cli import app
from nmt_cli.config import DecodeConfig
from nmt_cli.core.checkpoint import load_checkpoint
from nmt_cli.core.eval_mode import evaluating
from nmt_cli.cpu_level import at_least
from nmt_cli.engines.translate.chunks import read_chunks
from nmt_cli.engines.translate.loading import set_threads
from nmt_cli.engines.translate.translator import Translator, length_batches, translate_lines
from nmt_cli.engines.translate.workers import forks
from nmt_cli.errors import NmtError
from tests.fixtures.translation_ckpt import (
    COPY_POOL,
    RandomCheckpoints,
    sentences,
)

runner = CliRunner()


@pytest.fixture
def copier(copy_model: Path) -> Path:
    return copy_model


@pytest.fixture
def random_ckpt(random_ckpt_of: RandomCheckpoints) -> Path:
    return random_ckpt_of()


def run(args: list[str], stdin: bytes | str = b"") -> tuple[int, str, str]:
    result = runner.invoke(app, ["translate", *args], input=stdin)
    no_escape(result)
    return result.exit_code, result.stdout, result.stderr


LINES = [*COPY_POOL[:12], "", "red dog", "", *COPY_POOL[12:21]]


def test_start_up_is_kept_from_the_collector_which_runs_for_the_work(copier: Path) -> None:
    """nmt_cli/collector.py: what start-up made (modules, the model) frozen out of the
    collector's reach, the collector on again for the translating."""
    gc.unfreeze()
    try:
        code, out, err = run(["-m", str(copier), "-q"], "red dog\n")
        assert code == 0 and out.strip(), err
        assert gc.isenabled() and gc.get_freeze_count() > 10_000
    finally:
        gc.unfreeze()


def test_copy_model_round_trips_raw_text_in_input_order(copier: Path) -> None:
    # Small batches force several length-sorted batches; output order must be the input's.
    code, out, err = run(["-m", str(copier), "--batch-size", "3"], "\n".join(LINES) + "\n")
    assert code == 0, err
    assert out.split("\n")[:-1] == LINES
    assert "translated 24 lines" in err


def test_greedy_fp32_bf16_int8_and_token_batches_agree(copier: Path) -> None:
    text = "\n".join(LINES) + "\n"
    outs = {
        run(["-m", str(copier), *extra, "-q"], text)[1]
        for extra in (
            ["--beam", "1"],
            ["--precision", "fp32"],
            ["--precision", "bf16", "--batch-tokens", "20"],
            ["--precision", "int8"],
            ["--precision", "int8", "--batch-size", "1"],
            ["--batch-size", "1"],
        )
    }
    assert outs == {text}


def test_files_in_and_out(copier: Path, tmp_path: Path) -> None:
    src, hyp = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    code, out, err = run(["-m", str(copier), "-i", str(src), "-o", str(hyp)])
    assert code == 0, err
    assert out == ""
    assert hyp.read_text(encoding="utf-8").split("\n")[:-1] == LINES


def test_engine_function_for_training_and_run(copier: Path) -> None:
    ckpt = load_checkpoint(copier)
    cfg = DecodeConfig(precision="fp32", buffer_lines=5)
    assert translate_lines(ckpt, iter(LINES), cfg) == LINES
    model = ckpt.build_model().train()  # a model being trained, as validation decodes it
    with evaluating(model):
        assert not model.training
        translator = Translator(model, ckpt.vocab, DecodeConfig(buffer_lines=5))
        assert [t.text for t in translator.translate(iter(LINES))] == LINES
    assert model.training  # restored after translating


def test_unusual_text_never_crashes_and_keeps_one_line_per_line(random_ckpt: Path) -> None:
    weird = [
        b"tab\there and bell \x07 and NUL \x00 here",
        "emoji 🐈‍⬛ 👩🏽‍🚀".encode(),
        "right to left עברית العربية".encode(),
        b"invalid utf-8 \xff\xfe \xed\xa0\x80 surrogate",
        b"windows line end\r",
        "zero\u200bwidth and line\u2028separator".encode(),
        b"   ",
        b"",
        b"\x1b[31mescape\x1b[0m",
    ]
    text = b"\n".join(weird) + b"\n"
    args = ["-m", str(random_ckpt), "--max-len-b", "5"]
    code, out, err = run([*args, "--on-bad-utf8", "replace"], text)
    assert code == 0, err
    assert out.count("\n") == len(weird)
    assert out.split("\n")[6:8] == ["", ""]  # blank lines stay blank
    assert "warning: 2 line(s) with invalid UTF-8 or NUL bytes" in err and "stdin:1)" in err
    # by default, bytes that are not text stop the command at the first such line
    code, out, err = run(args, text)
    assert code == 1 and out == ""
    assert err.strip() == (
        "error: stdin:1: a NUL byte at column 29: binary data, not text; "
        "fix the input or pass --on-bad-utf8 replace"
    )


def test_last_line_without_newline_and_no_input(random_ckpt: Path) -> None:
    code, out, _ = run(["-m", str(random_ckpt), "--max-len-b", "3"], b"a cat\nthe dog")
    assert code == 0 and out.count("\n") == 2
    code, out, _ = run(["-m", str(random_ckpt)], b"")
    assert code == 0 and out == ""


def test_too_long_input_is_truncated_with_a_counted_warning(random_ckpt: Path) -> None:
    long = " ".join(["the big red house"] * 40)  # far beyond 40 positions
    text = f"{long}\nthe cat\n{long}\n"
    code, out, err = run(["-m", str(random_ckpt), "--max-len-b", "3"], text)
    assert code == 0
    assert out.count("\n") == 3
    assert "2 input line(s) longer than 39 subword tokens were truncated (lines 1, 3)" in err


def test_nbest_prints_k_scored_hypotheses_per_line(copier: Path) -> None:
    code, out, err = run(["-m", str(copier), "--nbest", "3"], "the cat\n\nred dog\n")
    assert code == 0, err
    rows = [line.split(" ||| ") for line in out.splitlines()]
    assert [r[0] for r in rows] == ["0", "0", "0", "1", "2", "2", "2"]
    assert rows[0][1] == "the cat" and rows[4][1] == "red dog"
    scores = [float(r[2]) for r in rows[:3]]
    assert scores == sorted(scores, reverse=True)


def test_json_lines_carry_source_hypotheses_scores_and_timing(copier: Path) -> None:
    code, out, err = run(["-m", str(copier), "--json", "--nbest", "2"], "the cat\n\n")
    assert code == 0, err
    first, second = (json.loads(line) for line in out.splitlines())
    assert first["source"] == "the cat" and first["line"] == 1
    assert first["hypotheses"][0]["text"] == "the cat"
    assert len(first["hypotheses"]) == 2
    assert first["hypotheses"][0]["score"] >= first["hypotheses"][1]["score"]
    assert first["hypotheses"][0]["log_prob"] < 0
    assert first["timing"]["chunk_seconds"] >= 0
    assert second["hypotheses"] == []


def test_bad_checkpoints_and_options_are_clear_errors(tmp_path: Path, random_ckpt: Path) -> None:
    code, _, err = run(["-m", str(tmp_path / "missing.pt")], "x\n")
    assert code == 1 and "no such checkpoint file" in error_line(err)
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(random_ckpt.read_bytes()[:300])
    code, _, err = run(["-m", str(corrupt)], "x\n")
    assert code == 1 and "not a readable checkpoint" in error_line(err)
    code, _, err = run(["-m", str(random_ckpt), "--nbest", "5", "--beam", "4"], "x\n")
    assert code == 2 and "--nbest must not exceed the beam size (4), got 5" in error_line(err)
    code, _, err = run(["-m", str(random_ckpt), "-i", str(tmp_path / "nope.txt")])
    assert code == 1 and "nope.txt: no such file" in error_line(err)
    code, _, err = run(["-m", str(random_ckpt), "--precision", "int4"], "x\n")
    message = "--precision 'int4': use fp32, bf16, fp16, int8 or auto"
    assert code == 2 and message in error_line(err)


def test_help_prints_the_length_penalty_formula() -> None:
    result = runner.invoke(app, ["translate", "--help"], env={"COLUMNS": "200"})
    assert "((5 + |Y|) / 6) ** alpha" in result.stdout


def test_batched_equals_one_by_one_through_the_translator(random_ckpt: Path) -> None:
    ckpt = load_checkpoint(random_ckpt)
    lines = sentences(10, seed=3)
    cfg = DecodeConfig(precision="fp32", max_len_b=6, nbest=2)
    batched = Translator.from_checkpoint(ckpt, cfg).translate(lines)
    alone = Translator.from_checkpoint(ckpt, DecodeConfig(precision="fp32", max_len_b=6, nbest=2))
    for line, result in zip(lines, batched, strict=True):
        [single] = alone.translate([line])
        assert [h.text for h in single.hypotheses] == [h.text for h in result.hypotheses]


def test_verbose_says_how_each_operation_runs(copier: Path) -> None:
    """--verbose prints the plan: the planner's choice for the model (encoding's attention
    by PyTorch's fused kernels on a CPU) and the CPU backend's for the decoder step."""
    code, out, err = run(["-m", str(copier), "--precision", "fp32", "-v"], "a b\n")
    assert code == 0 and out.strip()
    plan = [line.removeprefix("plan: ") for line in err.splitlines() if line.startswith("plan: ")]
    assert "attention: PyTorch's fused kernels" in plan
    # fp32: the module's few-row kernel wherever AVX2 is in force (above its rows MKL's
    # products on Intel's CPUs, oneDNN's on others), PyTorch's products below
    reference = "linear: core's reference (PyTorch operations) (not the module's AVX2 fp32"
    more = "PyTorch's product" if mkl_tuned() else "oneDNN's packed fp32"
    avx2 = f"linear: the module's AVX2 fp32 kernel for few rows, {more} for more"
    assert any(line.startswith(avx2 if at_least("avx2") else reference) for line in plan)
    assert any(line.startswith("decoder step: ") for line in plan)
    _, _, quiet_err = run(["-m", str(copier), "--precision", "fp32"], "a b\n")
    assert "plan: " not in quiet_err


def test_batch_size_defaults_to_64_sentences_on_a_cpu(copier: Path) -> None:
    ckpt = load_checkpoint(copier)
    auto = Translator.from_checkpoint(ckpt, DecodeConfig(precision="fp32"))
    assert auto.batch_sentences == 64
    # fp32 keeps exactly the open sentences as they finish (no kernel built per shape),
    # up to the module kernel's rows where oneDNN's products take more (CPUs not Intel's)
    beam = auto.cfg.beam_size
    if isinstance(auto.model.projection, Fp32OnednnLinear):
        assert auto.model.slots(8, beam) == 8 and auto.model.slots(9, beam) == 16
    else:
        assert auto.model.slots(9, beam) == 9 and auto.model.slots(61, beam) == 61
    # bf16 on oneDNN alone keeps its few shapes: 2 finished sentences ride along as filler
    onednn = Translator.from_checkpoint(ckpt, DecodeConfig(precision="bf16", compiled_step=False))
    assert onednn.model.slots(9, beam) == 16
    sizes = [len(b) for b in length_batches(list(range(150)), [[5]] * 150, auto.batch_sentences)]
    assert sizes == [64, 64, 22]
    given = Translator.from_checkpoint(ckpt, DecodeConfig(precision="fp32", batch_sentences=100))
    assert given.batch_sentences == 100
    assert [len(b) for b in length_batches(list(range(150)), [[5]] * 150, 100)] == [100, 50]
    # and in padded tokens: 6 tokens a sentence (EOS included), at most 20 a batch
    assert [len(b) for b in length_batches(list(range(7)), [[5] * 5] * 7, 64, 20)] == [3, 3, 1]


@pytest.mark.usefixtures("one_thread")  # one thread per worker: processes where possible
def test_batches_decoded_side_by_side_give_the_same_output(copier: Path) -> None:
    """Two workers (forked processes on Linux) give what one gives: texts, scores and
    the attention recorded for alignments; closing stops the processes."""
    ckpt = load_checkpoint(copier)
    cfg = DecodeConfig(precision="fp32", batch_sentences=2)
    lines = COPY_POOL[20:35]
    one = Translator.from_checkpoint(ckpt, cfg, workers=1, alignment_layer=0)
    two = Translator.from_checkpoint(ckpt, cfg, workers=2, alignment_layer=0)
    expected, got = one.translate(lines, attention=True), two.translate(lines, attention=True)
    assert [t.text for t in got] == [t.text for t in expected] == lines
    assert [t.hypotheses for t in got] == [t.hypotheses for t in expected]
    pool = two._pool
    assert pool is not None and pool.processes == forks()
    workers = set(multiprocessing.active_children())
    assert len(workers) >= (2 if pool.processes else 0)
    two.close()
    assert two._pool is None and not workers & set(multiprocessing.active_children())
    with pytest.raises(NmtError, match="closed"):
        pool.map([[[5]]], attention=False)


@pytest.mark.slow
def test_worker_processes_end_without_noise_at_exit(copier: Path) -> None:
    """Several batches on two workers, in a fresh interpreter: the workers are stopped
    and waited for before exit. (Stopped without waiting, Python 3.11 sometimes printed
    an ignored "Bad file descriptor" traceback from the pool's shutdown at exit.)"""
    command = [sys.executable, "-m", "nmt_cli", "translate", "-m", str(copier), "-q"]
    command += ["--batch-size", "2", "--workers", "2", "--threads", "2"]
    text = "\n".join(COPY_POOL[:16]) + "\n"
    for _ in range(3):
        done = subprocess.run(command, input=text, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert done.stdout.splitlines() == COPY_POOL[:16]


def test_read_chunks_answers_a_slow_pipe_at_once() -> None:
    """A writer that waits for each answer: its first line comes after the wait for
    company, every later one at once (in far less than the wait)."""
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as reader, os.fdopen(write_fd, "wb", buffering=0) as writer:
        chunks = read_chunks(reader, max_lines=1000, wait_s=3.0)
        for line, within in ((b"first line", 30.0), (b"second line", 1.5), (b"third", 1.5)):
            got: list[list[str]] = []
            thread = threading.Thread(target=lambda g=got: g.append(next(chunks)), daemon=True)
            writer.write(line + b"\n")  # and the writer keeps the pipe open
            thread.start()
            thread.join(timeout=within)
            assert got == [[line.decode()]]


def test_read_chunks_gathers_a_bursts_trickling_lines() -> None:
    """After a chunk of several lines the next one waits for more: a line that comes
    soon after its first joins it."""
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as reader, os.fdopen(write_fd, "wb", buffering=0) as writer:
        writer.write(b"a\nb\n")
        chunks = read_chunks(reader, max_lines=2, wait_s=600.0)
        assert next(chunks) == ["a", "b"]  # full: no wait
        got: list[list[str]] = []
        thread = threading.Thread(target=lambda: got.append(next(chunks)), daemon=True)
        thread.start()
        writer.write(b"c\n")
        time.sleep(0.2)  # far less than the wait: "d" belongs with "c"
        writer.write(b"d\n")
        thread.join(timeout=10)
        assert got == [["c", "d"]]


def test_read_chunks_fills_whole_chunks_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "input.txt"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(5000)))
    sizes = []
    with path.open("rb") as stream:
        for chunk in read_chunks(stream, max_lines=1000):
            sizes.append(len(chunk))
            time.sleep(0.05)  # translating it: meanwhile the next chunk's lines queue up
    assert sum(sizes) == 5000
    assert sizes[1:-1] == [1000] * (len(sizes) - 2)  # the first may start before the rest is read


def test_read_chunks_bounds_the_buffer_and_keeps_every_line() -> None:
    data = b"".join(b"line %d\n" % i for i in range(2500))
    chunks = list(read_chunks(io.BytesIO(data), max_lines=300))
    assert max(len(c) for c in chunks) <= 300
    assert [x for c in chunks for x in c] == [f"line {i}" for i in range(2500)]
    # lines are text by the one policy of text_io.py: bytes that are not text name their line
    with pytest.raises(NmtError, match=r"^in.txt:2: not valid UTF-8"):
        list(read_chunks(io.BytesIO(b"fine\nbad \xff\n"), max_lines=300, name="in.txt"))


@pytest.mark.slow
def test_interactive_user_is_answered_before_input_ends(copier: Path) -> None:
    """A real process: write one line, read its translation, only then close stdin."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt_cli", "translate", "-m", str(copier), "-q"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(b"the red cat\n")
        proc.stdin.flush()
        answer: list[bytes] = []
        thread = threading.Thread(target=lambda: answer.append(proc.stdout.readline()))
        thread.start()
        thread.join(timeout=60)
        assert answer == [b"the red cat\n"]
        proc.stdin.write(b"a dog\n")
        proc.stdin.close()
        assert proc.stdout.read() == b"a dog\n"
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_thread_layout_gives_each_batch_its_own_threads() -> None:
    before = torch.get_num_threads()
    try:
        assert set_threads(2, 0) == (2, 2) and torch.get_num_threads() == 1
        assert set_threads(4, 2) == (4, 2) and torch.get_num_threads() == 2
        assert set_threads(3, 1) == (3, 1) and torch.get_num_threads() == 3
        assert set_threads(1, 5) == (1, 1) and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_the_python_step_translates_as_the_compiled_one(random_ckpt: Path, precision: str) -> None:
    """A random model's output is all near-ties: any difference in a step would show.
    Where the layers are PyTorch's (fp32 below AVX2) the two are bit-identical; bf16,
    int8 and fp32 use the compiled module's products only beside the compiled step, so
    there the two may differ and are compared on their scores: bf16 and fp32 in the last
    bits; int8 by its quantization, which differs between the module (a scale per row)
    and PyTorch's kernels (one a call), and in the bits of one operand on CPUs without
    VNNI (the module's weights and PyTorch's activations are 7-bit there): products within
    about 2% of the float ones either way, a relative grid step / sqrt(12) of 1.5-1.7%)."""
    text = "\n".join(f"{w} red dog" for w in COPY_POOL[:8]) + "\n"
    args = ["-m", str(random_ckpt), "--precision", precision, "--json", "-q", "--beam", "3"]
    code_c, compiled, _ = run(args, text)
    code_p, python, _ = run([*args, "--python-step"], text)
    assert code_c == code_p == 0
    a = [json.loads(line) for line in compiled.splitlines()]
    b = [json.loads(line) for line in python.splitlines()]
    if precision == "fp32" and not at_least("avx2"):
        assert [r["hypotheses"] for r in a] == [r["hypotheses"] for r in b]
    else:
        scores_a = [h["score"] for r in a for h in r["hypotheses"]]
        scores_b = [h["score"] for r in b for h in r["hypotheses"]]
        close = {"rel": 0.02} if precision == "int8" else {"abs": 0.05}
        assert scores_a == pytest.approx(scores_b, **close)


def test_a_step_that_cannot_be_compiled_is_a_warning_not_a_failure(
    copier: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nmt_cli.backends.cpu import build as compiled_step

    def no_compiler() -> None:
        raise compiled_step.CompileError("no C++ compiler (c++) on PATH")

    # As in a fresh process on a machine without a compiler: nothing loaded yet (an
    # earlier test of this process may have loaded the module), nothing built.
    monkeypatch.setattr(compiled_step, "_loaded", None)
    monkeypatch.setattr(compiled_step, "is_built", lambda: False)
    monkeypatch.setattr(compiled_step, "check_tools", no_compiler)
    text = "\n".join(COPY_POOL[:4]) + "\n"
    code, out, err = run(["-m", str(copier)], text)
    assert code == 0 and out == text
    assert "warning: decoding with the slower Python step" in err
    assert "the compiled step could not be built: no C++ compiler" in err
    assert "building" not in err
