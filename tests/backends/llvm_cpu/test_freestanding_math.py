"""<math.h> in freestanding code: standalone plugins and embedded objects call expf, sqrtf,
tanhf, powf, ... from pyree_build's freestanding math library, linked in where called, and
compute what numpy computes."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from conftest import PLUGIN_SAMPLE, SAMPLES, assert_clean_error

from pyree_build.backends.llvm_cpu import elf as elfcheck
from pyree_build.backends.llvm_cpu import fatelf

ARCHES = ("x86_64", "aarch64", "riscv64")
EMBEDDED = SAMPLES / "custom_dispatch" / "cpu" / "embedded"

# out[i] = function number rhs[i] of lhs[i]: one dispatch checks them all against numpy.
APPLY = r"""
#include <math.h>
static float apply(int k, float x) {
  switch (k) {
    case 0: return expf(x);
    case 1: return sqrtf(fabsf(x));
    case 2: return tanhf(x);
    case 3: return logf(fabsf(x));
    case 4: return powf(fabsf(x), 1.7f);
    case 5: return fabsf(x);
    case 6: return fmaxf(x, 0.5f);
    case 7: return erff(x);
    case 8: return sinf(x);
    case 9: return cosf(x);
    case 10: return atan2f(x, 0.3f);
    case 11: return expm1f(x);
    case 12: return log1pf(fabsf(x));
    case 13: return floorf(x);
    case 14: return rintf(x);
    case 15: return (float)exp((double)x);
    default: return NAN;
  }
}
"""
XS = np.array([-2.75, -1.3, -0.5, -0.11, 0.07, 0.25, 0.5, 0.9, 1.1, 1.9, 2.5, 2.95, 3.3, -3.1, 0.6931, 1.4], np.float32)
REFERENCE = [
    np.exp, lambda x: np.sqrt(np.abs(x)), np.tanh, lambda x: np.log(np.abs(x)), lambda x: np.abs(x) ** np.float64(np.float32(1.7)),
    np.abs, lambda x: np.maximum(x, 0.5), None, np.sin, np.cos, lambda x: np.arctan2(x, np.float64(np.float32(0.3))), np.expm1,
    lambda x: np.log1p(np.abs(x)), np.floor, np.rint, np.exp,
]  # fmt: skip

PLUGIN = (
    r"""
#include "iree/hal/local/executable_plugin.h"
"""
    + APPLY
    + r"""
typedef struct {
  const float* lhs; size_t lhs_offset; const float* rhs; size_t rhs_offset; float* out; size_t out_offset;
  size_t count; size_t workgroup; uint32_t processor_id; const uint64_t* processor_data;
} args_t;

static int math_workgroup(void* params, void* context, void* reserved) {
  (void)context; (void)reserved;
  const args_t* a = (const args_t*)params;
  for (size_t i = 0; i < a->count; ++i)
    a->out[a->out_offset + i] = apply((int)a->rhs[a->rhs_offset + i], a->lhs[a->lhs_offset + i]);
  return 0;
}
static iree_hal_executable_plugin_status_t load(const iree_hal_executable_plugin_environment_v0_t* e, size_t n,
    const iree_hal_executable_plugin_string_pair_t* p, void** self) { (void)e; (void)n; (void)p; *self = NULL; return iree_hal_executable_plugin_ok_status(); }
