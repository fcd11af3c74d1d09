"""`pyree-build doctor`: pyree_build's version and Python, the IREE wheels against the pinned
release, every tool (where, which version), per workflow whether it builds and runs here, and
which of pyree_build's extras are installed (a missing one: the workflows it would enable and
the command that adds it)."""

from __future__ import annotations

import functools
import platform
import sys
from collections.abc import Callable
from typing import Any

from pyree_build import backends
from pyree_build.backends.base import Workflow
from pyree_build.core import extras, toolchain
from pyree_build.core.errors import PyreeError
from pyree_build.core.package import PACKAGE_DIR, __version__

# The IREE release the samples' MLIR is written for; pyproject.toml pins the wheels to it.
PINNED_IREE = "3.13"
IREE_WHEELS = ("iree-base-compiler", "iree-base-runtime")

# (label, finder, required, what it is for, how to install): the tools every target uses;
# each backend adds its own (Backend.tools) between the IREE tools and the build tools.
Check = tuple[str, Callable[[], toolchain.Tool], bool, str, str]
_IREE_CHECKS: list[Check] = [
    ("iree-compile", toolchain.iree_compile, True, "MLIR -> .vmfb", toolchain.INSTALL_IREE),
    ("iree-lld", toolchain.iree_lld, True, "links standalone plugins", toolchain.INSTALL_IREE),
    ("iree-run-module", toolchain.iree_run_module, True, "runs modules", toolchain.INSTALL_IREE),
    ("iree-benchmark-module", toolchain.iree_benchmark_module, True, "benchmarks modules", toolchain.INSTALL_IREE),
    ("iree-import-onnx", toolchain.onnx_importer, False, "ONNX -> MLIR (pyree-build import)", toolchain.INSTALL_ONNX),
]
_BUILD_CHECKS: list[Check] = [
    ("cmake", toolchain.cmake, True, "builds the samples and downstream projects", "pip install cmake"),
    ("ctest", toolchain.ctest, True, "runs the sample tests", "pip install cmake"),
    ("ninja", toolchain.ninja, True, "CMake generator", "pip install ninja"),
    ("filecheck", toolchain.filecheck, True, "--check-file output checks", "pip install filecheck"),
    ("ray", toolchain.ray, False, "runs tune's sweeps on a Ray cluster (tune --ray)", toolchain.INSTALL_RAY),
    ("torch", toolchain.torch, False, "torch programs: import MODEL.pt2, verify --torch, pb.torch_op", toolchain.INSTALL_TORCH),
    ("iree-turbine", toolchain.turbine, False, "imports torch programs (aot.export)", toolchain.INSTALL_TORCH),
]
# Rows after the backends' own: what every target shares.
_SHARED_WORKFLOWS = [
    Workflow("dump / substitute / bench", build=("iree-compile",), run=("iree-run-module", "iree-benchmark-module")),
    Workflow("CMake projects (samples, new)", build=("cmake", "ninja"), run=("ctest",)),
    Workflow("ONNX models (import, replace, verify)", build=("iree-import-onnx", "iree-compile"), run=("iree-run-module",)),
    Workflow("tune on a Ray cluster (tune --ray)", build=("ray",), run=("ray", "iree-benchmark-module")),
    Workflow("torch programs (import .pt2, verify --torch, torch_op)", build=("torch", "iree-turbine", "iree-compile"), run=("torch", "iree-run-module")),
]


def checks() -> list[Check]:
    """Every tool doctor looks for: IREE's, each backend's (a label listed once), the build tools."""
    found: dict[str, Check] = {c[0]: c for c in _IREE_CHECKS}
    for backend in backends.every():
        for t in backend.tools:
            found.setdefault(t.label, (t.label, t.find, t.required, t.purpose, t.install))
    for c in _BUILD_CHECKS:
        found.setdefault(c[0], c)
    return list(found.values())


def workflows() -> list[Workflow]:
    """The workflow table's rows: each backend's (a name listed once), then the shared ones."""
    rows: dict[str, Workflow] = {}
    for backend in backends.every():
        for wf in backend.workflows:
            rows.setdefault(wf.name, wf)
    return [*rows.values(), *(wf for wf in _SHARED_WORKFLOWS if wf.name not in rows)]


def device_probes() -> dict[str, Callable[[], tuple[bool, str]]]:
    """Workflow device -> its probe, asked of the backend whose workflow names it ("host": the CPU)."""
    probes: dict[str, Callable[[], tuple[bool, str]]] = {}
    for backend in backends.every():
        for wf in backend.workflows:
            probes.setdefault(wf.device, functools.partial(backend.probe, wf.device))
    return probes


