"""Every command behaves like a good Unix tool: each case ends with the right output, a
warning, or one `error:` line (exit 1, or 2 for a usage error), never a traceback and
never a silently wrong result; and nothing that was there before is damaged."""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import json
import lzma
import os
import pty
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from unix_helpers import corpus_pairs, nmt, one_error, snapshot, write_lines

from nmt_cli.config import ConfigError, DataConfig, DecodeConfig, TrainConfig, load_recipe
from nmt_cli.core.model_config import ModelConfig
from tests.fixtures.train_data import make_data_dir
from tests.fixtures.translation_ckpt import RandomCheckpoints, random_checkpoint, tiny_vocab

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
LINES = ["the cat sat", "a dog ran", "", "the red house"]
STDIO = ["-i", "/dev/stdin", "-o", "/dev/stdout"]
FAST = ["--beam", "1", "--max-len-b", "3", "-q"]


@pytest.fixture
def ckpt(random_ckpt_of: RandomCheckpoints) -> Path:
    return random_ckpt_of()


@pytest.fixture
def text(tmp_path: Path) -> Path:
    return write_lines(tmp_path / "in.txt", LINES)


def translate(ckpt: Path, *args: str, stdin: bytes = b"") -> str:
    result = nmt("translate", "-m", str(ckpt), *FAST, *args, stdin=stdin)
    assert result.exit_code == 0, result.output
    return result.stdout


# --- compressed text is read by its content, and written by the output's name ------------

COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda b: gzip.compress(b, mtime=0),
    "xz": lzma.compress,
    "bzip2": bz2.compress,
}


@pytest.mark.parametrize("kind", COMPRESS)
def test_translate_and_score_read_compressed_text_whatever_its_name(
    ckpt: Path, text: Path, tmp_path: Path, kind: str
) -> None:
    packed = tmp_path / "val.en"  # no suffix: the content decides
    packed.write_bytes(COMPRESS[kind](text.read_bytes()))
    expected = translate(ckpt, "-i", str(text))
    assert translate(ckpt, "-i", str(packed)) == expected
    assert translate(ckpt, stdin=packed.read_bytes()) == expected
    ref = tmp_path / "ref.de.gz"
    ref.write_bytes(COMPRESS[kind](b"a b c d e\nf g h i j\n"))
    scored = nmt("score", "--ref", str(ref), "--no-paper", stdin="a b c d e\nf g h i j\n")
    assert scored.exit_code == 0, scored.output
    assert "BLEU = 100.00" in scored.stdout


def test_output_named_gz_is_written_gzipped(ckpt: Path, text: Path, tmp_path: Path) -> None:
    out = tmp_path / "hyp.de.gz"
    assert translate(ckpt, "-i", str(text), "-o", str(out)) == ""
    assert gzip.decompress(out.read_bytes()).decode() == translate(ckpt, "-i", str(text))


# --- outputs: links, FIFOs and devices are written through, never replaced --------------


def test_output_through_a_symlink_keeps_the_link(ckpt: Path, text: Path, tmp_path: Path) -> None:
    target = write_lines(tmp_path / "target.txt", ["old"])
    link = tmp_path / "link.txt"
    link.symlink_to(target.name)
    translate(ckpt, "-i", str(text), "-o", str(link))
    assert link.is_symlink() and link.readlink() == Path("target.txt")
    assert target.read_text().count("\n") == len(LINES)


