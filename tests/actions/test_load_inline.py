"""pb.load_inline: a program and its kernel from strings, built (cached) and called like a
function. Real builds and runs: zig, iree-compile, the IREE runtime, NVRTC, glslang."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLES
from hypothesis import given, settings
from hypothesis import strategies as st

import pyree_build as pb
from pyree_build.actions import inline as inline_action
from pyree_build.backends.cuda import target as cuda_target
from pyree_build.backends.vulkan import devices as vulkan
from pyree_build.core import args as pb_args
from pyree_build.core import echo, toolchain

# A dispatch that calls the import `scale_workgroup` on each 64-element tile, then adds b.
PROGRAM = textwrap.dedent("""\
    module @inline_test {
      stream.executable private @by_import {
        stream.executable.export public @entry workgroups(%n: index) -> (index, index, index) {
          %groups = affine.apply affine_map<()[s0] -> (s0 ceildiv 64)>()[%n]
          %one = arith.constant 1 : index
          stream.return %groups, %one, %one : index, index, index
        }
        builtin.module {
          func.func private @scale_workgroup(memref<f32>, index, memref<f32>, index, memref<f32>, index, index)
              attributes {llvm.bareptr = true}
          func.func @entry(%a_binding: !stream.binding, %b_binding: !stream.binding, %out_binding: !stream.binding, %n: index) {
            %c0 = arith.constant 0 : index
            %workgroup = stream.dispatch.workgroup.id[0] : index
            %begin = affine.apply affine_map<()[s0] -> (s0 * 64)>()[%workgroup]
            %count = affine.min affine_map<()[s0, s1] -> (64, s1 - s0)>()[%begin, %n]
            %a = stream.binding.subspan %a_binding[%c0] : !stream.binding -> memref<?xf32>{%n}
            %b = stream.binding.subspan %b_binding[%c0] : !stream.binding -> memref<?xf32>{%n}
            %out = stream.binding.subspan %out_binding[%c0] : !stream.binding -> memref<?xf32>{%n}
            %a_base, %a_offset, %a_size, %a_stride = iree_codegen.extract_strided_metadata %a : memref<?xf32> -> memref<f32>, index, index, index
            %b_base, %b_offset, %b_size, %b_stride = iree_codegen.extract_strided_metadata %b : memref<?xf32> -> memref<f32>, index, index, index
            %o_base, %o_offset, %o_size, %o_stride = iree_codegen.extract_strided_metadata %out : memref<?xf32> -> memref<f32>, index, index, index
            %a_at = arith.addi %a_offset, %begin : index
            %b_at = arith.addi %b_offset, %begin : index
            %o_at = arith.addi %o_offset, %begin : index
            func.call @scale_workgroup(%a_base, %a_at, %b_base, %b_at, %o_base, %o_at, %count)
                : (memref<f32>, index, memref<f32>, index, memref<f32>, index, index) -> ()
            return
          }
        }
      }
      func.func @f(%a: tensor<?xf32>, %b: tensor<?xf32>) -> tensor<?xf32> {
        %c0 = arith.constant 0 : index
        %n = tensor.dim %a, %c0 : tensor<?xf32>
        %r = flow.dispatch @by_import::@entry[%n](%a, %b, %n) : (tensor<?xf32>{%n}, tensor<?xf32>{%n}, index) -> tensor<?xf32>{%n}
        %sum = arith.addf %r, %b : tensor<?xf32>
        return %sum : tensor<?xf32>
      }
    }