def __getattr__(name: str) -> Any:
    # The tables as module constants (CHECKS, WORKFLOWS, DEVICES), read from the registry when first used.
    tables = {"CHECKS": checks, "WORKFLOWS": workflows, "DEVICES": device_probes}
    if name in tables:
        return tables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _iree_versions() -> list[tuple[str, str | None, bool]]:
    """(wheel, installed version or None, matches the pinned release)."""
    found = []
    for dist in IREE_WHEELS:
        version = toolchain._dist_version(dist)
        found.append((dist, version, version is not None and (version == PINNED_IREE or version.startswith(PINNED_IREE + "."))))
    return found


def _requirement(labels: tuple[str, ...], found: dict[str, str | None]) -> str | None:
    """None when every requirement has a tool found, else what is missing."""
    missing = [label for label in labels if not any(found.get(alt) for alt in label.split("|"))]
    return None if not missing else "needs " + ", ".join(m.replace("|", " or ") for m in missing)


def workflow_rows(found: dict[str, str | None], devices: dict[str, tuple[bool, str]]) -> list[tuple[str, str, str]]:
    """(workflow, can build, can run here) from which tools were found and which devices are usable."""
    rows = []
    for wf in workflows():
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


def extra_tools(extra: str, declared: dict[str, tuple[str, ...]]) -> list[Check]:
    """The tools `extra` brings: those whose install command is an extra's (`pip install
    "pyree_build[cuda]"`) whose distributions `extra` requires too ([all] brings cuda's)."""
    wanted = set(declared.get(extra, ()))
    brings = []
    for check in checks():
        source = extras.extra_of_install(check[4])
        if source is not None and (source == extra or (declared.get(source) and set(declared[source]) <= wanted)):
            brings.append(check)
    return brings


def extra_enables(extra: str, declared: dict[str, tuple[str, ...]]) -> str:
    """What `extra` enables: the workflows that need one of its tools, else its tools' purposes."""
    labels = {check[0] for check in extra_tools(extra, declared)}
    names = [wf.name for wf in workflows() if any(set(need.split("|")) & labels for need in wf.build + wf.run)]
    if names:
        return ", ".join(names)
    return "; ".join(f"{check[0]}: {check[3]}" for check in extra_tools(extra, declared)) or "nothing on this machine"


def extra_rows(declared: dict[str, tuple[str, ...]], have: set[str], found: dict[str, str | None]) -> list[tuple[str, str, str]]:
    """(extra, status, what it enables or how to add it) for every extra but the developers'.
    Status: "installed", "missing", or "not needed" (missing, but each of its tools was found
    elsewhere, e.g. glslang from apt)."""
    gaps = extras.missing(declared, have)
    rows = []
    for extra, _dists in declared.items():
        if extra in extras.DEVELOPER_EXTRAS:
            continue
        enables = extra_enables(extra, declared)
        tools = [check[0] for check in extra_tools(extra, declared)]
        if not gaps[extra]:
            rows.append((extra, "installed", enables))
        elif tools and all(found.get(label) for label in tools):
            rows.append((extra, "not needed", f"{enables} (its tools were found elsewhere)"))
        else:
            rows.append((extra, "missing", f"for: {enables}; install: {extras.install_command(extra)}"))
    return rows


def _extras(found: dict[str, str | None]) -> None:
    print("\nextras (the default install is the lean core, every CPU workflow; each extra adds a target's tools):")
    declared = extras.this_package()
    if declared is None:
        print("  unknown: pyree_build is not installed with pip here (no metadata names its extras)")
        return
    rows = extra_rows(declared, extras.installed_distributions(), found)
    width = max((len(row[0]) for row in rows), default=0)
    for extra, status, what in rows:
        print(f"  {status:<10} {extra:<{width}}  {what}")


def _versions(problems: list[str]) -> None:
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


def _tools(problems: list[str]) -> dict[str, str | None]:
    print("\ntools:")
    found: dict[str, str | None] = {}
    listed = checks()
    width = max(len(c[0]) for c in listed)
    for label, finder, required, purpose, install in listed:
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
    return found


def report() -> int:
    """Print versions, one line per tool, the workflow table and the extras; exit 1 when a
    required tool is missing or the IREE wheels are not the pinned release (a missing extra is
    not a problem: the lean install is a choice)."""
    problems: list[str] = []
    _versions(problems)
    found = _tools(problems)
    devices = {name: probe() for name, probe in device_probes().items()}
    print("\ndevices:")
    for name, (usable, reason) in devices.items():
        label = "host CPU" if name == "host" else f"{name} GPU"
        print(f"  {label:<10} {'usable' if usable else 'not usable'}: {reason}")
    rows = [("workflow", "build", "run on this machine")] + workflow_rows(found, devices)
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    print("\nworkflows:")
    for name, build, run in rows:
        print(f"  {name:<{widths[0]}}  {build:<{widths[1]}}  {run}")
    _extras(found)
    if problems:
        print("\nproblems: " + "; ".join(problems))
        return 1
    skipped = [name for name, (usable, _) in devices.items() if name != "host" and not usable]
    print("\nall required tools found" + (f"; tests on {', '.join(skipped)} will be skipped (no usable device)" if skipped else ""))
    return 0
