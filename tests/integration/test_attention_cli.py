"""`nmt attention` end to end on a tiny trained model: the pictures decode, differ where
the weights differ, the HTML page carries every layer and head, and bad input gets one
line. Without matplotlib the command says how to install it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner
from unix_helpers import error_line, no_escape, one_error

from nmt_cli.cli import app
from nmt_cli.config import DecodeConfig
from nmt_cli.engines.translate.alignment import MERGE_NOTE
from nmt_cli.engines.translate.attention import record_attention
from nmt_cli.engines.translate.translator import Translator
from tests.fixtures.translation_ckpt import RandomCheckpoints

runner = CliRunner()
SENTENCE = "the big red dog sat"
REVERSED = "sat dog red big the"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def untrained(random_ckpt_of: RandomCheckpoints) -> Path:
    """A model of the reverser's shape (1 layer a stack, 2 heads) with random weights: all
    that the errors and the page without pictures need, without the reverser's training."""
    return random_ckpt_of(d_model=64)


def draw(model: Path, out: Path, *args: str) -> tuple[int, list[Path], str]:
    result = runner.invoke(app, ["attention", SENTENCE, "-m", str(model), "-o", str(out), *args])
    no_escape(result)
    return result.exit_code, [Path(p) for p in result.stdout.split()], result.stderr


def read_png(path: Path) -> np.ndarray:
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    return np.asarray(matplotlib.image.imread(path))


def page_data(path: Path) -> dict:  # type: ignore[type-arg]
    text = path.read_text(encoding="utf-8")
    found = re.search(
        r'<script type="application/json" id="nmt-attention-data">(.*?)</script>', text, re.S
    )
    assert found is not None
    return json.loads(found.group(1))  # type: ignore[no-any-return]


@pytest.mark.slow
def test_pictures_decode_and_the_page_has_every_layer_and_head(
    reverser_unseen: Path, tmp_path: Path
) -> None:
    code, files, err = draw(reverser_unseen, tmp_path / "out")
    assert code == 0, err
    assert f"-> {REVERSED!r}" in err  # the model reverses the sentence exactly
    names = sorted(p.name for p in files)
    stems = ["cross", "decoder-self", "encoder-layer1-heads", "encoder-layer1-lines"]
    assert names == sorted(["attention.html", *(f"{s}.{e}" for s in stems for e in ("png", "svg"))])
    for path in files:
        assert path.is_file() and path.stat().st_size > 2_000
        if path.suffix == ".png":
            height, width, channels = read_png(path).shape
            assert height > 200 and width > 300 and channels in (3, 4)
        elif path.suffix == ".svg":
            root = ET.parse(path).getroot()
            assert root.tag == "{http://www.w3.org/2000/svg}svg"
    svg = (tmp_path / "out/cross.svg").read_text(encoding="utf-8")
    assert "Encoder-decoder attention" in svg and "SentencePiece pieces" in svg

    page = (tmp_path / "out/attention.html").read_text(encoding="utf-8")
    assert set(re.findall(r"https?://[^\"' ]+", page)) == {"http://www.w3.org/2000/svg"}
    assert "<link" not in page and " src=" not in page
    data = page_data(tmp_path / "out/attention.html")
    translator = Translator.load(reverser_unseen, DecodeConfig(precision="fp32"))
    maps = record_attention(translator, SENTENCE)
    for kind, weights in (
        ("encoder", maps.encoder),
        ("decoder", maps.decoder),
        ("cross", maps.cross),
    ):
        shown = np.array(data["kinds"][kind]["layers"])
        assert shown.shape == weights.shape  # every layer x head x rows x columns
        np.testing.assert_allclose(shown, weights, atol=6e-4)
    assert data["kinds"]["cross"]["rows"] == maps.target and data["translation"] == REVERSED


