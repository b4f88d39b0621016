"""Building and loading the compiled module of the CPU decoding backend (csrc/).

The module holds the decoder step as one C++ call (csrc/decoder_step.cpp, used by
backends/cpu/step.py) and the kernels both steps use: bf16 and int8 products for the few
rows of a step (csrc/bf16_linear.cpp, csrc/int8_linear.cpp, through backends/cpu/linear.py),
attention over the SlotCache (csrc/attention.cpp), a log-softmax (csrc/log_softmax.cpp)
and beam search's bookkeeping with its one-pass candidate selection (csrc/beam_topk.cpp),
also fused with the log-softmax (csrc/beam_choose.cpp);
and, for training on a CPU, dropout's masks (csrc/dropout_mask.cpp) and the smoothed
loss's sweep over the logits (csrc/smoothed_loss.cpp), through backends/cpu/training.py.
The kernels compile as one translation unit (csrc/kernels.cpp includes them), the step
and its bindings as the other.

It is built with PyTorch's extension builder (a C++ compiler and ninja) once per source
text, source directory, Python ABI and PyTorch version, into a per-user cache
(`TORCH_EXTENSIONS_DIR` if set); where that fails, decoding keeps the Python step and the
caller is told why.

Built once means built once: a finished build leaves a stamp beside the library, and a
process that finds both loads the library itself, without running the builder. (The
builder runs ninja in every process that calls it, and ninja rebuilds every object when
its log was written by another ninja version: ninja 1.11 and 1.12+ hash the same command
differently, and which ninja PATH finds first, a system one or the wheel's, can differ
between the processes of one installation, such as `nmt train` and `torchrun` in an
activated environment.) Only a missing or unfinished build runs the builder, with the ninja
wheel's binary first on PATH, under a lock that the kernel releases when its holder dies;
every process that builds or waits says so, with its progress.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from types import ModuleType

import torch

from nmt_cli.cpu_level import LEVELS, cpu_level

_CSRC = Path(__file__).with_name("csrc")
# Two translation units, compiled side by side: the decoder step with the Python bindings,
# and every kernel (kernels.cpp includes their files, so that ATen's headers are read once).
SOURCES = [_CSRC / "decoder_step.cpp", _CSRC / "kernels.cpp"]
# What the two include: part of the module's name, as the sources are.
INCLUDED = sorted(p for p in _CSRC.iterdir() if p.suffix in (".cpp", ".h") and p not in SOURCES)


# OpenMP: `at::parallel_for` in the kernels runs on PyTorch's own OpenMP threads (its
# libgomp, already loaded, is the one the module links to); without the flag it is serial.
CFLAGS = ("-O3", "-fopenmp")
LDFLAGS = ("-fopenmp",)

# Part of the module's name: a change to how the module is built or stamped builds anew.
BUILDER_VERSION = 2

WHAT = "nmt's CPU kernels"
HEARTBEAT_SECONDS = 30.0  # a progress line at least this often, so a build is never silent
POLL_SECONDS = 0.5  # how often a waiting process looks at the lock and the objects
STALE_LOCK_SECONDS = 600  # PyTorch's own lock, where the file system has no flock

# A line of text for the user about a build in progress (None: on stderr).
Report = Callable[[str], None]


class CompileError(RuntimeError):
    """The step could not be built or loaded here; the message says why."""


@cache
def _module_name() -> str:
    """One name per source text, PyTorch version, Python ABI and source directory, so a
    changed source or a new PyTorch never loads a stale build, and two installations do
    not rebuild in turn (the builder's ninja file names the sources by their paths)."""
    digest = hashlib.sha256(torch.__version__.encode())
    digest.update(str(_CSRC.resolve()).encode())
    digest.update(str(sysconfig.get_config_var("EXT_SUFFIX")).encode())
    digest.update(f"builder {BUILDER_VERSION}".encode())
    digest.update(" ".join(CFLAGS + LDFLAGS).encode())  # tuples: the builder extends lists
    for path in SOURCES + INCLUDED:
        digest.update(path.read_bytes())
    return f"nmt_decoder_step_{digest.hexdigest()[:16]}"


def build_directory() -> Path:
    base = os.environ.get("TORCH_EXTENSIONS_DIR")
    if base:
        return Path(base) / _module_name()
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache_home / "nmt" / "extensions" / _module_name()


def library_path() -> Path:
    return build_directory() / f"{_module_name()}.so"


def _stamp_path(directory: Path) -> Path:
    return directory / "built.json"


def _identity(library: Path) -> dict[str, object]:
    """What the stamp records of a finished build: a library replaced or cut short since
    (a link killed half-way) no longer matches it."""
    status = library.stat()
    return {
        "module": library.stem,
        "torch": torch.__version__,
        "bytes": status.st_size,
        "mtime_ns": status.st_mtime_ns,
    }


def is_built() -> bool:
    """Whether the module is built for this source and loads without the builder: its
    library, and the stamp a finished build writes beside it. Raises OSError where a
    source file cannot be read."""
    library = library_path()
    try:
        identity = _identity(library)
    except OSError:  # no library: not built
        return False
    try:
        stamp = json.loads(_stamp_path(library.parent).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no stamp: not built, or not finished
        return False
    return isinstance(stamp, dict) and all(stamp.get(k) == v for k, v in identity.items())


_loaded: ModuleType | None = None
_loading = threading.Lock()


def load_kernel(report: Report | None = None) -> ModuleType:
    """The compiled module, built on the first call of the process if need be (once per
    process: loading an extension is process-wide anyway), its kernels capped at nmt's
    CPU level as the setting reads now (nmt_cli/cpu_level.py). A build, or the wait for
    another process's, is told to `report` line by line (None: on stderr)."""
    global _loaded
    with _loading:
        if _loaded is None:
            _loaded = _obtain(report or _to_stderr)
        module = _loaded
    module.set_cpu_level_cap(LEVELS.index(cpu_level()))
    return module


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _obtain(report: Report) -> ModuleType:
    """The module: loaded as it is where a finished build is found, built otherwise."""
    try:
        if is_built():
            return _import(library_path())
        check_tools()
        directory = build_directory()
        directory.mkdir(parents=True, exist_ok=True)
        with _build_lock(directory, report) as waited_for:
            if is_built():  # by the process this one waited for
                if waited_for is not None:
                    report(f"{waited_for} has built {WHAT}: loading them")
                return _import(library_path())
            if waited_for is not None:
                report(f"{waited_for} stopped before it finished: this process builds {WHAT}")
            return _build(directory, report)
    except CompileError:
        raise
    except Exception as exc:  # unwritable cache, a compiler error, a missing file, a bad .so
        first = str(exc).strip().splitlines()
        raise CompileError(first[0] if first else type(exc).__name__) from exc


def _import(library: Path) -> ModuleType:
    """Load a built library as PyTorch's builder would, without running the builder."""
    spec = importlib.util.spec_from_file_location(library.stem, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {library}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(directory: Path, report: Report) -> ModuleType:
    """Run PyTorch's builder (ninja resumes a build that was stopped), saying how far it
    has come, then stamp the library as finished."""
    from torch.utils.cpp_extension import load

    since = time.time()
    progress = _Progress(directory, f"building {WHAT} (once per installation and source)", since)
    stop = threading.Event()

    def watch() -> None:
        while True:
            progress.tick(report)
            if stop.wait(1.0):
                return

    # Its own lock: only a build that was killed leaves it while this one holds ours.
    with contextlib.suppress(FileNotFoundError):
        (directory / "lock").unlink()
    watcher = threading.Thread(target=watch, name="nmt-build-progress", daemon=True)
    with _ninja_first_on_path():
        watcher.start()
        try:
            module = load(
                name=_module_name(),
                sources=[str(path) for path in SOURCES],
                extra_cflags=list(CFLAGS),
                extra_ldflags=list(LDFLAGS),
                build_directory=str(directory),
                verbose=False,
            )
        finally:
            stop.set()
            watcher.join()
    stamp = {**_identity(library_path()), "seconds": round(time.time() - since, 1)}
    temporary = directory / f"built.json.{os.getpid()}"
    temporary.write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")
    temporary.replace(_stamp_path(directory))
    report(f"built {WHAT} in {time.time() - since:.0f} s")
    return module


class _Progress:
    """Lines saying how far a build has come, counted from the object files in its
    directory (so the process building and those waiting count alike): one when an
    object is done, and one every HEARTBEAT_SECONDS otherwise."""

    def __init__(self, directory: Path, head: str, since: float) -> None:
        self.directory, self.head, self.since = directory, head, since
        self.done = -1
        self.said = 0.0

    def tick(self, report: Report) -> None:
        done = sum((self.directory / f"{source.stem}.o").is_file() for source in SOURCES)
        now = time.time()
        if done != self.done or now - self.said >= HEARTBEAT_SECONDS:
            self.done, self.said = done, now
            step = "linking" if done == len(SOURCES) else "objects"
            seconds = max(0.0, now - self.since)
            report(f"{self.head}: {done}/{len(SOURCES)} {step}, {seconds:.0f} s")


@contextlib.contextmanager
def _build_lock(directory: Path, report: Report) -> Iterator[str | None]:
    """Held while building: one process builds, the others wait, told whom they wait
    for and how far it has come; yields the process waited for, if any. An flock, which
    the kernel releases when its holder exits, however (SIGKILL included): a killed
    build never leaves a lock to wait on."""
    fd = os.open(directory / "build.lock", os.O_RDWR | os.O_CREAT, 0o644)
    waited_for = None
    try:
        try:
            waited_for = _wait_for_lock(fd, directory, report)
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            _clear_stale_lock(directory / "lock")  # no flock here: PyTorch's lock alone
        else:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {time.time():.3f}\n".encode(), 0)
        yield waited_for
    finally:
        os.close(fd)  # releases the flock


def _wait_for_lock(fd: int, directory: Path, report: Report) -> str | None:
    """Take the lock, waiting as long as its holder lives; the holder, where this process
    waited long enough to say so (a holder that only looks at the stamp is quick)."""
    holder: str | None = None
    waited: _Progress | None = None
    start = time.monotonic()
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return holder
        except BlockingIOError:
            pass
        if waited is None and time.monotonic() - start >= 1.0:
            holder, since = _holder(fd)
            head = f"waiting for {holder}, which is building {WHAT} (once per installation)"
            waited = _Progress(directory, head, since)
        if waited is not None:
            waited.tick(report)
        time.sleep(POLL_SECONDS)


def _holder(fd: int) -> tuple[str, float]:
    """Who holds the lock and since when, as the holder wrote them into it."""
    try:
        pid, since = os.pread(fd, 64, 0).decode().split()
        return f"process {int(pid)}", float(since)
    except (OSError, ValueError):  # written in a moment
        return "another process", time.time()


def _clear_stale_lock(lock: Path) -> None:
    """PyTorch's builder holds `lock` while it compiles and others wait for it to go; a
    build killed outright leaves it behind. Where flock is not to be had, a lock older
    than any build is taken for such a one."""
    with contextlib.suppress(FileNotFoundError):
        if time.time() - lock.stat().st_mtime > STALE_LOCK_SECONDS:
            lock.unlink()


def _ninja() -> Path | None:
    """The ninja to build with: the ninja wheel's (a dependency, so the one version in
    every process of an installation, whatever PATH says), else PATH's or the scripts'
    of this Python."""
    with contextlib.suppress(ImportError, AttributeError):
        import ninja

        wheel = Path(ninja.BIN_DIR) / "ninja"
        if wheel.is_file():
            return wheel
    found = shutil.which("ninja")
    if found is not None:
        return Path(found)
    scripts = Path(sysconfig.get_path("scripts")) / "ninja"
    return scripts if scripts.is_file() else None


@contextlib.contextmanager
def _ninja_first_on_path() -> Iterator[None]:
    """PyTorch's builder runs `ninja` from PATH: for the build, that is _ninja()."""
    ninja = _ninja()
    before = os.environ.get("PATH")
    if ninja is not None:
        os.environ["PATH"] = os.pathsep.join([str(ninja.parent), before or os.defpath])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = before


def check_tools() -> None:
    """Raise CompileError unless a build can start: a C++ compiler, and ninja."""
    if shutil.which("c++") is None:
        raise CompileError("no C++ compiler (c++) on PATH")
    if _ninja() is None:
        raise CompileError("ninja is not installed (pip install ninja)")


def prepare_kernel(on_compile: Report | None = None) -> ModuleType:
    """The compiled module, built first where need be (a minute or more; then, or while
    it waits for another process's build, `on_compile` is told how far it has come,
    line by line; None: on stderr). Raises CompileError where it cannot be built or
    loaded here, a missing source file included."""
    try:
        is_built()  # hashes the sources: a missing one is named here
    except OSError as exc:
        raise CompileError(f"cannot read the module's sources: {exc}") from exc
    return load_kernel(on_compile)
