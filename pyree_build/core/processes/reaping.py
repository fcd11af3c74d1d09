"""Ending what pyree_build started: a tool's process group and session (end_group), what a
tool left behind outside its session (end_descendants: holders of its pipes, orphans this
process reaps as a subreaper), and every orphan a command adopted (command_ends_its_processes)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence

from pyree_build.core import lazy
from pyree_build.core.processes import stops

# Loaded when first used: only the prctl call needs it (ctypes).
libc = lazy.module("pyree_build.core.libc")

# How long a stopped tool gets to clean up after SIGTERM (toolchain.ninja ends its jobs, a nested
# pyree_build its tools and temporaries, which may mean finishing an in-process NVRTC
# compile) before everything left in its session gets SIGKILL.
STOP_GRACE_S = 10.0


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
    stops._killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    if not wait_leader(STOP_GRACE_S):
        stops._killpg(pgid, signal.SIGKILL)
        wait_leader(60.0)
    # Members may outlive the leader (a compiler's own children, toolchain.ninja's jobs): the same bound.
    while (_session_members(pgid) if has_proc else stops._killpg(pgid, 0)) and time.monotonic() < deadline:
        time.sleep(0.02)
    stops._killpg(pgid, signal.SIGKILL)
    for pid in _session_members(pgid) if has_proc else ():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


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
    with stops._SPAWN_LOCK:  # no child of ours is between its fork and its registration meanwhile
        with stops._LIVE_LOCK:
            ours = set(stops._LIVE)
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
            with stops._SPAWN_LOCK, stops._LIVE_LOCK:
                end_orphans((os.getpid(), 0), set(stops._LIVE) | before)


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
