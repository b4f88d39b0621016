"""Properties of every command, whatever a user feeds it: random bytes as text, random
TOML as a recipe, random option values. The command ends with exit code 0, 1 or 2, no
exception escapes it (nor does an "internal error", the one-line form of a bug), a
failure ends with one `error:` line, and no file outside the output path it was given
has changed.

Bounded to stay fast: few examples, a tiny model, decoding capped at a few tokens, and
no example database (the tests are reproducible from their seed).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from translation_ckpt import random_checkpoint, tiny_vocab
from unix_helpers import error_line, nmt, no_escape, snapshot, write_lines

from nmt_cli.engines.train.run_dir import RunDir

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
SMALL_INT = st.integers(min_value=-5, max_value=40)


def mostly(valid: st.SearchStrategy[Any], other: st.SearchStrategy[Any]) -> Any:
    """Values that are usually valid, so that examples get past the option checks."""
    return st.one_of(valid, valid, valid, other)


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


def check(args: list[str], root: Path, output: Path | None, stdin: bytes = b"") -> None:
    """Run `nmt args`; the code, the absence of a traceback and the untouched files."""
    before = snapshot(root)
    result = nmt(*args, stdin=stdin)
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
    beam=mostly(st.integers(1, 4), SMALL_INT),
    batch=mostly(st.integers(1, 8), SMALL_INT),
    nbest=mostly(st.just(1), st.integers(-2, 6)),
    alpha=mostly(st.floats(0.0, 2.0), ANY_FLOAT),
    max_len_a=st.floats(-1.0, 2.0),
    threads=mostly(st.integers(0, 2), st.integers(-3, 3)),
    precision=mostly(st.sampled_from(["fp32", "auto"]), st.just("fp8")),
    policy=mostly(st.sampled_from(["error", "replace"]), st.just("skip")),
    json_out=st.booleans(),
)
def test_translate_takes_any_input_and_options(
    example_dir: Path,
    data: bytes,
    beam: int,
    batch: int,
    nbest: int,
    alpha: float,
    max_len_a: float,
    threads: int,
    precision: str,
    policy: str,
    json_out: bool,
) -> None:
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
    check(args, example_dir, out)
    _reset(out)


@SETTINGS
@given(
    hyp=TEXT_BYTES,
    ref=TEXT_BYTES,
    bootstrap=mostly(st.sampled_from([0, 5, 20]), st.integers(-5, 25)),
    lang=mostly(st.sampled_from(["de", "en", "fr"]), st.text(max_size=4)),
    test=mostly(st.just("bs"), st.sampled_from(["ar", "xx"])),
    paper=st.booleans(),
)
def test_score_takes_any_text_and_options(
    example_dir: Path, hyp: bytes, ref: bytes, bootstrap: int, lang: str, test: str, paper: bool
) -> None:
    (example_dir / "hyp.txt").write_bytes(hyp)
    (example_dir / "ref.txt").write_bytes(ref)
    args = [
        *("score", "--ref", str(example_dir / "ref.txt"), str(example_dir / "hyp.txt")),
        *("--bootstrap", str(bootstrap), "--lang", lang, "--test", test, "-q"),
        "--paper" if paper else "--no-paper",
    ]
    check(args, example_dir, None)


@SETTINGS
@given(
    src=TEXT_BYTES,
    tgt=TEXT_BYTES,
    vocab=mostly(st.integers(8, 20), st.integers(-5, 60)),
    max_len=mostly(st.integers(0, 12), st.integers(-2, 12)),
    ratio=mostly(st.sampled_from([0.0, 1.5, 9.0]), ANY_FLOAT),
    policy=mostly(st.sampled_from(["error", "replace"]), st.just("x")),
)
def test_prepare_takes_any_files_and_options(
    example_dir: Path, src: bytes, tgt: bytes, vocab: int, max_len: int, ratio: float, policy: str
) -> None:
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
    check(args, example_dir, out)
    _reset(out)


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


@SETTINGS
@given(recipe=recipes(), override=st.text(max_size=20), raw=st.binary(max_size=40))
def test_train_dry_run_takes_any_recipe_and_override(
    example_dir: Path, recipe: str, override: str, raw: bytes
) -> None:
    path = example_dir / "recipe.toml"
    path.write_text(recipe, encoding="utf-8", errors="surrogatepass")
    check(["train", str(path), "--dry-run", "--vocab-size", "100", "-q"], example_dir, None)
    check(["train", str(path), "--dry-run", "--set", override, "-q"], example_dir, None)
    path.write_bytes(raw)
    check(["train", str(path), "--dry-run", "-q"], example_dir, None)


@SETTINGS
@given(
    last=mostly(st.integers(1, 4), st.integers(-3, 0)),
    junk=st.binary(max_size=64),
    use_run=st.booleans(),
)
def test_average_takes_any_selection_and_files(
    example_dir: Path, last: int, junk: bytes, use_run: bool
) -> None:
    (example_dir / "junk.pt").write_bytes(junk)
    out = example_dir / "avg.pt"
    if use_run:
        args = ["average-checkpoints", str(example_dir / "run"), "--last", str(last)]
    else:
        args = ["average-checkpoints", str(example_dir / "model.pt"), str(example_dir / "junk.pt")]
    check([*args, "-o", str(out), "-q"], example_dir, out)
    _reset(out)


STAGES = st.sampled_from(["prepare", "train", "average", "translate", "score"])
STAGE = mostly(STAGES, st.text(max_size=10))


@SETTINGS
@given(first=STAGE, last=STAGE, gpus=mostly(st.just(0), st.integers(-2, -1)))
def test_run_takes_any_stage_names(example_dir: Path, first: str, last: str, gpus: int) -> None:
    """A recipe with no corpus: every stage fails at once, with one line, or is refused."""
    recipe = write_lines(
        example_dir / "r.toml",
        [
            "[data]",
            f'dir = "{example_dir / "no-data"}"',
            "[train]",
            f'run_dir = "{example_dir / "no-run"}"',
        ],
    )
    args = ["run", str(recipe), "--from", first, "--until", last]
    check([*args, "--gpus", str(gpus), "-q"], example_dir, None)
