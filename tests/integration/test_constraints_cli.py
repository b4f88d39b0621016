"""`nmt translate --constraints / --prefix / --prefix-file` and the Python API's `prefix=`
and `constraints=`, on a model trained here to copy its input: every output holds what it
was given, lines without constraints translate as before, and bad constraint files are
one `error:` line naming the file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner
from unix_helpers import no_escape, one_error

from nmt_cli.cli import app
from nmt_cli.engines.translate.translator import Translator
from nmt_cli.errors import NmtError
from tests.fixtures.translation_ckpt import COPY_POOL

runner = CliRunner()
LINES = COPY_POOL[:6]
# Per line: a word of the sentence (written anyway), none, phrases it lacks.
PHRASES = [["red"], [], ["under the mat"], ["big", "blue"], [], ["sat"]]


def translate(*args: str, stdin: str = "\n".join(LINES) + "\n") -> tuple[int, list[str], str]:
    result = runner.invoke(app, ["translate", *args, "-q"], input=stdin)
    no_escape(result)
    return result.exit_code, result.stdout.splitlines(), result.stderr


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("beam", ["1", "4"])
def test_every_translation_holds_its_phrases(copy_model: Path, tmp_path: Path, beam: str) -> None:
    cons = write(tmp_path / "cons.txt", ["\t".join(p) for p in PHRASES])
    code, plain, err = translate("-m", str(copy_model), "--beam", beam)
    assert code == 0 and plain == LINES, err
    code, held, err = translate("-m", str(copy_model), "--beam", beam, "--constraints", str(cons))
    assert code == 0, err
    for line, phrases, out in zip(LINES, PHRASES, held, strict=True):
        assert all(phrase in out for phrase in phrases), (line, phrases, out)
        if all(phrase in line for phrase in phrases):  # nothing forced: as without
            assert out == line
    assert any(out != line for out, line in zip(held, LINES, strict=True))
    # Side by side in worker processes, and as n-best lists: the same.
    code, two, _ = translate("-m", str(copy_model), "--beam", beam, "--constraints", str(cons),
                             "--workers", "2", "--batch-size", "2")  # fmt: skip
    assert code == 0 and two == held
    if beam == "4":
        code, nbest, _ = translate("-m", str(copy_model), "--nbest", "3", "--json",
                                   "--constraints", str(cons))  # fmt: skip
        for record, phrases in zip(map(json.loads, nbest), PHRASES, strict=True):
            assert len(record["hypotheses"]) == 3
            for hyp in record["hypotheses"]:
                assert all(phrase in hyp["text"] for phrase in phrases)


def test_prefix_for_every_line_or_one_a_line(copy_model: Path, tmp_path: Path) -> None:
    code, out, err = translate("-m", str(copy_model), "--prefix", "the big")
    assert code == 0, err
    assert len(out) == len(LINES) and all(line.startswith("the big") for line in out)
    starts = ["red", LINES[1], "", "a small dog", "green", "mat cat"]
    code, out, err = translate("-m", str(copy_model), "--prefix-file",
                               str(write(tmp_path / "p.txt", starts)))  # fmt: skip
    assert code == 0, err
    for line, start, got in zip(LINES, starts, out, strict=True):
        assert got.startswith(start)
        if line.startswith(start):  # the model would have written it: nothing changes
            assert got == line


def test_python_api_takes_prefixes_and_constraints(copy_model: Path, tmp_path: Path) -> None:
    cons = write(tmp_path / "cons.txt", ["\t".join(p) for p in PHRASES])
    _, cli, _ = translate("-m", str(copy_model), "--constraints", str(cons), "--prefix", "the")
    with Translator.load([copy_model], workers=1) as translator:
        texts = translator.translate(iter(LINES), constraints=iter(PHRASES), prefix="the")
        assert [t.text for t in texts] == cli
        # A text alone is one phrase; a prefix a line.
        [alone] = translator.translate("the cat", constraints=["big dog"], prefix=["a"])
        assert alone.text.startswith("a") and "big dog" in alone.text
        assert [t.text for t in translator.translate(LINES)] == LINES  # none: as before


def test_bad_constraint_files_name_the_file_and_line(copy_model: Path, tmp_path: Path) -> None:
    model = ["-m", str(copy_model)]
    cases = {
        "red\tblue\t\tsat": "cons.txt:2: an empty constraint",
        "red\t日本": "cons.txt:2: '日本' has characters the target vocabulary lacks",
        " ".join(["dog"] * 40): "target pieces; the model writes at most 39",
    }
    for bad, message in cases.items():
        cons = write(tmp_path / "cons.txt", ["red", bad, "", "", "", ""])
        one_error(runner.invoke(app, ["translate", *model, "--constraints", str(cons)],
                                input="\n".join(LINES) + "\n"), 1, message)  # fmt: skip
    short = write(tmp_path / "short.txt", ["red", "blue"])
    one_error(runner.invoke(app, ["translate", *model, "--constraints", str(short)],
                            input="\n".join(LINES) + "\n"), 1,
              "short.txt has 2 lines, the input more")  # fmt: skip
    long = write(tmp_path / "long.txt", ["red"] * 7)
    one_error(runner.invoke(app, ["translate", *model, "--prefix-file", str(long)],
                            input="\n".join(LINES) + "\n"), 1,
              "long.txt has more lines than the input (6)")  # fmt: skip
    one_error(runner.invoke(app, ["translate", *model, "--constraints", str(tmp_path / "no")],
                            input="x\n"), 1, "no: no such file")  # fmt: skip
    one_error(runner.invoke(app, ["translate", *model, "--prefix", "日本"], input="x\n"), 2,
              "--prefix: '日本' has characters the target vocabulary lacks")  # fmt: skip
    one_error(runner.invoke(app, ["translate", *model, "--prefix", "a", "--prefix-file",
                                  str(long)], input="x\n"), 2,
              "--prefix and --prefix-file: give one of them")  # fmt: skip
    one_error(runner.invoke(app, ["translate", *model, "--ray", "--prefix", "a"], input="x\n"),
              2, "--constraints, --prefix and --prefix-file are not for --ray")  # fmt: skip
    with (
        Translator.load([copy_model], workers=1) as translator,
        pytest.raises(NmtError, match="^line 2: an empty constraint"),
    ):
        translator.translate(["red dog", "the cat"], constraints=[["red"], ["a", " "]])
