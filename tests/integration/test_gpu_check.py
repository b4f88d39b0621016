"""The GPU check script and its helpers, on a machine without a GPU: the parts that run
anywhere run, the GPU stages are skipped with a clear message, and the helpers' code
paths (training variants, decoding speed, run figures) run on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

import gpu_decode
import gpu_train
import run_figures
from train_data import make_data_dir, tiny_recipe
from translation_ckpt import random_checkpoint, sentences, tiny_vocab

from nmt_cli.core.transformer import ModelConfig
from nmt_cli.engines.train import train

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"

# A GPU machine's python may lack these (torch, numpy, typer, rich, sentencepiece and
# sacrebleu only); nothing the check runs may need them.
BLOCKER = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("sacremoses", "datasets", "matplotlib", "tensorboard"):
            raise ImportError(name + " is not installed here")
        return None
sys.meta_path.insert(0, _Block())
"""

needs_no_gpu = pytest.mark.skipif(
    torch.cuda.is_available(), reason="on a GPU machine the check runs its GPU stages"
)


def _run_check(tmp_path: Path, data: Path, seconds: int = 540) -> subprocess.CompletedProcess[str]:
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        PYTHONPATH=str(block),
        GPU_CHECK_SECONDS=str(seconds),
    )
    env.pop("OUT", None)
    out = tmp_path / "out"
    return subprocess.run(
        ["bash", str(SCRIPT), str(data), str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@needs_no_gpu
def test_without_a_gpu_the_check_runs_what_it_can_and_says_what_it_skipped(
    tmp_path: Path,
) -> None:
    data = make_data_dir(tmp_path / "data")
    done = _run_check(tmp_path, data)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "imports: nmt_cli's commands load without sacremoses or datasets" in done.stdout
    assert "-- recipe: done" in done.stdout
    assert "no CUDA GPU visible: skipping the GPU stages" in done.stdout
    summary = (tmp_path / "out" / "SUMMARY.txt").read_text(encoding="utf-8")
    assert "no CUDA GPU visible" in summary and "GPU: none visible" in summary


@needs_no_gpu
def test_without_the_prepared_data_the_check_says_how_to_get_it(tmp_path: Path) -> None:
    done = _run_check(tmp_path, tmp_path / "missing")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no prepared Multi30k directory" in done.stdout
    assert "Prepare it as this script's header says" in done.stdout


def test_stages_past_the_time_budget_are_skipped_and_make_the_check_fail(
    tmp_path: Path,
) -> None:
    done = _run_check(tmp_path, tmp_path / "missing", seconds=10)
    assert done.returncode == 1
    assert "== environment: SKIPPED, the check's 10s are spent" in done.stdout


def test_training_variants_run_their_code_path_on_the_cpu() -> None:
    cfg = ModelConfig(
        encoder_layers=1, decoder_layers=1, d_model=32, d_ff=64, n_heads=2,
        src_vocab_size=60, tgt_vocab_size=60,
    )  # fmt: skip
    corpus = gpu_train.wmt_like_corpus(cfg, max_tokens=400, count=3)
    assert len(corpus.groups) == 3 and all(f > 0 for f in corpus.flops)
    for key in ("eager", "baseline"):  # "nmt" adds compilation, tested in the unit tests
        line = gpu_train.run_variant("tiny", key, cfg, corpus, 2, (1.0, 1e12), torch.device("cpu"))
        assert line.startswith(f"tiny {key}: 2 steps") and "ms/step" in line


def test_decoding_speed_runs_on_the_cpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = random_checkpoint(tmp_path / "random.pt", tiny_vocab())
    text = tmp_path / "test.txt"
    text.write_text("\n".join(sentences(12, seed=3)) + "\n", encoding="utf-8")
    argv = ["gpu_decode.py", "--model", str(model), "--input", str(text), "--device", "cpu"]
    monkeypatch.setattr(sys, "argv", [*argv, "--single", "3", "--max-len-b", "3"])
    gpu_decode.main()
    out = capsys.readouterr().out
    assert "beam 4, batch 128, cpu:" in out and "(12 sentences)" in out
    assert "beam 4, batch 1, cpu:" in out and "(3 sentences)" in out


def test_run_figures_read_a_training_run(tmp_path: Path) -> None:
    data = make_data_dir(tmp_path / "data")
    result = train(tiny_recipe(data, tmp_path / "run", max_steps=4))
    results = {"systems": [{"system": "last", "bleu": 12.34, "chrf": 40.0}]}
    (result.run_dir / "results.json").write_text(json.dumps(results), encoding="utf-8")
    lines = run_figures.figures(result.run_dir)
    assert lines[0].startswith("4 updates in ")
    assert lines[1].startswith("  0-") and "target tokens/s" in lines[1]
    assert lines[-1] == "last: sacreBLEU 12.3, chrF2 40.0"
