"""Tools started by parallel threads (tune's variants, a verb's -j steps) never end each other.

The sweeps for what a finished tool left behind (an orphan reparented to a subreaper, a
process still holding the tool's pipes) once killed a sibling thread's tool: one started
after the finished tool but not yet registered, or a forked child that had inherited the
write ends of another tool's pipes while that tool's Popen was under way. Each test forces
the interleaving that went wrong, in a child interpreter (a subreaper must not be the test
process), and checks that the sibling ran to its end."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreapers and /proc are Linux's")


def _run(script: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_an_orphan_sweep_never_ends_a_sibling_started_while_it_looks():
    """Thread A's tool (runs_user_code) exits and its orphans are swept while thread B's tool
    has been forked but not yet registered (its registration held back 0.4 s)."""
    out = _run(
        """
        import threading, time
        from pyree_build.core import processes
        from pyree_build.core.processes import stops
        processes.become_subreaper()
        real_register = stops._register
        def late_register(pgid, name):
            if name == "sh":
                time.sleep(0.4)
            real_register(pgid, name)
        stops._register = late_register
        errors = []
        def sibling():
            time.sleep(0.05)  # after A's tool started, so that its start time is no earlier
            try:
                # Its output, not its exit status, says it ran to its end: a child killed and
                # reaped by the sweep reads as exit status 0 to subprocess (ECHILD).
                said = processes.spawn(["sh", "-c", "sleep 0.5; echo finished"], what="the sibling").stdout
                if said != "finished\\n":
                    errors.append(f"it was ended early (it printed {said!r})")
            except Exception as exc:
                errors.append(str(exc))
        b = threading.Thread(target=sibling)
        b.start()
        processes.spawn(["sleep", "0.15"], what="the plugin run", runs_user_code=True)
        b.join()
        print("sibling:", errors or "ran to its end")
        """
    )
    assert "sibling: ran to its end" in out, out


def test_the_orphan_sweep_reads_the_children_a_walk_of_proc_finds():
    """The sweep reads /proc/self/task/*/children instead of walking /proc: with a child of the
    main thread, one of a thread still running and an orphan reparented to this subreaper (a
    tool's `sh -c 'sleep &'`), both name the same processes."""
    out = _run(
        """
        import os, subprocess, tempfile, threading, time
        from pyree_build.core import processes
        from pyree_build.core.processes import reaping
        os.chdir(tempfile.mkdtemp())
        processes.become_subreaper()
        started, done = [], threading.Event()
        def other_thread():
            started.append(subprocess.Popen(["sleep", "30"]))
            done.wait()
        t = threading.Thread(target=other_thread)
        t.start()
        started.append(subprocess.Popen(["sleep", "30"]))
        subprocess.run(["sh", "-c", "sleep 30 & echo $! > orphan.pid"], check=True)
        while len(started) < 2:
            time.sleep(0.01)
        orphan = int(open("orphan.pid").read())
        me = str(os.getpid())
        walked = set()
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1] == me:
                    walked.add(int(entry))
            except OSError:
                pass
        read = reaping._children()
        for pid in walked:
            os.kill(pid, 9)
        done.set()
        print("unsupported" if read is None else f"same={set(read) == walked} orphan={orphan in walked} count={len(walked)}")
        """
    )
    if "unsupported" in out:
        pytest.skip("this kernel has no /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN): the sweep walks /proc")
    assert "same=True orphan=True count=3" in out, out


def test_a_forked_child_never_holds_a_siblings_pipes():
    """Thread B forks a child (call_in_child) while thread A's Popen holds its new pipes' write
    ends (the exec held back 0.3 s). A's tool exits at once; its pipes must reach EOF without
    B's child being taken for a daemon that holds them."""
    out = _run(
        """
        import threading, time
        from pyree_build.core import processes
        from pyree_build.core.processes import tools
        real_execute = tools._Tool._execute_child
        def slow_execute(self, *args, **kwargs):
            time.sleep(0.3)
            return real_execute(self, *args, **kwargs)
        tools._Tool._execute_child = slow_execute
        errors = []
        def sibling():
            time.sleep(0.1)  # inside A's held-back Popen
            try:
                assert processes.call_in_child(time.sleep, 4.0, what="the sibling call", file=None, timeout=30) is None
            except Exception as exc:
                errors.append(str(exc))
        b = threading.Thread(target=sibling)
        b.start()
        started = time.monotonic()
        processes.spawn(["true"], what="the quick tool")
        took = time.monotonic() - started
        b.join()
        print("sibling:", errors or "ran to its end")
        print(f"quick tool took {took:.2f} s")
        """
    )
    assert "sibling: ran to its end" in out, out
    took = float(out.split("quick tool took ")[1].split()[0])
    assert took < 3.0, f"the quick tool waited for the sibling's child to exit: {out}"


def test_a_forked_child_can_start_tools_of_its_own():
    """call_in_child forks while holding the spawn lock: the child's copy of it must not stay
    held, or the child's first tool would wait forever (here: until the timeout)."""
    out = _run(
        """
        from pyree_build.core import processes
        def child():
            return processes.spawn(["echo", "from the child"], what="echo").stdout
        print(processes.call_in_child(child, what="the child", file=None, timeout=20), end="")
        """
    )
    assert out == "from the child\n", out


def test_a_stop_between_a_fork_and_its_registration_still_ends_the_tool():
    """SIGTERM arrives (here: is sent) after the tool is forked and before it is registered: the
    stop handler raised there, out of the spawn, and the tool ran on with nothing to end it."""
    out = _run(
        """
        import os, signal, time
        from pyree_build.core import processes
        from pyree_build.core.processes import stops
        started = []
        real_register = stops._register
        def register_after_a_stop(pgid, name):
            started.append(pgid)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler runs meanwhile, between two bytecodes
            real_register(pgid, name)
        stops._register = register_after_a_stop
        outcome = "returned"
        try:
            with processes.stop_on_signals():
                processes.spawn(["sleep", "30"], what="a long tool")
        except processes.Stopped:
            outcome = "stopped"
        time.sleep(0.5)
        alive = os.path.exists(f"/proc/{started[0]}") and open(f"/proc/{started[0]}/stat").read().split(") ")[1][0] != "Z"
        print(outcome, "tool alive" if alive else "tool ended")
        """
    )
    assert out.split() == ["stopped", "tool", "ended"], out
