"""Issue 44 item 3: files a tool reads that no scanner sees.

A C source whose inline asm says `.incbin "/abs/inc.bin"` (or a `.S`/`.s` file saying it, or
`.include`) reads a file that clang's -MD output does not list: on main an edit to that file
was a cache hit with the old bytes, for `plugin` and `objects` alike. Such a source is now
built and not cached, with a note saying why, however a macro, a string escape or adjacent
literals spell the directive. `#embed` is listed by the compiler's depfile, and
`__has_embed` names are resolved into the key as `__has_include` names are.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PACKAGE_ROOT, PLUGIN_SAMPLE
from hypothesis import given, settings
from hypothesis import strategies as st

from pyree_build.core.inputs import assembler_reads


def _env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYREE_BUILD_REMOTE_CACHE")}
    env.update(PYREE_BUILD_CACHE=str(cache), PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), env.get("PYTHONPATH", "")]))
    return env


def _build(argv: list[str], cache: Path) -> str:
    result = subprocess.run([sys.executable, "-m", "pyree_build", *argv], env=_env(cache), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stderr


# How a source may spell `.incbin "PATH"`: plainly, split over adjacent literals, with a hex
# escape, pasted by the preprocessor (found only after -E), upper case, or as assembly.
SPELLINGS = {
    "inline asm": ('__asm__(".section .rodata.blob,\\"a\\"\\n.incbin \\"{path}\\"\\n.text\\n");\n', ".c"),
    "adjacent literals": ('__asm__(".section .rodata.blob,\\"a\\"\\n.inc" "bin \\"{path}\\"\\n.text\\n");\n', ".c"),
    "hex escape": ('__asm__(".section .rodata.blob,\\"a\\"\\n.inc\\x62in \\"{path}\\"\\n.text\\n");\n', ".c"),
    "pasted by macros": (
        "#define STR(x) #x\n#define XSTR(x) STR(x)\n#define CAT(a, b) a##b\n"
        '__asm__(".section .rodata.blob,\\"a\\"\\n" XSTR(CAT(.inc, bin)) " \\"{path}\\"\\n.text\\n");\n',
        ".c",
    ),
    "upper case": ('__asm__(".section .rodata.blob,\\"a\\"\\n.INCBIN \\"{path}\\"\\n.text\\n");\n', ".c"),
    "preprocessed assembly": ('.section .rodata.blob,"a"\n.incbin "{path}"\n', ".S"),
    "assembly": ('.section .rodata.blob,"a"\n.incbin "{path}"\n', ".s"),
}


def _source(work: Path, spelling: str, blob: Path, suffix_code: str = "") -> Path:
    template, suffix = SPELLINGS[spelling]
    src = work / f"k{suffix}"
    src.write_text(template.replace("{path}", str(blob)) + (suffix_code if suffix == ".c" else ""))
    return src


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_an_edited_incbin_file_is_never_a_stale_cache_hit_for_objects(tmp_path, spelling):
    blob = tmp_path / "inc.bin"
    src = _source(tmp_path, spelling, blob, "int pyree_value(int x) { return x + 1; }\n")
    out = tmp_path / "o"
    blob.write_bytes(b"FIRST-CONTENT-4c1d")
    _build(["objects", src, "--arch", "x86_64", "-o", out], tmp_path / "cache")
    assert b"FIRST-CONTENT-4c1d" in (out / "k_x86_64.o").read_bytes()
    blob.write_bytes(b"OTHER-CONTENT-9e7a")  # same size: only the content says it changed
    log = _build(["objects", src, "--arch", "x86_64", "-o", out, "--depfile", tmp_path / "k.d"], tmp_path / "cache")
    assert b"OTHER-CONTENT-9e7a" in (out / "k_x86_64.o").read_bytes(), log
    assert "cache hit" not in log and "not cached" in log and ".incbin" in log, log
    assert str(blob) in (tmp_path / "k.d").read_text()  # Ninja reruns the step when it changes


def test_an_edited_incbin_file_is_never_a_stale_cache_hit_for_a_system_plugin(tmp_path):
    blob = tmp_path / "inc.bin"
    src = tmp_path / "plugin.c"
    asm = '__asm__(".section .rodata.blob,\\"a\\"\\n.globl pyree_blob\\npyree_blob:\\n.incbin \\"' + str(blob) + '\\"\\n.text\\n");\n'
    src.write_text((PLUGIN_SAMPLE / "system_plugin.c").read_text() + asm)
    out = tmp_path / "p.so"
    for marker in (b"FIRST-CONTENT-4c1d", b"OTHER-CONTENT-9e7a"):
        blob.write_bytes(marker)
        log = _build(["plugin", "--kind", "system", src, "-o", out], tmp_path / "cache")
        assert marker in out.read_bytes() and "cache hit" not in log, log


def test_a_source_without_assembler_reads_is_still_cached(tmp_path):
    src = tmp_path / "k.c"
    src.write_text('__asm__(".text\\n.p2align 4\\n");\nint pyree_value(int x) { return x * 3; }\n')
    _build(["objects", src, "--arch", "x86_64", "-o", tmp_path / "a"], tmp_path / "cache")
    log = _build(["objects", src, "--arch", "x86_64", "-o", tmp_path / "b"], tmp_path / "cache")
    assert "cache hit" in log and "not cached" not in log, log


def test_a_file_that_starts_to_exist_for_has_embed_is_never_a_stale_hit(tmp_path):
    src = tmp_path / "h.c"
    src.write_text(
        '#if __has_embed("x.bin")\nstatic const char data[] = {\n#embed "x.bin"\n, 0};\nconst char *get(void) { return data; }\n'
        '#else\nconst char *get(void) { return "NO-FILE-HERE"; }\n#endif\n'
    )
    out = tmp_path / "o"
    _build(["objects", src, "--arch", "x86_64", "-o", out], tmp_path / "cache")
    assert b"NO-FILE-HERE" in (out / "h_x86_64.o").read_bytes()
    for marker in (b"EMBEDDED-ONE", b"EMBEDDED-TWO"):  # it appears, then its bytes change
        (tmp_path / "x.bin").write_bytes(marker)
        log = _build(["objects", src, "--arch", "x86_64", "-o", out], tmp_path / "cache")
        assert marker in (out / "h_x86_64.o").read_bytes(), log


# Words and fragments of C that hold no assembler directive, around one that may.
_noise = st.sampled_from(["int f(int x) { return x % 3; }\n", 'const char *s = "%.2f included";\n', "struct include_t { int n; };\n", ""])


@settings(max_examples=60, deadline=None)
@given(st.lists(_noise, max_size=3), st.sampled_from(["incbin", "include", "macro", "irp", "irpc", "altmacro"]), st.integers(0, 5), st.booleans())
def test_the_scan_finds_a_directive_however_its_literal_spells_it(noise, directive, split, upper):
    """Every spelling of a directive in preprocessed text is found: split over adjacent
    literals at any point, a letter as an octal escape, in any case; the noise alone is not."""
    name = ("." + directive).upper() if upper else "." + directive
    at = min(split, len(name) - 1)
    if split % 2:  # two literals the compiler joins
        spelled = f'"{name[:at]}" "{name[at:]} \\"f.bin\\""'
    else:  # one letter as an octal escape
        spelled = f'"{name[:at]}\\{ord(name[at]):03o}{name[at + 1 :]} \\"f.bin\\""'
    text = "".join(noise) + f"__asm__({spelled});\n"
    why, _ = assembler_reads(text)
    assert why is not None and f"`.{directive}`" in why, (text, why)
    assert assembler_reads("".join(noise))[0] is None


def test_a_directive_name_an_operand_completes_is_found_and_a_printf_format_is_not():
    assert assembler_reads('void f(void) { __asm__ volatile(".in" "%c0 \\"f.bin\\"" :: "s"(cbin)); }\n')[0] is not None
    assert assembler_reads('void f(void) { asm(".%c0 \\"f.bin\\"" :: "s"(incbin_alias)); }\n')[0] is not None
    assert assembler_reads('int f(const char *a) { return printf("%s.%s", a, a); }\n')[0] is None
    assert assembler_reads('void f(int x) { asm volatile("movl %0, %%eax\\n.p2align 4" :: "r"(x)); }\n')[0] is None
