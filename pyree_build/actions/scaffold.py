"""`pyree-build new DIR`: a downstream CMake project that uses find_package(pyree_build).

The project is the system-plugin sample (C plugin + MLIR program) with its own
CMakeLists.txt, a README and a pyproject.toml, so it builds with plain CMake
(`-Dpyree_build_DIR=$(pyree-build --cmake-dir)`) and with scikit-build-core, where the
`cmake.prefix` entry point of pyree_build makes find_package work with no flags. Its
wheel (py3-none-<platform>) holds the module, the plugin and a loader package whose
`run(...)` runs the program through iree.runtime and returns numpy arrays.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from pathlib import Path

from pyree_build.actions import import_stub, signature
from pyree_build.actions.sample_runner import samples_dir
from pyree_build.backends.llvm_cpu import plugin_entry
from pyree_build.core import args
from pyree_build.core.errors import PyreeError
from pyree_build.core.files import DISK_ERRORS, disk_error, prepare_output_dir, remove_tree
from pyree_build.core.outputs import check_output_dir, check_outputs, replace_directory_files
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
pyree_iree_module(NAME {name}_program SRC program.mlir TARGET llvm-cpu EXPECT_IMPORTS {import_name}{module_flags})

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
# pyree_build is not on PyPI: build with --no-build-isolation in an environment that has it
# (and scikit-build-core), or give an isolated build its wheel with --find-links (README.md).
requires = ["scikit-build-core>=0.10", "pyree_build=={version}"]
build-backend = "scikit_build_core.build"

[project]
name = "{name}"
version = "0.1.0"
description = "An IREE program with a custom CPU plugin, built with pyree_build"
requires-python = ">=3.10"
# What the loader (src/{name}/__init__.py) runs the program with; the module is compiled for this release.
dependencies = ["{runtime}", "numpy"]

[tool.scikit-build]
wheel.packages = ["src/{name}"]
# The .so is an IREE plugin for this platform, not a CPython extension: one wheel serves
# every Python 3 (py3-none-<platform>).
wheel.py-api = "py3"
"""

# src/{name}/__init__.py (src/: so that `import {name}` in this folder finds the installed
# package, with its module and plugin, not this source): what the wheel gives its user besides the two files.
LOADER = '''\
"""{name}: an IREE program and the CPU plugin its executable calls, built by pyree_build.

`run(...)` calls a function of the program with the plugin loaded and returns numpy arrays.
MODULE and PLUGIN are the files, for `iree-run-module --module=... --executable_plugin=...`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
MODULE = HERE / "{name}_program.vmfb"
PLUGIN = HERE / "{name}_plugin.so"
FUNCTION = "{function}"
_FUNCTIONS: dict[str, Any] = {{}}  # device -> the loaded module's functions


def run(*inputs: Any, function: str = FUNCTION, device: str = "local-sync") -> list[np.ndarray]:
    """Call `function` with `inputs` (numpy arrays, numbers for scalar parameters).

    IREE's runtime reads the plugin flag when it first creates a CPU device in the process,
    so the first call here must come before anything else in the process creates one.
    """
    results = _functions(device)[function](*inputs)
    results = results if isinstance(results, (tuple, list)) else [results]
    return [np.asarray(r.to_host() if hasattr(r, "to_host") else r) for r in results]


def _functions(device: str) -> Any:
    import iree.runtime as rt

    if not MODULE.is_file() or not PLUGIN.is_file():
        raise FileNotFoundError(f"{{MODULE.name}} or {{PLUGIN.name}} is not next to {{__file__}}: build and install the wheel (README.md)")
    if not _FUNCTIONS:
        rt.flags.parse_flags(f"--executable_plugin={{PLUGIN}}")
    if device not in _FUNCTIONS:
        context = rt.SystemContext(config=rt.Config(device))
        module = rt.VmModule.mmap(context.instance, str(MODULE))
        context.add_vm_module(module)
        _FUNCTIONS[device] = context.modules[module.name]
    return _FUNCTIONS[device]
'''

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

{wheel}## By hand

```sh
pyree-build plugin --kind system plugin.c -o build/plugin.so
pyree-build compile program.mlir -o build/program.vmfb --target llvm-cpu
pyree-build run build/program.vmfb --function mixed_invocation \\
    --input 8xf32=2 --input 8xf32=4 --plugin build/plugin.so --expect "{expected}"
```

Change `plugin.c` (the function is `simple_mul_workgroup`) and `cmake --build build`
rebuilds only what depends on it.
"""

# The wheel section of both READMEs: `{name}`, `{run_example}` and `{result}` are filled in.
WHEEL_README = """\
## Build a wheel

The wheel holds the module, the plugin and a loader, `{name}.run(...)`, which runs the
program with its plugin through IREE's Python runtime and returns numpy arrays:

