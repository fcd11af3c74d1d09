"""`pyree-build doctor`: versions, the pinned IREE release, tools, and per workflow whether it
builds and runs on this machine."""

from __future__ import annotations

import platform
import re
import sys

from conftest import REPO

from pyree_build.actions import doctor
from pyree_build.backends.cuda import target as cuda_target
from pyree_build.core.package import __version__


def test_doctor_shows_versions_python_and_the_pinned_release(cli):
    result = cli("doctor")
    assert result.returncode == 0, result
    out = result.stdout
    assert f"pyree_build  {__version__} (" in out
    assert f"python       {platform.python_version()} ({sys.executable})" in out
    for dist in ("iree-base-compiler", "iree-base-runtime"):
        assert re.search(rf"^{dist} +3\.13\.\d+, the pinned release 3\.13\.\*$", out, re.M), out


def test_the_pinned_release_is_the_one_pyproject_pins():
    text = (REPO / "pyproject.toml").read_text()
    for dist in doctor.IREE_WHEELS:
        assert f'"{dist}=={doctor.PINNED_IREE}.*"' in text


def test_every_workflow_says_whether_it_builds_and_runs_here(cli):
    out = cli("doctor").stdout
    table = out.split("workflows:\n", 1)[1].split("\n\n", 1)[0]  # the extras section follows
    for wf in doctor.WORKFLOWS:
        (line,) = [line for line in table.splitlines() if line.strip().startswith(wf.name + "  ")]
        assert "  yes  " in line, line  # everything builds here
    usable, reason = cuda_target.cuda_status()
    (cuda,) = [line for line in table.splitlines() if "CUDA PTX" in line]
    assert cuda.rstrip().endswith(f"yes ({reason})" if usable else f"no: {reason}"), cuda
    (system,) = [line for line in table.splitlines() if "system plugin" in line]
    assert "yes (this " in system


def test_a_missing_tool_is_named_per_workflow():
    found = {label: "1.0" for label, *_ in doctor.CHECKS}
    found.update({"nvrtc": None, "nvcc": None, "iree-benchmark-module": None})
    devices = {"host": (True, "this host"), "cuda": (True, "1 device")}
    rows = {name: (build, run) for name, build, run in doctor.workflow_rows(found, devices)}
    assert rows["CUDA PTX"] == ("no: needs nvrtc or nvcc", "no: cannot build")
    assert rows["dump / substitute / bench"] == ("yes", "no: needs iree-benchmark-module")
    assert rows["system plugin"] == ("yes", "yes (this host)")
    found["nvcc"] = "13.0"
    devices["cuda"] = (False, "no CUDA driver")
    rows = {name: (build, run) for name, build, run in doctor.workflow_rows(found, devices)}
    assert rows["CUDA PTX"] == ("yes", "no: no CUDA driver")


def test_every_workflow_names_known_tools_and_devices():
    labels = {label for label, *_ in doctor.CHECKS}
    for wf in doctor.WORKFLOWS:
        for need in wf.build + wf.run:
            assert set(need.split("|")) <= labels, (wf.name, need)
        assert wf.device in doctor.DEVICES, wf.name
