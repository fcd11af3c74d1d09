"""What a run establishes about a module or a plugin is remembered by content (issue 23 item 4):
the same bytes are not read again, other bytes at the same path always are, and answers
that depend on more than the bytes (a plugin that cannot load here) are never remembered."""

from __future__ import annotations

import json
import os
import time

import pytest
from conftest import PLUGIN_SAMPLE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyree_build.actions import compile as compile_action
from pyree_build.actions import results
from pyree_build.actions import run as run_action
from pyree_build.backends.llvm_cpu import imports, plugins
from pyree_build.cache import facts, local
from pyree_build.core import processes
from pyree_build.core.errors import PyreeError

PROGRAM = """func.func @{name}(%a: tensor<4xf32>) -> tensor<4xf32> {{
  %0 = arith.{op} %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}}
"""


def _facts(kind: str) -> list[dict]:
    directory = local.work_dir(facts.FACTS_DIR)
    found = [json.loads(p.read_text()) for p in directory.glob("*.json")] if directory and directory.is_dir() else []
    return [f for f in found if f["kind"] == kind]


def _counting_spawns(monkeypatch: pytest.MonkeyPatch, tool: str) -> list[list[str]]:
    """The real spawn, with a record of each call that runs `tool` (no tool is replaced)."""
    calls: list[list[str]] = []
    real = processes.spawn

    def spawn(argv, **kwargs):  # type: ignore[no-untyped-def]
        if any(tool in os.fspath(a) for a in argv[:3]):
            calls.append([os.fspath(a) for a in argv])
        return real(argv, **kwargs)

    monkeypatch.setattr(processes, "spawn", spawn)
    return calls


def test_a_modules_functions_are_read_once_per_content(tmp_path, monkeypatch):
    module = tmp_path / "m.vmfb"
    (tmp_path / "p.mlir").write_text(PROGRAM.format(name="twice", op="addf"))
    compile_action.compile(tmp_path / "p.mlir", module)
    dumps = _counting_spawns(monkeypatch, "iree-dump-module")
    assert results.function_results(module, "twice") == (1, ["tensor<4xf32>"])
    assert len(dumps) == 1
    facts.forget_in_process()  # as a new process would: the stored fact answers
    assert results.function_results(module, "twice") == (1, ["tensor<4xf32>"])
    assert results.exported_functions(module) == ["twice"]
    assert len(dumps) == 1, dumps
    assert any(f["files"] == [str(module)] for f in _facts("module-metadata"))
    # Other bytes at the same path: read again, never the old answer.
    (tmp_path / "p.mlir").write_text(PROGRAM.format(name="squared", op="mulf"))
    compile_action.compile(tmp_path / "p.mlir", module)
    assert results.exported_functions(module) == ["squared"]
    assert len(dumps) == 2


def test_a_rebuilt_plugin_at_the_same_path_is_asked_again(tmp_path, monkeypatch):
    module = compile_action.compile(PLUGIN_SAMPLE / "example.mlir", tmp_path / "m.vmfb")
    plugin = tmp_path / "p.so"
    plugins.system_plugin([PLUGIN_SAMPLE / "system_plugin.c"], plugin)
    asks = []
    real = processes.call_in_child
    monkeypatch.setattr(processes, "call_in_child", lambda *a, **k: asks.append(a[1]) or real(*a, **k))
    imports.check_resolved(module, [plugin])
    facts.forget_in_process()  # as a new process would: the stored answer (of these bytes, whatever their path) serves
    imports.check_resolved(module, [plugin])
    assert len(asks) <= 1  # none when another test already asked a plugin of these bytes
    # The same path, now a plugin whose resolve knows another name: asked again, and the run is refused.
    other = tmp_path / "other.c"
    other.write_text((PLUGIN_SAMPLE / "system_plugin.c").read_text().replace('"simple_mul_workgroup"', '"renamed_workgroup"'))
    plugins.system_plugin([other], plugin)
    before = len(asks)
    with pytest.raises(PyreeError, match="no plugin resolves import 'simple_mul_workgroup'"):
        imports.check_resolved(module, [plugin])
    assert len(asks) == before + 1 and asks[-1] == str(plugin.resolve())


def test_an_answer_that_depends_on_this_machine_is_not_remembered(tmp_path):
    calls = []

    def cannot_load() -> dict:
        calls.append(1)
        return {"error": "cannot be loaded here (libfoo.so: not found)"}

    some_file = tmp_path / "plugin.so"
    some_file.write_bytes(b"\x7fELF not really")
    for _ in range(2):
        reply = facts.remembered("plugin-resolves", [some_file], cannot_load, depends_on=["x"], keep=lambda r: "error" not in r)
        assert reply == {"error": "cannot be loaded here (libfoo.so: not found)"}
    assert len(calls) == 2
    assert not [f for f in _facts("plugin-resolves") if f["files"] == [str(some_file)]]