```sh
# readme-test: skip (pyree_build's tests/actions/test_new.py runs this block in a fresh venv)
pip install scikit-build-core                                # the build backend, once
pip wheel . --no-build-isolation --no-deps -w dist          # with the pyree_build installed here
pip install dist/{name}-0.1.0-py3-none-*.whl                 # brings iree-base-runtime and numpy
python -c "import numpy as np, {name}; print({name}.run({run_example})[0].tolist())"
# => {result}
```

`--no-build-isolation` builds with the pyree_build (and scikit-build-core, CMake, IREE's
compiler) of this environment: pyree_build is not on PyPI, so an isolated build could not
fetch it. scikit-build-core finds pyree_build's CMake package through its `cmake.prefix`
entry point, so no `pyree_build_DIR` is needed. For an isolated build, give pip a folder
holding pyree_build's wheel (`pip wheel PATH/TO/pyree_build --no-deps -w wheels`):
`pip wheel . --find-links wheels --no-deps -w dist`; it then downloads scikit-build-core
and pyree_build's dependencies (IREE's compiler among them) into the build environment.

The wheel is tagged `py3-none-<platform>`: the `.so` is an IREE plugin for this platform,
not a CPython extension, so one wheel serves every Python 3 on it. `{name}.MODULE` and
`{name}.PLUGIN` are the installed files, for `iree-run-module` or `pyree-build run`.

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

{wheel}"""


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
        named = signature.is_named_form(import_args)
        files = (_signature_project_files if named else _import_project_files)(project, import_name, import_args)
    else:
        files = _sample_project_files(project)
    files["pyproject.toml"] = PYPROJECT.format(name=project, version=__version__, runtime=_runtime_requirement())
    # Every file is checked before any is written: --force replaces regular files only.
    check_outputs([target / rel for rel in files])
    _write_project(target, files)
    return target


_KEEPS_EDITS = (
    "new --force replaces only files an earlier `new` wrote that are unchanged since: move your edited or own files "
    "out of the way (or remove them), or choose another directory"
)


def _runtime_requirement() -> str:
    """pyree_build's own pin of IREE's runtime: the release the project's module is compiled with."""
    try:
        pins = importlib.metadata.requires("pyree_build") or []
    except importlib.metadata.PackageNotFoundError:
        pins = []
    return next((p.split(";")[0].strip() for p in pins if p.startswith("iree-base-runtime")), "iree-base-runtime")


def _import_project_files(project: str, import_name: str, import_args: str) -> dict[str, str]:
    """The project's files (all but pyproject.toml) generated for one import."""
    arguments = import_stub.parse_args(import_name, import_args)
    inputs, expected = import_stub.test_values(arguments)
    run_example, result = import_stub.python_example(arguments)
    cmake = CMAKELISTS.format(name=project, import_name=import_name, function="run", inputs=_quoted(inputs), expected=_quoted(expected), module_flags="")
    readme = IMPORT_README.format(
        name=project, import_name=import_name, args=import_args, run_inputs=" ".join(f'--input "{i}"' for i in inputs),
        inputs_text=", ".join(f"`{i}`" for i in inputs) or "no inputs", expected_text=" and ".join(f"`{e}`" for e in expected),
        wheel=WHEEL_README.format(name=project, run_example=run_example, result=result),
    )  # fmt: skip
    return {
        "CMakeLists.txt": cmake,
        "README.md": readme,
        "plugin.c": import_stub.c_source(import_name, arguments),
        "program.mlir": import_stub.mlir_source(import_name, arguments),
        f"src/{project}/__init__.py": LOADER.format(name=project, function="run"),
    }


SIGNATURE_README = """\
# {name}

An IREE program (`program.mlir`) that calls the plain C function `{function}`
(`kernel.c`), built into a CPU plugin (`plugin.c`). Made by
`pyree-build new --import {function} --args "{args}"`; it builds and passes its test
as written. The program and the call in `plugin.c` were generated from the signature:
`{function}` takes the buffers and scalars in that order, then the sizes
{sizes}. Edit `kernel.c` (the body is a placeholder) and keep its parameters.

## Build and test with CMake

```sh
cmake -G Ninja -S . -B build -Dpyree_build_DIR="$(pyree-build --cmake-dir)"
cmake --build build
ctest --test-dir build --output-on-failure
```

The test runs `{function}` with {inputs_text} and expects {expected_text}: the placeholder
body writes each `out` element as {placeholder}, and adds 1 plus the scalars to each `inout`
element. Replace it with your kernel and update the test's EXPECT.

The program reads every named size from the arrays at each call (one module for every
size) and {tiling}.

## By hand

```sh
pyree-build plugin --kind system plugin.c -o build/plugin.so
pyree-build compile program.mlir -o build/program.vmfb --expect-import {import_name}{compile_flags}
pyree-build run build/program.vmfb --function {function} {run_inputs} --plugin build/plugin.so
```

From Python, without a project: `pb.load_inline(c_source=open("kernel.c").read(),
function="{function}", args="{args}")`.

{wheel}"""

