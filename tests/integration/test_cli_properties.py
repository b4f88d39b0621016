"""Properties of every command, whatever a user feeds it: random bytes as text, random
TOML as a recipe, random option values. The command ends with exit code 0, 1 or 2, no
exception escapes it (nor does an "internal error", the one-line form of a bug), a
failure ends with one `error:` line, and no file outside the output path it was given
has changed. Beyond that, each test knows which examples are a usage error (exit 2),
which must succeed, and what a success promises (one output line per input line, a
score of a text against itself, a checkpoint that is the mean of its inputs, ...): a
command that failed cleanly on everything would not pass.

Bounded to stay fast: few examples, a tiny model, decoding capped at a few tokens, and
no example database (the tests are reproducible from their seed).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sentencepiece as spm
import torch
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from typer.testing import Result
from unix_helpers import error_line, nmt, no_escape, snapshot, write_lines

from nmt_cli.core.checkpoint import load_checkpoint
from nmt_cli.engines.train.run_dir import RunDir
from tests.fixtures.translation_ckpt import random_checkpoint, tiny_vocab

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
SMALL_INT = st.integers(min_value=-5, max_value=40)


def mostly(valid: st.SearchStrategy[Any], other: st.SearchStrategy[Any]) -> Any:
    """Values that are usually valid, so that examples get past the option checks."""
    return st.one_of(valid, valid, valid, other)


Choice = tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]


def options(**choices: Choice) -> st.SearchStrategy[dict[str, Any]]:
    """A command's option values, each from (valid values, other values): all valid in
    about half the examples, so that they get past the option checks to what the
    command promises for valid input; else each one valid or not."""
    valid = st.fixed_dictionaries({name: ok for name, (ok, _) in choices.items()})
    anything = st.fixed_dictionaries({name: st.one_of(*c) for name, c in choices.items()})
    return st.one_of(valid, anything)


ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True, width=32)
TEXT_BYTES = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=120).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.lists(st.sampled_from(["the cat", "a dog ran", "", "red house"]), max_size=6).map(
        lambda lines: "\n".join(lines).encode()
    ),
)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint and a run directory with two step checkpoints, read-only inputs."""
    root = tmp_path_factory.mktemp("world")
    vocab = tiny_vocab()
    random_checkpoint(root / "model.pt", vocab)
    run = RunDir(root / "run")
    run.checkpoints.mkdir(parents=True)
    for step in (1, 2):
        random_checkpoint(run.step_path(step), vocab, seed=step, step=step)
    return root


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    return tmp_path


# The first bytes of the compressed formats text readers recognise: a text starting so is
# read as (broken) compressed data
MAGIC = (b"\x1f\x8b", b"\xfd7zXZ\x00", b"BZh")


def lines_of(data: bytes) -> list[bytes]:
    """The lines a command reads: the text cut at each newline byte, and nothing else."""
    lines = data.split(b"\n")
    return lines[:-1] if lines[-1] == b"" else lines


def readable(data: bytes, policy: str = "error") -> bool:
    """Whether a reader takes `data` as text: not compressed-looking, and UTF-8 without
    NUL bytes unless bad bytes are replaced."""
    if data.startswith(MAGIC):
        return False
    if policy == "replace":
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\x00" not in data


