"""Issue 33: the CMakeLists.txt `replace` writes imports the model itself (pyree_onnx_import,
from a path set at configure time), so the generated directory works copied anywhere; its
verify test runs with the unreplaced module as the baseline."""

from __future__ import annotations

import shutil

import pytest
from conftest import run_cli

pytest.importorskip("onnx", reason='onnx is not installed (pip install "pyree_build[onnx]")')
pytest.importorskip("onnxruntime", reason='onnxruntime is not installed (pip install "pyree_build[onnx]")')

from support import onnx_models as models  # noqa: E402


@pytest.mark.slow
def test_the_generated_directory_builds_and_verifies_where_it_is_copied(tmp_path):
    from support.cmake_projects import build, configure, ctest_run

    work = tmp_path / "work"
    work.mkdir()
    models.save(models.matmul_add_relu(), work / "model.onnx")
    assert run_cli("import", work / "model.onnx", "-o", work / "model.mlir").returncode == 0
    result = run_cli("replace", work / "model.mlir", "--ops", "1", "--import", "mar", "-o", work / "kernels", "--onnx", work / "model.onnx")
    assert result.returncode == 0, result
    text = (work / "kernels" / "CMakeLists.txt").read_text()
    assert "../" not in text and "pyree_onnx_import(NAME model_mlir" in text and "BASELINE model_unreplaced" in text
    # Copied elsewhere, with the model moved too: the configure-time path is all it needs.
    elsewhere, moved = tmp_path / "elsewhere" / "kernels", tmp_path / "models" / "renamed.onnx"
    shutil.copytree(work / "kernels", elsewhere)
    moved.parent.mkdir()
    shutil.move(work / "model.onnx", moved)
    shutil.rmtree(work)
    out = tmp_path / "build"
    configure(elsewhere, out, extra=[f"-Dmodel_ONNX={moved}"])
    build(out)
    assert (out / "model_mlir.mlir").is_file() and (out / "model_replaced.vmfb").is_file() and (out / "model_unreplaced.vmfb").is_file()
    result = ctest_run(out, "--output-on-failure")
    assert result.returncode == 0 and "100% tests passed" in result.stdout, result.stdout


@pytest.mark.slow
def test_the_generated_directory_tunes_the_declared_knobs_when_asked(tmp_path):
    """Issue 36: `replace` writes the CMake that tunes its kernels' declared knobs against
    onnxruntime (pyree_tune with ONNX) and builds the chosen variants (TUNED); off by default.
    Issue 47: with two kernels each is tuned inside the whole module, which calls both imports:
    the other kernel's plugin loaded (PLUGINS), the first's as tuned for the second's tune.
    Without it every variant of either is refused (the module's other import unresolved)."""
    import json

    from support.cmake_projects import build, configure, ctest_run

    models.save(models.mlp(), tmp_path / "model.onnx")
    assert run_cli("import", tmp_path / "model.onnx", "-o", tmp_path / "model.mlir").returncode == 0
    result = run_cli("replace", tmp_path / "model.mlir", "--ops", "1", "--ops", "3", "--import", "fc1", "--import", "sm", "-o", tmp_path / "kernels",
                     "--onnx", tmp_path / "model.onnx")  # fmt: skip
    assert result.returncode == 0, result
    assert all("// pyree-tune:" in (tmp_path / "kernels" / f"{name}.c").read_text() for name in ("fc1", "sm"))
    text = (tmp_path / "kernels" / "CMakeLists.txt").read_text()
    assert "option(model_TUNE" in text and "${fc1_TUNED}" in text and "${sm_TUNED}" in text
    assert "pyree_tune(NAME fc1_tune SYSTEM SRCS fc1.c CPU ${model_PLUGIN_CPU} MODULE model_replaced PLUGINS sm_untuned FUNCTION" in text
    assert "pyree_tune(NAME sm_tune SYSTEM SRCS sm.c CPU ${model_PLUGIN_CPU} MODULE model_replaced PLUGINS fc1_plugin FUNCTION" in text

    untuned = tmp_path / "untuned"
    configure(tmp_path / "kernels", untuned)
    build(untuned)
    assert not list(untuned.glob("*_tune.json")) and not list(untuned.glob("*_untuned*"))

    tuned = tmp_path / "tuned"
    configure(tmp_path / "kernels", tuned, extra=["-Dmodel_TUNE=ON"])
    build(tuned)
    for name in ("fc1", "sm"):
        best = json.loads((tuned / f"{name}_tune.json").read_text())
        assert best["choice"] and len(best["variants"]) > 1, best
        assert any(v["status"] == "ok" for v in best["variants"]), best["variants"]
    result = ctest_run(tuned, "--output-on-failure")
    assert result.returncode == 0 and "100% tests passed" in result.stdout, result.stdout