""")


def kernel_c(factor: int) -> str:
    """The import only: out = a * b * factor. No plugin entry, no header."""
    return textwrap.dedent(f"""\
        #include <stddef.h>
        typedef struct {{
          const float* a; size_t a_offset;
          const float* b; size_t b_offset;
          float* out; size_t out_offset;
          size_t count;
        }} args_t;

        int scale_workgroup(void* params, void* context, void* reserved) {{
          const args_t* p = (const args_t*)params;
          for (size_t i = 0; i < p->count; ++i)
            p->out[p->out_offset + i] = p->a[p->a_offset + i] * p->b[p->b_offset + i] * {factor};
          return 0;
        }}
        """)


A = np.arange(1, 101, dtype=np.float32)  # two tiles: the second one partial
B = np.full(100, 2, np.float32)


@pytest.mark.parametrize("kind", ["system", "standalone"])
def test_a_kernel_from_strings_is_a_function_of_arrays(kind):
    kernel = pb.load_inline(mlir=PROGRAM, c_source=kernel_c(3), function="f", kind=kind)
    result = kernel(A, B)
    assert isinstance(result, np.ndarray) and result.dtype == np.float32
    np.testing.assert_array_equal(result, A * B * 3 + B)
    assert kernel.plugins and kernel.plugins[0].suffix == {"system": ".so", "standalone": ".sos"}[kind]


def test_embedded_objects_from_strings_are_linked_into_the_module(tmp_path):
    """kind='embedded': the C becomes one object per arch the program names (STEM_ARCH.o, the
    arch spelled as the MLIR spells it: arm_64), linked into the module; no plugin is loaded."""
    directory = SAMPLES / "custom_dispatch" / "cpu" / "embedded"
    mlir = (directory / "example.mlir").read_text()
    kernel = pb.load_inline(mlir=mlir, files={"functions.c": (directory / "functions.c").read_text()}, function="mixed_invocation",
                            kind="embedded", build_dir=tmp_path)  # fmt: skip
    assert not kernel.plugins
    assert sorted(p.name for p in kernel.module.parent.glob("*.o")) == ["functions_aarch64.o", "functions_riscv64.o", "functions_x86_64.o"]
    np.testing.assert_array_equal(kernel(np.full(8, 2, np.float32), np.full(8, 4, np.float32)), np.full(8, 96, np.float32))

    with pytest.raises(pb.PyreeError) as caught:
        pb.load_inline(mlir=mlir, c_source=(directory / "functions.c").read_text(), function="mixed_invocation", kind="embedded")
    assert "names no object of kernel.c (kernel_ARCH.o)" in caught.value.what


def test_the_same_strings_find_the_same_build_and_rebuild_nothing(capfd, monkeypatch):
    monkeypatch.setattr(echo, "VERBOSITY", 1)  # the step lines, whatever an earlier test left set
    first = pb.load_inline(mlir=PROGRAM, c_source=kernel_c(5), function="f")
    built = {p: p.read_bytes() for p in (first.module, *first.plugins)}
    capfd.readouterr()
    again = pb.load_inline(mlir=PROGRAM, c_source=kernel_c(5), function="f")
    log = capfd.readouterr().err
    assert again.module == first.module and again.plugins == first.plugins
    assert {p: p.read_bytes() for p in (again.module, *again.plugins)} == built
    assert "compile: cache hit (kernel.vmfb)" in log and "plugin: cache hit (kernel.so)" in log, log
    assert "zig cc" not in log and "iree-compile program.mlir" not in log, log


def test_an_edited_kernel_in_the_same_process_gives_the_new_numbers():
    # The notebook loop: IREE's runtime cannot unload the first plugin, so the edit must
    # still be what runs (never the old code's answer).
    code = textwrap.dedent(f"""\
        import sys
        import numpy as np
        import pyree_build as pb
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]  # this file, and conftest
        from test_load_inline import PROGRAM, kernel_c
        a, b = np.full(8, 2, np.float32), np.full(8, 4, np.float32)
        for factor in (1, 7, 1):
            print(pb.load_inline(mlir=PROGRAM, c_source=kernel_c(factor), function="f")(a, b)[0])
        """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["12.0", "60.0", "12.0"]


def test_c_with_its_own_plugin_entry_is_built_as_it_is():
    sample = SAMPLES / "custom_dispatch" / "cpu" / "plugin"
    kernel = pb.load_inline(mlir=(sample / "example.mlir").read_text(), c_source=(sample / "system_plugin.c").read_text(), function="mixed_invocation")
    np.testing.assert_array_equal(kernel(np.full(8, 2, np.float32), np.full(8, 4, np.float32)), np.full(8, 12, np.float32))


def test_a_c_error_names_the_line_of_the_string():
    broken = kernel_c(3).replace("++i)", "++i")
    line = next(n for n, text in enumerate(broken.splitlines(), 1) if "++i" in text) + 1
    with pytest.raises(pb.PyreeError) as caught:
        pb.load_inline(mlir=PROGRAM, c_source=broken, function="f")
    assert caught.value.what.startswith(f"c_source line {line}: ")
    assert "/inline/" not in caught.value.render().split("command:")[0]  # no cache path before the command


def test_an_mlir_error_names_the_line_of_the_string():
    broken = PROGRAM.replace("%sum = arith.addf", "%sum = arith.bogus")
    line = next(n for n, text in enumerate(broken.splitlines(), 1) if "arith.bogus" in text)
    with pytest.raises(pb.PyreeError) as caught:
        pb.load_inline(mlir=broken, c_source=kernel_c(3), function="f")
    assert caught.value.what.startswith(f"mlir line {line}: ")
    assert "arith.bogus" in caught.value.render()


def test_c_without_the_import_the_program_calls_says_which():
    with pytest.raises(pb.PyreeError, match="no function 'scale_workgroup', which the program calls"):
        pb.load_inline(mlir=PROGRAM, c_source=kernel_c(3).replace("scale_workgroup", "scale"), function="f")


def test_c_for_a_program_that_calls_no_import_is_refused():
    no_import = "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %a : tensor<4xf32>\n}\n"
    with pytest.raises(pb.PyreeError, match="the program calls no import, so there is nothing for the C source to provide"):
        pb.load_inline(mlir=no_import, c_source=kernel_c(3), function="f")


def test_a_build_dir_holding_the_users_files_is_refused_and_left_as_it_was(tmp_path):
    mine = tmp_path / "program.mlir"
    mine.write_text("my own program")
    with pytest.raises(pb.PyreeError, match="build_dir is not empty and was not made by pb.load_inline"):
        pb.load_inline(mlir=PROGRAM, c_source=kernel_c(3), function="f", build_dir=tmp_path)
    assert mine.read_text() == "my own program" and sorted(p.name for p in tmp_path.iterdir()) == ["program.mlir"]
    fresh = tmp_path / "fresh"
    np.testing.assert_array_equal(pb.load_inline(mlir=PROGRAM, c_source=kernel_c(3), function="f", build_dir=fresh)(A, B), A * B * 3 + B)
    again = pb.load_inline(mlir=PROGRAM, c_source=kernel_c(4), function="f", build_dir=fresh)  # its own directory: reused
    np.testing.assert_array_equal(again(A, B), A * B * 4 + B)


def test_a_build_dir_shared_by_two_kernels_keeps_each_ones_code(tmp_path):
    """issue 35 item 6: the second load_inline into one build_dir rewrote the first's module and
    plugin, so the first kernel ran the second's code (10, not 12), in this process and another."""
    first = pb.load_inline(mlir=PROGRAM, c_source=kernel_c(2), function="f", build_dir=tmp_path / "bd")
    second = pb.load_inline(mlir=PROGRAM, c_source=kernel_c(5), function="f", build_dir=tmp_path / "bd")
    np.testing.assert_array_equal(first(A, B), A * B * 2 + B)
    np.testing.assert_array_equal(second(A, B), A * B * 5 + B)
    code = (
        "import sys, numpy as np, pyree_build as pb; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/..']; from test_load_inline import PROGRAM, kernel_c, A, B; "
        "pb.load_inline(mlir=PROGRAM, c_source=kernel_c(7), function='f', build_dir=sys.argv[2])"
    )
    other = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(tmp_path / "bd")], capture_output=True, text=True, timeout=600)
    assert other.returncode == 0, other.stderr
    np.testing.assert_array_equal(first(A, B), A * B * 2 + B)
    assert first.module != second.module and first.module.read_bytes() != second.module.read_bytes()


