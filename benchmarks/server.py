"""What the per-user server saves (issue 23, item 5), side by side in one run.

    python benchmarks/server.py [--repeat 15] [--only run,hit,verbs,cache]

Every command runs through each client in turn: `typed` (the `pyree-build` pip installed beside
this Python: the native client, CMakeLists.txt), `native` (the client CMake runs,
`--native-client`), `python` (`python -m pyree_build`, the Python client's path), all served
by a warm server, and `off` (PYREE_BUILD_SERVER=off: the whole CLI in a fresh process, as before
the server). Rows alternate their commands `--repeat` times and print medians:

  run    `run` of the cpu/plugin sample with its system plugin  vs  the raw iree-run-module
         binary with the same flags (target <= 1.5x). The same command line each time: from
         its second run on, the native clients run the tool from the run's plan
         (client/plans.py) without the server
  split  where that run's milliseconds go: the tool, the worker's own work (the CLI in this
         warm process), a served run (the typed client with another environment each time,
         so that no plan applies), the typed client from the plan (minimums); and the setpriv
         wrapper a command in its own process spawns its tools under
  hit    a cache hit of the sample's system plugin  vs  `python -S -c pass` (target <= +5 ms)
  verbs  benchmarks/run.py's verbs section (3-arch standalone plugin and objects against the
         raw tools, zig's cache cold on both sides; target <= 1.3x), each verb through the native client
  cache  benchmarks/run.py's cache section (warm against cold of the sample plugin; target >= 10x),
         through the native client

Children run with PYTHONDONTWRITEBYTECODE unset, as an installed wheel runs (with .pyc files).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO), str(BENCH)]

import run as run_bench  # noqa: E402  benchmarks/run.py: its sections, through the native client

from pyree_build.client import native as native_client  # noqa: E402
from pyree_build.client import protocol  # noqa: E402
from pyree_build.core import toolchain  # noqa: E402
from pyree_build.core.processes import tools  # noqa: E402

PLUGIN = REPO / "samples" / "custom_dispatch" / "cpu" / "plugin"
INPUTS = ("8xf32=2", "8xf32=4")


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tempfile.gettempdir())
    return time.perf_counter() - start


def row(label: str, commands: dict[str, tuple[list[str], dict[str, str]]], repeat: int, base: str) -> dict[str, float]:
    """Alternate the commands; print each median and its ratio to (and difference from) `base`."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for argv, env in commands.values():
        timed(argv, env)  # warm: the server, .pyc files, the page cache
    for _ in range(repeat):
        for name, (argv, env) in commands.items():
            times[name].append(timed(argv, env))
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"\n{label}")
    for name, t in times.items():
        extra = "" if name == base else f"   {1000 * (medians[name] - medians[base]):+7.1f} ms   {medians[name] / medians[base]:5.2f}x {base}"
        print(f"  {name:<8} median {1000 * medians[name]:7.1f} ms  (min-max {1000 * min(t):6.1f}-{1000 * max(t):6.1f}){extra}")
    return medians


TYPED = Path(sys.executable).with_name("pyree-build")


def clients(work: Path, env: dict[str, str]) -> dict[str, tuple[list[str], dict[str, str]]]:
    native = native_client.build(work / "client")
    typed = {"typed": ([str(TYPED)], dict(env, PYREE_BUILD_SERVER="on"))} if TYPED.is_file() else {}
    return {
        **typed,
        "native": ([str(native)], dict(env, PYREE_BUILD_SERVER="on")),
        "python": ([sys.executable, "-m", "pyree_build"], dict(env, PYREE_BUILD_SERVER="on")),
        "off": ([sys.executable, "-m", "pyree_build"], dict(env, PYREE_BUILD_SERVER="off")),
    }


def section_run(work: Path, env: dict[str, str], repeat: int) -> None:
    module, plugin = work / "example.vmfb", work / "plugin.so"
    subprocess.run([sys.executable, "-m", "pyree_build", "compile", "-q", PLUGIN / "example.mlir", "-o", module], check=True, env=env)
    subprocess.run([sys.executable, "-m", "pyree_build", "plugin", "-q", PLUGIN / "system_plugin.c", "-o", plugin], check=True, env=env)
    raw = toolchain.iree_run_module().command(
        f"--module={module}", "--function=mixed_invocation", *(f"--input={i}" for i in INPUTS), f"--executable_plugin={plugin}"
    )
    args = ["run", str(module), "--function", "mixed_invocation", *(a for i in INPUTS for a in ("--input", i)), "--plugin", str(plugin)]
    commands = {"raw": (raw, env), **{name: ([*argv, *args], e) for name, (argv, e) in clients(work, env).items()}}
    row("run the cpu/plugin sample with its system plugin  vs  the iree-run-module binary (target <= 1.5x)", commands, repeat, "raw")


