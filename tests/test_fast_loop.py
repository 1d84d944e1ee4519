"""The fast loop (`pytest -m "not slow"`, tests/conftest.py): its tables name
real tests, and it keeps the files of the core rules."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import SLOW_FILES, SLOW_TESTS

TESTS = Path(__file__).resolve().parent
# Parsing, chunking, search rules, guards and checks: the fast loop runs them.
CORE_RULES = ("test_parsers.py", "test_x_graphql.py", "test_chunking.py", "test_search.py", "test_reading.py",
              "test_fetch_guard.py", "test_gate.py", "test_wiki_checks.py", "test_bad_input.py", "test_settings.py")


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    return {node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")}


def test_the_slow_tables_name_files_and_tests_that_exist():
    missing = [name for name in SLOW_FILES if not (TESTS / name).is_file()]
    for file, names in SLOW_TESTS.items():
        path = TESTS / file
        missing += [f"{file}::{name}" for name in sorted(names - _test_names(path))] if path.is_file() else [file]
    assert not missing, f"tests/conftest.py names tests that do not exist (renamed?): {missing}"


def test_the_fast_loop_keeps_most_tests_of_the_core_rules():
    for file in CORE_RULES:
        assert file not in SLOW_FILES, file
        names = _test_names(TESTS / file)
        assert len(SLOW_TESTS.get(file, set())) * 2 <= len(names), f"most tests of {file} are slow"
