"""The only place that starts a tool: each in its own session, bounded, and ended when pyree_build stops.

One module per job, their public names re-exported here (`processes.spawn(...)`):

- stops: SIGINT/SIGTERM and request_stop, the registry of live process groups a stop ends,
  the spawn lock, a command's time limit;
- tools: spawn, stream and ran_elsewhere (a tool's run and how it ended), thread_pool;
- reaping: ending a tool's group and session, what it left behind, a command's orphans;
- child: call_in_child (a function run in a bounded forked child).

A module-level global that is rebound (stops._STOP_SIGNAL, stops._SPAWN_LOCK,
tools._PARENT_ENDS_TOOLS, reaping._SUBREAPER...) lives in its module only: read and set it
there, never through a copy imported here.
"""

from __future__ import annotations

from pyree_build.core.processes.child import call_in_child
from pyree_build.core.processes.reaping import (
    STOP_GRACE_S,
    become_subreaper,
    born_since,
    command_ends_its_processes,
    end_descendants,
    end_group,
    end_orphans,
    start_ticks,
)
from pyree_build.core.processes.stops import Stopped, check_stopped, request_stop, shielded, signal_name, stop_on_signals, time_limit
from pyree_build.core.processes.tools import parent_ends_tools, ran_elsewhere, spawn, stream, thread_pool

__all__ = [
    "STOP_GRACE_S",
    "Stopped",
    "become_subreaper",
    "born_since",
    "call_in_child",
    "check_stopped",
    "command_ends_its_processes",
    "end_descendants",
    "end_group",
    "end_orphans",
    "parent_ends_tools",
    "ran_elsewhere",
    "request_stop",
    "shielded",
    "signal_name",
    "spawn",
    "start_ticks",
    "stop_on_signals",
    "stream",
    "thread_pool",
    "time_limit",
]
