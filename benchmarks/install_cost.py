"""What pyree_build's default install and each extra cost (issue 25, items 3 and 4).

    python benchmarks/install_cost.py [--repeat 15] [--wheels DIR]

Sizes: for the default install and for each extra, the distributions it adds (requirements
walked recursively through the installed metadata, markers evaluated for this machine; an
extra's are those the default install does not already bring) and their installed size: the
sum of the sizes that each distribution's RECORD lists, in this environment. With --wheels DIR
(a directory of `pip download --no-deps` wheels) the download size too.

Start-up: two fresh virtual environments (`python -m venv --without-pip`), one holding the
default install's distributions and one with [vulkan]'s added; each distribution's files are
linked from this environment (no download). Each runs `python -c pass` --repeat times (the
median and the minimum in ms) and `python -X importtime -c pass`, which names every module
imported at start-up that is not the standard library's: the default install must name none.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from importlib import metadata
from pathlib import Path

from pyree_build.core import extras

# Distributions a fresh `python -m venv` holds (pip, and setuptools in older Pythons).
SEEDED = {"pip", "setuptools", "wheel"}


def closure(roots: set[str], extra: str = "") -> set[str]:
    """`roots` and every distribution they require here (each root's requirements read with
    `extra`; theirs with none)."""
    seen: set[str] = set()
    todo = [(extras.normalize(r), extra) for r in roots]
    environment = extras.marker_environment()
    while todo:
        name, wanted = todo.pop()
        if name in seen and not wanted:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            dist, nested, marker = extras.parse_requirement(line)
            if marker and not extras.marker_holds(marker, {**environment, "extra": wanted}):
                continue
            todo.extend([(dist, "")] + [(dist, e) for e in nested])
    return seen


def installed_bytes(dist: str) -> int:
    try:
        files = metadata.distribution(dist).files or []
    except metadata.PackageNotFoundError:
        return 0
    return sum(f.size or 0 for f in files)


def wheel_bytes(dist: str, wheels: Path | None) -> int:
    if wheels is None:
        return 0
    stem = dist.replace("-", "_")
    return sum(w.stat().st_size for w in wheels.glob("*.whl") if extras.normalize(w.name.split("-")[0]) == extras.normalize(stem))


def sets() -> dict[str, set[str]]:
    """The default install's distributions ("default"), and each extra's beyond those."""
    default = closure({extras.DIST})
    result = {"default": default - {extras.normalize(extras.DIST)}}
    for extra in extras.this_package() or {}:
        if extra not in extras.DEVELOPER_EXTRAS:
            result[extra] = closure({extras.DIST}, extra) - default
    return result


def print_sizes(groups: dict[str, set[str]], wheels: Path | None) -> None:
    print(f"{'install':<10} {'installed MB':>12} {'wheels MB':>10}  distributions")
    for name, dists in groups.items():
        size = sum(installed_bytes(d) for d in dists) / 1e6
        download = sum(wheel_bytes(d, wheels) for d in dists) / 1e6
        shown = f"{download:10.0f}" if wheels else f"{'-':>10}"
        print(f"{name:<10} {size:12.0f} {shown}  {', '.join(sorted(dists))}")


def make_venv(where: Path, dists: set[str]) -> Path:
    """A fresh venv whose site-packages links each distribution's files from this environment."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", where], check=True)
    python = where / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())  # fmt: skip
    here = Path(sysconfig.get_path("purelib"))
    for dist in dists:
        for file in metadata.distribution(dist).files or []:
            top = Path(str(file)).parts[0]
            if top != ".." and not (site / top).exists() and (here / top).exists():
                (site / top).symlink_to(here / top)
    return python


def startup(python: Path, repeat: int) -> tuple[float, float, list[str]]:
    """(median ms, min ms, the modules `-X importtime` shows that the standard library lacks)."""
    times = []
    for _ in range(repeat + 1):
        start = time.perf_counter()
        subprocess.run([python, "-c", "pass"], check=True)
        times.append((time.perf_counter() - start) * 1000)
    log = subprocess.run([python, "-X", "importtime", "-c", "pass"], capture_output=True, text=True, check=True).stderr
    names = [line.split("|")[2].strip() for line in log.splitlines() if line.count("|") == 2 and "import time:" in line]
    foreign = [n for n in names if n.split(".")[0] not in sys.stdlib_module_names and n not in ("imported package", "sitecustomize")]
    return statistics.median(times[1:]), min(times[1:]), foreign


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--wheels", type=Path, help="a directory of `pip download --no-deps` wheels, for download sizes")
    args = parser.parse_args()
    groups = sets()
    print_sizes(groups, args.wheels)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    os.environ.clear()
    os.environ.update(env)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"\nstart-up, {args.repeat} runs of `python -c pass` (ms), and what -X importtime shows beyond the standard library:")
        for name, dists in (("default", groups["default"]), ("[vulkan]", groups["default"] | groups.get("vulkan", set()))):
            python = make_venv(Path(tmp) / name.strip("[]"), dists - SEEDED)
            median, low, foreign = startup(python, args.repeat)
            print(f"  {name:<9} median {median:5.1f}  min {low:5.1f}  imports: {', '.join(foreign) or 'nothing'}")


if __name__ == "__main__":
    main()
