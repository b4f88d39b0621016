"""Shared fixtures: tiny seeded models so the whole suite runs on a CPU in minutes.

What takes time to build and is only read (a data directory, checkpoints, a trained
baseline) is built once a session here, from the builders in tests/fixtures/; a test that
would change one copies it to its own tmp_path first (tests/fixtures/files.py checks)."""

from __future__ import annotations

import dataclasses
import gc
import os
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from nmt_cli.cpu_level import apply_to_torch_environment

# pytest-xdist's workers inherit the terminal's size as COLUMNS and LINES; rich's consoles,
# made when nmt's commands are imported, would keep it for the session, where a plain run
# has none and a test's own COLUMNS (CliRunner's env) takes effect. Every process alike:
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

# Before torch loads: NMT_CPU_LEVEL=avx2 (say) caps oneDNN and ATen too, so the whole suite
# runs as on a CPU of that level.
apply_to_torch_environment()

# isort: split
import torch  # noqa: E402

from nmt_cli.core.transformer import ModelConfig, Transformer  # noqa: E402
from nmt_cli.engines.train import TrainResult  # noqa: E402
from tests.fixtures.configs import tiny_model_config  # noqa: E402
from tests.fixtures.files import shared_read_only, snapshot  # noqa: E402
from tests.fixtures.translation_ckpt import RandomCheckpoints  # noqa: E402

# Two threads at most, and the cores shared among pytest-xdist's workers when the suite
# runs in several processes (`-n 2`): more threads than cores slow tiny models many-fold.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, torch.get_num_threads() // _WORKERS)))


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Decoding tiny models is thousands of tiny operations: one thread is fastest, and on
    a busy 2-core machine two threads per operation can be 10-100x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny_config() -> ModelConfig:
    return tiny_model_config(
        encoder_layers=2,
        decoder_layers=2,
        src_vocab_size=40,
        tgt_vocab_size=40,
        max_positions=128,
    )


@pytest.fixture
def tiny_model(tiny_config: ModelConfig) -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_config).eval()


@pytest.fixture(scope="session")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The training tests' data directory (tests/fixtures/train_data.py), shared read-only;
    a test that changes one makes its own with `make_data_dir(tmp_path / ...)`."""
    from tests.fixtures.train_data import make_data_dir

    with shared_read_only(make_data_dir(tmp_path_factory.mktemp("data"))) as root:
        yield root


@pytest.fixture(scope="session")
def accumulating_run(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainResult]:
    """`tiny_recipe` with ACCUMULATING's settings, trained once in this process: the one
    process that the data-parallel tests (gloo ranks, torchrun nodes) must end equal to,
    in weights and dev loss. Its run directory is shared read-only."""
    from nmt_cli.engines.train import train
    from tests.fixtures.train_data import ACCUMULATING, tiny_recipe

    run_dir = tmp_path_factory.mktemp("accumulating") / "one"
    result = train(tiny_recipe(data, run_dir, **ACCUMULATING))
    with shared_read_only(result.run_dir):
        yield result


@pytest.fixture(scope="session")
def random_ckpt_of(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RandomCheckpoints]:
    """`random_ckpt_of(**settings)`: a checkpoint of tiny_vocab with seeded random weights
    (translation_ckpt.random_checkpoint's settings), written once a session for each
    settings and shared read-only: the session's end checks that none changed."""
    from tests.fixtures.translation_ckpt import random_checkpoint, tiny_vocab

    root = tmp_path_factory.mktemp("random")
    written: dict[str, str] = {}

    @cache
    def made(**settings: int) -> Path:
        name = "".join(f"_{key}{value}" for key, value in sorted(settings.items()))
        path = random_checkpoint(root / f"random{name}.pt", tiny_vocab(), **settings)
        written[path.name] = snapshot(root)[path.name]
        return path

    yield made
    assert snapshot(root) == written, f"a test changed a checkpoint in {root}, shared read-only"


def replace(cfg: ModelConfig, **changes: object) -> ModelConfig:
    return dataclasses.replace(cfg, **changes)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _collector_within_reach() -> Iterator[None]:
    """A command run in this process (CliRunner) freezes what exists once it has loaded
    (nmt_cli/collector.py), as a command's own process would until it exits. Each test
    hands it back, so that the next one finds the collector, and what walks its objects
    (`gc.get_referrers`), as a fresh process would."""
    yield
    gc.unfreeze()
