"""The fast loop (`pytest -m "not slow"`, tests/conftest.py): the slow marks
sit on tests, and the fast loop keeps the files of the core rules."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# Parsing, chunking, search rules, guards and checks: the fast loop runs them.
CORE_RULES = ("test_parsers.py", "test_x_graphql.py", "test_chunking.py", "test_search.py", "test_reading.py",
              "test_fetch_guard.py", "test_gate.py", "test_wiki_checks.py", "test_bad_input.py", "test_settings.py")


def _is_slow_mark(node: ast.expr) -> bool:
    return ast.unparse(node) == "pytest.mark.slow"


def _file_is_slow(tree: ast.Module) -> bool:
    """The file sets `pytestmark` to the slow mark, or to a list that holds it."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                for t in node.targets):
            marks = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            return any(_is_slow_mark(m) for m in marks)
    return False


def _tests(tree: ast.Module) -> dict[str, bool]:
    """Each test function at the top of the file, and whether it carries the slow mark."""
    return {node.name: any(_is_slow_mark(d) for d in node.decorator_list) for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def test_each_slow_mark_sits_on_a_test_or_on_its_file():
    """A slow mark on a helper or a fixture marks nothing: the test that it
    was meant for then runs in the fast loop."""
    misplaced = []
    for path in sorted(TESTS.glob("test_*.py")):
        tree = _tree(path)
        placed = {id(m) for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.name.startswith("test_") for d in node.decorator_list for m in ast.walk(d)}
        placed |= {id(m) for node in tree.body if isinstance(node, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
                   for m in ast.walk(node.value)}
        placed |= {id(d) for node in tree.body if isinstance(node, ast.ClassDef) and node.name.startswith("Test")
                   for d in ast.walk(node) if isinstance(d, ast.expr)}
        misplaced += [f"{path.name}:{n.lineno}" for n in ast.walk(tree)
                      if isinstance(n, ast.expr) and _is_slow_mark(n) and id(n) not in placed]
    assert not misplaced, f"slow marks outside a test or pytestmark: {misplaced}"


def test_the_fast_loop_keeps_most_tests_of_the_core_rules():
    for file in CORE_RULES:
        tree = _tree(TESTS / file)
        assert not _file_is_slow(tree), file
        marks = _tests(tree)
        assert sum(marks.values()) * 2 <= len(marks), f"most tests of {file} are slow"
