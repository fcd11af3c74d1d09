"""The only place that starts a tool: each in its own session, bounded, and ended when pyree_build stops."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import locale
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, BinaryIO, NoReturn

from pyree_build.core import echo, lazy
from pyree_build.core.errors import PyreeError, trim

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

# Loaded when first used, not by every verb: a cache hit needs no pool (~5 ms), and only a
# plugin query in a child needs pickle (~2 ms) or the prctl call (ctypes).
libc = lazy.module("pyree_build.core.libc")
futures = lazy.module("concurrent.futures")
pickle = lazy.module("pickle")


class Stopped(KeyboardInterrupt):
    """pyree_build was asked to stop (SIGINT or SIGTERM); every tool it started has been ended."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum  # 130 for SIGINT, 143 for SIGTERM, as shells report them


# Every running child, by process group (= its pid: each runs in its own session), so that a
# stop can end all of them, also those started by worker threads.
_LIVE: dict[int, str] = {}
# Reentrant: the stop handler reads _LIVE and may run in the main thread while it holds the lock.
_LIVE_LOCK = threading.RLock()
# Held from a child's fork to its registration in _LIVE, and by every sweep for what a tool
# left behind (end_descendants). Without it a sweep in one thread saw another thread's child
# before it was registered (an orphan of ours, by its parent pid and start time) and killed
# it, and a child forked while another thread's Popen still held its pipes' write ends kept
# them (call_in_child's fork never execs) and was taken for a daemon holding that tool's pipes.
_SPAWN_LOCK = threading.Lock()
_STOP_SIGNAL: int | None = None
# How long a stopped tool gets to clean up after SIGTERM (toolchain.ninja ends its jobs, a nested
# pyree_build its tools and temporaries, which may mean finishing an in-process NVRTC
# compile) before everything left in its session gets SIGKILL.
STOP_GRACE_S = 10.0


class _Deadline:
    """When the whole command must be done (time.monotonic()), and the limit it was given."""

    def __init__(self, at: float, total: float) -> None:
        self.at = at
        self.total = total


# The bound of the command under way in this thread (None: unbounded). Every tool and child it
# starts gets what is left of it, so that a command has one bound, however many steps it takes.
_DEADLINE: contextvars.ContextVar[_Deadline | None] = contextvars.ContextVar("pyree_build_deadline", default=None)


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """While in this block, every tool and child started here ends within `seconds` from now
    in all (an outer, earlier limit still holds). None: no limit of its own."""
    if seconds is None:
        yield
        return
    outer = _DEADLINE.get()
    limit = _Deadline(time.monotonic() + seconds, seconds)
    token = _DEADLINE.set(outer if outer is not None and outer.at <= limit.at else limit)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _bounded(timeout: float | None) -> tuple[float | None, str | None]:
    """The seconds a tool may run: its own `timeout` or what is left of the command's limit,
    whichever ends first; and the limit to name when it runs out ("5 s, the command's limit")."""
    limit = _DEADLINE.get()
    if limit is None:
        return timeout, None if timeout is None else f"{timeout:g} s"
    left = max(0.0, limit.at - time.monotonic())
    if timeout is None or left < timeout:
        return left, f"{limit.total:g} s, the command's time limit (--timeout)"
    return timeout, f"{timeout:g} s"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@functools.cache
def _set_pdeathsig() -> Callable[[], None] | None:
    """A function that makes the calling (forked) process get SIGKILL when its parent dies.

    It covers the one stop no handler can see (SIGKILL of pyree_build): the child dies with
    it instead of writing into the output directory later. Linux only; looked up in the
    parent, once, so that the forked child runs no lookup.
    """
    prctl = libc.function("prctl") if sys.platform.startswith("linux") else None
    if prctl is None:
        return None
    pr_set_pdeathsig, sigkill = 1, int(signal.SIGKILL)
    return functools.partial(prctl, pr_set_pdeathsig, sigkill, 0, 0, 0)


@functools.cache
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


_PARENT_ENDS_TOOLS = False