def test_without_a_cache_nothing_is_remembered_in_the_process_either(tmp_path, monkeypatch):
    # A served command's process is a worker that served others before it (and the server
    # shares what workers learn): a fact kept in memory with the cache off reached commands
    # that, in processes of their own, never knew it (a CPU note said or not).
    monkeypatch.setenv(local.CACHE_ENV, "off")
    some_file = tmp_path / "a.txt"
    some_file.write_text("one")
    calls = []
    ask = lambda: calls.append(1) or ["answer"]  # noqa: E731
    assert facts.remembered("test-kind", [some_file], ask) == ["answer"]
    assert facts.remembered("test-kind", [some_file], ask) == ["answer"]
    assert len(calls) == 2
    assert not [e for e in facts.learned() if e[0] == "fact"]


def test_a_fact_remembered_in_one_cache_is_not_known_in_another(tmp_path, monkeypatch):
    some_file = tmp_path / "a.txt"
    some_file.write_text("one")
    calls = []
    ask = lambda: calls.append(1) or ["answer"]  # noqa: E731
    for cache in ("one", "two", "one"):
        monkeypatch.setenv(local.CACHE_ENV, str(tmp_path / cache))
        assert facts.remembered("test-kind", [some_file], ask) == ["answer"]
    assert len(calls) == 2


def test_cache_clear_removes_the_facts(tmp_path):
    some_file = tmp_path / "a.txt"
    some_file.write_text("clear me")
    facts.remembered("test-kind", [some_file], lambda: {"x": 1})
    assert _facts("test-kind")
    local.cache_clear()
    assert not _facts("test-kind")


VARIANTS = [("f", "addf"), ("f", "mulf"), ("g", "addf"), ("g", "subf")]


@given(st.lists(st.sampled_from(range(len(VARIANTS))), min_size=2, max_size=4))
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_runs_through_remembered_facts_equal_runs_without_them(tmp_path, monkeypatch, edits):
    """A sequence of rebuilds of one module path, each run with the facts remembered and with
    the cache off: the same result text, or the same refusal, every time."""
    for step, choice in enumerate(edits):
        name, op = VARIANTS[choice]
        source = tmp_path / f"p{step}.mlir"
        source.write_text(PROGRAM.format(name=name, op=op))
        module = compile_action.compile(source, tmp_path / "m.vmfb")
        outcomes = []
        for cache in (os.environ[local.CACHE_ENV], "off"):
            monkeypatch.setenv(local.CACHE_ENV, cache)
            facts.forget_in_process()
            try:
                outcomes.append(run_action.run(module, "f", inputs=["4xf32=3"]).stdout)
            except PyreeError as err:
                outcomes.append(err.what)
        assert outcomes[0] == outcomes[1], (edits, step, outcomes)
        assert ("4xf32=" in outcomes[0]) == (name == "f")


@pytest.fixture(autouse=True)
def _fresh_memory():
    facts.forget_in_process()
    yield
    facts.forget_in_process()


def test_a_file_rewritten_after_its_digest_was_remembered_is_hashed_again(tmp_path, monkeypatch):
    """The in-process memo of digests (which workers hand back to the server) keeps a digest
    with the file's stat, and only for a file unchanged for two seconds: a later write changes
    the stat, so the same path with other bytes of the same size is a new fact."""
    monkeypatch.setenv("PYREE_BUILD_CACHE", str(tmp_path / "cache"))
    facts.forget_in_process()
    path = tmp_path / "data.bin"
    path.write_bytes(b"a" * 64)
    asks: list[bytes] = []

    def ask() -> str:
        asks.append(path.read_bytes())
        return asks[-1][:1].decode()

    assert facts.remembered("first-byte", [path], ask) == "a"
    assert not [e for e in facts.learned() if e[0] == "digest"], "a digest remembered for a file written just now"
    os.utime(path, (1, 1))  # mtime back in time; the ctime this sets is now, so still too young
    time.sleep(2.1)
    assert facts.remembered("first-byte", [path], ask) == "a" and len(asks) == 1
    assert [e for e in facts.learned() if e[0] == "digest"], "no digest remembered for a file unchanged for 2 s"
    path.write_bytes(b"b" * 64)  # same size, same inode
    os.utime(path, (1, 1))  # even the same mtime: the ctime still changed
    assert facts.remembered("first-byte", [path], ask) == "b" and len(asks) == 2
    facts.forget_in_process()


def test_an_answer_that_read_a_file_it_is_not_keyed_by_is_not_remembered(tmp_path, monkeypatch):
    """Issue 44 item 2: a fact stands only for what was checked. An answer keyed by one file
    whose computation also read another (recorded where it was opened, core/reads.py) would be
    stale once that other file changed: it is not remembered."""
    monkeypatch.setenv(local.CACHE_ENV, str(tmp_path / "cache"))
    keyed, other = tmp_path / "keyed.txt", tmp_path / "other.txt"
    keyed.write_text("k")
    other.write_text("1")
    ask = lambda: [keyed.read_text(), other.read_text()]  # noqa: E731
    assert facts.remembered("test-two-files", [keyed], ask) == ["k", "1"]
    other.write_text("2")
    assert facts.remembered("test-two-files", [keyed], ask) == ["k", "2"]
    assert not _facts("test-two-files")
    assert facts.remembered("test-one-file", [keyed], lambda: [keyed.read_text()]) == ["k"]
    assert _facts("test-one-file"), "an answer drawn from its own file alone was not remembered"