@pytest.mark.slow
def test_attention_maps_are_distributions_and_the_decoder_is_causal(reverser_unseen: Path) -> None:
    translator = Translator.load(reverser_unseen, DecodeConfig(precision="fp32"))
    maps = record_attention(translator, SENTENCE)
    assert maps.translation == translator.translate([SENTENCE])[0].text
    assert (
        maps.source[-1] == "</s>" and maps.target[-1] == "</s>" and maps.decoder_inputs[0] == "<s>"
    )
    for weights in (maps.encoder, maps.decoder, maps.cross):
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.triu(maps.decoder, k=1).max() == 0.0
    words = maps.merged()
    assert words.source == ["the", "big", "red", "dog", "sat", "</s>"]
    assert words.cross.shape[-2:] == (6, 6) and words.unit_note == MERGE_NOTE
    np.testing.assert_allclose(words.cross.sum(-1), 1.0, atol=1e-5)
    # The model attends to the word it writes: target word j looks at source word 4 - j
    # most, and the end of the sentence at the end.
    assert list(words.cross.mean(axis=(0, 1)).argmax(-1)) == [4, 3, 2, 1, 0, 5]


@pytest.mark.slow
def test_two_heads_give_two_different_pictures(reverser_unseen: Path, tmp_path: Path) -> None:
    pictures = []
    for head in ("1", "2"):
        code, files, err = draw(reverser_unseen, tmp_path, "--head", head, "--format", "png")
        assert code == 0, err
        assert tmp_path / f"cross-head{head}.png" in files
        pictures.append(read_png(tmp_path / f"cross-head{head}.png"))
    assert pictures[0].shape == pictures[1].shape
    assert np.abs(pictures[0] - pictures[1]).max() > 0.1


@pytest.mark.slow
def test_words_merge_pieces_and_say_so(reverser_unseen: Path, tmp_path: Path) -> None:
    code, files, err = draw(
        reverser_unseen, tmp_path, "--words", "--format", "svg,html", "--focus", "red"
    )
    assert code == 0, err
    assert {p.suffix for p in files} == {".svg", ".html"}
    assert MERGE_NOTE in (tmp_path / "encoder-layer1-lines.svg").read_text(encoding="utf-8")
    data = page_data(tmp_path / "attention.html")
    assert data["unit"] == MERGE_NOTE
    assert data["kinds"]["encoder"]["rows"] == ["the", "big", "red", "dog", "sat", "</s>"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layer", "2"], "--layer 2: the model has 1 encoder layer(s); use 1 to 1"),
        (["--decoder-layer", "3"], "--decoder-layer 3: the model has 1 decoder layer(s)"),
        (["--head", "3"], "--head 3: the model has 2 heads; use 1 to 2"),
        (["--focus", "zebra"], "--focus 'zebra': not a token of the sentence"),
        (["--format", "gif"], "--format gif: use one or more of png, svg, html"),
    ],
)
def test_bad_options_get_one_line(
    untrained: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    code, _, err = draw(untrained, tmp_path / "out", *args)
    assert code == 1
    assert len(err.strip().splitlines()) == 1 and message in error_line(err)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_missing_model_empty_sentence_and_unwritable_output(
    untrained: Path, tmp_path: Path
) -> None:
    code, _, err = draw(tmp_path / "nope.pt", tmp_path / "out")
    assert code == 1 and err.strip() == f"error: {tmp_path / 'nope.pt'}: no such checkpoint file"
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, _, err = draw(untrained, blocker / "out")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert f"--out {blocker / 'out'}: cannot create the directory" in error_line(err)
    result = runner.invoke(app, ["attention", "", "-m", str(untrained), "-o", str(tmp_path)])
    one_error(result, 1, "the sentence is empty")


def test_without_matplotlib_images_are_refused_and_html_still_works(
    untrained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    code, _, err = draw(untrained, tmp_path, "--format", "png")
    assert code == 1
    assert err.strip().splitlines() == [
        "error: matplotlib is not installed, and drawing PNG/SVG pictures needs it: "
        "pip install 'nmt-cli[plot]' (or pip install matplotlib); "
        "or pass --format html for the page alone, which needs no matplotlib"
    ]
    code, files, err = draw(untrained, tmp_path, "--format", "html")
    assert code == 0 and files == [tmp_path / "attention.html"]


def test_help_never_imports_matplotlib() -> None:
    script = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from nmt_cli.cli import app\n"
        "assert CliRunner().invoke(app, ['--help']).exit_code == 0\n"
        "assert CliRunner().invoke(app, ['attention', '--help']).exit_code == 0\n"
        "print(sorted(m for m in sys.modules if m.startswith('matplotlib')))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
