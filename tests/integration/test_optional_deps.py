"""A machine without one of the libraries some commands need (a bare GPU machine with
PyTorch, an install without the extras) gets one `error:` line naming the package, the pip
extra that installs it and the setting that does without it, never an internal error.
Each library is hidden as an uninstalled one looks to `import` (`sys.modules[name] = None`).
"""

from __future__ import annotations

import gzip
import json
import re
import sys
import tomllib
from pathlib import Path

import pytest
from unix_helpers import nmt, no_escape, one_error

from nmt_cli.config import TrainConfig
from nmt_cli.engines.train.events import Notice, TrainEvent
from nmt_cli.engines.train.report import Reporter
from nmt_cli.engines.train.run_dir import RunDir
from nmt_cli.optional import PACKAGES
from tests.fixtures.translation_ckpt import RandomCheckpoints, sentences

ROOT = Path(__file__).resolve().parents[2]


def hide(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """As if `names` (and every submodule already imported) were not installed."""
    for name in names:
        for loaded in [m for m in sys.modules if m.startswith(name + ".")]:
            monkeypatch.setitem(sys.modules, loaded, None)
        monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture
def model(random_ckpt_of: RandomCheckpoints) -> Path:
    """Random weights, short outputs (its positions end translations early)."""
    return random_ckpt_of(max_positions=12)


def text_corpus(root: Path, pairs: int = 60) -> Path:
    """train/valid text files, en-de, gzipped, as `nmt prepare --from` reads them."""
    root.mkdir(parents=True)
    for split, n, seed in (("train", pairs, 0), ("valid", 10, 1)):
        for lang, lines in (("en", sentences(n, seed)), ("de", sentences(n, seed + 10))):
            data = "".join(line + "\n" for line in lines).encode()
            (root / f"{split}.{lang}.gz").write_bytes(gzip.compress(data, mtime=0))
    return root


def test_every_package_names_an_extra_of_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    for package, extra in PACKAGES.items():
        wanted = extras[extra] if extra else project["dependencies"]
        assert any(re.split(r"[\[<>=~!; ]", r)[0] == package for r in wanted), package


def test_score_without_sacremoses_names_no_paper_which_still_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hyp, ref = tmp_path / "hyp", tmp_path / "ref"
    hyp.write_text("the cat sat on the mat\na big-red dog\n", encoding="utf-8")
    ref.write_text("the cat sat on a mat\na big-red dog\n", encoding="utf-8")
    hide(monkeypatch, "sacremoses")
    line = one_error(nmt("score", str(hyp), "-r", str(ref)), 1, "sacremoses is not installed")
    assert "pip install sacremoses" in line and "nmt score --no-paper" in line
    result = nmt("score", str(hyp), "-r", str(ref), "--no-paper", "--json")
    no_escape(result)
    assert result.exit_code == 0, result.output
    assert "tokenized BLEU" not in result.stdout and '"BLEU"' in result.stdout


def test_run_without_sacremoses_stops_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hide(monkeypatch, "sacremoses")
    data, run = tmp_path / "data", tmp_path / "run"
    recipe = str(ROOT / "recipes" / "demo.toml")
    result = nmt("run", recipe, f"--set=data.dir={data}", f"--set=train.run_dir={run}")
    one_error(result, 1, "sacremoses is not installed", "score.paper_bleu = false")
    assert not data.exists() and not run.exists()


def test_prepare_without_sacremoses_or_datasets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = text_corpus(tmp_path / "corpus")
    hide(monkeypatch, "sacremoses", "datasets")
    local = ("--from", str(corpus), "--src", "en", "--tgt", "de", "--vocab-size", "40")
    out = tmp_path / "normalized"
    result = nmt("prepare", *local, "--normalize-punctuation", "--out", str(out))
    one_error(result, 1, "sacremoses is not installed", "pip install sacremoses")
    assert "--normalize-punctuation" in result.stderr and not out.exists()
    out = tmp_path / "wmt14"
    result = nmt("prepare", "wmt14-en-de", "--out", str(out))
    one_error(result, 1, "datasets is not installed", "pip install datasets", "--from DIR")
    assert not out.exists()
    parquet = tmp_path / "parquet"
    parquet.mkdir()
    (parquet / "train.parquet").write_bytes(b"")
    result = nmt("prepare", "--from", str(parquet), "--src", "en", "--tgt", "de")
    one_error(result, 1, "datasets is not installed", "directory of text files")
    # Text files need neither.
    out = tmp_path / "text"
    result = nmt("prepare", *local, "--out", str(out))
    no_escape(result)
    assert result.exit_code == 0, result.output
    assert (out / "manifest.json").is_file()


@pytest.mark.usefixtures("one_thread")
def test_pictures_without_matplotlib(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    record = {"type": "train", "step": 10, "loss": 5.0, "nll": 4.0, "lr": 1e-3}
    (run / "metrics.jsonl").write_text(json.dumps(record | {"elapsed_s": 1.0}) + "\n")
    hide(monkeypatch, "matplotlib")
    hint = "pip install 'nmt-cli[plot]'"
    one_error(nmt("plot", str(run)), 1, "matplotlib is not installed", hint)
    args = ("attention", "the cat", "-m", str(model), "-o", str(tmp_path / "maps"))
    one_error(nmt(*args, "--format", "png"), 1, "matplotlib is not installed", hint, "html")
    result = nmt(*args, "--format", "html", "--beam", "1")
    no_escape(result)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("target", "package"), [("ctranslate2", "ctranslate2"), ("huggingface", "transformers")]
)
def test_export_without_its_library(
    target: str, package: str, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hide(monkeypatch, package)
    out = tmp_path / "out"
    result = nmt("export", "--to", target, str(model), str(out))
    one_error(result, 1, f"{package} is not installed", "pip install 'nmt-cli[export]'")
    assert not out.exists()


def test_tensorboard_missing_is_a_notice_naming_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hide(monkeypatch, "tensorboard")
    for setting, warned in ((True, True), ("auto", False)):
        events: list[TrainEvent] = []
        tc = TrainConfig(tensorboard=setting)
        reporter = Reporter(RunDir(tmp_path / str(setting)), tc, events.append, is_main=True)
        reporter.open_tensorboard()
        assert reporter.tensorboard is None
        notices = [e.text for e in events if isinstance(e, Notice)]
        assert len(notices) == int(warned)
        if warned:
            assert "tensorboard is not installed" in notices[0]
            assert "pip install 'nmt-cli[tensorboard]'" in notices[0]
            assert "train.tensorboard = false" in notices[0]


def test_translate_on_ray_without_ray_names_the_extra_and_nothing_else_changes(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hide(monkeypatch, "ray")
    source, out = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("the cat\na dog\n", encoding="utf-8")
    args = ("translate", "-m", str(model), "-i", str(source), "-o", str(out), "--beam", "1")
    line = one_error(nmt(*args, "--ray"), 1, "ray is not installed", "nmt translate --ray")
    assert "pip install 'nmt-cli[ray]'" in line and "leave out --ray" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]
    result = nmt(*args, "--threads", "1")
    no_escape(result)
    assert result.exit_code == 0, result.output
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2