def parent_ends_tools() -> None:
    """This process's parent ends the tools it leaves behind if it is killed (the pyree_build
    server does for its workers: a subreaper, it inherits them and kills them): tools are then
    exec'd directly, without the setpriv wrapper, which cost ~1.3 ms of every spawn."""
    global _PARENT_ENDS_TOOLS
    _PARENT_ENDS_TOOLS = True


def _wrapper() -> tuple[str, ...]:
    return () if _PARENT_ENDS_TOOLS else _pdeathsig_wrapper()


def warm_up() -> None:
    """Find now what the first spawn of a process would (the setpriv probe is a spawn, ~3 ms)
    and load the thread pool's module (concurrent.futures loads it on first use, ~3 ms): the
    pyree_build server does it once, before it forks, for all its workers. No thread starts."""
    _pdeathsig_wrapper()
    _set_pdeathsig()
    _ = futures.ThreadPoolExecutor  # its first read imports concurrent.futures.thread


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
    orphans they linger). The session, not the group: toolchain.ninja puts each job in a group of its
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
    """SIGTERM a child's process group, give it STOP_GRACE_S to exit (toolchain.ninja and toolchain.ctest pass the
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
    # Members may outlive the leader (a compiler's own children, toolchain.ninja's jobs): the same bound.
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


def _on_stop_signal(signum: int, _frame: object) -> None:
    """The SIGINT/SIGTERM handler stop_on_signals installs. Between a child's fork and its
    registration the stop is only recorded: raised there, it left a started tool that nothing
    would end; registered, the child is ended at once (_register) and the wait that follows
    raises Stopped."""
    first = _STOP_SIGNAL is None
    request_stop(signum)
    if first and not _SPAWNING:  # a second signal must not interrupt the cleanup of the first
        raise Stopped(signum)


# Whether the main thread (where signal handlers run) is between a fork and its registration.
_SPAWNING = False


@contextlib.contextmanager
def _spawning() -> Iterator[None]:
    """_SPAWN_LOCK, and for the main thread the stop handler's deferral (_on_stop_signal)."""
    global _SPAWNING
    main = threading.current_thread() is threading.main_thread()
    with _SPAWN_LOCK:
        if main:
            _SPAWNING = True
        try:
            yield
        finally:
            if main:
                _SPAWNING = False


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
    previous = {s: signal.signal(s, _on_stop_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
        _STOP_SIGNAL = None


class _Tool(subprocess.Popen):  # type: ignore[type-arg]
    """A Popen whose timed wait returns the moment the tool exits.

    communicate(timeout=...) ends in wait(timeout), which polls waitpid with sleeps from 0.5 ms
    up: a tool that closed its pipes but has not quite exited costs 0.5-2 ms more (~0.4 ms a run
    on average). A pidfd (Linux >= 5.3) is readable exactly when the process exits.
    """

    def _wait(self, timeout: float | None) -> int | None:
        if timeout is not None and timeout > 0 and self.returncode is None and hasattr(os, "pidfd_open"):
            try:
                pidfd = os.pidfd_open(self.pid)
            except OSError:  # already reaped, or a kernel without pidfds: the polling wait
                pass
            else:
                try:
                    select.select([pidfd], [], [], timeout)
                finally:
                    os.close(pidfd)
                timeout = 0.0  # exited (reaped now, without a sleep) or out of time (TimeoutExpired)
        return super()._wait(timeout)  # type: ignore[misc,no-any-return]


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


@contextlib.contextmanager
def thread_pool(jobs: int | None) -> Iterator[ThreadPoolExecutor]:
    """A pool for a verb's independent steps (-j N; default: every core). concurrent.futures is
    loaded here, when steps run, not by every verb (a cache hit needs no pool: ~5 ms).

    A block left by an exception (a stop, a failed step) starts none of the steps still queued:
    it waits only for those running, so a stopped job ends, and removes its temporaries, within
    the grace its parent gives it (end_group), not after every queued compile has run."""
    pool = futures.ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1)
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


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
    hang_hint: str | None = None,
    runs_user_code: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run one tool in its own process group. On failure raise PyreeError with its stderr and
    the command to reproduce.

    `explain` may turn the tool's output into a better message (e.g. a known IREE crash).
    `crash_hint` is added when the tool is killed by a signal or by the `timeout`; `hang_hint`,
    where given, in its place for the timeout (a tool that loops on its input has not crashed). A stop
    (Stopped, KeyboardInterrupt) or any other exception while it runs ends its whole group.
    `runs_user_code` (a run that loads plugins): after it exits, the orphans it left that this
    process reaps (become_subreaper) are ended too; that look at /proc costs a few ms, so only
    where code that may daemonize runs. Whatever holds its pipes is ended for every tool.
    """
    args = [os.fspath(a) for a in argv]
    _echo_spawn(args, cwd, env, fed=stdin is not None)
    full_env = {**os.environ, **env} if env else None
    check_stopped()
    timeout, command_limit = _bounded(timeout)
    proc = _start(args, cwd=cwd, piped_stdin=stdin is not None, env=full_env)
    stdout, stderr, timed_out = _run_started(proc, stdin, timeout, runs_user_code=runs_user_code)
    check_stopped()  # our tool was ended by a stop: say so, not "the tool failed"
    result = subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)
    _require_success(result, what=what, file=file, fix=fix, check=check, explain=explain, crash_hint=crash_hint,
                     timed_out=command_limit if timed_out else None, hang_hint=hang_hint)  # fmt: skip
    return result


def ran_elsewhere(
    argv: Sequence[str], returncode: int, stdout: bytes, stderr: bytes, *, timed_out: bool, what: str,
    file: str | os.PathLike[str] | None = None, explain: Callable[[str], str | None] | None = None,
    timeout: float | None = None, crash_hint: str | None = None,
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """What `spawn` returns or raises for a tool that another process ran with this argv (the
    native client, client/plans.py): its output decoded as spawn decodes a tool's (the
    locale's encoding, undecodable bytes replaced, universal newlines)."""
    check_stopped()
    _, command_limit = _bounded(timeout)
    result = subprocess.CompletedProcess(list(argv), returncode, _as_text(stdout), _as_text(stderr))
    _require_success(result, what=what, file=file, fix=None, check=True, explain=explain, crash_hint=crash_hint,
                     timed_out=command_limit if timed_out else None)  # fmt: skip
    return result


def _as_text(data: bytes) -> str:
    return data.decode(locale.getpreferredencoding(False), "replace").replace("\r\n", "\n").replace("\r", "\n")


def _require_success(
    result: subprocess.CompletedProcess[str],
    *,
    what: str,
    file: str | os.PathLike[str] | None,
    fix: str | None,
    check: bool,
    explain: Callable[[str], str | None] | None,
    crash_hint: str | None,
    timed_out: str | None,
    hang_hint: str | None = None,
) -> None:
    """Raise the PyreeError that says how the tool ended, unless it succeeded (or `check` is
    off and it only returned non-zero). `timed_out`: the limit it ran past, if it did."""
    stdout, stderr = result.stdout, result.stderr
    output = (stderr or "") + (stdout or "")
    if timed_out is not None:
        hint = hang_hint if hang_hint is not None else crash_hint
        raise PyreeError(
            f"{what} timed out after {timed_out} and was stopped",
            file=file,
            details=(hint + "\n" if hint else "") + (trim(output, 20) or "(the tool printed nothing)"),
            command=result.args,
            fix=fix if not hint else "see the likely causes above; or give it more time with --timeout SECONDS",
        )
    if result.returncode != 0 and _DISK_FULL in output:  # a full disk aborts some tools (lld): not their bug
        raise PyreeError(f"{what} failed: {_DISK_FULL.lower()} while it wrote", file=file, details=trim(output, 12), command=result.args,
                         fix="free space on that file system, or write the outputs to another one")  # fmt: skip
    if crash_hint is None and (result.returncode < 0 or _CRASH_BANNER in output):
        raise _tool_crashed(what, file, result.args, result.returncode, output)
    if result.returncode < 0:
        raise PyreeError(
            f"{what} was killed by {signal_name(-result.returncode)}",
            file=file,
            details=(crash_hint + "\n" if crash_hint else "") + (output or "(the tool printed nothing)"),
            command=result.args,
            fix=fix,
        )
    if check and result.returncode != 0:
        better = explain(output) if explain else None
        raise PyreeError(f"{what} failed (exit code {result.returncode})", file=file, details=better or output or "(the tool printed nothing)",
                         command=result.args, fix=fix)  # fmt: skip


def _run_started(proc: subprocess.Popen[str], stdin: str | None, timeout: float | None, *, runs_user_code: bool) -> tuple[str, str, bool]:
    """Wait for a started (and registered) tool and end what it left."""
    ticks = start_ticks(proc.pid) if _SUBREAPER and runs_user_code else None
    tool = (proc.pid, ticks) if ticks is not None else None
    try:
        return _communicate(proc, stdin, timeout)
    except BaseException:
        end_group(proc.pid, _Popen(proc))
        raise
    finally:
        _unregister(proc.pid)
        if tool is not None:  # what it left that closed its pipes too (a daemon) was reparented here
            end_descendants(tool=tool)


# strerror(ENOSPC), as tools print it.
_DISK_FULL = "No space left on device"
# What LLVM's crash handler (iree-compile, clang, lld) prints before its backtrace.
_CRASH_BANNER = "Stack dump:"
_REPORT_TO = re.compile(r"(?:report issues to|submit a bug report to)\s+(\S+?)[.,]?(?:\s|$)", re.IGNORECASE)


def _tool_crashed(what: str, file: str | os.PathLike[str] | None, args: list[str], returncode: int, output: str) -> PyreeError:
    """A tool that crashed (a signal, or LLVM's crash handler): a bug in the tool, so the
    message says so, shows what it said before crashing, and never blames the input's lines."""
    how = f"was killed by {signal_name(-returncode)}" if returncode < 0 else f"crashed (exit code {returncode})"
    before, _, backtrace = output.partition(_CRASH_BANNER)
    report = _REPORT_TO.search(before)
    said = [line for line in before.splitlines() if line.strip() and not _REPORT_TO.search(line)]
    return PyreeError(
        f"{what} {how}: the tool itself crashed, a bug in it rather than an error it found in the input",
        file=file,
        details=("what it said before crashing:\n" + trim("\n".join(said), 10) if said else "it said nothing before crashing")
        + ("\nits backtrace begins:\n" + trim(backtrace.strip(), 12) if backtrace.strip() else ""),
        command=args,
        fix="if it said what it was doing (an unknown option value, an op it cannot handle), change that; otherwise try "
        "other flags or rewrite the construct it was working on, and report the crash with this command and the input"
        + (f" to {report.group(1)}" if report else ""),
    )


def _echo_spawn(args: list[str], cwd: str | os.PathLike[str] | None, env: Mapping[str, str] | None, *, fed: bool) -> None:
    if not fed:
        echo.echo_command(echo.shell_line(args, cwd=cwd, env=env))
    elif echo.VERBOSITY >= 2:  # fed from memory: shown under -v as a comment, not a line that would wait on the terminal
        echo._write_line(f"# {echo.shell_line(args, cwd=cwd, env=env)} < (its input comes from pyree_build)")


def _start(args: list[str], *, cwd: str | os.PathLike[str] | None, piped_stdin: bool, env: dict[str, str] | None) -> subprocess.Popen[str]:
    """Popen `args` in a session of its own (under the pdeathsig wrapper where there is one),
    registered in _LIVE, so that a stop ends it."""
    wrapper = _wrapper()
    try:
        if wrapper and not shutil.which(args[0], path=(env or os.environ).get("PATH")):
            raise FileNotFoundError(2, "No such file or directory")
        with _spawning():
            proc = _Tool(
                [*wrapper, *args], cwd=cwd, stdin=subprocess.PIPE if piped_stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", env=env,
                start_new_session=True,
            )  # fmt: skip
            _register(proc.pid, args[0])
        return proc
    except FileNotFoundError as exc:
        raise PyreeError(f"cannot run {args[0]}: {exc.strerror}", fix="run `pyree-build doctor` to see which tools are found") from None


# How long the pipes of a tool that has exited may stay open (its output still draining)
# before whatever holds them is taken for a descendant that outlived it.
_DRAIN_S = 0.3


def start_ticks(pid: int) -> int | None:
    """When a process started (clock ticks since boot, /proc/PID/stat field 22), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _pipe_holders(files: Sequence[object]) -> list[int]:
    """Other processes that hold one of these pipes (by inode, read from /proc/PID/fd)."""
    names = set()
    for f in files:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            names.add(f"pipe:[{os.fstat(f.fileno()).st_ino}]")  # type: ignore[attr-defined]
    holders = []
    me = os.getpid()
    for entry in os.scandir("/proc") if names and os.path.isdir("/proc/self") else ():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(f"/proc/{entry.name}/fd/{fd}") in names for fd in os.listdir(f"/proc/{entry.name}/fd")):
                holders.append(int(entry.name))
    return holders


def end_descendants(pipes: Sequence[object] = (), tool: tuple[int, int] | None = None) -> None:
    """End what a tool left running after it exited, outside its session (a plugin's
    `setsid()` grandchild): every process that still holds the tool's output pipes, and,
    where this process is a subreaper (become_subreaper), every orphan reparented to it that
    started with or after the `tool` (its pid and start ticks) and is no tool of ours. Each
    gets SIGKILL; orphans are reaped."""
    with _SPAWN_LOCK:  # no child of ours is between its fork and its registration meanwhile
        with _LIVE_LOCK:
            ours = set(_LIVE)
        for pid in _pipe_holders(pipes):
            if pid not in ours:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if tool is not None and _SUBREAPER:
            end_orphans(tool, ours)


def born_since(first: int) -> Iterator[int]:
    """The pids that can belong to processes started since pid `first` was: the kernel hands
    out pids in increasing order, so unless the numbers wrapped since (the last one handed out,
    ns_last_pid, is below `first`) only `first` to that one. Reading every process's stat
    cost ~2 ms of each run; this reads the few a tool's run started."""
    try:
        with open("/proc/sys/kernel/ns_last_pid", "rb") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = -1
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (last < first or first <= int(entry.name) <= last):
            yield int(entry.name)


def _children() -> list[int] | None:
    """This process's children, read from /proc/self/task/*/children (a subreaper's orphans are
    attached to one of its threads): a few small reads instead of a walk of /proc (~80 us).
    None where the kernel has no such file (CONFIG_PROC_CHILDREN): then born_since is walked."""
    found: list[int] = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children", "rb") as f:
                found += [int(pid) for pid in f.read().split()]
        except FileNotFoundError:
            if not os.path.isdir(f"/proc/self/task/{task}"):
                continue  # a thread that ended between the listing and the read
            return None  # the kernel keeps no such file
        except OSError:
            continue
    return found


def end_orphans(since: tuple[int, int], ours: set[int]) -> None:
    """SIGKILL and reap each child of this process (a subreaper's orphans) started with or
    after `since` (a pid and its start ticks) that is not in `ours`, and every process in the
    session each one leads (a tool's own children). Until none is left: an orphan killed here
    may have forked (after a setsid() and a sleep, say) since it was listed, and what it
    forked is reparented here only once it is dead."""
    me = str(os.getpid()).encode()
    for _round in range(1000):  # bounded: a fork bomb outruns no sweep, it only ends this one
        ended = False
        children = _children()
        for pid in born_since(since[0]) if children is None else children:
            if pid in ours:
                continue
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me and int(fields[19]) >= since[1]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if int(fields[3]) == pid:  # it leads its session, as every tool we start does
                        os.killpg(pid, signal.SIGKILL)
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
                ended = True
        if not ended:
            return


@contextlib.contextmanager
def command_ends_its_processes() -> Iterator[None]:
    """Around a command in a process that is its whole program (the CLI, a server's worker):
    at its end, every orphan it adopted (a subreaper's) and what they started is ended. A
    plugin may fork from its constructor in any process that loads it, and the fork may outlive
    every per-tool sweep (it sleeps, then forks again): nothing a command started outlives it.
    Children this process had before (a server the client started) are left alone."""
    before = set(_own_children()) if _SUBREAPER else set()
    try:
        yield
    finally:
        if _SUBREAPER:
            with _SPAWN_LOCK, _LIVE_LOCK:
                end_orphans((os.getpid(), 0), set(_LIVE) | before)


def _own_children() -> list[int]:
    children = _children()
    if children is not None:
        return children
    me, found = str(os.getpid()).encode(), []
    for pid in born_since(0):
        with contextlib.suppress(OSError, IndexError), open(f"/proc/{pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[1] == me:
                found.append(pid)
    return found


_SUBREAPER = False


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux PR_SET_CHILD_SUBREAPER),
    so that a tool's descendant that leaves its session still reparents here and is ended
    with the tool (end_descendants). Only for a process pyree_build owns (the CLI, a server
    worker): a library caller's own orphans must not become this process's."""
    global _SUBREAPER
    prctl = libc.function("prctl") if sys.platform.startswith("linux") else None
    if prctl is not None and prctl(36, 1, 0, 0, 0) == 0:  # PR_SET_CHILD_SUBREAPER
        _SUBREAPER = True
    return _SUBREAPER


def _communicate(proc: subprocess.Popen[str], stdin: str | None, timeout: float | None) -> tuple[str, str, bool]:
    """The tool's stdout and stderr, and whether it ran past `timeout` (then its group was ended).
    Raises Stopped when a stop comes while it runs. Once the tool has exited, a descendant that
    keeps its pipes open is ended rather than waited for."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = stdin
    exited_at: float | None = None
    while True:
        # Short slices, so that a worker thread notices a stop and a timeout is kept.
        slice_s = 0.25 if deadline is None else max(0.0, min(0.25, deadline - time.monotonic()))
        try:
            stdout, stderr = proc.communicate(pending, timeout=slice_s if exited_at is None else min(slice_s, _DRAIN_S))
            return stdout, stderr, False
        except subprocess.TimeoutExpired:
            pending = None
            if _STOP_SIGNAL is not None:
                raise Stopped(_STOP_SIGNAL) from None
            if proc.poll() is not None:  # the tool has exited; only something it left holds the pipes
                if exited_at is None:
                    exited_at = time.monotonic()
                elif time.monotonic() - exited_at >= _DRAIN_S:
                    end_descendants([proc.stdout, proc.stderr])
            if deadline is not None and time.monotonic() >= deadline:
                end_group(proc.pid, _Popen(proc))
                try:  # what it printed before; a straggler outside its group may hold the pipes
                    stdout, stderr = proc.communicate(timeout=5)
                except subprocess.TimeoutExpired:
                    stdout, stderr = "", ""
                return stdout, stderr, True


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
    echo.echo_command(echo.shell_line(args))
    check_stopped()
    wrapper = _wrapper()
    try:
        if wrapper and not shutil.which(args[0]):
            raise FileNotFoundError(2, "No such file or directory")
        # Its own session, like every tool `spawn` starts: a stop ends it and all its jobs.
        with _spawning():
            proc = _Tool(
                [*wrapper, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                errors="replace", bufsize=1, start_new_session=True,
            )  # fmt: skip
            _register(proc.pid, args[0])
    except FileNotFoundError as exc:
        raise PyreeError(f"cannot run {args[0]}: {exc.strerror}", fix="run `pyree-build doctor` to see which tools are found") from None
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
    check_stopped()
    bound, command_limit = _bounded(timeout)
    timeout = timeout if bound is None else bound
    die_with_parent = _set_pdeathsig()
    # Loaded here, in the parent: the forked child must not import (another thread may have
    # held the import lock at the fork).
    dumps = pickle.dumps
    max_fd = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    with _spawning():
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller's code
            _run_child(fn, args, read_fd, write_fd, max_fd, die_with_parent, dumps)
        os.close(write_fd)
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # also here: the child may not have run yet
        _register(pid, what)
    ticks = start_ticks(pid) if _SUBREAPER else None
    child = _Child(pid)
    try:
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            chunks, timed_out = _read_until_closed(pipe, time.monotonic() + timeout, child)
        if timed_out or not child(10.0):
            end_group(pid, child)
    except BaseException:
        if child.status is None:
            end_group(pid, child)
        raise
    finally:
        _unregister(pid)
        if ticks is not None:  # what the code forked (a plugin's constructor, its query) was reparented here
            end_descendants(tool=(pid, ticks))
    if timed_out:
        raise PyreeError(f"{what} did not return within {command_limit} (it was stopped)", file=file,
                         fix="look for an endless loop or a blocking call in that code")  # fmt: skip
    return _child_result(child.status or 0, chunks, what=what, file=file)


def _run_child(
    fn: Callable[..., object], args: tuple[object, ...], read_fd: int, write_fd: int, max_fd: int,
    die_with_parent: Callable[[], None] | None, dumps: Callable[[object], bytes],
) -> NoReturn:  # fmt: skip
    """The forked child: run `fn`, write its pickled outcome to `write_fd`, and exit."""
    global _SPAWN_LOCK, _LIVE_LOCK, _SPAWNING
    code = 0
    try:
        # The fork happened under _SPAWN_LOCK (and maybe another thread's _LIVE_LOCK): this
        # child's copies stay held, and the parent's tools are not this child's to end.
        _SPAWN_LOCK, _LIVE_LOCK, _SPAWNING = threading.Lock(), threading.RLock(), False
        _LIVE.clear()
        os.close(read_fd)
        # Nothing of the parent's but the standard streams: other threads' tool pipes (their
        # read ends: the sweep for a daemon holding them would take this child for one) and,
        # in a server worker, the client's connection.
        os.closerange(3, write_fd)
        os.closerange(write_fd + 1, max_fd)
        os.setpgid(0, 0)
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL)
        if die_with_parent is not None:
            die_with_parent()
        try:
            payload = dumps(("ok", fn(*args)))
        except PyreeError as err:
            payload = dumps(("pyree", (err.what, err.file, err.fix, err.details)))
        except BaseException as exc:  # noqa: BLE001 - reported by the parent
            payload = dumps(("error", f"{type(exc).__name__}: {exc}"))
        view = memoryview(payload)
        while view:
            view = view[os.write(write_fd, view) :]
    except BaseException:  # noqa: BLE001
        code = 1
    finally:
        os._exit(code)


class _Child:
    """A forked child as end_group()'s wait_leader; keeps its wait status once reaped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.status: int | None = None

    def __call__(self, seconds: float) -> bool:
        if self.status is not None:  # reaped already
            return True
        end = time.monotonic() + seconds
        pause = 0.0002  # the child is usually exiting already: look again soon, then less often
        while True:
            done, st = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.status = st
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.01)


def _read_until_closed(pipe: BinaryIO, deadline: float, child: _Child) -> tuple[list[bytes], bool]:
    """What the child wrote until its end closed, and whether `deadline` came first. Once the
    child has exited, a descendant it left holding the pipe (a fork, even after setsid()) is
    ended rather than waited for. Raises Stopped when a stop comes meanwhile."""
    chunks: list[bytes] = []
    exited_at: float | None = None
    while True:
        if _STOP_SIGNAL is not None:
            raise Stopped(_STOP_SIGNAL)
        left = deadline - time.monotonic()
        if left <= 0:
            return chunks, True
        ready, _, _ = select.select([pipe], [], [], min(left, 0.25 if exited_at is None else _DRAIN_S))
        if not ready and child(0.0):
            exited_at = exited_at or time.monotonic()
            if time.monotonic() - exited_at >= _DRAIN_S:
                end_descendants([pipe])
        if ready:
            chunk = pipe.read(65536)
            if not chunk:
                return chunks, False
            chunks.append(chunk)


def _child_result(st: int, chunks: list[bytes], *, what: str, file: str | os.PathLike[str] | None) -> object:
    """The value the child returned, or the PyreeError for how it ended."""
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