def reader_error(path: Path, data: bytes, compressed: str = "unreadable") -> str:
    """The pattern of the one line a command gives for `data` that is not text, worked
    out here from Python's own decoder: compressed-looking data fails to decompress (the
    middle is the decompressor's own words; `compressed` is how the command puts it), else
    the first line with invalid UTF-8 or a NUL byte is named, with the column."""
    if data.startswith(MAGIC):
        return rf"error: {re.escape(str(path))}: {compressed} \(.+\); is the file truncated\?"
    for number, raw in enumerate(lines_of(data), 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            problem = f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"
        else:
            if "\x00" not in text:
                continue
            problem = f"a NUL byte at column {text.index(chr(0)) + 1}: binary data, not text"
        return re.escape(
            f"error: {path}:{number}: {problem}; fix the input or pass --on-bad-utf8 replace"
        )
    raise AssertionError(f"{data!r} is text")


def usage_error(result: Result, refusals: list[tuple[bool, str]]) -> None:
    """Exit 2 with the line of one of the options out of range: a command checks its
    options in an order of its own and names the first it refuses."""
    assert result.exit_code == 2, result.output
    expected = {f"error: {message}" for refused, message in refusals if refused}
    assert expected and error_line(result.stderr) in expected, (result.stderr, expected)


def check(args: list[str], root: Path, output: Path | None, stdin: bytes = b"") -> Result:
    """Run `nmt args`; the code, the absence of a traceback and the untouched files."""
    before = snapshot(root)
    result = nmt(*args, stdin=stdin)
    event(f"nmt {args[0]}: exit {result.exit_code}")  # --hypothesis-show-statistics
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.output)
    no_escape(result)  # under CliRunner an escaped exception prints no "Traceback"
    assert "internal error" not in result.output, result.output
    if result.exit_code != 0:
        error_line(result.stderr)
    after = snapshot(root)
    if output is not None:
        rel = str(output.relative_to(root))
        after = {k: v for k, v in after.items() if k != rel and not k.startswith(rel + "/")}
        before = {k: v for k, v in before.items() if k != rel and not k.startswith(rel + "/")}
    assert after == before, (args, result.output)
    return result


@pytest.fixture
def example_dir(world: Path) -> Iterator[Path]:
    """A copy of the world for one test (examples share it; outputs are removed)."""
    folder = Path(tempfile.mkdtemp(prefix="prop-"))
    shutil.copytree(world, folder / "w")
    yield folder / "w"
    shutil.rmtree(folder, ignore_errors=True)


