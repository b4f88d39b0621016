"""The package's layering, as docs/ARCHITECTURE.md states it: imports run one way
(commands -> engines -> backends -> core), with no cycle anywhere (imports inside
functions count; an import only for type checking does not), core holds the paper's
model and no build machinery, and engines never call the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "nmt_cli"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The nmt_cli modules `path` imports at run time, anywhere in it."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    package = (
        _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    )
    found: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                ).strip(".")
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != _module_name(path):
                found.add(name)
    return found


def test_no_module_imports_itself_back() -> None:
    modules = _modules()
    graph = {name: _imports(path, modules) for name, path in modules.items()}
    # a package imports what its __init__ re-exports; that is no cycle of the code's
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_core_is_the_model_and_imports_no_layer_above_it() -> None:
    modules = _modules()
    core = {name: path for name, path in modules.items() if name.startswith("nmt_cli.core")}
    above = ("nmt_cli.engines", "nmt_cli.commands", "nmt_cli.backends", "nmt_cli.cli")
    for name, path in core.items():
        assert not [d for d in _imports(path, modules) if d.startswith(above)], name
        assert "cpp_extension" not in path.read_text(), name
    assert not list((PACKAGE / "core").rglob("*.cpp")) and not list((PACKAGE / "core").rglob("*.h"))


def test_the_backend_imports_no_engine_and_engines_never_call_the_cli() -> None:
    modules = _modules()
    for name, path in modules.items():
        if name.startswith("nmt_cli.backends.cpu"):
            deps = _imports(path, modules)
            assert not [d for d in deps if d.startswith(("nmt_cli.engines", "nmt_cli.commands"))]
        if name.startswith("nmt_cli.engines"):
            deps = _imports(path, modules)
            assert not [d for d in deps if d.startswith(("nmt_cli.commands", "nmt_cli.cli"))], name
            assert "nmt_cli.__main__" not in deps and "nmt_cli.cli" not in deps, name
            strings = {
                node.value
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
            }
            assert not {"nmt_cli", "-m nmt_cli"} & strings, f"{name} runs the CLI"


def test_one_class_is_named_translator() -> None:
    homes = [
        _module_name(path)
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.name == "Translator"
    ]
    assert len(homes) == 1, homes


# The rule for core's size: each module stays a file one reads through against the paper,
# at most MODULE_LINES lines; one that grows past it is split (as the embeddings, attention,
# the beam's bookkeeping and the parameter counts were), whatever the others' sizes. The cap
# is the rule, not a module's current size: the largest held about 400 lines when it was set.
MODULE_LINES = 450


def test_every_core_module_reads_top_to_bottom() -> None:
    over = {
        name: lines
        for name, path in _modules().items()
        if name.startswith("nmt_cli.core")
        and (lines := len(path.read_text().splitlines())) > MODULE_LINES
    }
    assert over == {}, f"split these core modules (at most {MODULE_LINES} lines each): {over}"


def test_core_chooses_no_kernel() -> None:
    """How an operation runs is the planner's (nmt_cli/backends): core holds no kernel
    library's name, no batch-shape or cache-layout knowledge of a backend, and no setter
    that swaps an implementation into a built model."""
    forbidden = ("onednn", "bucket", "slotcache", "sdpa_kernel", "torch.backends", "avx")
    for path in (PACKAGE / "core").rglob("*.py"):
        if path.name == "precision.py":  # which precision a machine's units run well
            continue
        text = path.read_text().lower()
        assert not [word for word in forbidden if word in text], path.name
        tree = ast.parse(path.read_text())
        setters = [
            method.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)
            for method in node.body
            if isinstance(method, ast.FunctionDef) and method.name.startswith("set_")
        ]
        assert setters == [], (path.name, setters)


def test_attention_is_written_in_one_place() -> None:
    """softmax(QK^T / sqrt(d_k)) V is computed by core/attention.py's reference and
    handed to PyTorch's fused kernel there; every other caller goes through them (the
    band's blocks change which keys are scored, not how)."""
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        calls = {
            node.func.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        }
        attention_calls = calls & {"softmax", "scaled_dot_product_attention", "baddbmm"}
        if path.relative_to(PACKAGE).as_posix() != "core/attention.py":
            assert not attention_calls, (path, attention_calls)


def test_nothing_is_swapped_into_a_built_model() -> None:
    """A model holds what its plan gave it when it was built (core's constructors make
    every submodule, the planned linear layers included): no code puts a submodule into
    a model afterwards, as a decoding backend once replaced every linear layer. Outside
    core nothing calls `add_module`, `register_module` or `set_submodule`, and `setattr`
    only sets the fields of an export's own spec objects."""
    swaps = {"add_module", "register_module", "set_submodule"}
    exports = {"engines/export/ctranslate2.py"}  # CTranslate2's spec objects, not modules
    for path in PACKAGE.rglob("*.py"):
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith("core/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            assert name not in swaps, (where, name)
            assert name != "setattr" or where in exports, (where, ast.unparse(node))
