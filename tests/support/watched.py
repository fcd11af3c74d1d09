"""Shared by the tests: Watched, leftovers, RUN_ARGS, plugin_variant, process_table, slow_c_source, is_server_process, PF_EXITING, descendants, marked (once in test_stop.py)."""

from __future__ import annotations

import os
import random
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PLUGIN_SAMPLE, run_cli

# task->flags bit (the 9th field of /proc/PID/stat) of a process inside exit(): it runs no more
# code and its command line already reads empty, but it stays "R" or "D" until it is a zombie.
PF_EXITING = 0x4


def process_table() -> dict[int, tuple[int, int, int, str, str]]:
    """pid -> (ppid, pgrp, session, state, command line) of every process; the state of one
    already inside exit() is "X" (dead): a server's worker that has answered its client is still
    there for a moment, and its empty command line no longer says it is the server's."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:  # the command line first: read empty because the process began to exit, its stat then says so
            cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = Path(f"/proc/{entry.name}/stat").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[1].split()
        state = "X" if int(fields[6]) & PF_EXITING else fields[0].decode()
        table[int(entry.name)] = (int(fields[1]), int(fields[2]), int(fields[3]), state, cmdline)
    return table


def descendants(root: int, table: dict[int, tuple[int, int, int, str, str]]) -> set[int]:
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, row in table.items() if row[0] in frontier and pid not in found}
        found |= frontier
    return found


def marked(marker: bytes) -> set[int]:
    """Processes whose environment holds `marker`: the tools a server's worker started for a
    client (they are not below the client, which only waits, but inherit its environment)."""
    found = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if marker in Path(f"/proc/{entry.name}/environ").read_bytes():
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


class Watched:
    """A pyree_build process, with every process, group and session seen below it (and below
    the tools its server's worker started for it)."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.marker = f"PYREE_TEST_WATCH={random.random()}"
        env = dict(env, PYREE_TEST_WATCH=self.marker.partition("=")[2])
        # Its own session, as a shell job would be; the signal goes to its pid only.
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.pids: set[int] = set()
        self.groups: set[int] = set()

    def wait_for(self, marker: str, timeout: float = 120) -> None:
        """Poll until a descendant whose command line contains `marker` runs."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            table = process_table()
            below = descendants(self.proc.pid, table)
            for root in marked(self.marker.encode()) & table.keys():
                below |= {root, *descendants(root, table)}
            self.pids |= below
            self.groups |= {table[p][1] for p in below} | {table[p][2] for p in below}
            if any(marker in table[p][4] and table[p][3] not in "ZX" for p in below):
                return
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                pytest.fail(f"finished before {marker} was seen (rc {self.proc.returncode}): {err[-3000:]}")
            time.sleep(0.005)
        pytest.fail(f"no {marker} process appeared within {timeout} s")

    def stop(self, sig: int) -> tuple[int, str]:
        os.kill(self.proc.pid, sig)
        self.out, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, err

    def survivors(self) -> list[str]:
        """Processes still running (not zombies) that were below pyree_build or share a tool's
        group or session. The per-user server (and the spare worker it keeps) outlives every
        command by design: started by this client, it was below it for a while."""
        table = process_table()
        own = {os.getpid(), *descendants(os.getpid(), table)} - self.pids
        return [
            f"{pid} {row[4]}"
            for pid, row in table.items()
            if row[3] not in "ZX" and pid not in own and not is_server_process(row[4]) and (pid in self.pids or row[1] in self.groups or row[2] in self.groups)
        ]


def is_server_process(cmdline: str) -> bool:
    """The per-user server or one of its workers: started as `python -c BOOT PACKAGE_DIR server
    --socket PATH` (client/protocol.boot_argv)."""
    return " server --socket " in cmdline


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*") if p.name.endswith((".tmp", ".build")) or ".tmp" in p.name)


def slow_c_source(path: Path) -> Path:
    """The sample's standalone plugin plus a function that keeps the compiler busy for a while
    (and a random comment, so that no compiler cache answers for it)."""
    body = "\n".join(f"  v = v * {i % 7 + 3} + (v >> {i % 5 + 1}) + {i};" for i in range(1200))
    path.write_text(
        (PLUGIN_SAMPLE / "standalone_plugin.c").read_text()
        + f"\n/* {random.random()} */\nunsigned long slow_to_compile(unsigned long v) {{\n{body}\n  return v;\n}}\n"
    )
    return path


def plugin_variant(tmp_path: Path, name: str, statement: str) -> Path:
    """The sample's system plugin whose import first runs `statement`."""
    anchor = "  const mul_args_t* a = (const mul_args_t*)params_ptr;\n"
    text = (PLUGIN_SAMPLE / "system_plugin.c").read_text()
    assert anchor in text
    src = tmp_path / f"{name}.c"
    src.write_text(text.replace(anchor, anchor + statement + "\n"))
    so = tmp_path / f"{name}.so"
    built = run_cli("plugin", src, "-o", so)
    assert built.returncode == 0, built
    return so


RUN_ARGS = ["--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4"]