static void unload(void* self) { (void)self; }
static iree_hal_executable_plugin_status_t resolve(void* self, const iree_hal_executable_plugin_resolve_params_v0_t* params,
    iree_hal_executable_plugin_resolution_t* out) {
  (void)self; *out = 0;
  for (size_t i = 0; i < params->count; ++i) {
    if (iree_hal_executable_plugin_strcmp(params->symbol_names[i], "simple_mul_workgroup") != 0) continue;
    params->out_fn_ptrs[i] = (void*)math_workgroup; params->out_fn_contexts[i] = NULL;
  }
  return iree_hal_executable_plugin_ok_status();
}
IREE_HAL_EXECUTABLE_PLUGIN_EXPORT const iree_hal_executable_plugin_header_t**
iree_hal_executable_plugin_query(iree_hal_executable_plugin_version_t max_version, void* reserved) {
  (void)reserved;
  static const iree_hal_executable_plugin_header_t header = {
      .version = IREE_HAL_EXECUTABLE_PLUGIN_VERSION_LATEST, .name = "math", .description = "libm test",
      .features = IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_STANDALONE, .sanitizer = IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_NONE};
  static const iree_hal_executable_plugin_v0_t plugin = {.header = &header, .load = load, .unload = unload, .resolve = resolve};
  return max_version <= IREE_HAL_EXECUTABLE_PLUGIN_VERSION_LATEST ? (const iree_hal_executable_plugin_header_t**)&plugin : NULL;
}
"""
)

# Two objects per arch for one module, each carrying its copy of expf and powf: the
# library's weak symbols must let IREE's linker take both.
OBJECT_A = (
    APPLY
    + r"""
