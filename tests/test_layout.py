"""The package's shape, as helpers/README.md promises it to a maintainer: every module on the map and
mirrored by a test file, no import cycle (lazy imports inside functions included), and no module
past about 300 lines of logic. Static checks: nothing is imported."""

import ast
import io
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "helpers"
MAX_LOGIC_LINES = 300


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (packages by their __init__)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports, at the top or inside a function."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                target = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out |= {c for c in [target, *(f"{target}.{a.name}" for a in node.names)] if c in known}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
    return out - {name}


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` as a path that ends where it starts, or [] when there is none."""
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt]
            if not state.get(nxt):
                found = visit(nxt, path + [node])
                if found:
                    return found
        state[node] = 2
        return []

    for start in sorted(graph):
        if not state.get(start):
            found = visit(start, [])
            if found:
                return found
    return []


def logic_lines(path: Path) -> int:
    """Lines holding code: no blank lines, comments or docstrings."""
    source = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    code = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            code.update(range(tok.start[0], tok.end[0] + 1))
    return len(code - docstrings)


def test_the_import_graph_has_no_cycle():
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    assert "helpers.step" in graph["helpers.training"]  # the graph sees the package's own imports
    assert cycle(graph) == [], " -> ".join(cycle(graph))


def test_the_cycle_finder_finds_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_is_on_the_map_and_has_its_test_file(name):
    path = modules()[name]
    parts = name.split(".")[1:]
    if not parts:  # the package itself
        return
    if path.name == "__init__.py" and len(ast.parse(path.read_text()).body) <= 1:
        return  # a subpackage whose __init__ is only its docstring
    if parts[-1] == "__main__":
        return
    readme = (PACKAGE / "README.md").read_text()
    assert f"`{parts[-1]}`" in readme or f"`{parts[-1]}/`" in readme, f"{name} is not on the map in helpers/README.md"
    if path.name == "__init__.py":
        test = ROOT / "tests" / parts[0] / f"test_{parts[0]}.py"
    elif len(parts) == 1:
        test = ROOT / "tests" / f"test_{parts[0]}.py"
    else:
        test = ROOT / "tests" / parts[0] / f"test_{parts[1]}.py"
    assert test.exists(), f"{name} has no test file ({test.relative_to(ROOT)})"


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_module_does_several_jobs_by_size(name):
    lines = logic_lines(modules()[name])
    assert lines <= MAX_LOGIC_LINES, f"{name}: {lines} lines of logic; split it by job"


def test_logic_lines_count_code_only(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text('"""Doc\nstring."""\n\n# a comment\nx = 1\n\n\ndef f():\n    """Doc."""\n    return (x +\n            1)\n')
    assert logic_lines(sample) == 4  # x = 1, def f():, and the two lines of the return