def section_split(work: Path, env: dict[str, str], repeat: int) -> None:
    """Where a served `run`'s milliseconds go, each step measured side by side (minimums, the
    least disturbed by load): the tool alone; under the setpriv wrapper every spawn uses; the
    CLI called in this warm process (what a worker does: checks, scratch directory, spawn,
    .npy results); the typed client served (that plus the client and the server's hand-off:
    another environment each time, so that no plan applies), and from the run's plan."""
    module, plugin = work / "example.vmfb", work / "plugin.so"
    if not module.is_file():
        section_run(work, env, 1)
    raw = toolchain.iree_run_module().command(
        f"--module={module}", "--function=mixed_invocation", *(f"--input={i}" for i in INPUTS), f"--executable_plugin={plugin}"
    )
    args = ["run", str(module), "--function", "mixed_invocation", *(a for i in INPUTS for a in ("--input", i)), "--plugin", str(plugin)]
    wrapper = list(tools._pdeathsig_wrapper())
    typed = [str(TYPED)] if TYPED.is_file() else [*clients(work, env)["native"][0]]
    cli_main = importlib.import_module("pyree_build.cli").main

    def in_process() -> float:
        # As a served worker spawns: the server ends a killed worker's tools, so no wrapper.
        saved, tools._PARENT_ENDS_TOOLS = tools._PARENT_ENDS_TOOLS, True
        start = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                assert cli_main(["-q", *args]) == 0
            return time.perf_counter() - start
        finally:
            tools._PARENT_ENDS_TOOLS = saved

    steps: dict[str, Callable[[], float]] = {
        "tool": lambda: timed(raw, env),
        "wrapped": lambda: timed([*wrapper, *raw], env),
        "worker": in_process,
        "served": lambda: timed([*typed, *args], dict(env, PYREE_BUILD_SERVER="on", PYREE_BENCH_NONCE=str(time.monotonic_ns()))),
        "typed": lambda: timed([*typed, *args], dict(env, PYREE_BUILD_SERVER="on")),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():
        step()
    for _ in range(repeat):
        for name, step in steps.items():
            times[name].append(step())
    best = {name: 1000 * min(t) for name, t in times.items()}
    print("\nwhere a served run's time goes (minimum of each)")
    labels = {
        "tool": "iree-run-module itself",
        "worker": "+ pyree_build's own work in a warm process, spawning as a served worker does (checks, scratch dir, .npy results)",
        "served": "+ the typed client and the server's hand-off (connect, fds, the waiting worker, its first touches; a new plan written)",
    }
    previous = 0.0
    for name, label in labels.items():
        print(f"  {name:<8} {best[name]:7.1f} ms  ({best[name] - previous:+6.1f} ms  {label})")
        previous = best[name]
    print(f"  typed    {best['typed']:7.1f} ms  ({best['typed'] - best['tool']:+6.1f} ms over the tool: the typed client running it from the run's plan)")
    print(f"  served / tool: {best['served'] / best['tool']:.2f}x; from the plan: {best['typed'] / best['tool']:.2f}x")
    print(f"  (in its own process, a command spawns each tool under setpriv --pdeathsig: {best['wrapped'] - best['tool']:+.1f} ms)")


def section_hit(work: Path, env: dict[str, str], repeat: int) -> None:
    args = ["plugin", "-q", str(PLUGIN / "system_plugin.c"), "-o", str(work / "hit.so")]
    subprocess.run([sys.executable, "-m", "pyree_build", *args], check=True, env=env)
    commands = {"python-S": ([sys.executable, "-S", "-c", "pass"], env), **{name: ([*argv, *args], e) for name, (argv, e) in clients(work, env).items()}}
    row("cache hit: plugin --kind system  vs  python -S -c pass (target <= +5 ms)", commands, repeat, "python-S")


def _through_native(work: Path) -> None:
    """benchmarks/run.py's verbs, run by the native client."""
    native = str(native_client.build(work / "client"))
    run_bench.pyree = lambda *a: [native, *map(os.fspath, a)]


def section_verbs(work: Path, env: dict[str, str], repeat: int) -> None:
    _through_native(work)
    run_bench.section_verbs(work, repeat)


def section_cache(work: Path, env: dict[str, str], repeat: int) -> None:
    _through_native(work)
    run_bench.section_cache(work, repeat)


SECTIONS = {"run": section_run, "split": section_split, "hit": section_hit, "verbs": section_verbs, "cache": section_cache}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--only", default=",".join(SECTIONS))
    parser.add_argument("--rows", default="", help="verbs/cache: only rows whose label contains one of these (benchmarks/run.py --rows)")
    a = parser.parse_args()
    run_bench.ROWS[:] = [r.strip() for r in a.rows.split(",") if r.strip()]
    print(f"machine: {os.cpu_count()} cores, load {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1, 5, 15 min)")
    with tempfile.TemporaryDirectory(prefix="pyree-server.", dir="/tmp") as tmp:
        work = Path(tmp)
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        # A server of this benchmark's own (its socket directory), stopped at the end.
        os.environ.update(XDG_RUNTIME_DIR=str(work), PYREE_BUILD_CACHE=str(work / "cache"))
        env = dict(os.environ)
        try:
            for name in a.only.split(","):
                SECTIONS[name.strip()](work, env, a.repeat)
        finally:
            report = protocol.control("stop", env)
            if report:
                print(f"\n(server pid {report['pid']} served {report['requests']} requests)")
            else:
                print("\nWARNING: no server ran: every served column measured the in-process path")
    return 0


if __name__ == "__main__":
    sys.exit(main())