#include <stddef.h>
void simple_mul_workgroup(const float* lhs, size_t lhs_offset, const float* rhs, size_t rhs_offset,
                          float* out, size_t out_offset, size_t count, size_t workgroup) {
  (void)workgroup;
  for (size_t i = 0; i < count; ++i) out[out_offset + i] = apply((int)rhs[rhs_offset + i], lhs[lhs_offset + i]);
}
"""
)
OBJECT_B = r"""
#include <math.h>
#include <stddef.h>
void simple_mul_inplace_workgroup(const float* factor, size_t factor_offset, float* inout, size_t inout_offset,
                                  size_t count, size_t workgroup) {
  (void)workgroup;
  for (size_t i = 0; i < count; ++i) inout[inout_offset + i] *= powf(expf(factor[factor_offset + i]), 0.5f);
}
"""


def inputs() -> tuple[np.ndarray, np.ndarray]:
    lhs = np.tile(XS, len(REFERENCE))
    rhs = np.repeat(np.arange(len(REFERENCE), dtype=np.float32), len(XS))
    return lhs, rhs


def check_numbers(got: np.ndarray) -> None:
    """Each function against numpy in double precision, within 1e-6 relative (~8 float ulps)."""
    import math

    got = got.reshape(len(REFERENCE), len(XS))
    x64 = XS.astype(np.float64)
    for k, ref in enumerate(REFERENCE):
        want = np.array([math.erf(v) for v in x64]) if ref is None else ref(x64)
        np.testing.assert_allclose(got[k], want, rtol=1e-6, atol=0, err_msg=f"function {k}")


def defined(obj: Path) -> dict[str, str]:
    """The global and weak symbols an object defines, whatever their visibility, and their binding."""
    from elftools.elf.elffile import ELFFile

    with open(obj, "rb") as f:
        return {
            s.name: s["st_info"]["bind"] for s in ELFFile(f).get_section_by_name(".symtab").iter_symbols()
            if s.name and s["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK") and s["st_shndx"] != "SHN_UNDEF"
        }  # fmt: skip


def program(text: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        assert old in text, old  # the sample changed: update this test's edits
        text = text.replace(old, new)
    return text


def loader_safe(elf_bytes: bytes, arch: str) -> None:
    """What IREE's embedded ELF loader accepts (IREE_FACTS.md 1.13): no undefined symbol, no
    thread-local data, only the relocations it applies."""
    from elftools.elf.elffile import ELFFile

    # By number (pyelftools does not name RISC-V's): x86_64 64, GLOB_DAT, JUMP_SLOT, RELATIVE;
    # aarch64 ABS64, GLOB_DAT, JUMP_SLOT, RELATIVE; riscv 64, RELATIVE, JUMP_SLOT.
    accepted = {"x86_64": {1, 6, 7, 8}, "aarch64": {257, 1025, 1026, 1027}, "riscv64": {2, 3, 5}}[arch]
    elf = ELFFile(io.BytesIO(elf_bytes))
    symbols = [s for sec in elf.iter_sections() if sec["sh_type"] in ("SHT_SYMTAB", "SHT_DYNSYM") for s in sec.iter_symbols()]
    assert [s.name for s in symbols if s.name and s["st_shndx"] == "SHN_UNDEF"] == []
    assert "PT_TLS" not in [seg["p_type"] for seg in elf.iter_segments()]
    relocations = [r for sec in elf.iter_sections() if sec["sh_type"] in ("SHT_RELA", "SHT_REL") for r in sec.iter_relocations()]
    kinds = {r["r_info_type"] for r in relocations}
    assert kinds <= accepted, kinds


@pytest.fixture(scope="module")
def math_plugin(tmp_path_factory) -> Path:
    from conftest import run_cli

    d = tmp_path_factory.mktemp("math_plugin")
    (d / "math_plugin.c").write_text(PLUGIN)
    result = run_cli("plugin", "--kind", "standalone", *(a for arch in ARCHES for a in ("--arch", arch)), d / "math_plugin.c", "-o", d / "math.sos")
    assert result.returncode == 0, result
    assert "links pyree_build's freestanding math library" in result.stderr
    return d / "math.sos"


def test_every_arch_of_the_fatelf_is_loader_safe(math_plugin):
    data = math_plugin.read_bytes()
    records = fatelf.read(math_plugin)
    assert sorted(r.arch for r in records) == sorted(ARCHES)
    for r in records:
        loader_safe(data[r.offset : r.offset + r.size], r.arch)
        info = elfcheck.read_elf(math_plugin, data=data[r.offset : r.offset + r.size])
        assert info.defined_exports == {elfcheck.QUERY_EXPORT}  # the library adds no export


def test_standalone_plugin_math_matches_numpy(cli, math_plugin, tmp_path):
    import pyree_build as pb

    mlir = tmp_path / "math.mlir"
    mlir.write_text(program(
        (PLUGIN_SAMPLE / "example.mlir").read_text(),
        {"%sum = arith.addf %product, %b : tensor<?xf32>\n    return %sum": "return %product"},
    ))  # fmt: skip
    assert cli("compile", mlir, "-o", tmp_path / "math.vmfb").returncode == 0
    (got,) = pb.run(tmp_path / "math.vmfb", "mixed_invocation", list(inputs()), plugins=[math_plugin], in_process=False)
    check_numbers(got)


def test_embedded_objects_carry_their_math_and_match_numpy(cli, tmp_path):
    import pyree_build as pb

    objs = tmp_path / "objects"
    for name, text in (("math_a", OBJECT_A), ("math_b", OBJECT_B)):
        (tmp_path / f"{name}.c").write_text(text)
        result = cli("objects", tmp_path / f"{name}.c", *(a for arch in ARCHES for a in ("--arch", arch)), "-o", objs)
        assert result.returncode == 0, result
    for arch in ARCHES:
        info = elfcheck.read_elf(objs / f"math_a_{arch}.o")
        assert info.undefined == ()  # the object carries expf & co: IREE links no library
        assert "tanhf" in defined(objs / f"math_a_{arch}.o")
        assert "tanhf" not in defined(objs / f"math_b_{arch}.o")  # only what is called
    edits = {"return %result": "return %product"}
    for arch in ARCHES:
        edits[f'[#hal.executable.object<{{path = "functions_{arch}.o"}}>]'] = (
            f'[#hal.executable.object<{{path = "math_a_{arch}.o"}}>, #hal.executable.object<{{path = "math_b_{arch}.o"}}>]'
        )
    mlir = tmp_path / "math.mlir"
    mlir.write_text(program((EMBEDDED / "example.mlir").read_text(), edits))
    # Compiled for all three arches: iree-lld links each arch's two objects, duplicates and all.
    result = cli("compile", mlir, "--object-search-path", objs, "-o", tmp_path / "math.vmfb")
    assert result.returncode == 0, result
    (got,) = pb.run(tmp_path / "math.vmfb", "mixed_invocation", list(inputs()), in_process=False)
    check_numbers(got)


def test_only_what_is_called_is_linked_and_the_library_is_built_once(cli, math_plugin, tmp_path):
    sizes = {}
    for name, text in (("math", PLUGIN), ("none", (PLUGIN_SAMPLE / "standalone_plugin.c").read_text())):
        (tmp_path / f"{name}.c").write_text(text)
        result = cli("plugin", "--kind", "standalone", "--arch", "x86_64", tmp_path / f"{name}.c", "-o", tmp_path / f"{name}.so")
        assert result.returncode == 0, result
        assert ("freestanding math library" in result.stderr) == (name == "math")
        if name == "math":  # math_plugin built the x86_64 library for this test session
            assert "math library: cache hit" in result.stderr, result
        sizes[name] = (tmp_path / f"{name}.so").stat().st_size
    # Sixteen functions cost tens of KiB, not the whole library (hundreds of KiB).
    assert sizes["math"] - sizes["none"] < 64 * 1024, sizes


def test_other_libc_headers_keep_their_hint(cli, tmp_path):
    src = tmp_path / "stdio.c"
    src.write_text("#include <stdio.h>\n#include <math.h>\nfloat f(float x) { return expf(x); }\n")
    result = cli("objects", src, "--arch", "x86_64", "-o", tmp_path / "out")
    assert_clean_error(result, "'stdio.h' file not found", "<stdio.h> is part of libc", "<math.h>")


def test_a_function_of_the_users_own_wins(cli, tmp_path):
    src = tmp_path / "own.c"
    src.write_text("#include <math.h>\nfloat expf(float x) { return x + 1.0f; }\nfloat g(float x) { return expf(x) * tanhf(x); }\n")
    result = cli("objects", src, "--arch", "x86_64", "-o", tmp_path / "out")
    assert result.returncode == 0, result
    obj = tmp_path / "out" / "own_x86_64.o"
    assert defined(obj)["expf"] == "STB_GLOBAL"  # the user's, not the library's weak one
    assert "tanhf" in defined(obj)


def test_cache_clear_removes_the_libraries(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("PYREE_BUILD_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "k.c"
    src.write_text("#include <math.h>\nfloat k(float x) { return tanhf(x); }\n")
    assert cli("objects", src, "--arch", "riscv64", "-o", tmp_path / "out").returncode == 0
    (kept,) = (tmp_path / "cache" / "libm").glob("*/libpyree_m_riscv64.a")
    assert cli("cache", "clear").returncode == 0
    assert not kept.exists() and not (tmp_path / "cache" / "libm").exists()
    assert (tmp_path / "out" / "k_riscv64.o").is_file()


def test_functions_with_an_instruction_need_no_library(cli, tmp_path):
    """sqrtf, fabsf, fminf, fmaxf, copysignf are compiler builtins in <math.h>: one instruction
    on every arch (no errno to set), so the loop stays a loop the compiler may vectorize."""
    src = tmp_path / "inline.c"
    src.write_text(
        "#include <math.h>\n#include <stddef.h>\n"
        "void k(float* restrict o, const float* restrict x, size_t n) {\n"
        "  for (size_t i = 0; i < n; ++i) o[i] = copysignf(sqrtf(fabsf(x[i])), fminf(fmaxf(x[i], -1.f), 1.f));\n}\n"
    )
    result = cli("objects", src, *(a for arch in ARCHES for a in ("--arch", arch)), "-o", tmp_path / "out")
    assert result.returncode == 0, result
    assert "math library" not in result.stderr
    for arch in ARCHES:
        assert set(defined(tmp_path / "out" / f"inline_{arch}.o")) == {"k"}