def test_output_to_a_fifo_is_written_through(ckpt: Path, text: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    translate(ckpt, "-i", str(text), "-o", str(fifo))
    reader.join(timeout=30)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert got and got[0].count(b"\n") == len(LINES)


def test_dash_dev_null_and_a_pipe_are_inputs(ckpt: Path, text: Path) -> None:
    expected = translate(ckpt, "-i", str(text))
    assert translate(ckpt, "-i", "-", "-o", "-", stdin=text.read_bytes()) == expected
    assert translate(ckpt, "-i", "/dev/null") == ""
    read_fd, write_fd = os.pipe()  # what <(zcat f.gz) hands over: /dev/fd/N
    data = gzip.compress(text.read_bytes())

    def feed() -> None:
        with os.fdopen(write_fd, "wb") as fh:
            fh.write(data)

    threading.Thread(target=feed, daemon=True).start()
    try:
        assert translate(ckpt, "-i", f"/dev/fd/{read_fd}") == expected
    finally:
        os.close(read_fd)


@pytest.mark.slow
def test_dev_stdin_and_dev_stdout_in_a_real_process(ckpt: Path, text: Path, tmp_path: Path) -> None:
    """`-o /dev/stdout >> log` appends to the shell's file instead of replacing it."""
    log = write_lines(tmp_path / "log.txt", ["earlier line"])
    with open(log, "ab") as out:
        done = subprocess.run(
            [sys.executable, "-m", "nmt_cli", "translate", "-m", str(ckpt), *FAST, *STDIO],
            input=gzip.compress(text.read_bytes()),
            stdout=out,
            stderr=subprocess.PIPE,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr.decode()
    lines = log.read_text().split("\n")[:-1]
    assert lines[0] == "earlier line" and len(lines) == 1 + len(LINES)


# --- outputs are checked before the work: a directory, a place that cannot be written --


@pytest.mark.parametrize("command", ["translate", "average-checkpoints", "prepare"])
def test_a_bad_output_fails_before_any_work(command: str, tmp_path: Path) -> None:
    """The whole line a user sees names the option and the path, and says what to do."""
    folder = tmp_path / "folder"
    folder.mkdir()
    a_file = write_lines(tmp_path / "file.txt", ["keep me"])
    before = snapshot(tmp_path)
    # the model and checkpoint do not exist: the error must be about the output, first
    args = {
        "translate": ["translate", "-m", str(tmp_path / "x.pt"), "-o", str(folder)],
        "average-checkpoints": [
            "average-checkpoints",
            str(tmp_path / "none.pt"),
            "-o",
            str(folder),
        ],
        "prepare": ["prepare", "demo", "--out", str(a_file)],
    }[command]
    expected = {
        "translate": f"error: --output {folder}: is a directory; name a file to write",
        "average-checkpoints": f"error: --output {folder}: is a directory; name a file to write",
        "prepare": f"error: --out {a_file}: exists and is not a directory; choose another",
    }[command]
    assert one_error(nmt(*args), 1) == expected
    assert snapshot(tmp_path) == before


def test_check_output_path_refuses_unwritable_places(tmp_path: Path) -> None:
    from nmt_cli.errors import NmtError
    from nmt_cli.outputs import check_output_path

    a_file = write_lines(tmp_path / "file.txt", ["x"])
    with pytest.raises(NmtError, match="is not a directory"):
        check_output_path(a_file / "out.txt")
    with pytest.raises(NmtError, match="is also an input"):
        check_output_path(a_file, inputs=[tmp_path / "other", a_file])
    check_output_path(tmp_path / "new" / "deeper" / "out.txt")  # created when written
    check_output_path("-")


def test_average_refuses_to_write_over_one_of_its_inputs(ckpt: Path, tmp_path: Path) -> None:
    other = random_checkpoint(tmp_path / "b.pt", tiny_vocab(), seed=1)
    before = snapshot(tmp_path)
    line = one_error(nmt("average-checkpoints", str(ckpt), str(other), "-o", str(other)), 1)
    assert line == (
        f"error: --output {other} is also an input ({other}); writing it would destroy "
        "that input: choose another output"
    )
    assert snapshot(tmp_path) == before


# --- one policy for bytes that are not text, with file:line ---------------------------

BAD = b"fine line\nbroken \xff byte\nlast\n"


@pytest.mark.parametrize("command", ["translate", "score", "prepare"])
def test_invalid_utf8_is_one_policy_for_every_command(
    command: str, ckpt: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.en"
    bad.write_bytes(BAD)
    good = write_lines(tmp_path / "good.de", ["eins zwei", "drei vier", "fünf"])
    out = tmp_path / "out"
    args = {
        "translate": ["translate", "-m", str(ckpt), *FAST, "-i", str(bad), "-o", str(out)],
        "score": ["score", "--ref", str(good), str(bad), "--no-paper"],
        "prepare": [
            *("prepare", "--train-src", str(bad), "--train-tgt", str(good), "--valid-src"),
            *(str(bad), "--valid-tgt", str(good), "--src", "en", "--tgt", "de", "--out"),
            *(str(out), "--vocab-size", "20"),
        ],
    }[command]
    line = one_error(nmt(*args), 1)
    assert f"{bad}:2: not valid UTF-8 (byte 0xff at column 8)" in line
    assert "--on-bad-utf8 replace" in line
    assert not out.exists()
    if command != "prepare":  # prepare's replace path is covered by its own tests
        replaced = nmt(*args, "--on-bad-utf8", "replace")
        assert replaced.exit_code == 0, replaced.output
        assert "warning: 1 line(s) with invalid UTF-8 or NUL bytes" in replaced.stderr
        assert f"(first: {bad}:2)" in replaced.stderr


def test_binary_input_is_refused_not_translated(ckpt: Path, tmp_path: Path) -> None:
    binary = tmp_path / "model-as-input.pt"
    binary.write_bytes(ckpt.read_bytes())
    try:  # where Python's own decoder first stops on the checkpoint's first line
        binary.read_bytes().split(b"\n")[0].decode("utf-8")
        raise AssertionError("a checkpoint's first line is not UTF-8")
    except UnicodeDecodeError as exc:
        byte, column = exc.object[exc.start], exc.start + 1
    line = one_error(nmt("translate", "-m", str(ckpt), "-i", str(binary)), 1)
    assert line == (
        f"error: {binary}:1: not valid UTF-8 (byte 0x{byte:02x} at column {column}); "
        "fix the input or pass --on-bad-utf8 replace"
    )
    # binary data that happens to be valid UTF-8 is told by its NUL byte
    nul = tmp_path / "nul.bin"
    nul.write_bytes(b"a line\nab\x00cd\n")
    line = one_error(nmt("translate", "-m", str(ckpt), "-i", str(nul)), 1)
    assert line == (
        f"error: {nul}:2: a NUL byte at column 3: binary data, not text; "
        "fix the input or pass --on-bad-utf8 replace"
    )


# --- numeric settings are range-checked, naming the key ------------------------------


def _numeric_fields() -> list[tuple[str, str, object]]:
    """(section, key, a value outside every range) for every numeric setting."""
    cases = []
    for section, cls in (
        ("data", DataConfig),
        ("model", ModelConfig),
        ("train", TrainConfig),
        ("decode", DecodeConfig),
    ):
        for f in cls.__dataclass_fields__.values():
            kind = str(f.type)
            if "int" in kind and "bool" not in kind:
                cases.append((section, f.name, -5))
            elif "float" in kind:
                cases.append((section, f.name, "nan"))
    return cases


@pytest.mark.parametrize(("section", "key", "value"), _numeric_fields())
def test_every_numeric_setting_is_range_checked(
    tmp_path: Path, section: str, key: str, value: object
) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text(f"[{section}]\n{key} = {value}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{recipe.resolve()}: {section}\.{key} must"):
        load_recipe(recipe.resolve())
    with pytest.raises(ConfigError, match=rf"^--set {section}\.{key}={value}: {section}\.{key}"):
        load_recipe(RECIPES / "demo.toml", [f"{section}.{key}={value}"])


def test_negative_max_steps_through_the_cli(tmp_path: Path) -> None:
    line = one_error(
        nmt("train", str(RECIPES / "demo.toml"), "--set", "train.max_steps=-5", "--dry-run"), 2
    )
    assert line == "error: --set train.max_steps=-5: train.max_steps must be at least 0, got -5"
    recipe = tmp_path / "r.toml"
    recipe.write_text("[train]\nmax_steps = -5\n", encoding="utf-8")
    line = one_error(nmt("train", str(recipe)), 1)
    assert line.endswith("r.toml: train.max_steps must be at least 0, got -5")


# --- the run directory records what was trained ---------------------------------------


def _tiny_train_args(data: Path, run: Path, *sets: str) -> list[str]:
    settings = [
        f"data.dir={data}",
        f"train.run_dir={run}",
        "model.encoder_layers=1",
        "model.decoder_layers=1",
        "model.d_model=32",
        "model.d_ff=64",
        "model.n_heads=4",
        "model.max_positions=64",
        "train.batch_tokens=240",
        "train.max_steps=2",
        "train.save_interval_steps=2",
        "train.log_interval_steps=1",
        "train.precision='fp32'",
        "train.threads=1",
        *sets,
    ]
    return ["train", str(RECIPES / "base.toml"), *[f"--set={s}" for s in settings]]


def test_run_directory_records_the_data_and_refuses_other_languages(tmp_path: Path) -> None:
    data = make_data_dir(tmp_path / "data")
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["tgt"] = "fr"
    manifest["vocab"].update(size=len(tiny_vocab().src) + 1, joint=True)
    manifest["files"] = {"valid.src.txt": _sha(data / "valid.src.txt")}
    (data / "manifest.json").write_text(json.dumps(manifest))
    run = tmp_path / "run"
    line = one_error(nmt(*_tiny_train_args(data, run)), 1)
    assert "holds en->fr data but the recipe's [data] says en->de" in line
    assert "--set data.tgt=fr" in line and not run.exists()

    done = nmt(*_tiny_train_args(data, run, "data.tgt=fr"))
    assert done.exit_code == 0, done.output
    assert "warning: the recipe's data.vocab_size is 8000" in done.stderr
    config = json.loads((run / "config.json").read_text())
    assert (config["data"]["tgt"], config["data"]["vocab_size"]) == (
        "fr",
        manifest["vocab"]["size"],
    )
    record = json.loads((run / "data.json").read_text())
    assert (record["src"], record["tgt"]) == ("en", "fr")
    assert record["files"] == manifest["files"] and record["dir"] == str(data.resolve())
    log = (run / "train.log").read_text()
    assert "starting:" in log and "saved step_00000002.pt" in log and "stopped at step 2" in log

    # the same run directory, resumed on other data: refused, naming what changed
    (data / "valid.src.txt").write_text("other sentences\n" * 12)
    manifest["files"] = {"valid.src.txt": _sha(data / "valid.src.txt")}
    (data / "manifest.json").write_text(json.dumps(manifest))
    line = one_error(nmt(*_tiny_train_args(data, run, "data.tgt=fr", "train.max_steps=4")), 1)
    assert "was trained on other data" in line and "valid.src.txt" in line


def _sha(path: Path) -> str:
    from nmt_cli.data_dir import sha256_file

    return sha256_file(path)


# --- tracebacks and poor messages that were --------------------------------------------


def _case_files(tmp: Path) -> dict[str, str]:
    (tmp / "dir").mkdir()
    (tmp / "latin1.toml").write_bytes(b'name = "caf\xe9"\n')
    (tmp / "include5.toml").write_text("include = 5\n")
    (tmp / "recipe.toml").write_text('name = "x"\n')
    write_lines(tmp / "a.txt", ["a b", "c d"])
    return {"tmp": str(tmp)}


# The whole line a user sees after `error: `, with the case's paths filled in ({tmp},
# {ckpt}); "..." at the end: the line starts so (the rest is a list owned elsewhere,
# checked by its own test below).
CASES: list[tuple[str, list[str], int, str]] = [
    (
        "train on a directory",
        ["train", "{tmp}/dir"],
        1,
        "{tmp}/dir: is a directory, not a recipe file",
    ),
    (
        "recipe not UTF-8",
        ["train", "{tmp}/latin1.toml"],
        1,
        "{tmp}/latin1.toml:1: not valid UTF-8 (byte 0xe9); a recipe is a UTF-8 TOML file",
    ),
    (
        "include = 5",
        ["train", "{tmp}/include5.toml"],
        1,
        "{tmp}/include5.toml: include must be a file name or a list of file names, "
        'e.g. include = "base.toml"; got 5',
    ),
    (
        "directory as --train-src",
        [
            *("prepare", "--train-src", "{tmp}/dir", "--train-tgt", "{tmp}/a.txt"),
            *("--valid-src", "{tmp}/a.txt", "--valid-tgt", "{tmp}/a.txt", "--src", "en"),
            *("--tgt", "de", "--out", "{tmp}/out"),
        ],
        1,
        "{tmp}/dir: is a directory; give a text file",
    ),
    (
        "directory as -m",
        ["translate", "-m", "{tmp}/dir"],
        1,
        "{tmp}/dir: is a directory, not a checkpoint file",
    ),
    (
        "directory as -i",
        ["translate", "-m", "{ckpt}", "-i", "{tmp}/dir"],
        1,
        "{tmp}/dir: is a directory; give a text file",
    ),
    (
        "--beam 0",
        ["translate", "-m", "{ckpt}", "--beam", "0"],
        2,
        "--beam must be at least 1, got 0",
    ),
    (
        "--batch-size -1",
        ["translate", "-m", "{ckpt}", "--batch-size", "-1"],
        2,
        "--batch-size must be at least 0, got -1",
    ),
    (
        "--threads -3",
        ["translate", "-m", "{ckpt}", "--threads", "-3"],
        2,
        "--threads must be at least 0, got -3",
    ),
    (
        "a TOML file as --model",
        ["translate", "-m", "{tmp}/recipe.toml"],
        1,
        "{tmp}/recipe.toml: not a checkpoint (it is text; nmt train and nmt "
        "average-checkpoints write checkpoints as .pt files)",
    ),
    (
        "--set error",
        ["train", "{tmp}/recipe.toml", "--set", "model.d_modle=3"],
        2,
        "--set model.d_modle=3: unknown key model.d_modle; did you mean model.d_model? (valid: ...",
    ),
    (
        "--last on a missing run directory",
        ["average-checkpoints", "{tmp}/no-run", "--last", "3", "-o", "{tmp}/x.pt"],
        1,
        "{tmp}/no-run: no such run directory",
    ),
    (
        "--last 0",
        ["average-checkpoints", "{tmp}", "--last", "0", "-o", "{tmp}/x.pt"],
        2,
        "--last must be at least 1, got 0",
    ),
    (
        "--bootstrap -5",
        ["score", "--ref", "{tmp}/a.txt", "{tmp}/a.txt", "--bootstrap", "-5"],
        2,
        "--bootstrap must be 0 (none) or a number of resamples, got -5",
    ),
    (
        "--lang zz",
        ["score", "--ref", "{tmp}/a.txt", "{tmp}/a.txt", "--lang", "zz"],
        2,
        "--lang 'zz': not a language the Moses tokenizer knows (...",
    ),
    (
        "--test xx",
        ["score", "--ref", "{tmp}/a.txt", "{tmp}/a.txt", "--test", "xx"],
        2,
        "--test 'xx': use bs (paired bootstrap) or ar",
    ),
    (
        "--precision",
        ["translate", "-m", "{ckpt}", "--precision", "fp8"],
        2,
        "--precision 'fp8': use fp32, bf16, fp16, int8 or auto",
    ),
    (
        "--on-bad-utf8",
        ["translate", "-m", "{ckpt}", "--on-bad-utf8", "skip"],
        2,
        "--on-bad-utf8 'skip': use error or replace",
    ),
    (
        "--until",
        ["run", "{tmp}/recipe.toml", "--until", "deploy"],
        2,
        "unknown stage 'deploy'; stages are prepare, train, average, translate, score",
    ),
    (
        "--gpus -1",
        ["train", "{tmp}/recipe.toml", "--gpus", "-1"],
        2,
        "--gpus must not be negative, got -1",
    ),
    (
        "--workers -1",
        ["prepare", "demo", "--workers", "-1", "--out", "{tmp}/o"],
        2,
        "--workers must be >= 0 (0 = one per CPU), got -1",
    ),
    (
        "not a number",
        ["translate", "-m", "{ckpt}", "--beam", "four"],
        2,
        "Invalid value for '--beam': Input should be a valid integer, unable to parse string "
        "as an integer; see 'nmt translate --help'",
    ),
    ("missing argument", ["train"], 2, "Missing argument 'RECIPE'; see 'nmt train --help'"),
    (
        "unknown option",
        ["score", "--bogus"],
        2,
        "No such option: --bogus (Possible options: --verbose); see 'nmt score --help'",
    ),
    (
        "unknown command",
        ["trian"],
        2,
        "No such command 'trian'. Did you mean 'train'?; see 'nmt --help'",
    ),
]


@pytest.mark.parametrize(("why", "args", "code", "message"), CASES, ids=[c[0] for c in CASES])
def test_mistakes_end_in_one_error_line_with_the_right_code(
    why: str, args: list[str], code: int, message: str, ckpt: Path, tmp_path: Path
) -> None:
    values = {**_case_files(tmp_path), "ckpt": str(ckpt)}
    args = [a.format(**values) for a in args]
    expected = "error: " + message.format(**values)
    before = snapshot(tmp_path)
    line = one_error(nmt(*args, stdin=b"a b\n"), code)
    if expected.endswith("..."):
        assert line.startswith(expected.removesuffix("...")), line
    else:
        assert line == expected
    assert snapshot(tmp_path) == before


def test_an_unknown_language_is_told_the_languages_moses_knows(tmp_path: Path) -> None:
    """The list in the message is the tokenizer's: sacremoses's non-breaking prefix files,
    plus Japanese and Korean (its CJK modes), sorted; the unknown code is not among them."""
    from sacremoses.corpus import NonbreakingPrefixes

    ref = write_lines(tmp_path / "a.txt", ["a b"])
    line = one_error(nmt("score", "--ref", str(ref), str(ref), "--lang", "zz"), 2)
    listed = line[line.index("(") + 1 : line.rindex(")")].split(", ")
    known = set(NonbreakingPrefixes().available_langs.values()) | {"ja", "ko"}
    assert listed == sorted(known)
    assert {"de", "en", "fr"} <= set(listed) and "zz" not in listed


def test_a_misspelt_setting_is_told_every_valid_key_of_its_section(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('name = "x"\n')
    line = one_error(nmt("train", str(recipe), "--set", "model.d_modle=3"), 2)
    listed = line[line.index("(valid: ") + len("(valid: ") : line.rindex(")")].split(", ")
    assert listed == sorted(f.name for f in dataclasses.fields(ModelConfig))


def test_a_second_prepare_on_one_directory_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "data"
    out.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / "prepare.lock").write_text(f"{live.pid} {socket.gethostname()}\n")
        line = one_error(nmt("prepare", "demo", "--out", str(out)), 1)
        assert f"is in use by another nmt prepare (pid {live.pid}" in line
        assert sorted(p.name for p in out.iterdir()) == ["prepare.lock"]
    finally:
        live.kill()
        live.wait()


# --- signals: saved, but the exit code says the work is not finished -------------------


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_errors_carry_the_shell_exit_code(signum: int, code: int) -> None:
    from nmt_cli.errors import Interrupted

    assert Interrupted("stopped", signum).exit_code == code


# --- progress and verbosity --------------------------------------------------------------


@pytest.mark.parametrize(
    "command", ["prepare", "train", "translate", "average-checkpoints", "score", "run"]
)
def test_every_command_has_quiet_and_verbose(command: str) -> None:
    text = nmt(command, "--help").stdout
    assert "-q, --quiet" in text and "-v, --verbose" in text


def test_no_progress_or_summary_when_not_a_terminal_or_quiet(ckpt: Path, text: Path) -> None:
    loud = nmt("translate", "-m", str(ckpt), "--beam", "1", "-i", str(text))
    assert loud.exit_code == 0
    assert "━" not in loud.stderr and "translated 4 lines" in loud.stderr
    quiet = nmt("translate", "-m", str(ckpt), "--beam", "1", "-i", str(text), "-q")
    assert quiet.exit_code == 0 and quiet.stderr == ""
    scored = nmt("score", "--ref", str(text), str(text), "--bootstrap", "20", "-q")
    assert scored.exit_code == 0 and scored.stderr == "" and "95% CI" in scored.stdout


def test_translate_progress_is_shown_on_a_terminal(ckpt: Path, text: Path) -> None:
    """On a terminal (stderr a pseudo-terminal, as a person's shell gives it), `nmt
    translate` draws its bar (label, bar, lines done of the input's 4) and replaces it
    with the summary; the translations on stdout carry no control sequences."""
    command = [sys.executable, "-m", "nmt_cli", "translate", "-m", str(ckpt), "-i", str(text)]
    overrides = ("TTY_COMPATIBLE", "TTY_INTERACTIVE", "FORCE_COLOR")  # rich's, not a terminal's
    env = {k: v for k, v in os.environ.items() if k not in overrides}
    controller, terminal = pty.openpty()
    try:
        with os.fdopen(terminal, "wb") as stderr:
            done = subprocess.run(
                [*command, "--beam", "1", "--max-len-b", "3"],
                stdout=subprocess.PIPE,
                stderr=stderr,
                env={**env, "TERM": "xterm", "COLUMNS": "100"},
                timeout=120,
            )
        shown = _read_all(controller).decode("utf-8", "replace")
    finally:
        os.close(controller)
    assert done.returncode == 0, shown
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)  # colours and cursor moves off
    assert re.search(r"translate +━+ 0/4 ", plain), repr(shown)
    erased = shown.rindex("\x1b[2K")  # the bar's line erased (transient) ...
    assert "translated 4 lines" in shown[erased:]  # ... and the summary in its place
    assert done.stdout.count(b"\n") == 4 and b"\x1b" not in done.stdout


def _read_all(fd: int) -> bytes:
    """Everything a pseudo-terminal's controller holds once the other side is closed
    (Linux reports the end as EIO)."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_mostly_empty_output_is_warned_about(tmp_path: Path) -> None:
    ref = write_lines(tmp_path / "ref.txt", ["a b c", "d e f", "g h i"])
    hyp = write_lines(tmp_path / "hyp.txt", ["", "", "g h i"])
    result = nmt("score", "--ref", str(ref), str(hyp), "--no-paper")
    assert result.exit_code == 0
    assert f"warning: {hyp}: 2 of 3 lines are empty" in result.stderr


def test_shell_completion_is_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    # The shell named, not detected: detection walks the parent processes for a shell,
    # and a test run started without one (a service, a detached job) has none.
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    result = nmt("--show-completion", "bash")
    assert result.exit_code == 0 and "complete" in result.stdout
    assert "--install-completion" in nmt("--help").stdout


def test_help_score_and_preset_list_start_without_torch(tmp_path: Path) -> None:
    ref = write_lines(tmp_path / "ref.txt", ["a b c"])
    code = (
        "import sys\n"
        "from nmt_cli.cli import app\n"
        f"for args in (['--help'], ['score', '--ref', {str(ref)!r}, {str(ref)!r}], "
        "['prepare', '--list']):\n"
        "    try:\n"
        "        app(args)\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code == 0, (args, exc.code)\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip().splitlines()[-1] == "False"


# --- Multi30k without local files: downloaded from a mirror, checked by SHA-256 ----------

M30K_SPLITS = {
    "train": 300,
    "val": 30,
    "test_2016_flickr": 20,
    "test_2017_flickr": 20,
    "test_2018_flickr": 20,
    "test_2017_mscoco": 10,
}


def _mirror(root: Path) -> Path:
    """Small Multi30k-shaped files (gzipped, named as the repository names them)."""
    root.mkdir(parents=True)
    offset = 0
    for split, n in M30K_SPLITS.items():
        items = corpus_pairs(n, offset)
        offset += n
        write_lines(root / f"{split}.en.gz", [a for a, _ in items], gz=True)
        write_lines(root / f"{split}.de.gz", [b for _, b in items], gz=True)
    return root


def _checksums(mirror: Path) -> Path:
    table = mirror.parent / "SHA256SUMS"
    table.write_text("".join(f"{_sha(p)}  {p.name}\n" for p in sorted(mirror.iterdir())))
    return table


def test_multi30k_downloads_verifies_caches_and_prepares(tmp_path: Path) -> None:
    mirror = _mirror(tmp_path / "mirror")
    env = {
        "NMT_MULTI30K_URL": mirror.as_uri(),
        "NMT_MULTI30K_SHA256SUMS": str(_checksums(mirror)),
        "NMT_CACHE_DIR": str(tmp_path / "cache"),
    }
    out = tmp_path / "m30k"
    args = ["prepare", "multi30k-en-de", "--out", str(out), "--vocab-size", "120", "-q"]
    done = nmt(*args, env=env)
    assert done.exit_code == 0, done.output
    from nmt_cli.data_dir import open_data_dir

    data = open_data_dir(out)
    assert (data.src_lang, data.tgt_lang) == ("en", "de")
    assert data.manifest["source"]["name"] == "multi30k-en-de"
    assert data.manifest["source"]["files"]["test"] == [
        "test_2016_flickr.en.gz",
        "test_2016_flickr.de.gz",
    ]
    assert data.manifest["settings"]["max_len_ratio"] == 9.0  # the preset's
    cached = sorted(p.name for p in (tmp_path / "cache" / "multi30k").iterdir())
    assert len(cached) == 2 * len(M30K_SPLITS)
    # offline: the mirror is gone, the verified cache serves the next preparation
    for f in mirror.iterdir():
        f.unlink()
    again = nmt(
        "prepare", "multi30k-en-de", "--out", str(tmp_path / "b"), "--vocab-size", "120", "-q",
        "--test-split", "test_2017_flickr", env=env,
    )  # fmt: skip
    assert again.exit_code == 0, again.output


def test_multi30k_refuses_a_file_whose_checksum_is_wrong(tmp_path: Path) -> None:
    mirror = _mirror(tmp_path / "mirror")  # not the official files: the official sums fail
    env = {"NMT_MULTI30K_URL": mirror.as_uri(), "NMT_CACHE_DIR": str(tmp_path / "cache")}
    out = tmp_path / "m30k"
    line = one_error(nmt("prepare", "multi30k-en-de", "--out", str(out), env=env), 1)
    assert "train.en.gz: SHA-256" in line and "is not the expected d79cfa999dd4c51d" in line
    assert "was not kept" in line
    assert not out.exists()
    assert not list((tmp_path / "cache").rglob("*.gz"))  # nothing unverified is kept


def test_multi30k_from_a_local_copy_works_offline(tmp_path: Path) -> None:
    copy = _mirror(tmp_path / "copy")
    env = {"NMT_MULTI30K_URL": "http://127.0.0.1:9/", "NMT_CACHE_DIR": str(tmp_path / "c")}
    out = tmp_path / "m30k"
    done = nmt(
        "prepare", "multi30k-en-de", "--from", str(copy), "--out", str(out),
        "--vocab-size", "120", "-q", env=env,
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert not (tmp_path / "c").exists()


def test_multi30k_download_failure_says_what_to_do(tmp_path: Path) -> None:
    env = {"NMT_MULTI30K_URL": "http://127.0.0.1:9/", "NMT_CACHE_DIR": str(tmp_path / "c")}
    line = one_error(nmt("prepare", "multi30k-en-fr", "--out", str(tmp_path / "o"), env=env), 1)
    assert "could not download http://127.0.0.1:9/train.en.gz" in line and "--from DIR" in line


@pytest.mark.parametrize("pair", ["de", "fr"])
def test_multi30k_recipes_use_the_preset(pair: str) -> None:
    recipe = load_recipe(RECIPES / f"multi30k-en-{pair}.toml")
    assert (recipe.data.preset, recipe.data.source_dir) == (f"multi30k-en-{pair}", "")
