"""Issue 45: weights are never parsed as text. `import` keeps a model's large weights out of the
MLIR by default (`OUT_params.irpa` beside it, scope `model`), `compile` imports every one of them
back into the module (so run, verify, bench, tune and ctest need no archive), the archive is an
input of the compile (an edited one rebuilds), and a missing or foreign archive is a clear error.
Real tools throughout: iree-import-onnx, iree-compile, the IREE runtime."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import assert_clean_error, run_cli

onnx = pytest.importorskip("onnx", reason='onnx is not installed (pip install "pyree_build[onnx]")')

import numpy as np  # noqa: E402
from support import onnx_models as models  # noqa: E402

import pyree_build as pb  # noqa: E402
from pyree_build.actions import parameters  # noqa: E402

# x[4,256] -> MatMul W[256,256] -> Add b[256] -> Relu: W (65536 elements, 256 KiB) and b (256)
# are both at least the importer's threshold (100 elements).
M, K, N = 4, 256, 256
X = np.random.default_rng(5).uniform(-1, 1, (M, K)).astype(np.float32)


def _model(tmp_path: Path, seed: int = 0, name: str = "dense") -> Path:
    assert K * N >= parameters.PARAM_ELEMENTS_THRESHOLD and N >= parameters.PARAM_ELEMENTS_THRESHOLD
    return Path(models.save(models.dense_layer(M, K, N, seed), tmp_path / f"{name}.onnx"))


def _run(vmfb: Path) -> np.ndarray:
    (result,) = pb.run(vmfb, "dense", [X])
    return result


def _stream_form(text: str) -> str:
    return text.replace("#flow.parameter.named<", "#stream.parameter.named<")


def test_large_weights_are_externalized_by_default_and_the_module_holds_them(tmp_path):
    onnx_file = _model(tmp_path)
    mlir, inline = tmp_path / "dense.mlir", tmp_path / "inline.mlir"
    assert run_cli("import", onnx_file, "-o", mlir).returncode == 0
    archive = tmp_path / "dense_params.irpa"
    text = mlir.read_text()
    assert archive.stat().st_size >= (K * N + N) * 4
    assert '#flow.parameter.named<"model"::"W">' in text and '#flow.parameter.named<"model"::"b">' in text
    assert "dense_resource" not in text and len(mlir.read_bytes()) < 4096, text  # no weight as text
    result = run_cli("import", onnx_file, "-o", inline, "--inline-params")
    assert result.returncode == 0, result
    assert not (tmp_path / "inline_params.irpa").exists() and "parameter.named" not in inline.read_text()
    assert len(inline.read_bytes()) > 2 * K * N * 4  # hex text: two characters a byte

    vmfb, inline_vmfb = tmp_path / "dense.vmfb", tmp_path / "inline.vmfb"
    assert run_cli("compile", mlir, "-o", vmfb).returncode == 0
    assert run_cli("compile", inline, "-o", inline_vmfb).returncode == 0
    assert b"io_parameters" not in vmfb.read_bytes()  # self-contained: loads no parameters at run time
    # The archive is not needed to run: the module alone, moved away from it, gives the inline import's numbers.
    alone = tmp_path / "elsewhere"
    alone.mkdir()
    shutil.move(vmfb, alone / "dense.vmfb")
    archive.unlink()
    got, want = _run(alone / "dense.vmfb"), _run(inline_vmfb)
    assert got.shape == (M, N) and np.array_equal(got, want)
    verified = run_cli("verify", alone / "dense.vmfb", "--onnx", onnx_file)
    assert verified.returncode == 0, verified


def test_the_python_api_and_the_old_flag_externalize_too(tmp_path):
    onnx_file = _model(tmp_path)
    out = pb.import_onnx(onnx_file, tmp_path / "py.mlir")
    assert "parameter.named" in out.read_text() and (tmp_path / "py_params.irpa").is_file()
    assert pb.compile(out, tmp_path / "py.vmfb").is_file()
    inline = pb.import_onnx(onnx_file, tmp_path / "in.mlir", externalize_params=False)
    assert "parameter.named" not in inline.read_text() and not (tmp_path / "in_params.irpa").exists()
    result = run_cli("import", onnx_file, "-o", tmp_path / "old.mlir", "--externalize-params")  # accepted: the default
    assert result.returncode == 0, result
    assert (tmp_path / "old_params.irpa").read_bytes() == (tmp_path / "py_params.irpa").read_bytes()


def test_an_edited_archive_rebuilds_the_module(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    for where, seed in ((first, 0), (second, 1)):
        assert run_cli("import", _model(where, seed), "-o", where / "dense.mlir").returncode == 0
    assert (first / "dense.mlir").read_text() == (second / "dense.mlir").read_text()  # same program: only the weights differ
    vmfb, other = tmp_path / "a.vmfb", tmp_path / "b.vmfb"
    depfile = tmp_path / "a.vmfb.d"
    assert run_cli("compile", first / "dense.mlir", "-o", vmfb, "--depfile", depfile).returncode == 0
    assert str(first / "dense_params.irpa") in depfile.read_text()  # listed: CMake rebuilds when it changes
    assert run_cli("compile", second / "dense.mlir", "-o", other).returncode == 0
    before = _run(vmfb)
    assert not np.array_equal(before, _run(other))
    shutil.copyfile(second / "dense_params.irpa", first / "dense_params.irpa")  # the program's weights edited
    assert run_cli("compile", first / "dense.mlir", "-o", vmfb).returncode == 0
    assert np.array_equal(_run(vmfb), _run(other))  # keyed by the archive's content: no stale hit


def test_a_program_without_its_archive_is_a_clear_error(tmp_path):
    onnx_file = _model(tmp_path)
    assert run_cli("import", onnx_file, "-o", tmp_path / "dense.mlir").returncode == 0
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(tmp_path / "dense.mlir", moved / "dense.mlir")
    result = run_cli("compile", moved / "dense.mlir", "-o", moved / "dense.vmfb")
    assert_clean_error(result, "dense.mlir: the program names 2 parameter(s) ('W', 'b')", "dense_params.irpa is not there",
                       str(moved / "dense_params.irpa"), "keep the two together", "--inline-params")  # fmt: skip
    assert not (moved / "dense.vmfb").exists()
    with pytest.raises(pb.PyreeError, match="dense_params.irpa is not there"):
        pb.compile(moved / "dense.mlir", moved / "dense.vmfb")
    (moved / "dense_params.irpa").mkdir()
    assert_clean_error(run_cli("compile", moved / "dense.mlir", "-o", moved / "dense.vmfb"), "dense_params.irpa is a directory, not a regular file")


def test_an_archive_of_another_program_is_named_and_nothing_is_written(tmp_path):
    assert run_cli("import", _model(tmp_path), "-o", tmp_path / "dense.mlir").returncode == 0
    assert run_cli("import", models.save(models.softmax(), tmp_path / "softmax.onnx"), "-o", tmp_path / "sm.mlir").returncode == 0
    shutil.copyfile(tmp_path / "sm_params.irpa", tmp_path / "dense_params.irpa")  # an archive with none of its keys
    result = run_cli("compile", tmp_path / "dense.mlir", "-o", tmp_path / "dense.vmfb")
    assert_clean_error(result, "the module still reads weights from a parameter archive at run time", "dense_params.irpa lacks 2 of them ('W', 'b')",
                       "import the model again")  # fmt: skip
    assert not (tmp_path / "dense.vmfb").exists()


def test_parameters_in_the_stream_form_are_refused_by_name(tmp_path):
    assert run_cli("import", _model(tmp_path), "-o", tmp_path / "dense.mlir").returncode == 0
    (tmp_path / "raw.mlir").write_text(_stream_form((tmp_path / "dense.mlir").read_text()))  # as iree-import-onnx writes it
    shutil.copyfile(tmp_path / "dense_params.irpa", tmp_path / "raw_params.irpa")
    result = run_cli("compile", tmp_path / "raw.mlir", "-o", tmp_path / "raw.vmfb")
    assert_clean_error(result, "raw.mlir: the program's globals name 2 parameter(s) ('W', 'b') as #stream.parameter.named",
                       "pyree-build import", "#flow.parameter.named")  # fmt: skip
    # The caller's own parameter flags are the caller's choice: nothing is added or refused.
    flags = ["--", f"--iree-parameter-import=model={tmp_path / 'raw_params.irpa'}"]
    assert run_cli("compile", tmp_path / "raw.mlir", "-o", tmp_path / "raw.vmfb", *flags).returncode == 0


def test_a_model_without_large_weights_names_no_parameters(tmp_path):
    mlir = tmp_path / "mar.mlir"
    assert run_cli("import", models.save(models.matmul_add_relu(), tmp_path / "mar.onnx"), "-o", mlir).returncode == 0  # 72 and 6 elements
    archive = tmp_path / "mar_params.irpa"
    assert archive.is_file() and "parameter.named" not in mlir.read_text()  # written (an import's outputs are fixed), empty
    archive.unlink()
    assert run_cli("compile", mlir, "-o", tmp_path / "mar.vmfb").returncode == 0  # the archive is not asked for


def test_named_parameters_are_read_from_the_text():
    text = 'util.global private @a = #flow.parameter.named<"model"::"W\\22x"> : tensor<4xf32>\n' \
           'util.global private @b = #stream.parameter.named<"b"> : tensor<4xf32>\n'  # fmt: skip
    assert parameters.named(text) == [parameters.Parameter("flow", "model", "W\\22x"), parameters.Parameter("stream", "", "b")]
    assert parameters.named("module {}") == []
    assert parameters.flow_form(text).count("#flow.parameter.named<") == 2


@pytest.mark.slow
def test_cmake_module_depends_on_the_imports_archive(tmp_path):
    from support.cmake_projects import build, configure, write_project

    src, out = tmp_path / "src", tmp_path / "build"
    src.mkdir()
    assert run_cli("import", _model(src), "-o", src / "byhand.mlir").returncode == 0  # a program given by path, its archive beside it
    write_project(src, "params_project", """
