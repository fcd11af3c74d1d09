"""`pyree-build new DIR`: a downstream CMake project that uses find_package(pyree_build).

The project is the system-plugin sample (C plugin + MLIR program) with its own
CMakeLists.txt, a README and a pyproject.toml, so it builds with plain CMake
(`-Dpyree_build_DIR=$(pyree-build --cmake-dir)`) and with scikit-build-core, where the
`cmake.prefix` entry point of pyree_build makes find_package work with no flags.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from pyree_build.actions import import_stub
from pyree_build.actions.sample_runner import samples_dir
from pyree_build.core import args
from pyree_build.core.errors import PyreeError
from pyree_build.core.outputs import check_output_dir, check_outputs
from pyree_build.core.package import __version__

PathLike = str | os.PathLike[str]

EXPECTED = "8xf32=12 12 12 12 12 12 12 12"

CMAKELISTS = """\
cmake_minimum_required(VERSION 3.21)
project({name} LANGUAGES NONE)

# Found through `-Dpyree_build_DIR=$(pyree-build --cmake-dir)`, or with no flag at all
# in a scikit-build-core build (pyree_build registers a cmake.prefix entry point).
find_package(pyree_build CONFIG REQUIRED)
enable_testing()

# plugin.c -> {name}_plugin.so, a shared library the runtime opens with dlopen.
pyree_cpu_plugin(NAME {name}_plugin SYSTEM SRCS plugin.c)

# program.mlir -> {name}_program.vmfb; its executable imports {import_name}
# (EXPECT_IMPORTS fails the build if the module stops calling it).
pyree_iree_module(NAME {name}_program SRC program.mlir TARGET llvm-cpu EXPECT_IMPORTS {import_name})

pyree_add_run_test(
  NAME {name}_{function}
  MODULE {name}_program
  FUNCTION {function}
  INPUTS {inputs}
  PLUGINS {name}_plugin
  EXPECT {expected}
)

# In a wheel build, ship the plugin and the module.
if(SKBUILD)
  get_target_property(_plugin {name}_plugin PYREE_OUTPUT)
  get_target_property(_module {name}_program PYREE_OUTPUT)
  install(FILES "${{_plugin}}" "${{_module}}" DESTINATION {name})
endif()
"""

PYPROJECT = """\
[build-system]
requires = ["scikit-build-core>=0.10", "pyree_build>={version}"]
build-backend = "scikit_build_core.build"

[project]
name = "{name}"
version = "0.1.0"
description = "An IREE program with a custom CPU plugin, built with pyree_build"

[tool.scikit-build]
wheel.packages = []
"""

README = """\
# {name}

An IREE program (`program.mlir`) whose executable calls `simple_mul_workgroup`, a
function provided at run time by a CPU plugin written in C (`plugin.c`). Made by
`pyree-build new`; it builds and passes its test as written.

## Build and test with CMake

```sh
cmake -G Ninja -S . -B build -Dpyree_build_DIR="$(pyree-build --cmake-dir)"
cmake --build build
ctest --test-dir build --output-on-failure
```

The test runs `mixed_invocation` with inputs `8xf32=2` and `8xf32=4` and expects
`{expected}` (2 * 4 through the plugin, then + 4 in generated code).

## Build a wheel (scikit-build-core)

```sh
# readme-test: needs pyree_build installed from a wheel (its cmake.prefix entry point)
pip install scikit-build-core                          # the build backend, once
pip wheel . --no-build-isolation --no-deps -w dist    # uses the pyree_build installed here
```

No `pyree_build_DIR` is needed there: scikit-build-core puts pyree_build's CMake package
on the search path through its `cmake.prefix` entry point.

## By hand

```sh
pyree-build plugin --kind system plugin.c -o build/plugin.so
pyree-build compile program.mlir -o build/program.vmfb --target llvm-cpu
pyree-build run build/program.vmfb --function mixed_invocation \\
    --input 8xf32=2 --input 8xf32=4 --plugin build/plugin.so --expect "{expected}"
```

Change `plugin.c` (the function is `simple_mul_workgroup`) and `cmake --build build`
rebuilds only what depends on it.
"""


def _project_name(directory: Path, name: str | None) -> str:
    raw = name or directory.name
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", raw).strip("_")
    if not cleaned or cleaned[0].isdigit():
        raise PyreeError(
            f"'{raw}' cannot name a CMake project",
            fix="pass --name with letters, digits and underscores, starting with a letter",
        )
    return cleaned


IMPORT_README = """\
# {name}

An IREE program (`program.mlir`) whose dispatch calls the import `{import_name}`,
provided at run time by a CPU plugin written in C (`plugin.c`). Made by
`pyree-build new --import {import_name} --args "{args}"`; it builds and passes its
test as written. The C argument struct and the MLIR declaration were generated from
the same argument list: change one, change the other (pyree_build's
`docs/writing-an-import.md` explains the layout).

## Build and test with CMake

```sh
cmake -G Ninja -S . -B build -Dpyree_build_DIR="$(pyree-build --cmake-dir)"
cmake --build build
ctest --test-dir build --output-on-failure
```