def test_a_new_cache_directory_is_marked_before_inline_builds_go_into_it(tmp_path, monkeypatch, capfd):
    # Writing inline/ into an unmarked cache made the cache refuse it as someone else's.
    monkeypatch.setenv("PYREE_BUILD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(echo, "VERBOSITY", 1)
    pb.load_inline(mlir=PROGRAM, c_source=kernel_c(9), function="f")
    log = capfd.readouterr().err
    assert "not caching" not in log, log
    assert (tmp_path / "cache" / "CACHEDIR.TAG").is_file() and any((tmp_path / "cache" / "inline").iterdir())


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"files": {"k.xyz": ""}}, "no target builds kernel sources named 'k.xyz'"),
        ({"files": {"a.cu": "", "b.c": ""}}, "kernels for more than one target"),
        ({"files": {"../a.c": ""}}, "files must map file names"),
        ({"files": {"a.glsl": ""}, "target": "cuda", "c_source": None}, "'a.glsl' is a kernel for vulkan, not for target 'cuda'"),
        ({"c_source": 3}, "c_source must be a non-empty string"),
        ({"kind": "shared"}, "unknown plugin kind 'shared'"),
        ({"files": {"kernel.c": "int x;"}}, "c_source and files\\['kernel.c'\\] would be the same file"),
        ({"files": {"a\0b.c": ""}, "c_source": None}, "files must map file names"),
        ({"name": "../../../x/victim"}, "name must be a plain file name"),
        ({"name": ".."}, "name must be a plain file name"),
        ({"name": "a\0b"}, "name must be a plain file name"),
    ],
)
def test_bad_arguments_are_named(arguments, message):
    keywords = {"mlir": PROGRAM, "function": "f", "c_source": kernel_c(1), **arguments}
    with pytest.raises(pb.PyreeError, match=message):
        pb.load_inline(**keywords)


