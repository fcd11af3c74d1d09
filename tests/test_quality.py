"""Issue 20, items 3 and 4: the habits of a well-kept package, held by the default test run.

Each tool runs as a subprocess from the repository root, configured by pyproject.toml, and a
failure shows the tool's own output. A tool that is not installed skips its test with the
reason (`pip install -e .[test]` brings them all).
"""

from __future__ import annotations

import ast
import inspect
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import PACKAGE_ROOT, REPO

import pyree_build as pb


def _tool(name: str) -> str:
    """The path of console script `name`: on PATH, or beside this Python (an unactivated venv)."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip(f"{name} is not installed (pip install -e .[test])")
    return found


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    # This checkout's package, never an installed copy: grimp and import-linter find it by import.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _assert_clean(proc: subprocess.CompletedProcess[str]) -> None:
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(proc.args)} (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}", pytrace=False)


def test_import_contracts_hold():
    # Layers cli > actions > backends > cache > core; backends independent; the backend interface names no target.
    _assert_clean(_run(_tool("lint-imports"), "--no-cache"))


# Each strongly connected component of the import graph with more than one module is a cycle:
# a module is in one with every module it imports (even indirectly) that imports it back.
# Imports inside functions count (grimp reads them); `if TYPE_CHECKING:` imports do not.
_CYCLES = textwrap.dedent(
    """
    import grimp

    graph = grimp.build_graph("pyree_build", cache_dir=None, exclude_type_checking_imports=True)
    seen = set()
    for module in sorted(graph.modules):
        if module in seen:
            continue
        cycle = {module} | (graph.find_upstream_modules(module) & graph.find_downstream_modules(module))
        seen |= cycle
        if len(cycle) > 1:
            print("cycle:", ", ".join(sorted(cycle)))
            for importer in sorted(cycle):
                for imported in sorted(graph.find_modules_directly_imported_by(importer) & cycle):
                    for detail in graph.get_import_details(importer=importer, imported=imported):
                        print(f"  {importer}:{detail['line_number']}: {detail['line_contents']}")
    """
)


def test_no_import_cycles():
    pytest.importorskip("grimp", reason="grimp is not installed (pip install -e .[test])")
    proc = _run(sys.executable, "-c", _CYCLES)
    _assert_clean(proc)
    if proc.stdout:
        pytest.fail("import cycles in pyree_build (break each, e.g. by moving what both need below both):\n" + proc.stdout, pytrace=False)


def test_ruff_check():
    _assert_clean(_run(_tool("ruff"), "check", "--no-cache", "."))


def test_ruff_format():
    _assert_clean(_run(_tool("ruff"), "format", "--check", "--no-cache", "."))


def test_mypy():
    # Strict for the public API (pyree_build, core.errors/args/records, backends, backends.base), default elsewhere.
    _assert_clean(_run(_tool("mypy")))


# A function a reader can follow on one screen: the longest in the package today is under this.
MAX_FUNCTION_LINES = 60


def _functions() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found = []
    for path in sorted((REPO / "pyree_build").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((f"{path.relative_to(REPO)}:{node.lineno} {node.name}", node))
    return found


def test_no_function_is_longer_than_a_screen():
    long = [f"{where} ({node.end_lineno - node.lineno + 1} lines)" for where, node in _functions() if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"split these into named steps (at most {MAX_FUNCTION_LINES} lines each):\n" + "\n".join(long)


def test_no_closure_shares_state_with_its_enclosing_function():
    """State a step needs is passed in or held by a record, never rebound through `nonlocal`."""
    shared = [where for where, node in _functions() if any(isinstance(n, ast.Nonlocal) for n in ast.walk(node))]
    assert not shared, "these functions rebind an enclosing function's variable:\n" + "\n".join(shared)


def test_imports_are_at_the_top_of_each_module():
    """A module's dependencies read from its first lines: start-up cost is kept down with
    core.lazy (loaded on first attribute read) and the backend registry, not by imports
    hidden in function bodies."""
    hidden = [f"{where}: line {n.lineno}" for where, node in _functions() for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not hidden, "move these imports to the top of their module (through core.lazy if heavy):\n" + "\n".join(hidden)


def _shape(signature: inspect.Signature) -> list[tuple[str, inspect._ParameterKind, object]]:
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


@pytest.mark.parametrize("name", sorted(v for v in pb._verb_names() if v != "run"))
def test_each_verb_declares_its_implementations_signature(name):
    """The typed signature declared in pyree_build/__init__.py (what help(), IDEs and type
    checkers see) has the implementation's parameters: names, kinds and defaults."""
    verb = getattr(pb, name)
    declared = inspect.signature(verb.__wrapped__)
    implementation = inspect.signature(verb._implementation())
    assert _shape(declared) == _shape(implementation)
    assert inspect.signature(verb) == declared  # what help() shows
    assert declared.return_annotation != inspect.Signature.empty


def test_run_passes_its_keywords_to_every_runner_it_chooses():
    from pyree_build.actions import inprocess
    from pyree_build.actions import run as run_action

    declared = inspect.signature(pb.run).parameters
    for runner in (inprocess.run, run_action.run_to_arrays, run_action.run):
        parameters = inspect.signature(runner).parameters
        assert list(parameters)[:2] == ["module", "function"], runner
        for keyword in ("plugins", "device"):
            assert parameters[keyword].kind is inspect.Parameter.KEYWORD_ONLY, (runner, keyword)
            assert parameters[keyword].default == declared[keyword].default, (runner, keyword)


def test_import_pyree_build_loads_no_action_or_backend():
    code = "import sys, pyree_build; print(sorted(m for m in sys.modules if m.startswith('pyree_build.')))"
    proc = _run(sys.executable, "-c", code)
    _assert_clean(proc)
    loaded = eval(proc.stdout)  # a list of module names printed by the line above
    assert not [m for m in loaded if m.startswith(("pyree_build.actions", "pyree_build.backends", "pyree_build.cli"))], loaded
