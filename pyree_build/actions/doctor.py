"""`pyree-build doctor`: pyree_build's version and Python, the IREE wheels against the pinned
release, every tool (where, which version), and per workflow whether it builds and runs here."""
from __future__ import annotations

import platform
import sys
from dataclasses import dataclass
from typing import Callable

from pyree_build.core import toolchain
from pyree_build.core.errors import PyreeError
from pyree_build.core.package import PACKAGE_DIR, __version__

# The IREE release the samples' MLIR is written for; pyproject.toml pins the wheels to it.
PINNED_IREE = "3.13"
IREE_WHEELS = ("iree-base-compiler", "iree-base-runtime")


@dataclass(frozen=True)
class Workflow:
    """One row of the workflow table. `build` and `run` name tools of CHECKS by label ("a|b":
    either will do); `device` names an entry of DEVICES that must be usable to run."""

    name: str
    build: tuple[str, ...]
    run: tuple[str, ...]
    device: str = "host"


def _host_device() -> tuple[bool, str]:
    from pyree_build.backends.llvm_cpu.elf import host_arch

    try:
        return True, f"this {host_arch()} host"
    except PyreeError as err:
        return False, err.what


def _cuda_device() -> tuple[bool, str]:
    from pyree_build.actions.iree import cuda_status

    return cuda_status()


def _hip_device() -> tuple[bool, str]:
    from pyree_build.actions.iree import hip_status

    return hip_status()


def _vulkan_device() -> tuple[bool, str]:
    from pyree_build.backends.vulkan.devices import status

    return status()


# device -> (usable, reason); a new backend adds its probe here and its rows to WORKFLOWS.
DEVICES: dict[str, Callable[[], tuple[bool, str]]] = {"host": _host_device, "cuda": _cuda_device, "vulkan": _vulkan_device, "hip": _hip_device}

WORKFLOWS: list[Workflow] = [
    Workflow("system plugin", build=("zig cc|clang|gcc", "iree-compile"), run=("iree-run-module",)),
    Workflow("standalone plugin (FatELF)", build=("zig cc|clang", "iree-lld", "iree-compile"), run=("iree-run-module",)),
    Workflow("embedded objects", build=("zig cc|clang", "iree-compile"), run=("iree-run-module",)),
    Workflow("CUDA PTX", build=("nvrtc|nvcc", "iree-compile"), run=("iree-run-module",), device="cuda"),
    Workflow("CUDA bitcode microkernels", build=("iree-compile",), run=("iree-run-module",), device="cuda"),
    Workflow("Vulkan SPIR-V shaders", build=("glslang|glslc", "spirv-val", "iree-compile"), run=("iree-run-module",), device="vulkan"),
    Workflow("HIP code objects", build=("iree-lld", "iree-compile"), run=("iree-run-module",), device="hip"),
    Workflow("dump / substitute / bench", build=("iree-compile",), run=("iree-run-module", "iree-benchmark-module")),
    Workflow("CMake projects (samples, new)", build=("cmake", "ninja"), run=("ctest",)),
]

# (label, finder, required, what it is for, how to install)
CHECKS: list[tuple[str, Callable[[], toolchain.Tool], bool, str, str]] = [
    ("iree-compile", toolchain.iree_compile, True, "MLIR -> .vmfb", toolchain.INSTALL_IREE),
    ("iree-lld", toolchain.iree_lld, True, "links standalone plugins", toolchain.INSTALL_IREE),
    ("iree-run-module", toolchain.iree_run_module, True, "runs modules", toolchain.INSTALL_IREE),
    ("iree-benchmark-module", toolchain.iree_benchmark_module, True, "benchmarks modules", toolchain.INSTALL_IREE),
    ("zig cc", lambda: toolchain.c_compiler("zig"), True, "default C compiler (every arch)", toolchain.INSTALL_ZIG),
    ("clang", lambda: toolchain.c_compiler("clang"), False, "optional C compiler (--cc clang)", toolchain.INSTALL_CLANG),
    ("gcc", lambda: toolchain.c_compiler("gcc"), False, "optional C compiler for system plugins (--cc gcc)", toolchain.INSTALL_GCC),
    ("nvrtc", toolchain.nvrtc, False, ".cu -> PTX without a CUDA SDK (default)", toolchain.INSTALL_NVRTC),
    ("nvcc", toolchain.nvcc, False, ".cu -> PTX (--compiler nvcc)", toolchain.INSTALL_NVCC),
    ("ptxas", toolchain.ptxas, False, "checks PTX at build time (--verify)", toolchain.INSTALL_PTXAS),
    ("glslang", lambda: toolchain.glsl_compiler("glslang"), False, "GLSL -> SPIR-V (pyree-build spirv)", toolchain.INSTALL_GLSLANG),
    ("glslc", lambda: toolchain.glsl_compiler("glslc"), False, "GLSL -> SPIR-V (spirv --compiler glslc)", toolchain.INSTALL_GLSLC),
    ("spirv-val", toolchain.spirv_val, False, "validates SPIR-V (pyree-build spirv)", toolchain.INSTALL_SPIRV_VAL),
    ("cmake", toolchain.cmake, True, "builds the samples and downstream projects", "pip install cmake"),
    ("ctest", toolchain.ctest, True, "runs the sample tests", "pip install cmake"),
    ("ninja", toolchain.ninja, True, "CMake generator", "pip install ninja"),
    ("filecheck", toolchain.filecheck, True, "--check-file output checks", "pip install filecheck"),
]


