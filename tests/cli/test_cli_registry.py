"""The CLI reads the backend registry: a backend another package installs (entry point group
`pyree_build.backends`) is a `compile --target`, its compile options and verbs are in the
parsers and the help, and a command naming a built-in target never scans for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PACKAGE_ROOT, install_backend

TOY = """
from pyree_build.backends.base import Backend, Option, Verb


class ToyBackend(Backend):
    name = "toy"
    description = "a backend installed by another package"
    devices = ("toydev",)
    compile_options = (Option(("--toy-level",), {"default": None, "help": "how toy the code is"}),)
    verbs = (
        Verb(
            "toy-hello", "greet a word", "toy_backend:hello", (Option(("word",), {"help": "the word"}),),
            description="Greet a word, as a verb a backend from another package declares.",
            examples="pyree-build toy-hello world",
        ),
    )

    def target_flags(self, options):
        return ["--iree-hal-target-device=toy"]


def hello(word):
    return f"hello {word}"


BACKEND = ToyBackend()
"""


@pytest.fixture(scope="module")
def toy_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory that, on PYTHONPATH, installs the `toy` backend through an entry point."""
    return install_backend(tmp_path_factory.mktemp("toy"), "toy", TOY)


def _python(code: str, toy_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), str(toy_path)]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def _cli(toy_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _python(f"import sys; from pyree_build.cli import main; sys.exit(main({list(args)!r}))", toy_path)


def test_an_installed_backend_is_in_the_help_and_its_verb_runs(toy_path):
    top = _cli(toy_path, "--help").stdout
    assert "toy-hello" in top and "greet a word" in top
    compile_help = _cli(toy_path, "compile", "--help").stdout
    assert "llvm-cpu,cuda,vulkan,hip,toy" in compile_help and "--toy-level" in compile_help
    assert "toydev" in _cli(toy_path, "run", "--help").stdout
    verb_help = _cli(toy_path, "toy-hello", "--help").stdout
    assert "Greet a word" in verb_help and "examples:\n  pyree-build toy-hello world" in verb_help
    result = _cli(toy_path, "toy-hello", "world")
    assert result.returncode == 0 and result.stdout == "hello world\n", result.stderr


def test_compile_takes_an_installed_target_and_passes_its_options_as_target_options(toy_path):
    code = (
        "import json; from pyree_build.cli import _parse; from pyree_build.cli.commands import _target_options\n"
        "_, ns = _parse(['compile', 'in.mlir', '-o', 'out.vmfb', '--target', 'toy', '--toy-level', '3', '--sm', '86'], [])\n"
        "print(json.dumps([ns.target, ns.sm, _target_options(ns)]))"
    )
    result = _python(code, toy_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["toy", "86", {"toy_level": "3"}]


def test_a_built_in_target_reads_no_installed_packages(toy_path):
    code = (
        "import sys; from pyree_build.cli import _parse\n"
        "_, ns = _parse(['compile', 'in.mlir', '-o', 'out.vmfb', '--target', 'cuda', '--sm', '86'], [])\n"
        "_, ns = _parse(['run', 'm.vmfb', '--function', 'f', '--device', 'local-task'], [])\n"
        "print('importlib.metadata' in sys.modules, 'toy_backend' in sys.modules)"
    )
    result = _python(code, toy_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]
