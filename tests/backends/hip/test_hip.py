"""HIP: .cu -> AMDGPU code object per gfx without ROCm (zig clang + iree-lld + the shipped
stand-in header), the gfx checks iree-compile does not make, hip modules, and the run
(skipped with the reason: no AMD GPU here)."""

from __future__ import annotations

import shutil

import pytest
from conftest import SAMPLES, assert_clean_error

from pyree_build.actions import compile as compile_action
from pyree_build.actions import run as run_action
from pyree_build.backends.hip import devices as hip_devices
from pyree_build.backends.hip import hsaco as hip
from pyree_build.core import toolchain
from pyree_build.core.errors import PyreeError

SAMPLE = SAMPLES / "custom_dispatch" / "hip" / "kernels"
KERNELS = SAMPLE / "kernels.cu"


@pytest.fixture(scope="module")
def hsaco_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("hsaco")
    hip.hsaco(KERNELS, [942, "gfx1100"], out)
    return out


def test_hsaco_writes_one_code_object_per_gfx_with_its_kernels(cli, tmp_path):
    result = cli("hsaco", KERNELS, "--gfx", "942", "--gfx", "gfx1100", "-o", tmp_path / "co", "--depfile", tmp_path / "co.d")
    assert result.returncode == 0, result
    for gfx in ("gfx942", "gfx1100"):
        obj = hip.check_code_object(tmp_path / "co" / gfx / "kernels.co", gfx)
        assert obj.gfx == gfx and obj.kernels == ("simple_mul", "simple_mul_inplace")
    deps = (tmp_path / "co.d").read_text()
    assert str(KERNELS) in deps and "hip_runtime.h" in deps and "iree-lld" in deps


def test_flat_layout_writes_the_names_iree_samples_reference_and_a_module_finds_them(cli, hsaco_dir, tmp_path):
    result = cli("hsaco", KERNELS, "--gfx", "942", "--gfx", "1100", "--layout", "flat", "-o", tmp_path / "flat")
    assert result.returncode == 0, result
    assert sorted(p.name for p in (tmp_path / "flat").iterdir()) == ["kernels_gfx1100.co", "kernels_gfx942.co"]
    for gfx in ("gfx942", "gfx1100"):  # the same objects as the per-gfx directories
        assert (tmp_path / "flat" / f"kernels_{gfx}.co").read_bytes() == (hsaco_dir / gfx / "kernels.co").read_bytes()
    program = tmp_path / "flat_example.mlir"
    program.write_text((SAMPLE / "example.mlir").read_text().replace('"kernels.co"', '"kernels_gfx1100.co"'))
    assert "kernels_gfx1100.co" in program.read_text()
    module = tmp_path / "flat.vmfb"
    compiled = cli("compile", program, "-o", module, "--target", "hip", "--gfx", "1100", "--object-search-path", tmp_path / "flat")
    assert compiled.returncode == 0, compiled
    assert {o.gfx for o in hip.embedded_code_objects(module)} == {"gfx1100"}
    assert_clean_error(cli("hsaco", KERNELS, "--gfx", "942", "--layout", "iree", "-o", tmp_path / "x"), "invalid choice: 'iree'")
    with pytest.raises(PyreeError, match="unknown layout 'iree'"):
        hip.hsaco(KERNELS, [942], tmp_path / "x", layout="iree")


def test_every_known_gfx_builds_to_the_machine_byte_in_the_table(tmp_path):
    outs = hip.hsaco(KERNELS, list(hip.GFX_MACH), tmp_path)
    for out in outs:
        gfx = out.parent.name
        assert hip.read_code_object(out.read_bytes()).mach == hip.GFX_MACH[gfx], gfx


def test_the_stand_in_header_ships_inside_the_package():
    header = toolchain.include_dir() / "hip" / "hip_runtime.h"
    assert header.is_file() and header in toolchain.package_files()


