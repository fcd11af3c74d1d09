"""Issue 35 item 1: one include scanner, as the preprocessor reads `#include` lines.

NVRTC's `ptx` and `hsaco` (whose compilers write no dependency list) follow includes with
core.inputs' scanner: `/* c */ #include "h.cuh"`, `#inc\\` + newline + `lude` and `%:include`
were missed, so an edited header was a stale cache hit and the depfile lacked it. Checked
against the real preprocessor (clang's `-M`) over random spellings, and end to end.
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

from pyree_build.core import toolchain
from pyree_build.core.files import parse_depfile
from pyree_build.core.inputs import c_includes

HEADERS = [f"h{i}.h" for i in range(4)]

lead = st.sampled_from(["", "  ", "\t", "/* c */ ", "/* two\nlines */ ", "/**/"])
hash_mark = st.sampled_from(["#", "%:", "# ", "#\\\n", "%:\\\n ", "#/* x */"])
between = st.sampled_from([" ", "\t", "/* x */", " /* y */ ", "\\\n "])
trail = st.sampled_from(["", " // c", " /* c */", "  "])


@st.composite
def keyword(draw: st.DrawFn) -> str:
    word = draw(st.sampled_from(["include", "include", "import"]))
    at = draw(st.integers(0, len(word)))
    return word[:at] + "\\\n" + word[at:] if draw(st.booleans()) else word


@st.composite
def directive(draw: st.DrawFn) -> tuple[str, str]:
    header = draw(st.sampled_from(HEADERS))
    name = f'"{header}"' if draw(st.booleans()) else f"<{header}>"
    return header, draw(lead) + draw(hash_mark) + draw(keyword()) + draw(between) + name + draw(trail) + "\n"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(directive(), min_size=1, max_size=4), st.sampled_from(["", '// #include "h3.h"\n', 'const char* s = "/*";\n']))
def test_the_scanner_finds_every_header_the_preprocessor_reads(tmp_path, directives, noise):
    """Differential: every header clang's preprocessor includes, the scanner found too."""
    work = tmp_path / "w"
    (work / "inc").mkdir(parents=True, exist_ok=True)
    for h in HEADERS:
        (work / "inc" / h).write_text(f"#pragma once\nint v_{h[:-2]};\n")
    source = work / "s.c"
    source.write_text("".join(text for _, text in directives) + noise + "int main(void) { return 0; }\n")
    zig = toolchain.zig_clang()
    dep = work / "s.d"
    result = subprocess.run(
        zig.command("-target", "x86_64-linux-musl", "-Wno-import-preprocessor-directive-pedantic", "-w", "-M", "-MF", dep, "-I", work / "inc", source),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, (source.read_text(), result.stderr)
    read = {Path(d).resolve() for d in parse_depfile(dep) if Path(d).parent.name == "inc"}
    found = set(c_includes(source, [work / "inc"]).files)
    assert read <= found, (source.read_text(), read - found)


def _env(cache: Path) -> dict[str, str]:
    return dict(os.environ, PYREE_BUILD_CACHE=str(cache), PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]))


def _build(work: Path, cache: Path, argv: list[str], out: str) -> tuple[dict[str, bytes], str]:
    argv = [a.replace("{out}", out) for a in argv]
    result = subprocess.run([sys.executable, "-m", "pyree_build", *argv, "--depfile", f"{out}.d"], cwd=work, env=_env(cache),
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr
    outputs = {p.name: p.read_bytes() for p in sorted((work / out).rglob("*")) if p.is_file() and not p.name.startswith(".")}
    return outputs, (work / f"{out}.d").read_text()


KERNEL = 'extern "C" __global__ void k(int* out) { out[0] = VALUE; }\n'
SPELLINGS = {
    "comment before": '/* c */ #include "h.cuh"\n',
    "spliced keyword": '#inc\\\nlude "h.cuh"\n',
    "digraph": '%:include "h.cuh"\n',
}
VERBS = {
    "ptx (nvrtc)": ["ptx", "k.cu", "--sm", "80", "-o", "{out}"],
    "hsaco": ["hsaco", "k.cu", "--gfx", "942", "-o", "{out}"],
}


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
@pytest.mark.parametrize("verb", sorted(VERBS))
def test_an_edited_header_is_never_a_stale_hit(tmp_path, verb, spelling):
    work = tmp_path / "w"
    work.mkdir()
    prefix = "#include <hip/hip_runtime.h>\n" if verb == "hsaco" else ""
    (work / "k.cu").write_text(prefix + SPELLINGS[spelling] + KERNEL)
    (work / "h.cuh").write_text("#define VALUE 1\n")
    first, depfile = _build(work, tmp_path / "cache", VERBS[verb], "a")
    assert str(work / "h.cuh") in parse_depfile(work / "a.d"), depfile
    (work / "h.cuh").write_text("#define VALUE 2\n")
    second, _ = _build(work, tmp_path / "cache", VERBS[verb], "b")
    assert second != first
    assert second == _build(work, tmp_path / "off", VERBS[verb], "c")[0]


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_the_output_check_and_tunes_depfile_use_the_same_scanner(tmp_path, spelling):
    """core.outputs.included_files (what an output must not overwrite, a tune's depfile) reads includes as c_includes does."""
    from pyree_build.core.outputs import included_files

    (tmp_path / "k.cu").write_text(SPELLINGS[spelling] + KERNEL)
    (tmp_path / "h.cuh").write_text("#define VALUE 1\n")
    assert [p.resolve() for p in included_files([tmp_path / "k.cu"])] == [(tmp_path / "h.cuh").resolve()]
