"""Starting a tool: spawn (and stream, ran_elsewhere) run one in a session of its own, bounded
by its timeout and the command's time limit, registered so that a stop ends it, and turn how
it ended into a PyreeError; thread_pool runs a verb's independent steps."""

from __future__ import annotations

import contextlib
import functools
import locale
import os
import re
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from pyree_build.core import echo, lazy
from pyree_build.core.errors import PyreeError, trim
from pyree_build.core.processes import reaping, stops

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

# Loaded when first used, not by every verb: a cache hit needs no pool (~5 ms).
futures = lazy.module("concurrent.futures")


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
    _ = futures.ThreadPoolExecutor  # its first read imports concurrent.futures.thread


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
        return super()._wait(timeout)  # type: ignore[misc]


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
    stops.check_stopped()
    timeout, command_limit = stops._bounded(timeout)
    proc = _start(args, cwd=cwd, piped_stdin=stdin is not None, env=full_env)
    stdout, stderr, timed_out = _run_started(proc, stdin, timeout, runs_user_code=runs_user_code)
    stops.check_stopped()  # our tool was ended by a stop: say so, not "the tool failed"
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
    stops.check_stopped()
    _, command_limit = stops._bounded(timeout)
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
            f"{what} was killed by {stops.signal_name(-result.returncode)}",
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
    ticks = reaping.start_ticks(proc.pid) if reaping._SUBREAPER and runs_user_code else None
    tool = (proc.pid, ticks) if ticks is not None else None
    try:
        return _communicate(proc, stdin, timeout)
    except BaseException:
        reaping.end_group(proc.pid, _Popen(proc))
        raise
    finally:
        stops._unregister(proc.pid)
        if tool is not None:  # what it left that closed its pipes too (a daemon) was reparented here
            reaping.end_descendants(tool=tool)


# strerror(ENOSPC), as tools print it.
_DISK_FULL = "No space left on device"
# What LLVM's crash handler (iree-compile, clang, lld) prints before its backtrace.
_CRASH_BANNER = "Stack dump:"
_REPORT_TO = re.compile(r"(?:report issues to|submit a bug report to)\s+(\S+?)[.,]?(?:\s|$)", re.IGNORECASE)


def _tool_crashed(what: str, file: str | os.PathLike[str] | None, args: list[str], returncode: int, output: str) -> PyreeError:
    """A tool that crashed (a signal, or LLVM's crash handler): a bug in the tool, so the
    message says so, shows what it said before crashing, and never blames the input's lines."""
    how = f"was killed by {stops.signal_name(-returncode)}" if returncode < 0 else f"crashed (exit code {returncode})"
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
        with stops._spawning():
            proc = _Tool(
                [*wrapper, *args], cwd=cwd, stdin=subprocess.PIPE if piped_stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", env=env,
                start_new_session=True,
            )  # fmt: skip
            stops._register(proc.pid, args[0])
        return proc
    except FileNotFoundError as exc:
        raise PyreeError(f"cannot run {args[0]}: {exc.strerror}", fix="run `pyree-build doctor` to see which tools are found") from None


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
            stdout, stderr = proc.communicate(pending, timeout=slice_s if exited_at is None else min(slice_s, reaping._DRAIN_S))
            return stdout, stderr, False
        except subprocess.TimeoutExpired:
            pending = None
            if stops._STOP_SIGNAL is not None:
                raise stops.Stopped(stops._STOP_SIGNAL) from None
            if proc.poll() is not None:  # the tool has exited; only something it left holds the pipes
                if exited_at is None:
                    exited_at = time.monotonic()
                elif time.monotonic() - exited_at >= reaping._DRAIN_S:
                    reaping.end_descendants([proc.stdout, proc.stderr])
            if deadline is not None and time.monotonic() >= deadline:
                reaping.end_group(proc.pid, _Popen(proc))
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
    stops.check_stopped()
    wrapper = _wrapper()
    try:
        if wrapper and not shutil.which(args[0]):
            raise FileNotFoundError(2, "No such file or directory")
        # Its own session, like every tool `spawn` starts: a stop ends it and all its jobs.
        with stops._spawning():
            proc = _Tool(
                [*wrapper, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                errors="replace", bufsize=1, start_new_session=True,
            )  # fmt: skip
            stops._register(proc.pid, args[0])
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
        reaping.end_group(proc.pid, _Popen(proc))
        raise
    finally:
        stops._unregister(proc.pid)
    stops.check_stopped()  # ended by a stop: say so, not "the tool failed"
    output = "".join(lines)
    if check and proc.returncode != 0:
        raise PyreeError(f"{what} failed (exit code {proc.returncode})", file=file, details=output or "(the tool printed nothing)",
                         command=args, fix=fix)  # fmt: skip
    return subprocess.CompletedProcess(args, proc.returncode, output, "")