pyree_onnx_import(NAME dense_mlir SRC dense.onnx)
pyree_iree_module(NAME dense SRC dense_mlir TARGET llvm-cpu)
pyree_onnx_import(NAME inline_mlir SRC dense.onnx INLINE_PARAMS)
pyree_iree_module(NAME inline SRC inline_mlir TARGET llvm-cpu)
pyree_iree_module(NAME byhand SRC byhand.mlir TARGET llvm-cpu)
""", {})  # fmt: skip
    configure(src, out)
    ran = build(out)
    assert (out / "dense_mlir_params.irpa").is_file() and not (out / "inline_mlir_params.irpa").exists(), ran
    assert np.array_equal(_run(out / "dense.vmfb"), _run(out / "inline.vmfb"))
    other = tmp_path / "other"
    other.mkdir()
    assert run_cli("import", _model(other, seed=1), "-o", other / "dense.mlir").returncode == 0
    shutil.copyfile(other / "dense_params.irpa", out / "dense_mlir_params.irpa")  # the weights edited
    shutil.copyfile(other / "dense_params.irpa", src / "byhand_params.irpa")
    again = build(out)
    assert "dense.vmfb" in again and "byhand.vmfb" in again and "inline.vmfb" not in again and " import " not in again, again
    assert not np.array_equal(_run(out / "dense.vmfb"), _run(out / "inline.vmfb"))
    assert np.array_equal(_run(out / "dense.vmfb"), _run(out / "byhand.vmfb"))