def test_hip_module_embeds_the_code_object_of_its_gfx(cli, hsaco_dir, tmp_path):
    for gfx in ("942", "1100"):
        module = tmp_path / f"m{gfx}.vmfb"
        result = cli("compile", SAMPLE / "example.mlir", "-o", module, "--target", "hip", "--gfx", gfx, "--object-search-path", hsaco_dir)
        assert result.returncode == 0, result
        listed = cli("code-objects", module, "--gfx", gfx)
        assert listed.returncode == 0, listed
        objects = hip.embedded_code_objects(module)
        assert {o.gfx for o in objects} == {f"gfx{gfx}"}
        assert any(o.kernels == ("simple_mul", "simple_mul_inplace") for o in objects)
    missing = cli("code-objects", tmp_path / "m942.vmfb", "--gfx", "1100")
    assert_clean_error(missing, "the module embeds no code object for gfx1100")


def test_a_code_object_for_another_gfx_is_refused_before_iree_compile_embeds_it(cli, hsaco_dir, tmp_path):
    shutil.copy(hsaco_dir / "gfx1100" / "kernels.co", tmp_path / "kernels.co")
    out = tmp_path / "m.vmfb"
    result = cli("compile", SAMPLE / "example.mlir", "-o", out, "--target", "hip", "--gfx", "942", "--object-search-path", tmp_path)
    assert_clean_error(result, "kernels.co: code object is for gfx1100, not gfx942", "--gfx 942")
    assert not out.exists()


def test_unknown_gfx_is_refused(cli, tmp_path):
    result = cli("hsaco", KERNELS, "--gfx", "9000", "-o", tmp_path)
    assert_clean_error(result, "'9000' is not a known AMD GPU (gfx) target", "942")
    result = cli("compile", SAMPLE / "example.mlir", "-o", tmp_path / "m.vmfb", "--target", "hip", "--gfx", "sm_80")
    assert_clean_error(result, "'sm_80' is not a known AMD GPU (gfx) target")


def test_hip_that_does_not_compile_names_file_and_line_and_writes_nothing(cli, tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('#include <hip/hip_runtime.h>\nextern "C" __global__ void k(float* a) {\n  a[0] = undefined_x;\n}\n')
    result = cli("hsaco", bad, "--gfx", "942", "--gfx", "1100", "-o", tmp_path / "co")
    assert_clean_error(result, "bad.cu: compiling bad.cu for gfx", "bad.cu:3:10: error: use of undeclared identifier 'undefined_x'")
    assert not list((tmp_path / "co").rglob("*.co")) if (tmp_path / "co").exists() else True


def test_an_undefined_device_function_is_named(cli, tmp_path):
    src = tmp_path / "ext.cu"
    src.write_text(
        '#include <hip/hip_runtime.h>\n__device__ float helper(float);\nextern "C" __global__ void k(float* a) { a[threadIdx.x] = helper(a[threadIdx.x]); }\n'
    )
    result = cli("hsaco", src, "--gfx", "942", "-o", tmp_path / "co")
    assert_clean_error(result, "linking the gfx942 code object with iree-lld failed", "nothing defines: helper(float)")


def test_hip_run_without_an_amd_gpu_is_skipped_with_the_reason(cli, hsaco_dir, tmp_path):
    usable, reason = hip_devices.hip_status()
    if usable:
        pytest.skip(f"an AMD GPU is usable here: {reason}")
    module = compile_action.compile(SAMPLE / "example.mlir", tmp_path / "m.vmfb", target="hip", gfx=942, object_search_paths=[hsaco_dir])
    result = cli("run", module, "--device", "hip", "--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4", "--skip-unavailable")
    assert result.returncode == run_action.SKIP_EXIT_CODE, result
    assert "skipped: no usable AMD GPU" in result.stderr


def test_a_key_with_a_target_configuration_is_explained(cli, hsaco_dir, tmp_path):
    """issue 26 item 6, hip half: `{target_arch = "gfx942"}` on an object key matches nothing
    in iree-compile 3.13; say why and which form matches every gfx."""
    bare = '#hal.executable.target<"rocm", "rocm-hsaco-fb">'
    text = (SAMPLE / "example.mlir").read_text()
    assert bare in text
    program = tmp_path / "configured.mlir"
    program.write_text(text.replace(bare, '#hal.executable.target<"rocm", "rocm-hsaco-fb", {target_arch = "gfx942"}>', 1))
    result = cli("compile", program, "--target", "hip", "--gfx", "942", "--object-search-path", hsaco_dir, "-o", tmp_path / "o.vmfb")
    assert_clean_error(result, 'keys its objects with a hip/rocm target that has a configuration ({target_arch = "gfx942"})', bare)
