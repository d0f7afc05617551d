"""The pipeline's direction and the house rules, checked on the source (docs/architecture.md).

A module may import from its own layer and from layers to its left, never from a layer to its
right; the check reads every ``import`` statement with the ``ast`` module, including imports
inside functions and under ``TYPE_CHECKING`` (a lazy import is still a dependency). It also
checks that no module imports another module's private names, and that long modules and
functions say why they are long.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "xpuprof"

#: Layers, left to right (docs/architecture.md). ``sim`` is reserved for the simulator.
LAYERS = (
    "core",
    "capture",
    "workloads",
    "formats",
    "costmodel",
    "hardware",
    "trace",
    "analysis",
    "sim",
    "advise",
    "view",
    "export",
    "live",
    "ui",
)

#: Modules longer than this, and functions longer than FUNCTION_LINES, must carry a line
#: starting with ``Length:`` in their docstring that says why they are not split.
MODULE_LINES = 600
FUNCTION_LINES = 80

GENERATED = ("formats/proto/",)


def modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if not str(p.relative_to(SRC)).startswith(GENERATED))


def layer_of(module: str) -> str | None:
    """The layer of a dotted module name inside xpuprof (None for the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def imported(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import of an xpuprof module in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "xpuprof" or a.name.startswith("xpuprof."):
                    out.append((node.lineno, a.name, []))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package of this file
                pkg = path.relative_to(SRC.parent).with_suffix("").parts[: -node.level]
                base = ".".join(pkg) + (f".{node.module}" if node.module else "")
            else:
                base = node.module or ""
            if base == "xpuprof" or base.startswith("xpuprof."):
                out.append((node.lineno, base, [a.name for a in node.names]))
    return out


def test_every_package_is_a_known_layer() -> None:
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= set(LAYERS), f"packages without a layer: {packages - set(LAYERS)}"
    loose = {p.name for p in SRC.glob("*.py")} - {"__init__.py", "__main__.py"}
    assert not loose, f"modules outside any layer: {sorted(loose)}"


def test_no_module_imports_from_a_layer_to_its_right() -> None:
    bad = []
    for path in modules():
        here = layer_of(".".join(("xpuprof", *path.relative_to(SRC).with_suffix("").parts)))
        if here is None:  # the package root re-exports the public API lazily
            continue
        for line, module, names in imported(path):
            there = layer_of(module)
            if there is None:  # "from xpuprof import X" goes through the facade: any layer
                bad.append(f"{path.relative_to(SRC)}:{line} imports the facade ({names})")
                continue
            if LAYERS.index(there) > LAYERS.index(here):
                bad.append(f"{path.relative_to(SRC)}:{line} ({here}) imports {module} ({there})")
    assert not bad, "imports against the pipeline's direction:\n" + "\n".join(bad)


def test_no_module_imports_private_names_of_another() -> None:
    bad = [
        f"{path.relative_to(SRC)}:{line} imports {module}.{name}"
        for path in modules()
        for line, module, names in imported(path)
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert not bad, "private names used across modules:\n" + "\n".join(bad)


def _says_why(doc: str | None) -> bool:
    return any(line.strip().startswith("Length:") for line in (doc or "").splitlines())


def test_long_modules_and_functions_say_why() -> None:
    bad = []
    for path in modules():
        text = path.read_text()
        tree = ast.parse(text)
        rel = path.relative_to(SRC)
        n = text.count("\n")
        if n > MODULE_LINES and not _says_why(ast.get_docstring(tree)):
            bad.append(f"{rel}: {n} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > FUNCTION_LINES and not _says_why(ast.get_docstring(node)):
                    bad.append(f"{rel}:{node.lineno} {node.name}: {length} lines")
    assert not bad, (
        f"modules over {MODULE_LINES} lines or functions over {FUNCTION_LINES} lines without "
        "a 'Length:' line in their docstring saying why:\n" + "\n".join(bad)
    )


@pytest.mark.parametrize(
    ("snippet", "here", "expected"),
    [
        ("from xpuprof.trace.store import read_manifest", "capture/x.py", False),
        ("import xpuprof.ui.cli", "analysis/x.py", False),
        ("from xpuprof.core.errors import XpuprofError", "ui/x.py", True),
        ("def f():\n    from xpuprof.analysis import overview\n", "trace/x.py", False),
        ("from xpuprof import profile", "ui/x.py", False),
    ],
)
def test_the_direction_check_itself(tmp_path: Path, snippet: str, here: str, expected: bool):
    """The checker flags what it must (so the test above cannot pass by reading nothing)."""
    path = SRC / here
    fake = tmp_path / "x.py"
    fake.write_text(snippet)
    layer = here.split("/")[0]
    ok = True
    for _line, module, _names in imported(fake):
        there = layer_of(module)
        if there is None or LAYERS.index(there) > LAYERS.index(layer):
            ok = False
    assert ok is expected, (snippet, path)


def test_moved_modules_still_import_under_their_old_names() -> None:
    """Scripts written against the flat layout keep working: each old dotted name imports as
    the very module that replaced it, with the new module's own spec."""
    import importlib

    import xpuprof

    for old, new in xpuprof.MOVED.items():
        a, b = importlib.import_module(old), importlib.import_module(new)
        assert a is b, (old, new)
        assert b.__spec__.name == new
    from xpuprof.session import profile  # the spelling of earlier scripts

    assert profile is importlib.import_module("xpuprof.live.profile").profile


def test_every_tool_follows_the_tool_convention() -> None:
    """``tool(trace, *, ranks=None, steps=None, **options)``: what ``ui/tools.py`` lists as
    taking ranks and steps takes them keyword-only, defaulting to every rank and step, and
    every option the list declares is a keyword of the function (docs/architecture.md)."""
    import inspect

    from xpuprof.ui.tools import TOOLS

    for tool in TOOLS:
        params = inspect.signature(tool.function()).parameters
        positional = [p for p in params.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
        assert len(positional) == tool.inputs, (tool.name, positional)
        for name in tool.keywords():
            assert name in params, (tool.name, name)
            assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, (tool.name, name)
        for name in ("ranks", "steps"):
            if name in tool.common:
                assert params[name].default is None, (tool.name, name)