# Each named size's extent in the generated test: the tiled size spans two tiles of 4 rows.
_TEST_EXTENT = 3
_TEST_TILE = 4
_TEST_ROWS = 6


def _signature_test(sig: signature.Signature) -> tuple[list[str], list[str], str, str]:
    """(--input specs, expected result lines, a Python call's arguments, its first result's
    .tolist()) for the placeholder body: in buffer k holds k + 2, scalar k is k + 2."""
    extents = {s: _TEST_ROWS if s == sig.tiled else _TEST_EXTENT for s in sig.sizes}
    shape = {p.position: tuple(d if isinstance(d, int) else extents[d] for d in p.dims or ()) for p in sig.params}
    scalars = [p for p in sig.params if not p.is_buffer]
    bump = 1 + sum(k + 2 for k in range(len(scalars)))
    inputs, python, values = [], [], {}
    for k, p in enumerate(q for q in sig.operands if q.is_buffer):
        values[p.position] = k + 2
    for p in sig.operands:
        if not p.is_buffer:
            v = scalars.index(p) + 2
            inputs.append(f"{p.type}={v}")
            python.append(f"{float(v)}" if p.type.startswith("f") else str(v))
        else:
            dims = "x".join(map(str, shape[p.position]))
            inputs.append(f"{dims}x{p.type}={values[p.position]}")
            python.append(f"np.full({shape[p.position]}, {values[p.position]}, np.{p.dtype})")
    expected, first = [], None
    for p in sig.outputs:
        source = _same_shape_input(sig, p)
        value = (values[source.position] if source else 0) + bump if p.kind == "out" else values[p.position] + bump
        expected.append(f"{'x'.join(map(str, shape[p.position]))}x{p.type}=" + _nested(shape[p.position], str(value)))
        if first is None and p.kind == "out":
            first = _nested_list(shape[p.position], float(value) if p.type.startswith("f") else value)
    return inputs, expected, ", ".join(python), str(first)


def _same_shape_input(sig: signature.Signature, out: signature.Param) -> signature.Param | None:
    return next((p for p in sig.params if p.kind == "in" and p.is_buffer and p.dims == out.dims and p.type == out.type), None)


def _nested(shape: tuple[int, ...], value: str) -> str:
    if len(shape) == 1:
        return " ".join([value] * shape[0])
    return "".join("[" + _nested(shape[1:], value) + "]" for _ in range(shape[0]))


def _nested_list(shape: tuple[int, ...], value: object) -> object:
    return [value] * shape[0] if len(shape) == 1 else [_nested_list(shape[1:], value) for _ in range(shape[0])]


def _kernel_stub(sig: signature.Signature) -> str:
    """kernel.c: the function with the signature's parameters and a placeholder body."""
    params = [f"{'const ' if p.kind == 'in' and p.is_buffer else ''}{p.c_type}{'*' if p.is_buffer else ''} p{p.position}" for p in sig.params]
    params += [f"size_t {s}" for s in sig.sizes]
    scalars = " + ".join(f"(double)p{p.position}" for p in sig.params if not p.is_buffer)
    lines = [f"  const double bump = 1{' + ' + scalars if scalars else ''};"]
    for p in sig.outputs:
        count = " * ".join(str(d) for d in p.dims or ())
        source = _same_shape_input(sig, p)
        if p.kind == "out":
            value = f"(double)p{source.position}[i] + bump" if source else "bump"
            lines.append(f"  for (size_t i = 0; i < {count}; ++i) p{p.position}[i] = ({p.c_type})({value});")
        else:
            lines.append(f"  for (size_t i = 0; i < {count}; ++i) p{p.position}[i] = ({p.c_type})((double)p{p.position}[i] + bump);")
    unused = [f"p{p.position}" for p in sig.params if p.kind == "in" and p.is_buffer and all(_same_shape_input(sig, o) is not p for o in sig.outputs)]
    unused += [s for s in sig.sizes if all(s not in (o.dims or ()) for o in sig.outputs)]
    lines += [f"  (void){name};" for name in unused]
    return (
        f"// {sig.function}: called by the generated program with each tile of its arrays (see README.md).\n"
        f"// Signature: {sig.text()}\n"
        "// Placeholder body: each out element is the same element of the in buffer of its shape (0 if\n"
        "// none) plus 1 plus the scalars; each inout element gets 1 plus the scalars added. No libc,\n"
        "// so it also builds as a standalone plugin.\n"
        "#include <stddef.h>\n#include <stdint.h>\n\n"
        f"void {sig.function}({', '.join(params)}) {{\n" + "\n".join(lines) + "\n}\n"
    )


