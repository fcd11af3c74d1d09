"""The per-user server: a warm process that has imported what commands need and forks one
worker per connection, so a command costs a fork instead of a Python start-up and its imports.

The accept loop is single-threaded and starts no threads (BLAS pools are held to one thread
before numpy loads), so fork is safe. A worker owns its connection: it receives the client's
fds 0-2 and runs the CLI on them (output goes straight to the client's terminal or pipes, in
order, isatty where it is), in the client's cwd, umask and environment; a signal number from
the client is raised in the worker (processes.stop_on_signals stops the tools as in process),
and the client vanishing is a SIGTERM. The server exits after an idle time, when its package
files change (it answers "stale", so the client starts a fresh one), or on `server stop`.

The server's jobs, one module each: startup.py (imports, warm-up, the socket), pool.py (spares
and workers), serve.py (the loop), worker.py (one command in a forked worker); state.py holds
what they share. This module ties them: main() is the server's entry.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal

from pyree_build.cache import facts
from pyree_build.client import protocol
from pyree_build.core import libc, processes
from pyree_build.server import reuse
from pyree_build.server.serve import serve
from pyree_build.server.startup import NOT_PRELOADED, listen, on_term, preload
from pyree_build.server.state import State, log, unlink_if_ours
from pyree_build.server.watch import Watch

__all__ = ["NOT_PRELOADED", "State", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyree_build.server", description="the per-user pyree_build server (started by the client)")
    parser.add_argument("--socket", required=True, help="the socket path (core/protocol.socket_path)")
    parser.add_argument("--idle", type=float, default=None, help=f"seconds without work before exiting (default ${protocol.IDLE_ENV} or 900)")
    a = parser.parse_args(argv)
    os.closerange(3, 1 << 16)  # nothing the client's parent passed down (a jobserver's pipe) stays open here
    try:
        idle = protocol.idle_seconds({protocol.IDLE_ENV: str(a.idle)} if a.idle is not None else os.environ)
    except protocol.BadSetting as err:
        raise SystemExit(str(err)) from None
    state = State(a.socket, idle, Watch())  # before the imports: an edit during them is seen
    gc.disable()  # no collection in the server: it would leave freed holes in pages its workers share
    preload()
    facts.absorb([])  # what the imports learned is the server's own: no worker reports it back
    state.plan = reuse.Plan.of_loaded()
    libc.function("prctl")  # looked up before the forks
    context = protocol.context()
    if context is None:
        raise SystemExit("pyree_build server: /proc/self cannot be read, so no client's context can be compared with this server's")
    state.context = context
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    os.chdir("/")  # no client's directory is held busy
    state.reaps = processes.become_subreaper()
    sock, state.inode, state.bound = listen(a.socket)
    log(f"pid {os.getpid()} listening on {a.socket}")
    try:
        serve(sock, state)
    finally:
        if os.getpid() == state.pid:  # never in a forked spare or worker (see pool._spare)
            unlink_if_ours(state)
    return 0