The test runs `run` with {inputs_text} and expects {expected_text}: the
placeholder body in `plugin.c` takes, per element, the sum of the `in` buffers, times
the first scalar plus the second (a*x+b), writes it to each `out` and adds it to each
`inout`. Replace it with your kernel and update the test's EXPECT.

The import's argument block holds each buffer's base pointer and element offset (in
--args order), then the scalars, then the tile's size: `count` (elements, or rows of an
N-D buffer) and, for N-D buffers, the inner extents `dim1`, `dim2`, ....

## By hand

```sh
pyree-build plugin --kind system plugin.c -o build/plugin.so
pyree-build compile program.mlir -o build/program.vmfb --expect-import {import_name}
pyree-build imports build/program.vmfb --plugin build/plugin.so
pyree-build run build/program.vmfb --function run {run_inputs} --plugin build/plugin.so
```
"""


def _adapt(sample_text: str, project: str) -> str:
    """The sample's comments name the sample's files; the project's files have other names."""
    for old, new in (
        ("system_plugin.so", f"{project}_plugin.so"),
        ("example.mlir", "program.mlir"),
        ("every plugin in this folder", "the plugin in this project"),
    ):
        sample_text = sample_text.replace(old, new)
    return sample_text


def new_project(directory: PathLike, *, name: str | None = None, force: bool = False, import_name: str | None = None, import_args: str | None = None) -> Path:
    """Write a downstream project into `directory` (which must not exist or be empty).

    With `import_name` and `import_args` ("in:f32,in:f32,out:f32"), the plugin and the
    program are generated for that import (import_stub.py); otherwise they are the
    system-plugin sample's.
    """
    target = args.path(directory, "project directory")
    check_output_dir(target, "project directory")
    if (import_name is None) != (import_args is None):
        raise PyreeError("--import and --args go together", fix='pass both, e.g. --import my_op --args "in:f32,in:f32,out:f32"')
    if target.is_dir() and any(target.iterdir()) and not force:
        raise PyreeError("directory is not empty", file=target, fix="choose a new directory, or pass --force to overwrite its files")
    project = _project_name(target.resolve(), name)
    if import_name is not None and import_args is not None:
        cmake, readme, plugin_c, program = _import_project_texts(project, import_name, import_args)
    else:
        cmake, readme, plugin_c, program = _sample_project_texts(project)
    files = {
        "CMakeLists.txt": cmake,
        "pyproject.toml": PYPROJECT.format(name=project, version=__version__),
        "README.md": readme,
        "plugin.c": plugin_c,
        "program.mlir": program,
    }
    # Every file is checked before any is written: --force replaces regular files only.
    check_outputs([target / rel for rel in files])
    _write_project(target, files)
    return target


def _import_project_texts(project: str, import_name: str, import_args: str) -> tuple[str, str, str, str]:
    """CMakeLists.txt, README.md, plugin.c and program.mlir generated for one import."""
    arguments = import_stub.parse_args(import_name, import_args)
    inputs, expected = import_stub.test_values(arguments)
    cmake = CMAKELISTS.format(name=project, import_name=import_name, function="run", inputs=_quoted(inputs), expected=_quoted(expected))
    readme = IMPORT_README.format(
        name=project, import_name=import_name, args=import_args, run_inputs=" ".join(f"--input {i}" for i in inputs),
        inputs_text=", ".join(f"`{i}`" for i in inputs) or "no inputs", expected_text=" and ".join(f"`{e}`" for e in expected),
    )  # fmt: skip
    return cmake, readme, import_stub.c_source(import_name, arguments), import_stub.mlir_source(import_name, arguments)


def _quoted(items: list[str]) -> str:
    return " ".join(f'"{i}"' for i in items)


def _sample_project_texts(project: str) -> tuple[str, str, str, str]:
    """CMakeLists.txt, README.md, plugin.c and program.mlir from the system-plugin sample."""
    plugin_sample = samples_dir() / "custom_dispatch" / "cpu" / "plugin"
    cmake = CMAKELISTS.format(
        name=project, import_name="simple_mul_workgroup", function="mixed_invocation", inputs='"8xf32=2" "8xf32=4"', expected=f'"{EXPECTED}"'
    )  # fmt: skip
    readme = README.format(name=project, expected=EXPECTED)
    plugin_c = _adapt((plugin_sample / "system_plugin.c").read_text(encoding="utf-8"), project)
    program = _adapt((plugin_sample / "example.mlir").read_text(encoding="utf-8"), project)
    return cmake, readme, plugin_c, program


def _write_project(target: Path, files: dict[str, str]) -> None:
    """Write `files` next to `target` and rename them in, so an interrupted `new` leaves no half project."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        umask = os.umask(0o022)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp's 0700 would become the project's mode
        for rel, text in files.items():
            (staging / rel).write_text(text, encoding="utf-8")
        if target.exists():
            for rel in files:
                os.replace(staging / rel, target / rel)
        else:
            # mkdtemp made it private (0700); a project directory gets the usual umask mode.
            umask = os.umask(0)
            os.umask(umask)
            staging.chmod(0o777 & ~umask)
            os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
