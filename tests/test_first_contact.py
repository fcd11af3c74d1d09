"""Issue 44: what a new user meets first. CMake imports the installed pyree_build whatever
directory cmake is started from (a checkout's root holds a pyree_build/ of its own), and the
Vulkan probe tells a slow or failing tool from a machine with no Vulkan device."""

from __future__ import annotations

import os
import site
import subprocess
import venv
from pathlib import Path

from pyree_build.core import toolchain
from pyree_build.core.package import cmake_dir

FAKE_PACKAGE = """
import os, pathlib
pathlib.Path(os.environ["PYREE_TEST_FAKE_MARKER"]).write_text("the fake pyree_build was imported\\n")
raise SystemExit("a fake pyree_build in the current directory was imported")
"""


def _plain_python(root: Path) -> Path:
    """A Python that finds pyree_build as a regular install does, on sys.path after the current
    directory: an editable install's import hook would win over the current directory, and
    hide what a wheel install meets."""
    venv.create(root, with_pip=False, symlinks=True)
    (site_dir,) = root.glob("lib/python*/site-packages")
    import pyree_build

    (site_dir / "outer.pth").write_text("\n".join([str(Path(pyree_build.__file__).parent.parent), *site.getsitepackages()]) + "\n")
    return root / "bin" / "python"


def test_cmake_imports_the_installed_package_from_any_directory(tmp_path: Path) -> None:
    python = _plain_python(tmp_path / "venv")
    shadow = tmp_path / "checkout"
    (shadow / "pyree_build").mkdir(parents=True)
    (shadow / "pyree_build" / "__init__.py").write_text(FAKE_PACKAGE)
    (shadow / "pyree_build" / "__main__.py").write_text(FAKE_PACKAGE)
    src, build = tmp_path / "project", tmp_path / "build"
    src.mkdir()
    (src / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.21)\nproject(p LANGUAGES NONE)\nfind_package(pyree_build CONFIG REQUIRED)\n")
    marker = tmp_path / "marker"
    # No -DPYREE_BUILD_PYTHON: the config's own search (its version check) runs too.
    # A user's environment: conftest's PYTHONSAFEPATH and PYTHONPATH would hide the current directory.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    env.update(PYREE_BUILD_PYTHON=str(python), PYREE_TEST_FAKE_MARKER=str(marker))
    argv = [
        *toolchain.cmake().argv,
        "-G",
        "Ninja",
        "-S",
        src,
        "-B",
        build,
        f"-DCMAKE_MAKE_PROGRAM={toolchain.ninja().path}",
        f"-Dpyree_build_DIR={cmake_dir()}",
    ]
    result = subprocess.run(list(map(os.fspath, argv)), cwd=shadow, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not marker.exists(), "a configure step imported the pyree_build of cmake's current directory"
    cache = (build / "CMakeCache.txt").read_text()
    assert f"PYREE_BUILD_PYTHON:FILEPATH={python}" in cache
    assert "no native client" not in result.stdout, result.stdout  # built by the installed package


def test_a_slow_vulkan_probe_is_retried_and_named_not_read_as_no_device(monkeypatch) -> None:
    from pyree_build.backends.vulkan import devices

    # Every try past its (tiny) limit: the status names the timeouts, not a missing driver.
    monkeypatch.setattr(devices, "PROBE_LIMITS", (0.001, 0.002))
    monkeypatch.setattr(devices, "_known", [])
    usable, reason = devices.status()
    assert not usable
    assert "timed out after 0.001 s" in reason and "timed out after 0.002 s" in reason, reason
    assert "no Vulkan device" not in reason
    # A failed probe is not remembered: with time enough, the next ask probes again.
    monkeypatch.setattr(devices, "PROBE_LIMITS", (60.0,))
    usable, reason = devices.status()
    assert "probe failed" not in reason, reason
    assert usable == bool(devices.devices())
