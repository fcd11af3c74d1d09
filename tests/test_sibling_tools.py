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
        processes.become_subreaper()
        real_register = processes._register
        def late_register(pgid, name):
            if name == "sh":
                time.sleep(0.4)
            real_register(pgid, name)
        processes._register = late_register
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


def test_a_forked_child_never_holds_a_siblings_pipes():
    """Thread B forks a child (call_in_child) while thread A's Popen holds its new pipes' write
    ends (the exec held back 0.3 s). A's tool exits at once; its pipes must reach EOF without
    B's child being taken for a daemon that holds them."""
    out = _run(
        """
        import threading, time
        from pyree_build.core import processes
        real_execute = processes._Tool._execute_child
        def slow_execute(self, *args, **kwargs):
            time.sleep(0.3)
            return real_execute(self, *args, **kwargs)
        processes._Tool._execute_child = slow_execute
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
        started = []
        real_register = processes._register
        def register_after_a_stop(pgid, name):
            started.append(pgid)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler runs meanwhile, between two bytecodes
            real_register(pgid, name)
        processes._register = register_after_a_stop
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