def _reset(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@SETTINGS
@given(
    data=TEXT_BYTES,
    opts=options(
        beam=(st.integers(1, 4), SMALL_INT),
        batch=(st.integers(0, 8), SMALL_INT),
        nbest=(st.integers(1, 2), st.integers(-2, 6)),
        alpha=(st.floats(0.0, 2.0), ANY_FLOAT),
        max_len_a=(st.floats(0.0, 2.0), st.floats(-1.0, 2.0)),
        threads=(st.integers(0, 2), st.integers(-3, 3)),
        precision=(st.sampled_from(["fp32", "auto"]), st.just("fp8")),
        policy=(st.sampled_from(["error", "replace"]), st.just("skip")),
    ),
    json_out=st.booleans(),
)
@example(
    data=b"the cat\n\na dog ran\n",
    opts={"beam": 3, "batch": 2, "nbest": 2, "alpha": 0.6, "max_len_a": 1.0, "threads": 1,
          "precision": "fp32", "policy": "error"},
    json_out=False,
)  # fmt: skip
@example(
    data=b"the cat\nred \xff house\n",
    opts={"beam": 2, "batch": 0, "nbest": 2, "alpha": 1.0, "max_len_a": 0.0, "threads": 0,
          "precision": "fp32", "policy": "error"},
    json_out=True,
)  # fmt: skip
@example(
    data=b"\x1f\x8bthe cat\n",
    opts={"beam": 1, "batch": 0, "nbest": 1, "alpha": 0.0, "max_len_a": 0.0, "threads": 0,
          "precision": "fp32", "policy": "replace"},
    json_out=False,
)  # fmt: skip
def test_translate_takes_any_input_and_options(
    example_dir: Path, data: bytes, opts: dict[str, Any], json_out: bool
) -> None:
    """Options out of range are usage errors; readable text is translated, one output
    line (or JSON object) per input line, an empty line an empty translation; --nbest K
    gives each line at most K numbered hypotheses."""
    beam, batch, nbest, alpha = opts["beam"], opts["batch"], opts["nbest"], opts["alpha"]
    max_len_a, threads, precision, policy = (
        opts[k] for k in ("max_len_a", "threads", "precision", "policy")
    )
    source = example_dir / "input.txt"
    source.write_bytes(data)
    out = example_dir / "out.txt"
    args = [
        *("translate", "-m", str(example_dir / "model.pt"), "-i", str(source), "-o", str(out)),
        *("--beam", str(beam), "--batch-size", str(batch), "--nbest", str(nbest)),
        *("--alpha", str(alpha), "--max-len-a", str(max_len_a), "--max-len-b", "3"),
        *("--threads", str(threads), "--precision", precision, "--on-bad-utf8", policy, "-q"),
        *(["--json"] if json_out else []),
    ]
    result = check(args, example_dir, out)
    alpha, max_len_a = float(str(alpha)), float(str(max_len_a))  # as the command parses them
    refusals = [
        (beam < 1, f"--beam must be at least 1, got {beam}"),
        (batch < 0, f"--batch-size must be at least 0, got {batch}"),
        (nbest < 1, f"--nbest must be at least 1, got {nbest}"),
        (nbest > beam, f"--nbest must not exceed the beam size ({beam}), got {nbest}"),
        (not math.isfinite(alpha), f"--alpha must be a finite number, got {alpha!r}"),
        (alpha < 0, f"--alpha must be at least 0, got {alpha!r}"),
        (max_len_a < 0, f"--max-len-a must be at least 0, got {max_len_a!r}"),
        (threads < 0, f"--threads must be at least 0, got {threads}"),
        (precision == "fp8", "--precision 'fp8': use fp32, bf16, fp16, int8 or auto"),
        (policy == "skip", "--on-bad-utf8 'skip': use error or replace"),
    ]
    if any(refused for refused, _ in refusals):
        usage_error(result, refusals)
    elif not readable(data, policy):
        assert result.exit_code == 1, (args, result.output)
        pattern = reader_error(source, data, compressed="reading failed")
        assert re.fullmatch(pattern, error_line(result.stderr)), (pattern, result.stderr)
    else:
        assert result.exit_code == 0, (args, result.output)
        written = out.read_text(encoding="utf-8")
        _check_translations(_sources(data, policy), written, nbest, json_out, alpha)
    _reset(out)


def _sources(data: bytes, policy: str) -> list[str]:
    """Each input line as the command reads it: decoded under the text policy (bad bytes
    and NULs become U+FFFD), a byte-order mark opening the file dropped, stripped."""
    from nmt_cli.text_io import one_line

    lines = []
    for number, raw in enumerate(lines_of(data)):
        text = raw.decode("utf-8", errors="replace" if policy == "replace" else "strict")
        text = text.replace("\x00", "\ufffd")
        lines.append(one_line(text.lstrip("\ufeff") if number == 0 else text))
    return lines


def _check_translations(
    sources: list[str], written: str, nbest: int, as_json: bool, alpha: float
) -> None:
    """One record (or line, or block of numbered lines) per input line, in order; an empty
    line gets no hypothesis, any other exactly --nbest, best first, each scored as its
    log-probability over GNMT's length penalty ((5 + |Y|) / 6) ** alpha, |Y| counting
    the end of the sentence."""
    assert written == "" or written.endswith("\n")
    rows = written.splitlines()
    if as_json:
        records = [json.loads(row) for row in rows]
        assert [r["line"] for r in records] == list(range(1, len(sources) + 1))
        for source, record in zip(sources, records, strict=True):
            assert record["source"] == source
            hypotheses = record["hypotheses"]
            assert len(hypotheses) == (nbest if source else 0)
            scores = [h["score"] for h in hypotheses]
            assert scores == sorted(scores, reverse=True)
            for h in hypotheses:
                penalty = ((5 + h["tokens"] + 1) / 6) ** alpha
                assert math.isclose(h["score"], h["log_prob"] / penalty, rel_tol=1e-9)
    elif nbest == 1:
        assert len(rows) == len(sources)
        assert all(row == "" for source, row in zip(sources, rows, strict=True) if not source)
    else:  # "N ||| text ||| score ||| log-prob", N counted from 0
        numbers = [int(row.split(" ||| ")[0]) for row in rows]
        assert numbers == sorted(numbers)
        assert all(numbers.count(n) == (nbest if s else 1) for n, s in enumerate(sources))
        assert all(len(row.split(" ||| ")) == 4 for row in rows)


def _moses_languages() -> set[str]:
    """What the Moses tokenizer has rules for, from sacremoses itself."""
    from sacremoses.corpus import NonbreakingPrefixes

    return set(NonbreakingPrefixes().available_langs.values()) | {"ja", "ko"}


@SETTINGS
@given(
    hyp=TEXT_BYTES,
    ref=TEXT_BYTES,
    same=st.booleans(),
    opts=options(
        bootstrap=(st.sampled_from([0, 5, 20]), st.integers(-5, 25)),
        lang=(st.sampled_from(["de", "en", "fr"]), st.text(max_size=4)),
        test=(st.sampled_from(["bs", "ar"]), st.just("xx")),
    ),
    paper=st.booleans(),
)
@example(
    hyp=b"the cat sat\na dog ran\n", ref=b"", same=True,
    opts={"bootstrap": 0, "lang": "de", "test": "bs"}, paper=False,
)  # fmt: skip
@example(
    hyp=b"a b\n", ref=b"a\x00b\n", same=False,
    opts={"bootstrap": 0, "lang": "de", "test": "bs"}, paper=False,
)  # fmt: skip
def test_score_takes_any_text_and_options(
    example_dir: Path, hyp: bytes, ref: bytes, same: bool, opts: dict[str, Any], paper: bool
) -> None:
    """Options out of range are usage errors; two readable texts of one length are
    scored, every metric in its range, and a text scored against itself has no edits
    (TER 0) and every character n-gram right (chrF 100)."""
    bootstrap, lang, test = opts["bootstrap"], opts["lang"], opts["test"]
    ref = hyp if same else ref
    (example_dir / "hyp.txt").write_bytes(hyp)
    (example_dir / "ref.txt").write_bytes(ref)
    args = [
        *("score", "--ref", str(example_dir / "ref.txt"), str(example_dir / "hyp.txt")),
        *("--bootstrap", str(bootstrap), "--lang", lang, "--test", test, "-q"),
        "--paper" if paper else "--no-paper",
    ]
    result = check(args, example_dir, None)
    refusals = [
        (bootstrap < 0, f"--bootstrap must be 0 (none) or a number of resamples, got {bootstrap}"),
        (bootstrap == 1, "--bootstrap 1 gives no interval; use at least 2 resamples (e.g. 1000)"),
        (test == "xx", "--test 'xx': use bs (paired bootstrap) or ar"),
    ]
    if any(refused for refused, _ in refusals):
        usage_error(result, refusals)
        return
    if paper and lang not in _moses_languages():
        assert result.exit_code == 2, (args, result.output)
        known = ", ".join(sorted(_moses_languages()))
        line = f"error: --lang {lang!r}: not a language the Moses tokenizer knows ({known})"
        assert error_line(result.stderr) == line
        return
    n, m = len(lines_of(hyp)), len(lines_of(ref))
    hyp_path, ref_path = example_dir / "hyp.txt", example_dir / "ref.txt"
    if not (readable(hyp) and readable(ref)):
        assert result.exit_code == 1, (args, result.output)
        line = error_line(result.stderr)  # of one file that is not text
        bad = [reader_error(p, d) for p, d in ((hyp_path, hyp), (ref_path, ref)) if not readable(d)]
        assert any(re.fullmatch(pattern, line) for pattern in bad), (line, bad)
        return
    if not (n == m and n > 0):
        assert result.exit_code == 1, (args, result.output)
        expected = f"error: {ref_path}: the reference is empty" if m == 0 else (
            f"error: {hyp_path} has {n:,} lines but {ref_path} has {m:,}: "
            "hypotheses and references must be line-aligned"
        )  # fmt: skip
        assert error_line(result.stderr) == expected
        return
    assert result.exit_code == 0, (args, result.output)
    scores = {
        name: float(value)
        for name, value in re.findall(r"^(BLEU|chrF2|TER) = (-?[\d.]+)", result.stdout, re.M)
    }
    assert set(scores) == {"BLEU", "chrF2", "TER"}, result.stdout
    assert 0 <= scores["BLEU"] <= 100 and 0 <= scores["chrF2"] <= 100 and scores["TER"] >= 0
    assert ("tokenized BLEU = " in result.stdout) == paper
    if same:
        assert scores["TER"] == 0
        if any(line.decode("utf-8").strip() for line in lines_of(hyp)):
            assert scores["chrF2"] == 100


# A parallel corpus that prepares at any setting it fits: 24 distinct characters (30
# pieces hold them all), at most 3 words a sentence and as many on both sides
PARALLEL = (
    b"the cat\na dog ran\nred house\nthe red cat\na big dog\nthe small house\n",
    b"die katze\nein hund lief\nrotes haus\ndie rote katze\nein grosser hund\ndas kleine haus\n",
)


@SETTINGS
@given(
    src=TEXT_BYTES,
    tgt=TEXT_BYTES,
    parallel=st.booleans(),
    opts=options(
        vocab=(st.integers(30, 60), st.integers(-5, 29)),
        max_len=(st.integers(0, 12), st.integers(-2, 40)),
        ratio=(st.sampled_from([0.0, 1.5, 9.0]), ANY_FLOAT),
        policy=(st.sampled_from(["error", "replace"]), st.just("x")),
    ),
)
@example(
    src=b"", tgt=b"", parallel=True,
    opts={"vocab": 40, "max_len": 0, "ratio": 0.0, "policy": "error"},
)  # fmt: skip
def test_prepare_takes_any_files_and_options(
    example_dir: Path, src: bytes, tgt: bytes, parallel: bool, opts: dict[str, Any]
) -> None:
    """Options out of range are usage errors; a prepared directory accounts for every
    line read, dropping exactly the pairs the cleaning rules name (Moses'
    clean-corpus-n: an empty side, a side over --max-len words, sides whose word counts
    differ more than --max-len-ratio times), keeps every held-out pair, and holds a
    SentencePiece model of the size asked for; the parallel corpus above always prepares
    at settings it fits."""
    vocab, max_len, ratio, policy = (opts[k] for k in ("vocab", "max_len", "ratio", "policy"))
    if parallel:
        src, tgt = PARALLEL
    (example_dir / "a.en").write_bytes(src)
    (example_dir / "a.de").write_bytes(tgt)
    out = example_dir / "prepared"
    files = [str(example_dir / "a.en"), str(example_dir / "a.de")]
    args = [
        *("prepare", "--train-src", files[0], "--train-tgt", files[1], "--valid-src", files[0]),
        *("--valid-tgt", files[1], "--src", "en", "--tgt", "de", "--out", str(out)),
        *("--vocab-size", str(vocab), "--max-len", str(max_len), "--max-len-ratio", str(ratio)),
        *("--on-bad-utf8", policy, "--workers", "1", "-q"),
    ]
    result = check(args, example_dir, out)
    ratio = float(str(ratio))  # as the command parses it
    bad_ratio = not math.isfinite(ratio) or (ratio != 0 and ratio < 1)
    bad_vocab = vocab < 0 or 0 < vocab < 8
    refusals = [
        (bad_vocab, f"--vocab-size must be at least 8 (0 = the preset's), got {vocab}"),
        (max_len < 0, f"--max-len must be >= 0 (0 = no limit), got {max_len}"),
        (bad_ratio, f"--max-len-ratio must be >= 1 (0 = none), got {ratio}"),
        (policy == "x", "--on-bad-utf8 must be one of error, replace"),
    ]
    unreadable = [
        (path, data)
        for path, data in zip(files, (src, tgt), strict=True)
        if not readable(data, policy)
    ]
    if any(refused for refused, _ in refusals):
        usage_error(result, refusals)
    elif unreadable and len(lines_of(src)) == len(lines_of(tgt)):
        assert result.exit_code == 1, (args, result.output)
        line = error_line(result.stderr)  # of one file that is not text
        bad = [reader_error(Path(path), data) for path, data in unreadable]
        assert any(re.fullmatch(pattern, line) for pattern in bad), (line, bad)
    elif parallel and 30 <= vocab <= 60 and (max_len == 0 or max_len >= 3):
        assert result.exit_code == 0, (args, result.output)
    if result.exit_code == 0:
        pairs = list(zip(_words(src, policy), _words(tgt, policy), strict=True))
        manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
        cleaning = manifest["cleaning"]["train"]
        dropped = _dropped(pairs, max_len, ratio)
        assert cleaning["read"] == len(pairs) and cleaning["dropped"] == dropped
        assert manifest["splits"]["train"]["pairs"] == len(pairs) - sum(dropped.values())
        assert manifest["splits"]["valid"]["pairs"] == len(pairs)
        pieces = spm.SentencePieceProcessor(model_file=str(out / manifest["vocab"]["src_model"]))
        assert pieces.get_piece_size() == (vocab or manifest["vocab"]["size"])
        assert result.stdout.strip() == str(out)
    _reset(out)


def _words(data: bytes, policy: str) -> list[int]:
    """Each line's number of words under the text policy (bad bytes and NULs become
    U+FFFD, a byte-order mark opening the file is no word)."""
    counts = []
    for n, raw in enumerate(lines_of(data)):
        text = raw.decode("utf-8", errors="replace" if policy == "replace" else "strict")
        text = text.replace("\x00", "\ufffd")
        counts.append(len((text.lstrip("\ufeff") if n == 0 else text).split()))
    return counts


def _dropped(pairs: list[tuple[int, int]], max_len: int, ratio: float) -> dict[str, int]:
    """The training pairs each cleaning rule drops, a pair charged to the first it breaks."""
    dropped = dict.fromkeys(("empty", "too_long", "ratio", "duplicate"), 0)
    for a, b in pairs:
        if a == 0 or b == 0:
            dropped["empty"] += 1
        elif max_len and max(a, b) > max_len:
            dropped["too_long"] += 1
        elif ratio and max(a, b) > ratio * min(a, b):
            dropped["ratio"] += 1
    return dropped


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(str(value), repr(value))
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return str(value)


KEYS = {
    "data": ["src", "tgt", "vocab_size", "max_len", "max_len_ratio", "seed", "on_bad_utf8"],
    "model": ["encoder_layers", "d_model", "d_ff", "n_heads", "d_k", "dropout", "positions"],
    "train": ["max_steps", "batch_tokens", "warmup_steps", "lr_scale", "keep_last", "bogus"],
    "decode": ["beam_size", "nbest", "length_penalty", "batch_sentences", "workers"],
    "nonsense": ["x"],
}
SCALARS = st.one_of(
    SMALL_INT,
    ANY_FLOAT,
    st.booleans(),
    st.text(alphabet="abcdefghij.-/ ", max_size=8),
    st.lists(SMALL_INT, max_size=2),
)


@st.composite
def recipes(draw: st.DrawFn) -> str:
    """A recipe of random (mostly real) keys and random values, sometimes not TOML."""
    lines = []
    if draw(st.booleans()):
        lines.append(f"include = {_toml_value(draw(SCALARS))}")
    for section in draw(st.lists(st.sampled_from(sorted(KEYS)), max_size=3, unique=True)):
        lines.append(f"[{section}]")
        for key in draw(st.lists(st.sampled_from(KEYS[section]), max_size=3, unique=True)):
            lines.append(f"{key} = {_toml_value(draw(SCALARS))}")
    if draw(st.integers(0, 9)) == 0:
        lines.append(draw(st.text(max_size=20)))  # now and then, broken TOML
    return "\n".join(lines) + "\n"


# A recipe and an override that are valid: they must get through
VALID_RECIPE = "[model]\nencoder_layers = 2\nd_model = 64\nn_heads = 4\n"
VALID_OVERRIDE = "model.d_ff=128"


@SETTINGS
@given(
    recipe=st.one_of(recipes(), st.just(VALID_RECIPE)),
    override=st.one_of(st.text(max_size=20), st.just(VALID_OVERRIDE)),
    raw=st.binary(max_size=40),
)
@example(recipe=VALID_RECIPE, override=VALID_OVERRIDE, raw=b"")
def test_train_dry_run_takes_any_recipe_and_override(
    example_dir: Path, recipe: str, override: str, raw: bytes
) -> None:
    """A dry run reports the parameters of the model its settings table describes (the
    paper's count, from the table); the valid recipe and override get through, and the
    override's value is the one shown; an empty recipe is the defaults."""
    path = example_dir / "recipe.toml"
    path.write_text(recipe, encoding="utf-8", errors="surrogatepass")
    sized = check(["train", str(path), "--dry-run", "--vocab-size", "100", "-q"], example_dir, None)
    if sized.exit_code == 0:
        shown = _dry_run_model(sized)
        assert shown["src_vocab_size"] == 100
        if recipe == VALID_RECIPE:
            assert (shown["encoder_layers"], shown["d_model"], shown["n_heads"]) == (2, 64, 4)
    else:
        assert recipe != VALID_RECIPE, sized.output
    overridden = check(
        ["train", str(path), "--dry-run", "--set", override, "-q"], example_dir, None
    )
    if overridden.exit_code == 0:
        shown = _dry_run_model(overridden)
        if override == VALID_OVERRIDE:
            assert shown["d_ff"] == 128
    else:
        assert (recipe, override) != (VALID_RECIPE, VALID_OVERRIDE), overridden.output
    path.write_bytes(raw)
    plain = check(["train", str(path), "--dry-run", "-q"], example_dir, None)
    if plain.exit_code == 0:
        _dry_run_model(plain)
    if raw == b"":
        assert plain.exit_code == 0, plain.output


def _dry_run_model(result: Result) -> dict[str, Any]:
    """The model settings of a dry run's table, checked against the parameter count it
    printed: embeddings (one matrix, shared), then per layer each attention's four
    projections with biases, the feed-forward network and a LayerNorm a sub-layer
    (post-norm, sinusoidal positions: nothing learned besides)."""
    rows = dict(re.findall(r"model\.(\w+)\s+│\s+(\S+)", result.stderr))
    shown: dict[str, Any] = {k: int(v) if v.isdigit() else v for k, v in rows.items()}
    assert (shown["positions"], shown["pre_norm"], shown["activation"]) == (
        "sinusoidal", "False", "relu"
    )  # fmt: skip
    assert shown["share_embeddings"] == "True" and shown["output_bias"] == "False"
    d, heads, d_ff = shown["d_model"], shown["n_heads"], shown["d_ff"]
    d_k = shown["d_k"] if shown["d_k"] != "None" else d // heads
    d_v = shown["d_v"] if shown["d_v"] != "None" else d // heads
    attention = 2 * (d * heads * d_k + heads * d_k) + d * heads * d_v + heads * d_v
    attention += heads * d_v * d + d
    ffn, norm = 2 * d * d_ff + d_ff + d, 2 * d
    total = shown["src_vocab_size"] * d
    total += shown["encoder_layers"] * (attention + ffn + 2 * norm)
    total += shown["decoder_layers"] * (2 * attention + ffn + 3 * norm)
    assert result.stdout.strip() == f"parameters: {total}", (result.stdout, shown)
    return shown


@SETTINGS
@given(
    last=mostly(st.integers(1, 4), st.integers(-3, 0)),
    junk=st.one_of(st.binary(max_size=64), st.none()),
    use_run=st.booleans(),
)
@example(last=1, junk=None, use_run=False)
def test_average_takes_any_selection_and_files(
    example_dir: Path, last: int, junk: bytes | None, use_run: bool
) -> None:
    """--last N of a run averages its newest N step checkpoints (all it has, when fewer);
    two checkpoints of one model average to their mean, weight by weight; anything else
    is refused (--last below 1 as a usage error, junk as a file that is no checkpoint)."""
    run_steps = [RunDir(example_dir / "run").step_path(step) for step in (1, 2)]
    second = example_dir / "junk.pt"
    if junk is None:
        second.write_bytes(run_steps[1].read_bytes())  # a real checkpoint of the same model
    else:
        second.write_bytes(junk)
    out = example_dir / "avg.pt"
    if use_run:
        args = ["average-checkpoints", str(example_dir / "run"), "--last", str(last)]
        inputs = run_steps[-last:] if last >= 1 else []
    else:
        args = ["average-checkpoints", str(example_dir / "model.pt"), str(second)]
        inputs = [example_dir / "model.pt", second] if junk is None else []
    result = check([*args, "-o", str(out), "-q"], example_dir, out)
    if use_run and last < 1:
        usage_error(result, [(True, f"--last must be at least 1, got {last}")])
    elif not inputs:
        assert result.exit_code == 1, result.output
        pattern = _not_a_checkpoint(second, junk or b"")
        assert re.fullmatch(pattern, error_line(result.stderr)), (pattern, result.stderr)
    else:
        assert result.exit_code == 0, result.output
        averaged = load_checkpoint(out).model
        models = [load_checkpoint(path).model for path in inputs]
        assert set(averaged) == set(models[0])
        for key, value in averaged.items():
            mean = sum(m[key].double() for m in models) / len(models)
            torch.testing.assert_close(value.double(), mean, rtol=0, atol=1e-6)
    _reset(out)


def _not_a_checkpoint(path: Path, data: bytes) -> str:
    """The pattern of the line for a file that is no checkpoint, named for what its first
    bytes are (a zip archive or a pickle's opening goes to PyTorch, whose reason for not
    reading it follows)."""
    head = data[:4]
    if head.startswith((b"PK\x03\x04", b"\x80")):
        why = f"error: {path}: not a readable checkpoint (truncated or not written by nmt)"
        return re.escape(why) + "(: .+)?"
    looks = "empty" if not head else "compressed data" if head[:2] == b"\x1f\x8b" else "text"
    if looks == "text" and not head.isascii():
        looks = "some other binary format"
    return re.escape(
        f"error: {path}: not a checkpoint (it is {looks}; nmt train and nmt "
        "average-checkpoints write checkpoints as .pt files)"
    )


STAGES = st.sampled_from(["prepare", "train", "average", "translate", "score"])
ORDER = ["prepare", "train", "average", "translate", "score"]


@SETTINGS
@given(
    opts=options(
        first=(STAGES, st.text(max_size=10)),
        last=(STAGES, st.text(max_size=10)),
        gpus=(st.just(0), st.integers(-2, -1)),
    )
)
def test_run_takes_any_stage_names(example_dir: Path, opts: dict[str, Any]) -> None:
    """A recipe with no corpus: unknown stages, a --from after --until and negative --gpus
    are refused as usage errors; otherwise the first stage fails at once, naming what is
    missing (no corpus to prepare, no prepared data, no run to average)."""
    first, last, gpus = opts["first"], opts["last"], opts["gpus"]
    no_data, no_run = example_dir / "no-data", example_dir / "no-run"
    recipe = write_lines(
        example_dir / "r.toml", ["[data]", f'dir = "{no_data}"', "[train]", f'run_dir = "{no_run}"']
    )
    args = ["run", str(recipe), "--from", first, "--until", last]
    result = check([*args, "--gpus", str(gpus), "-q"], example_dir, None)
    stages = ", ".join(ORDER)
    unknown = [stage for stage in (first, last) if stage not in ORDER]
    refusals = [
        *((True, f"unknown stage {stage!r}; stages are {stages}") for stage in unknown),
        (
            not unknown and ORDER.index(first) > ORDER.index(last),
            f"--from {first} comes after --until {last}",
        ),
        (gpus < 0, f"--gpus must not be negative, got {gpus}"),
    ]
    if any(refused for refused, _ in refusals):
        usage_error(result, refusals)
    else:
        missing = {
            "prepare": "error: nothing to prepare: name a preset",
            "average": f"error: {no_run}: no such run directory",
        }.get(first, f"error: {no_data}: not a prepared data directory (no manifest.json)")
        assert result.exit_code == 1 and error_line(result.stderr).startswith(missing)