def _iree_versions() -> list[tuple[str, str | None, bool]]:
    """(wheel, installed version or None, matches the pinned release)."""
    found = []
    for dist in IREE_WHEELS:
        version = toolchain._dist_version(dist)
        found.append((dist, version, bool(version) and (version == PINNED_IREE or version.startswith(PINNED_IREE + "."))))
    return found


def _requirement(labels: tuple[str, ...], found: dict[str, str | None]) -> str | None:
    """None when every requirement has a tool found, else what is missing."""
    missing = [label for label in labels if not any(found.get(alt) for alt in label.split("|"))]
    return None if not missing else "needs " + ", ".join(m.replace("|", " or ") for m in missing)


def workflow_rows(found: dict[str, str | None], devices: dict[str, tuple[bool, str]]) -> list[tuple[str, str, str]]:
    """(workflow, can build, can run here) from which tools were found and which devices are usable."""
    rows = []
    for wf in WORKFLOWS:
        build_gap = _requirement(wf.build, found)
        run_gap = _requirement(wf.run, found)
        usable, reason = devices.get(wf.device, (False, f"no probe for device {wf.device}"))
        can_build = "yes" if build_gap is None else f"no: {build_gap}"
        if build_gap is not None:
            can_run = "no: cannot build"
        elif run_gap is not None:
            can_run = f"no: {run_gap}"
        else:
            can_run = f"yes ({reason})" if usable else f"no: {reason}"
        rows.append((wf.name, can_build, can_run))
    return rows


def report() -> int:
    """Print versions, one line per tool and the workflow table; exit 1 when a required tool is
    missing or the IREE wheels are not the pinned release."""
    problems = []
    print(f"pyree_build  {__version__} ({PACKAGE_DIR})")
    print(f"python       {platform.python_version()} ({sys.executable})")
    for dist, version, matches in _iree_versions():
        if version is None:
            print(f"{dist:<19} not installed (pinned: {PINNED_IREE}.*)")
            problems.append(f"{dist} is not installed")
        elif matches:
            print(f"{dist:<19} {version}, the pinned release {PINNED_IREE}.*")
        else:
            print(f"{dist:<19} {version}, NOT the pinned release {PINNED_IREE}.*: the samples' MLIR may not parse")
            problems.append(f'{dist} {version} is not {PINNED_IREE}.* (pip install "{dist}=={PINNED_IREE}.*")')
    print("\ntools:")
    found: dict[str, str | None] = {}
    width = max(len(c[0]) for c in CHECKS)
    for label, finder, required, purpose, install in CHECKS:
        try:
            tool = finder()
            found[label] = tool.version
            note = f" ({tool.note})" if tool.note else ""
            print(f"ok       {label:<{width}}  {tool.version:<12} {tool.path}{note}")
        except PyreeError as err:
            found[label] = None
            status = "MISSING " if required else "absent  "
            print(f"{status} {label:<{width}}  {'-':<12} {err.what}")
            print(f"{'':9}{'':<{width}}  for: {purpose}; install: {install}")
            if required:
                problems.append(f"{label} is missing (see its install command above)")
    devices = {name: probe() for name, probe in DEVICES.items()}
    print("\ndevices:")
    for name, (usable, reason) in devices.items():
        label = "host CPU" if name == "host" else f"{name} GPU"
        print(f"  {label:<10} {'usable' if usable else 'not usable'}: {reason}")
    rows = [("workflow", "build", "run on this machine")] + workflow_rows(found, devices)
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    print("\nworkflows:")
    for name, build, run in rows:
        print(f"  {name:<{widths[0]}}  {build:<{widths[1]}}  {run}")
    if problems:
        print("\nproblems: " + "; ".join(problems))
        return 1
    print("\nall required tools found" + ("" if devices["cuda"][0] else "; CUDA tests will be skipped (no usable GPU)"))
    return 0
