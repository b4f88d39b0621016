"""`nmt serve` as a command: its help, its start-up cost for the rest of the CLI, and the
mistakes it refuses before serving, each one `error:` line."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_help import help_text, option_entries
from test_optional_deps import hide
from unix_helpers import nmt, one_error

from nmt_cli.core.checkpoint import load_checkpoint, save_checkpoint
from tests.fixtures.translation_ckpt import RandomCheckpoints


@pytest.fixture
def model(random_ckpt_of: RandomCheckpoints) -> Path:
    return random_ckpt_of(max_positions=12)


def test_help_fits_80_columns_and_shares_translates_options() -> None:
    text = help_text(["serve"])
    assert all(len(line) <= 80 for line in text.splitlines()), text
    entries = {e.split()[0].rstrip(","): e for e in option_entries(text)}
    theirs = {e.split()[0].rstrip(","): e for e in option_entries(help_text(["translate"]))}
    for flag in ("--beam", "--alpha", "--batch-size", "--precision", "--workers", "--python-step"):
        assert entries[flag] == theirs[flag]
    assert "--api-key-file" in entries and "--cors-origin" in entries


def test_help_loads_neither_torch_nor_the_server() -> None:
    code = (
        "import sys\n"
        "from nmt_cli.cli import app\n"
        "for args in (['--help'], ['serve', '--help']):\n"
        "    try:\n"
        "        app(args)\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code == 0, (args, exc.code)\n"
        "print(sorted(m for m in ('torch', 'starlette', 'uvicorn') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--beam", "0"], "--beam must be at least 1"),
        (["--port", "70000"], "--port must be below 65536"),
        (["--timeout", "0"], "--timeout must be greater than 0"),
        (["--queue-limit", "2", "--max-sentences", "4"], "--queue-limit must hold at least one"),
        (["--precision", "fp8"], "--precision 'fp8'"),
        (["--pair", "english"], "--pair 'english': give two language codes"),
        (["--pair", "en-de", "--pair", "de-en"], "2 --pair for 1 --model"),
        (["--max-beam", "2"], "--max-beam 2 is below --beam 4"),
    ],
)
def test_bad_settings_are_usage_errors_naming_the_flag(
    model: Path, flags: list[str], fragment: str
) -> None:
    one_error(nmt("serve", "-m", str(model), "--port", "0", *flags), 2, fragment)


def test_every_model_needs_its_languages_and_one_model_a_pair(model: Path, tmp_path: Path) -> None:
    one_error(nmt("serve", "-m", str(model), "--port", "0"), 2, "records no languages", "--pair")
    one_error(
        nmt("serve", "-m", str(model), "-m", str(model), "--pair", "en-de", "--pair", "en-de"),
        2,
        "two models translate en-de",
    )
    # a checkpoint from `nmt train` names its languages; its pair is checked the same way
    named = load_checkpoint(model)
    named.recipe = {"data": {"src": "en", "tgt": "de"}}
    other = save_checkpoint(named, tmp_path / "named.pt")
    one_error(
        nmt("serve", "-m", str(other), "-m", str(model), "--pair", "en-de", "--pair", "en-de"),
        2,
        "two models translate en-de",
    )
    one_error(nmt("serve", "-m", str(other), "-m", str(other), "--port", "0"), 2, "en-de")


def test_a_port_in_use_is_refused_before_loading(model: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = nmt("serve", "-m", str(model), "--pair", "en-de", "--port", str(port))
    one_error(result, 1, f"cannot listen on 127.0.0.1 port {port}")


def test_another_host_without_keys_is_warned_about(tmp_path: Path) -> None:
    result = nmt("serve", "-m", str(tmp_path / "missing.pt"), "--host", "0.0.0.0")
    one_error(result, 1, "missing.pt: no such file")
    assert "warning: listening on 0.0.0.0 without --api-key-file" in result.stderr
    keys = tmp_path / "keys"
    keys.write_text("# none yet\n\n", encoding="utf-8")
    result = nmt("serve", "-m", str(tmp_path / "missing.pt"), "--api-key-file", str(keys))
    one_error(result, 1, "holds no key")


def test_without_the_serve_extra_one_line_names_it(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hide(monkeypatch, "starlette")
    line = one_error(nmt("serve", "-m", str(model), "--pair", "en-de"), 1, "starlette")
    assert "pip install 'nmt-cli[serve]'" in line