def test_a_name_with_a_directory_part_writes_nothing_outside_the_build_dir(tmp_path):
    build = tmp_path / "a" / "b" / "build"
    victim = tmp_path / "victim.c"
    victim.write_text("mine")
    for call in (pb.load_inline, inline_action.load_inline):  # the action checks too: it joins the names
        with pytest.raises(pb.PyreeError, match="plain file name"):
            call(mlir=PROGRAM, function="f", c_source=kernel_c(1), name="../../../victim", build_dir=build)
    assert victim.read_text() == "mine" and not build.exists()


@given(st.text(min_size=1, max_size=12, alphabet=st.sampled_from("ab./\\\0 $:#\n")))
@settings(max_examples=300, deadline=None)
def test_a_file_name_is_accepted_only_when_joining_it_stays_in_the_directory(name):
    base = Path("/some/dir")
    if pb_args.is_file_name(name):
        assert (base / name).parent == base and os.path.normpath(base / name) == str(base / name)
    else:
        with pytest.raises(pb.PyreeError, match="plain file name"):
            pb_args.file_name(name, "name")


needs_vulkan = pytest.mark.skipif(not vulkan.status()[0], reason=vulkan.status()[1])


@needs_vulkan
def test_glsl_shaders_from_strings_run_on_vulkan():
    shaders = SAMPLES / "custom_dispatch" / "vulkan" / "shaders"
    files = {name: (shaders / name).read_text() for name in ("simple_mul.glsl", "simple_mul_inplace.glsl")}
    kernel = pb.load_inline(mlir=(shaders / "example.mlir").read_text(), files=files, function="mixed_invocation")
    assert kernel.device == "vulkan"
    np.testing.assert_array_equal(kernel(np.full(8, 2, np.float32), np.full(8, 4, np.float32)), np.full(8, 96, np.float32))  # (2*4) * (2*4 + 4)


