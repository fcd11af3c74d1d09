"""pyree_build's fixed cost per verb (issue 17, item 2), side by side in one run.

    python benchmarks/overhead.py [--repeat 7] [--baseline REV]

Rows: `python -c pass`; `pyree-build --version`; a warm cache hit of the sample's 3-arch
standalone plugin and of its system plugin; `run` of the sample with its plugin against
iree-run-module with the same flags; `compile` (cache off) against iree-compile. Every
command of a row runs once to warm up, then all alternate `--repeat` times; each prints its
median and min-max in ms, and a verb's overhead over the raw tool (median difference).
With --baseline REV, the same verbs also run from pyree_build as committed at REV (exported
with `git archive`), so before and after are measured in the same run, on the same load.

Children run with PYTHONDONTWRITEBYTECODE unset, as an installed wheel runs (with .pyc
files); with it set, each command compiles pyree_build's sources again (~30 ms).
Targets: cache hit <= 60 ms; overhead over the raw tools <= 40 ms.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLUGIN = REPO / "samples" / "custom_dispatch" / "cpu" / "plugin"
ARCHS = ("x86_64", "aarch64", "riscv64")


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    # Outside the checkout: `python -m` puts the working directory first on sys.path, which
    # would run this checkout's pyree_build for every tree.
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tempfile.gettempdir())
    return time.perf_counter() - start


def export(rev: str, into: Path) -> Path:
    """pyree_build as committed at `rev`, in a directory of its own."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "pyree_build"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def row(label: str, commands: dict[str, tuple[list[str], dict[str, str]]], repeat: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in commands}
    for argv, env in commands.values():
        timed(argv, env)  # warm: .pyc files, page cache, the plugin's first load
    for _ in range(repeat):
        for name, (argv, env) in commands.items():
            times[name].append(timed(argv, env))
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"\n{label}")
    for name, t in times.items():
        extra = ""
        if "raw" in medians and name != "raw":
            extra = f"   overhead {1000 * (medians[name] - medians['raw']):+7.1f} ms   {medians[name] / medians['raw']:.2f}x raw"
        print(f"  {name:<10} median {1000 * medians[name]:7.1f} ms  (min-max {1000 * min(t):6.1f}-{1000 * max(t):6.1f}){extra}")
    return medians


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--baseline", metavar="REV", help="also time pyree_build as committed at REV (e.g. a commit before the cuts)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from pyree_build.actions import compile as compile_action
    from pyree_build.core import toolchain

    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory(prefix="pyree-overhead.") as tmp:
        work = Path(tmp)
        trees = {"now": REPO}
        if args.baseline:
            trees = {"before": export(args.baseline, work / "before"), **trees}
        envs = {name: dict(base, PYTHONPATH=str(tree), PYREE_BUILD_CACHE=str(work / f"cache-{name}")) for name, tree in trees.items()}

        def verb(*a: str | os.PathLike[str]) -> list[str]:
            return [sys.executable, "-m", "pyree_build", *map(os.fspath, a)]

        py = sys.executable
        print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} (1, 5, 15 min)")
        row("python start-up: -c pass (with site, as every command) / -S (no site, no .pth files)",
            {"site": ([py, "-c", "pass"], base), "no-site": ([py, "-S", "-c", "pass"], base)}, args.repeat)  # fmt: skip
        pth = subprocess.run([py, "-X", "importtime", "-c", "pass"], capture_output=True, text=True, env=base).stderr
        cmeel = [int(line.split("|")[1]) for line in pth.splitlines() if line.count("|") == 2 and line.split("|")[2].strip() == "cmeel_pth"]
        if cmeel:
            print(f"  of which the venv's cmeel .pth file imports {cmeel[0] / 1000:.1f} ms (-X importtime; environment, not pyree_build)")

        row("pyree-build --version", {name: (verb("--version"), env) for name, env in envs.items()}, args.repeat)

        arch_args = [x for a in ARCHS for x in ("--arch", a)]
        for name, env in envs.items():  # fill each tree's cache
            subprocess.run(
                verb("plugin", "-q", "--kind", "standalone", *arch_args, PLUGIN / "standalone_plugin.c", "-o", work / f"{name}.sos"),
                check=True,
                env=env,
                cwd=work,
            )
            subprocess.run(verb("plugin", "-q", PLUGIN / "system_plugin.c", "-o", work / f"{name}.so"), check=True, env=env, cwd=work)
        row("cache hit: plugin --kind standalone, 3 arches (FatELF)",
            {name: (verb("plugin", "-q", "--kind", "standalone", *arch_args, PLUGIN / "standalone_plugin.c", "-o", work / f"{name}.sos"), env) for name, env in envs.items()},
            args.repeat)  # fmt: skip
        row("cache hit: plugin --kind system",
            {name: (verb("plugin", "-q", PLUGIN / "system_plugin.c", "-o", work / f"{name}.so"), env) for name, env in envs.items()}, args.repeat)  # fmt: skip

        module = work / "example.vmfb"
        subprocess.run(verb("compile", "-q", PLUGIN / "example.mlir", "-o", module), check=True, env=envs["now"], cwd=work)
        inputs = ["8xf32=2", "8xf32=4"]
        raw_run = toolchain.iree_run_module().command(
            f"--module={module}", "--function=mixed_invocation", *(f"--input={i}" for i in inputs), f"--executable_plugin={work / 'now.so'}"
        )
        row("run the sample with its system plugin (iree-run-module)",
            {"raw": (raw_run, base), **{name: (verb("run", module, "--function", "mixed_invocation", *(a for i in inputs for a in ("--input", i)), "--plugin", work / f"{name}.so"), env) for name, env in envs.items()}},
            args.repeat)  # fmt: skip

        raw_compile = toolchain.iree_compile().command(PLUGIN / "example.mlir", *compile_action.target_flags("llvm-cpu"), "-o", work / "raw.vmfb")
        row("compile the sample, cache off (iree-compile)",
            {"raw": (raw_compile, base), **{name: (verb("compile", "-q", PLUGIN / "example.mlir", "-o", work / f"{name}.vmfb"), dict(env, PYREE_BUILD_CACHE="off")) for name, env in envs.items()}},
            args.repeat)  # fmt: skip
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
