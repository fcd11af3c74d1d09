"""The server's loop: keep spares waiting for clients, take workers' notices and reports
(pages to copy ahead, facts learned), and exit once idle or no longer the socket's server."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import time

from pyree_build.cache import facts
from pyree_build.server import prefault
from pyree_build.server.pool import Pool, drain
from pyree_build.server.state import FACTS, MAX_REPORT, SETTLED_BELOW, State, ours


def serve(sock: socket.socket, state: State) -> None:
    """Keep spare workers waiting for connections until idle (no request, no worker) for
    state.idle_s, or until the socket is no longer ours (removed, or taken by a newer server)."""
    notices_r, notices_w = os.pipe()
    os.set_blocking(notices_r, False)
    sock.setblocking(False)  # for the spares: see wait_for_client
    reports, state.report = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    reports.setblocking(False)
    # A worker's end is seen at once (SIGCHLD wakes the loop), so the tools of one that was
    # killed are ended at once too.
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    pool = Pool(sock, state, notices_w, notices_r)
    pool.refill(client_waiting=False)
    last = time.monotonic()
    try:
        while True:
            pool.reap()
            now = time.monotonic()
            if pool.children:
                last = now
            elif now - last >= state.idle_s or not ours(state):
                return
            # The listening socket only when no spare is left to take a client (else they do).
            waits: list[int | socket.socket] = [notices_r, reports.fileno(), wake_r, *([] if pool.spares else [sock])]
            quiet = pool.quiet_in()
            timeout = max(0.0, min(1.0, state.idle_s - (now - last), quiet if quiet is not None else 1.0))
            ready, _, _ = select.select(waits, [], [], timeout)
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
            _learn(reports, state)
            for kind, pid in drain(notices_r) if notices_r in ready else []:
                pool.note(kind, pid)
            pool.reap()
            if pool.refill(client_waiting=sock in ready):
                last = time.monotonic()
    finally:
        # Only the server: a forked worker must never get here (pool._spare), as its copies of the
        # spares are other processes' workers, and its drain would take the server's notices.
        if os.getpid() == state.pid:
            pool.kill_spares()


def _learn(reports: socket.socket, state: State) -> None:
    """Take what workers reported: the pages they wrote, which the next spares copy ahead; the
    facts they learned (cache/facts.py), which the next spares then know."""
    while True:
        try:
            data = reports.recv(MAX_REPORT)
        except BlockingIOError:
            return
        if data[:1] == FACTS:
            with contextlib.suppress(ValueError):
                facts.absorb(json.loads(data[1:]))
            continue
        new = prefault.learn(state.learned, prefault.decode(data[1:]))
        state.settled = state.settled + 1 if new < SETTLED_BELOW else 0
        state.learned_pages = len(state.learned)