def test_cuda_kernels_from_strings_build_a_ptx_per_sm_the_program_names(tmp_path):
    try:
        toolchain.nvrtc()
    except pb.PyreeError as exc:
        pytest.skip(f"NVRTC is not usable here: {exc.what}")
    sample = SAMPLES / "custom_dispatch" / "cuda" / "kernels"
    usable, reason = cuda_target.cuda_status()
    arguments = {"mlir": (sample / "example.mlir").read_text(), "files": {"kernels.cu": (sample / "kernels.cu").read_text()}, "function": "mixed_invocation"}
    if not usable:  # built, then refused at load with the reason: no GPU to run on
        with pytest.raises(pb.PyreeError, match="cuda"):
            pb.load_inline(**arguments, build_dir=tmp_path)
        assert sorted(p.name for p in tmp_path.glob("*/*.ptx")) == ["kernels_sm_75.ptx", "kernels_sm_80.ptx"]
        assert len(list(tmp_path.glob("*/kernel.vmfb"))) == 1
        pytest.skip(f"built; no CUDA GPU to run it on: {reason}")
    kernel = pb.load_inline(**arguments, build_dir=tmp_path)
    np.testing.assert_array_equal(kernel(np.full(8, 2, np.float32), np.full(8, 4, np.float32)), np.full(8, 96, np.float32))


def test_hip_kernels_named_cu_build_a_code_object_for_the_gfx_asked(tmp_path):
    sample = SAMPLES / "custom_dispatch" / "hip" / "kernels"
    arguments = {"mlir": (sample / "example.mlir").read_text(), "files": {"kernels.cu": (sample / "kernels.cu").read_text()}, "function": "mixed_invocation"}
    try:
        kernel = pb.load_inline(**arguments, target="hip", target_options={"gfx": 1100}, build_dir=tmp_path)
    except pb.PyreeError as exc:  # no AMD GPU here: built, then refused at load with the reason
        assert "device hip is not usable" in exc.what, exc.render()
        assert len(list(tmp_path.glob("*/gfx1100/kernels.co"))) == 1 and len(list(tmp_path.glob("*/kernel.vmfb"))) == 1
        pytest.skip(f"built; no AMD GPU to run it on: {exc.what}")
    np.testing.assert_array_equal(kernel(np.full(8, 2, np.float32), np.full(8, 4, np.float32)), np.full(8, 96, np.float32))


def _nvrtc_usable() -> bool:
    try:
        toolchain.nvrtc()
    except pb.PyreeError:
        return False
    return True


@pytest.mark.parametrize(
    ("sample", "kernel", "broken", "target"),
    [
        pytest.param(
            "cuda/kernels", "kernels.cu", ("blockIdx.x", "blockIdx.q"), None, marks=pytest.mark.skipif(not _nvrtc_usable(), reason="NVRTC is not usable here")
        ),
        ("vulkan/shaders", "simple_mul.glsl", ("uint i =", "uint i = q +"), None),
        ("hip/kernels", "kernels.cu", ("blockIdx.x", "blockIdx.q"), "hip"),
    ],
)
def test_each_compilers_error_names_the_line_of_the_string(tmp_path, sample, kernel, broken, target):
    directory = SAMPLES / "custom_dispatch" / sample
    sources = {p.name: p.read_text() for p in directory.iterdir() if p.suffix in (".cu", ".glsl")}
    sources[kernel] = sources[kernel].replace(*broken, 1)
    line = next(n for n, text in enumerate(sources[kernel].splitlines(), 1) if broken[1] in text)
    with pytest.raises(pb.PyreeError) as caught:
        pb.load_inline(mlir=(directory / "example.mlir").read_text(), files=sources, function="mixed_invocation", target=target, build_dir=tmp_path)
    assert caught.value.what.startswith(f"files['{kernel}'] line {line}: "), caught.value.render()
    assert "q" in caught.value.what
