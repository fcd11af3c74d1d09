"""Issue 35 item 2: the environment a compiler reads is part of the cache key.

clang (zig's too) reads CPATH, C_INCLUDE_PATH, CCC_OVERRIDE_OPTIONS...: a build with CPATH=a
was a cache hit for CPATH=b, giving the output of the other header. Each tool's variables are
listed once (toolchain.ENVIRONMENT_READ) and keyed with the tool.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PACKAGE_ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyree_build.cache import local
from pyree_build.core import toolchain

SOURCE = "#include <cfg.h>\nint pyree_value(void) { return CFG; }\n"


def _objects(work: Path, cache: Path, **env: str) -> tuple[bytes, str]:
    full = {k: v for k, v in os.environ.items() if k not in toolchain.ENVIRONMENT_READ["zig cc"]}
    full.update(PYREE_BUILD_CACHE=str(cache), PYREE_BUILD_SERVER="off", PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]))
    full.update(env)
    out = work / "out"
    result = subprocess.run([sys.executable, "-m", "pyree_build", "objects", "k.c", "--arch", "x86_64", "-o", out],
                            cwd=work, env=full, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return (out / "k_x86_64.o").read_bytes(), result.stderr


@pytest.mark.parametrize("variable", ["CPATH", "C_INCLUDE_PATH", "CCC_OVERRIDE_OPTIONS"])
def test_a_build_with_other_compiler_environment_is_never_a_stale_hit(tmp_path, variable):
    work = tmp_path / "w"
    for name, value in (("a", 1), ("b", 2)):
        (work / name).mkdir(parents=True)
        (work / name / "cfg.h").write_text(f"#define CFG {value}\n")
    (work / "k.c").write_text(SOURCE)

    def setting(name: str) -> dict[str, str]:
        if variable == "CCC_OVERRIDE_OPTIONS":  # clang's own: add the -I itself
            return {variable: f"+-I{work / name}"}
        return {variable: str(work / name)}

    cache = tmp_path / "cache"
    first, _ = _objects(work, cache, **setting("a"))
    second, log = _objects(work, cache, **setting("b"))
    assert second != first, log
    assert second == _objects(work, tmp_path / "off", **setting("b"))[0]
    again, log = _objects(work, cache, **setting("a"))
    assert again == first and "cache hit" in log, log


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.sampled_from(sorted({n for names in toolchain.ENVIRONMENT_READ.values() for n in names})),
    st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"), max_size=20),
    st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"), max_size=20),
)
def test_a_tool_reads_a_variable_then_its_value_is_keyed(tmp_path, monkeypatch, name, first, second):
    """Property: for every listed variable of every tool, two values give the same action
    one build each, and the same value a hit."""
    name = name.replace("*", "X")  # a prefix stands for every name it starts
    tool = next(toolchain.Tool(t, ("true",), Path(sys.executable), "1") for t, names in toolchain.ENVIRONMENT_READ.items()
                if name in names or any(n.endswith("*") and name.startswith(n[:-1]) for n in names))  # fmt: skip
    monkeypatch.setenv("PYREE_BUILD_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "in.txt"
    src.write_text("input")
    out = tmp_path / "out.txt"
    builds: list[str] = []

    def build(private: list[Path]) -> list[str]:
        builds.append(os.environ.get(name, ""))
        private[0].write_text(f"built with {builds[-1]!r}")
        return []

    def run(value: str) -> str:
        monkeypatch.setenv(name, value)
        local.cached_action("env-test", key=[name], inputs=[src], outputs=[out], build=build, tools_used=[tool])
        return out.read_text()

    try:
        assert run(first) == f"built with {first!r}"
        assert run(second) == f"built with {second!r}"
        assert len(builds) == (1 if first == second else 2)
    finally:
        import shutil

        shutil.rmtree(tmp_path / "cache", ignore_errors=True)
