"""Imports a module calls, read from its embedded ELFs, and which plugin resolves each (asked out of process)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import PLUGIN_SAMPLE, SAMPLES, assert_clean_error, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyree_build.backends.llvm_cpu import imports
from pyree_build.core.errors import PyreeError

MLP = SAMPLES / "custom_dispatch" / "cpu" / "mlp_plugin"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("imports")
    out = {
        "fallback_module": d / "fallback.vmfb",
        "fallback": d / "fallback.so",
        "override": d / "override.so",
        "standalone": d / "standalone.sos",
        "matmul_relu": d / "matmul_relu.so",
    }
    steps = [
        ("compile", PLUGIN_SAMPLE / "fallback_example.mlir", "-o", out["fallback_module"]),
        ("plugin", "--kind", "standalone", PLUGIN_SAMPLE / "fallback_plugin.c", "-o", out["fallback"]),
        ("plugin", "--kind", "standalone", PLUGIN_SAMPLE / "fallback_plugin.c", "-o", out["override"],
         "-D", 'PLUGIN_NAME="override"', "-D", "PROVIDE_ADD=0"),
        ("plugin", "--kind", "standalone", "--arch", "x86_64", "--arch", "aarch64", PLUGIN_SAMPLE / "standalone_plugin.c", "-o", out["standalone"]),
        ("plugin", "--kind", "system", MLP / "matmul_relu_plugin.c", "-o", out["matmul_relu"]),
    ]  # fmt: skip
    for step in steps:
        result = run_cli(*step)
        assert result.returncode == 0, result
    return out


def test_imports_are_read_from_the_embedded_executables(system_module, cli):
    found = imports.module_imports(system_module)
    assert [i.name for e in found for i in e.imports] == ["simple_mul_workgroup"]
    result = cli("imports", system_module)
    assert result.returncode == 0, result
    assert "simple_mul_workgroup" in result.stdout


def test_a_module_without_imports_lists_none(cli, tmp_path):
    out = tmp_path / "plain.vmfb"
    assert cli("compile", MLP / "mlp.mlir", "-o", out).returncode == 0
    assert all(not e.imports for e in imports.module_imports(out))
    assert "no imports" in cli("imports", out).stdout


def test_the_plugin_registered_last_is_asked_first(built, cli):
    module = built["fallback_module"]
    result = cli("imports", module, "--plugin", built["fallback"], "--plugin", built["override"])
    assert result.returncode == 0, result
    lines = result.stdout.splitlines()
    mul = next(line for line in lines if "simple_mul_workgroup" in line)
    add = next(line for line in lines if "simple_add_workgroup" in line)
    assert str(built["override"]) in mul and str(built["fallback"]) in add
    # Registered the other way round, fallback answers both.
    swapped = cli("imports", module, "--plugin", built["override"], "--plugin", built["fallback"]).stdout
    assert str(built["fallback"]) in next(line for line in swapped.splitlines() if "simple_mul_workgroup" in line)


def test_a_standalone_fatelf_plugin_is_asked_too(built, system_module):
    _, resolution = imports.check_resolved(system_module, [built["standalone"]])
    assert resolution.provider == {"simple_mul_workgroup": str(built["standalone"])}
    assert resolution.answers[0].name == "pyree_sample_standalone"


def test_an_import_no_plugin_resolves_is_an_error_naming_it(built, cli, system_module):
    result = cli("imports", system_module, "--plugin", built["matmul_relu"])
    assert_clean_error(result, "no plugin resolves import 'simple_mul_workgroup'", str(built["matmul_relu"]), "matmul_relu")


def test_run_checks_the_imports_before_running(built, cli, system_module):
    result = cli("run", system_module, "--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4", "--plugin", built["matmul_relu"])
    assert_clean_error(result, "'simple_mul_workgroup'", "plugins asked", str(built["matmul_relu"]))
    assert "EXEC" not in result.stdout


def _verdict(check, module: Path, plugins: list[Path]) -> str:
    try:
        check(module, plugins)
    except PyreeError as err:
        return err.what
    return "resolved"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["system", "fallback_module"]), st.lists(st.sampled_from(["fallback", "override", "standalone", "matmul_relu"]), max_size=3)), min_size=1, max_size=6))  # fmt: skip
def test_a_remembered_import_verdict_is_the_one_asked_again(built, system_module, tmp_path, monkeypatch, runs):
    """run's import check (require_resolved) remembers a clean verdict by the module's and the
    plugins' bytes in order: over any sequence of modules and plugin lists, in a cache it fills,
    its verdict is the one check_resolved gives when asked afresh, a missing import included."""
    monkeypatch.setenv("PYREE_BUILD_CACHE", str(tmp_path / "cache"))
    files = {**built, "system": system_module}
    for module, plugins in runs:
        paths = [files[p] for p in plugins]
        fresh = _verdict(lambda m, p: imports.check_resolved(m, p, ask_without_imports=False), files[module], paths)
        assert _verdict(imports.require_resolved, files[module], paths) == fresh, (module, plugins)


def test_a_clean_import_verdict_is_not_asked_again(built, system_module, tmp_path, monkeypatch):
    monkeypatch.setenv("PYREE_BUILD_CACHE", str(tmp_path / "cache"))
    imports.require_resolved(system_module, [built["standalone"]])
    real = imports.check_resolved
    monkeypatch.setattr(imports, "check_resolved", lambda *a, **k: pytest.fail("the verdict was asked again"))
    imports.require_resolved(system_module, [built["standalone"]])
    monkeypatch.setattr(imports, "check_resolved", real)
    with pytest.raises(PyreeError, match="no plugin resolves"):  # other bytes: asked (and refused) as before
        imports.require_resolved(system_module, [built["matmul_relu"]])


def test_expect_import_fails_the_compile_and_leaves_no_module(cli, tmp_path):
    out = tmp_path / "mlp.vmfb"
    result = cli("compile", MLP / "mlp.mlir", "-o", out, "--expect-import", "fused_matmul_relu")
    assert_clean_error(result, "does not call import 'fused_matmul_relu'", "matched nothing")
    assert not out.exists()
    result = cli("compile", MLP / "mlp.mlir", "-o", out, "--transform-spec", MLP / "matmul_relu_spec.mlir", "--expect-import", "fused_matmul_relu")
    assert result.returncode == 0, result
    assert out.is_file()


def test_memref_imports_without_bareptr_are_warned_about(cli, tmp_path):
    text = (PLUGIN_SAMPLE / "example.mlir").read_text()
    assert [i.name for i in imports.memref_imports_without_bareptr(text)] == []
    assert [i.name for i in imports.memref_imports_without_bareptr((SAMPLES / "custom_dispatch" / "cpu" / "embedded" / "example.mlir").read_text())] == []
    bare = tmp_path / "no_bareptr.mlir"
    bare.write_text(text.replace(",\n        llvm.bareptr = true", ""))
    assert [i.name for i in imports.memref_imports_without_bareptr(bare.read_text())] == ["simple_mul_workgroup"]
    result = cli("compile", bare, "-o", tmp_path / "m.vmfb", "-q")
    assert result.returncode == 0, result
    assert "import @simple_mul_workgroup takes memrefs but is not declared with `llvm.bareptr = true`" in result.stderr


DESCRIPTOR_IMPORT = """func.func private @scale_rows(%m: memref<?x?xf32>, %v: memref<f32>, %n: index) attributes {hal.import.static}
func.func private @bare_rows(%m: memref<?xf32>, %o: index) attributes {hal.import.static, llvm.bareptr = true}
"""


def test_descriptor_parameters_are_counted_per_rank_and_matched_to_c_beside_the_program(tmp_path):
    (found,) = imports.memref_imports_without_bareptr(DESCRIPTOR_IMPORT)
    assert (found.name, found.descriptor_params) == ("scale_rows", 7 + 3 + 1)  # rank 2: 3 + 2*2; rank 0: 3; index: 1
    c_text = (
        "/* scale_rows(a) is not this */ static void helper(void) {}\n"
        "void scale_rows(float *m, float *m_aligned, size_t m_offset, size_t m_size0, size_t m_size1,\n"
        "                size_t m_stride0, size_t m_stride1, // the 2-D descriptor\n"
        "                float *v, float *v_aligned, size_t v_offset, size_t n) { helper(); }\n"
    )
    assert imports.c_parameter_count(c_text, "scale_rows") == 11
    assert imports.c_parameter_count(c_text, "helper") == 0
    assert imports.c_parameter_count("int scale_rows(int a);", "scale_rows") is None  # a prototype defines nothing


@pytest.mark.parametrize(("c_params", "warned"), [
    ("const float *a, const float *a_aligned, size_t a_offset, size_t a_size, size_t a_stride, size_t n", False),
    ("const float *a, size_t a_offset, size_t n", True),
    (None, True),
], ids=["descriptor C", "pointer+offset C", "no C"])  # fmt: skip
def test_bareptr_warning_only_where_the_c_beside_the_spec_does_not_take_the_descriptors(cli, tmp_path, c_params, warned):
    """A spec whose import takes whole memref descriptors on purpose (as IREE's embedded transform
    sample does, its functions.c beside it) compiles without the warning; pointer + offset C, or
    no C to read, keeps it."""
    spec = tmp_path / "spec.mlir"
    spec.write_text(
        "module attributes {transform.with_named_sequence} {\n"
        "  func.func private @sum_all(%a: memref<?xf32>, %n: index) attributes {hal.import.static}\n"
        "  transform.named_sequence @__transform_main(%m: !transform.any_op) { transform.yield }\n}\n"
    )
    if c_params is not None:
        (tmp_path / "functions.c").write_text(f"#include <stddef.h>\nvoid sum_all({c_params}) {{}}\n")
    result = cli("compile", PLUGIN_SAMPLE / "example.mlir", "-o", tmp_path / "m.vmfb", "--transform-spec", spec, "-q")
    assert result.returncode == 0, result
    assert ("import @sum_all takes memrefs but is not declared with `llvm.bareptr = true`" in result.stderr) == warned, result.stderr


@pytest.mark.parametrize(("triple", "arch"), [("aarch64-unknown-linux-gnu", "arm_64"), ("riscv64-unknown-linux-gnu", "riscv_64")])
def test_imports_of_modules_for_other_arches_are_read_too(cli, tmp_path, triple, arch):
    out = tmp_path / "m.vmfb"
    result = cli("compile", PLUGIN_SAMPLE / "fallback_example.mlir", "-o", out, "--", f"--iree-llvmcpu-target-triple={triple}")
    assert result.returncode == 0, result
    (found,) = imports.module_imports(out)
    assert found.arch == arch
    assert sorted(i.name for i in found.imports) == ["simple_add_workgroup", "simple_mul_workgroup"]


def test_a_file_that_is_not_a_module_is_refused(cli, tmp_path, system_module):
    """issue 22 item 4: random bytes used to exit 0 with "no embedded CPU executables"."""
    noise = tmp_path / "noise.vmfb"
    noise.write_bytes(bytes(range(256)) * 16)
    assert_clean_error(cli("imports", noise), "not an IREE module")
    bare = tmp_path / "bare.vmfb"  # a FlatBuffer not wrapped in a zip is a module too
    source = tmp_path / "add.mlir"
    source.write_text("func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n  %0 = arith.addf %a, %a : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}\n")
    assert cli("compile", source, "-o", bare, "--", "--iree-vm-emit-polyglot-zip=false").returncode == 0
    assert not bare.read_bytes().startswith(b"PK")
    for module in (bare, system_module):
        assert cli("imports", module).returncode == 0