def _signature_project_files(project: str, function: str, text: str) -> dict[str, str]:
    """The project's files (all but pyproject.toml) for a plain C function and its signature."""
    sig = signature.parse(text, function, tile=_TEST_TILE)
    inputs, expected, run_example, result = _signature_test(sig)
    flags = "".join(f" {flag}" for flag in sig.compile_flags)  # f64 kept as f64
    cmake = CMAKELISTS.format(
        name=project, import_name=sig.import_name, function=function, inputs=_quoted(inputs), expected=_quoted(expected),
        module_flags=f" FLAGS{flags}" if flags else "",
    )  # fmt: skip
    plugin = (
        signature.adapter(sig, "kernel.c").replace("#include <stdint.h>\n", '#include <stdint.h>\n\n#include "iree/hal/local/executable_plugin.h"\n', 1)
        + "\n"
        + plugin_entry.plugin_entry(project, f"calls {function} of kernel.c", {sig.import_name: sig.import_name})
    )
    tiling = (
        f"gives each workgroup {sig.tile} rows of size `{sig.tiled}` (the generated `tile=`; `{sig.tiled}` is then the tile's row count)"
        if sig.tiled else "calls the function once with everything"
    )  # fmt: skip
    readme = SIGNATURE_README.format(
        name=project, function=function, args=text, import_name=sig.import_name, tiling=tiling, compile_flags=flags,
        sizes=", ".join(f"`size_t {s}`" for s in sig.sizes) or "(none)", run_inputs=" ".join(f'--input "{i}"' for i in inputs),
        inputs_text=", ".join(f"`{i}`" for i in inputs) or "no inputs", expected_text=" and ".join(f"`{e}`" for e in expected),
        placeholder="the same element of the `in` buffer of its shape (0 if none) plus 1 plus the scalars",
        wheel=WHEEL_README.format(name=project, run_example=run_example, result=result),
    )  # fmt: skip
    return {
        "CMakeLists.txt": cmake,
        "README.md": readme,
        "kernel.c": _kernel_stub(sig),
        "plugin.c": plugin,
        "program.mlir": signature.program(sig),
        f"src/{project}/__init__.py": LOADER.format(name=project, function=function),
    }


def _quoted(items: list[str]) -> str:
    return " ".join(f'"{i}"' for i in items)


def sample_readme(project: str) -> str:
    """The README of the project `pyree-build new` makes from the system-plugin sample."""
    wheel = WHEEL_README.format(name=project, run_example="np.full(8, 2, np.float32), np.full(8, 4, np.float32)", result=str([12.0] * 8))
    return README.format(name=project, expected=EXPECTED, wheel=wheel)


def _sample_project_files(project: str) -> dict[str, str]:
    """The project's files (all but pyproject.toml) from the system-plugin sample."""
    plugin_sample = samples_dir() / "custom_dispatch" / "cpu" / "plugin"
    cmake = CMAKELISTS.format(
        name=project, import_name="simple_mul_workgroup", function="mixed_invocation", inputs='"8xf32=2" "8xf32=4"', expected=f'"{EXPECTED}"',
        module_flags="",
    )  # fmt: skip
    return {
        "CMakeLists.txt": cmake,
        "README.md": sample_readme(project),
        "plugin.c": _adapt((plugin_sample / "system_plugin.c").read_text(encoding="utf-8"), project),
        "program.mlir": _adapt((plugin_sample / "example.mlir").read_text(encoding="utf-8"), project),
        f"src/{project}/__init__.py": LOADER.format(name=project, function="mixed_invocation"),
    }


def _write_project(target: Path, files: dict[str, str]) -> None:
    """Write `files` into a staging directory inside `target`, then move them into place with
    the manifest of what `new` wrote (outputs.replace_directory_files): a file in the way that
    `new` did not write, or that was edited since, is refused by name, --force or not. A full
    disk while staging is an error that replaced nothing."""
    prepare_output_dir(target)  # made for this command: removed again if it fails while empty
    staging = target / f".pyree-new.{os.getpid()}-{os.urandom(4).hex()}.build"
    try:
        staged: dict[str, Path] = {}
        for rel, text in files.items():
            path = staging / rel
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
            except OSError as exc:
                if exc.errno in DISK_ERRORS:
                    raise disk_error(exc, target / rel) from None
                raise
            staged[rel] = path
        replace_directory_files(target, staged, verb="new", prune=False, fix=_KEEPS_EDITS)
    finally:
        remove_tree(staging)
