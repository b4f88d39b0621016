"""Libraries a command may need that a Python environment may lack, imported in one way.

Every import of sacremoses, datasets, matplotlib, tensorboard, ctranslate2, transformers,
starlette, uvicorn (these two once, before the modules of `engines/serve` that import
them) or ray (`nmt translate --ray`) goes through `require`. A library's absence is then
a one-line `NmtError` that names the package, how to install it (the nmt-cli extra that
brings it, or the package itself for a core dependency a bare machine lacks) and the
setting that avoids needing it, never an "internal error" from a ModuleNotFoundError deep
in a command. Where the work goes on without the library (TensorBoard logs, `nmt run`'s
training curves), the caller catches `MissingPackage` and shows the same message as a
notice. The extras named here are pyproject.toml's `[project.optional-dependencies]`; a
test keeps the two in step.

A module that runs only after its library's gate (the drawing code after
`pictures.backend.new_figure`) imports the library's submodules directly.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from nmt_cli.errors import NmtError

# Package (its name on PyPI and its top-level module) -> the nmt-cli extra that installs
# it; "" for a core dependency, which only an environment built without nmt's own
# dependencies (a bare GPU machine's PyTorch image, `pip install --no-deps`) lacks.
PACKAGES: dict[str, str] = {
    "sacremoses": "",
    "datasets": "",
    "matplotlib": "plot",
    "tensorboard": "tensorboard",
    "ctranslate2": "export",
    "transformers": "export",
    "starlette": "serve",
    "uvicorn": "serve",
    "safetensors": "import",
    "subword_nmt": "import",
    "ray": "ray",
}
# Modules of other packages that import one of the above.
_PACKAGE_OF = {"torch.utils.tensorboard": "tensorboard"}


class MissingPackage(NmtError):
    """An optional library (or a core one) cannot be imported; the message says what to
    install and what avoids it."""

    def __init__(self, message: str, package: str) -> None:
        super().__init__(message)
        self.package = package


def package_of(module: str) -> str:
    """The package that provides `module`."""
    package = _PACKAGE_OF.get(module, module.split(".")[0])
    if package not in PACKAGES:
        raise ValueError(f"{module}: not an optional module nmt_cli knows")
    return package


def install_hint(package: str) -> str:
    """The pip command that installs `package` the way nmt-cli expects it."""
    extra = PACKAGES[package]
    if not extra:
        return f"pip install {package}"
    return f"pip install 'nmt-cli[{extra}]' (or pip install {package})"


def require(module: str, *, purpose: str, avoid: str = "") -> ModuleType:
    """Import `module`, or raise `MissingPackage`: "<package> is not installed, and
    <purpose> needs it: <pip command>; or <avoid>".

    `purpose` names the work that needs the library ("the paper's tokenized BLEU"),
    `avoid` the option or setting that does without it ("pass --no-paper").
    """
    package = package_of(module)
    try:
        importlib.import_module(package)
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingPackage(_message(package, purpose, avoid, exc), package) from None


def _message(package: str, purpose: str, avoid: str, exc: ImportError) -> str:
    name = exc.name or ""
    missing = isinstance(exc, ModuleNotFoundError) and (
        name.split(".")[0] == package or _PACKAGE_OF.get(name) == package
    )
    if missing:
        state = f"{package} is not installed"
    else:  # installed but broken: a missing dependency of its own, a bad binary
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        state = f"{package} cannot be imported ({reason})"
    line = f"{state}, and {purpose} needs it: {install_hint(package)}"
    return f"{line}; or {avoid}" if avoid else line
