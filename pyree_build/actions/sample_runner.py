"""The main job: configure every sample with CMake (Ninja), build iree-sample-deps, run ctest,
and print one table row per test: sample, test, result, time."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from pyree_build.core import echo, processes, toolchain
from pyree_build.core.errors import PyreeError
from pyree_build.core.package import PACKAGE_DIR, cmake_dir


def samples_dir() -> Path:
    """The samples project: installed inside the package, or the checkout's samples/."""
    here = PACKAGE_DIR
    for candidate in (here / "samples", here.parent / "samples"):
        if (candidate / "CMakeLists.txt").is_file():
            return candidate
    raise PyreeError("the samples are not installed", file=here, fix="reinstall with `pip install .` from the pyree_build checkout")


@dataclass
class TestRow:
    sample: str
    test: str
    result: str
    seconds: float


def _sample_of(working_dir: str | None, build_dir: Path) -> str:
    if not working_dir:
        return "?"
    try:
        return str(Path(working_dir).resolve().relative_to(build_dir.resolve()))
    except ValueError:
        return working_dir


def _skip_reason(output: str) -> str:
    for line in output.splitlines():
        if "skipped:" in line:
            return "skipped: " + line.split("skipped:", 1)[1].strip()
    return "skipped"


def collect_results(build_dir: Path, junit: Path, ctest_listing: str) -> list[TestRow]:
    listing = json.loads(ctest_listing)
    where = {}
    for test in listing.get("tests", []):
        props = {p["name"]: p["value"] for p in test.get("properties", [])}
        where[test["name"]] = _sample_of(props.get("WORKING_DIRECTORY"), build_dir)
    rows = []
    try:
        root = ET.parse(junit).getroot()
    except (ET.ParseError, OSError) as exc:
        raise PyreeError(f"ctest's result file cannot be read ({exc})", file=junit,
                         fix="delete it and run again; it must be the JUnit XML that ctest --output-junit writes") from None  # fmt: skip
    if root.tag not in ("testsuite", "testsuites"):
        raise PyreeError(f"ctest's result file is not JUnit XML (its root element is <{root.tag}>)", file=junit,
                         fix="delete it and run again; it must be the JUnit XML that ctest --output-junit writes")  # fmt: skip
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        output = case.findtext("system-out") or ""
        status = case.get("status", "")
        if case.find("skipped") is not None or status == "notrun" and "skipped:" in output:
            result = _skip_reason(output)
        elif status == "run" and case.find("failure") is None:
            result = "passed"
        elif status == "disabled":
            result = "disabled"
        else:
            result = "FAILED"
        rows.append(TestRow(where.get(name, "?"), name, result, float(case.get("time", "0") or 0)))
    return rows


class Progress:
    """Lines of CMake, Ninja and ctest shown as they come: ninja's `[n/N]` lines as one updating
    line on a terminal (plain lines otherwise), each test as it finishes; all of it under -v."""

    _NINJA = re.compile(r"^\[(\d+)/(\d+)\] ")
    _TEST = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: ")

    def __init__(self, out=None, tty: bool | None = None) -> None:  # type: ignore[no-untyped-def]
        self.out = out or sys.stderr
        self.tty = self.out.isatty() if tty is None else tty
        self.open_line = 0  # width of the updating line, 0 when none is shown

    def line(self, text: str) -> None:
        if echo.VERBOSITY >= 2:
            self._print("# " + text)
        elif echo.VERBOSITY < 1:
            return
        elif self._NINJA.match(text):
            if self.tty:
                width = max(20, shutil.get_terminal_size().columns - 1)
                shown = ("  " + text)[:width]
                self.out.write("\r" + shown.ljust(self.open_line))
                self.out.flush()
                self.open_line = len(shown)
            else:
                self._print("  " + text)
        elif self._TEST.match(text):
            self._print("  " + text.strip())

    def close(self) -> None:
        """Clear the updating line, so the next line (or an error) starts clean."""
        if self.open_line:
            self.out.write("\r" + " " * self.open_line + "\r")
            self.out.flush()
            self.open_line = 0

    def _print(self, text: str) -> None:
        self.close()
        print(text, file=self.out, flush=True)


# The table fits a terminal of this width when it cannot ask one (a pipe, CI's log).
TABLE_WIDTH = 100


def format_table(rows: list[TestRow], width: int | None = None) -> str:
    """sample, test, result and time, the result (a skip's reason can be long) wrapped onto
    continuation lines so that no line is wider than `width` (the terminal's, or TABLE_WIDTH)."""
    headers = ("sample", "test", "result", "time")
    cells = [(r.sample, r.test, r.result, f"{r.seconds:.2f} s") for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    room = max(20, (width or shutil.get_terminal_size((TABLE_WIDTH, 24)).columns) - (widths[0] + widths[1] + widths[3] + 6))
    widths[2] = min(widths[2], room)
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [line.format(*headers).rstrip(), line.format(*("-" * w for w in widths))]
    for sample, test, result, seconds in cells:
        wrapped = textwrap.wrap(result, widths[2], break_long_words=False, break_on_hyphens=False) or [""]
        out.append(line.format(sample, test, wrapped[0], seconds).rstrip())
        out += [" " * (widths[0] + widths[1] + 4) + more for more in wrapped[1:]]
    return "\n".join(out)


def _require_a_match(ctest: toolchain.Tool, build: Path, tests_regex: str) -> None:
    """Before building anything: a -R that selects no test is a mistake, not an empty success."""
    listing = processes.spawn(ctest.command("--test-dir", build, "--show-only=json-v1"), what="listing tests").stdout
    names = [t["name"] for t in json.loads(listing).get("tests", [])]
    chosen = processes.spawn(ctest.command("--test-dir", build, "--show-only=json-v1", "-R", tests_regex), what="listing tests").stdout
    if not json.loads(chosen).get("tests"):
        raise PyreeError(
            f"no test matches -R '{tests_regex}'",
            file=build,
            details="the tests are:\n" + "\n".join(names),
            fix="pass a regular expression that matches part of a test name above, e.g. -R plugin (`ctest --test-dir BUILD -N` lists them too)",
        )


def main_job(build_dir: Path, *, tests_regex: str | None = None, jobs: int | None = None) -> int:
    """Build and run every sample. Returns 0 when no test failed (skipped tests are not failures)."""
    cmake, ctest, ninja = toolchain.cmake(), toolchain.ctest(), toolchain.ninja()
    source = samples_dir()
    build = build_dir.resolve()
    echo.log_step(f"samples: {source} -> {build}")
    progress = Progress()
    _configure(cmake, ninja, source, build, progress)
    if tests_regex:
        _require_a_match(ctest, build, tests_regex)
    with echo.Stopwatch("build iree-sample-deps"), contextlib.closing(progress):
        processes.stream(
            cmake.command(
                "--build", build, "--target", "iree-sample-deps", *(["-j", str(jobs)] if jobs else []), *(["-v"] if echo.VERBOSITY >= 2 else [])
            ),  # fmt: skip
            what="building iree-sample-deps",
            file=build,
            fix="the first failing step is shown above; run it with -v to see every tool command",
            on_line=progress.line,
        )
    junit = build / "pyree-samples-junit.xml"
    result, listing = _run_ctest(ctest, build, junit, tests_regex=tests_regex, jobs=jobs, progress=progress)
    return _report(collect_results(build, junit, listing), result)


def _configure(cmake: toolchain.Tool, ninja: toolchain.Tool, source: Path, build: Path, progress: Progress) -> None:
    echo.log_step("  configuring with CMake ...")
    with echo.Stopwatch("configure (cmake -G Ninja)"):
        processes.stream(
            cmake.command(
                "-G",
                "Ninja",
                "-S",
                source,
                "-B",
                build,
                f"-DCMAKE_MAKE_PROGRAM={ninja.path}",
                f"-Dpyree_build_DIR={cmake_dir()}",
                f"-DPYREE_BUILD_PYTHON={sys.executable}",
            ),  # fmt: skip
            what="configuring the samples with CMake",
            file=source / "CMakeLists.txt",
            on_line=progress.line,
        )


def _run_ctest(
    ctest: toolchain.Tool, build: Path, junit: Path, *, tests_regex: str | None, jobs: int | None, progress: Progress
) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run the (selected) tests, writing `junit`; returns ctest's result and its JSON test listing."""
    regex = ["-R", tests_regex] if tests_regex else []
    select = regex + (["-j", str(jobs)] if jobs else []) + (["-V"] if echo.VERBOSITY >= 2 else [])
    listing = processes.spawn(ctest.command("--test-dir", build, "--show-only=json-v1", *regex), what="listing tests").stdout
    if not json.loads(listing).get("tests"):  # a -R without a match was refused before building
        raise PyreeError("the samples define no tests", file=build, fix="check samples/CMakeLists.txt")
    # Only the results of the ctest started here count: an older file (or one ctest could not
    # overwrite) must never be read as this run's results.
    try:
        junit.unlink(missing_ok=True)
    except OSError as exc:
        raise PyreeError(f"cannot remove the previous result file: {exc.strerror}", file=junit, fix="make the build directory writable") from None
    start = time.perf_counter()
    echo.log_step("  testing with ctest ...")
    result = processes.stream(
        ctest.command("--test-dir", build, "--output-junit", junit, "--output-on-failure", *select),
        what="ctest",
        file=build,
        check=False,
        on_line=progress.line,
    )
    echo.log_step(f"  ctest ({time.perf_counter() - start:.2f} s)")
    if not junit.is_file():
        raise PyreeError(f"ctest wrote no results (exit code {result.returncode})", file=build, details=result.stdout + result.stderr,
                         fix="the ctest output above says why; the build directory must be writable")  # fmt: skip
    return result, listing


def _report(rows: list[TestRow], result: subprocess.CompletedProcess[str]) -> int:
    """Print the table (under -v) and the failures' output; the exit code."""
    failed = [r for r in rows if r.result == "FAILED"]
    passed = sum(r.result == "passed" for r in rows)
    skipped = sum(r.result.startswith("skipped") for r in rows)
    if echo.VERBOSITY >= 1:
        print(format_table(rows))
        print(f"\n{passed} passed, {len(failed)} failed, {skipped} skipped")
    if failed:
        print("\nctest output for the failures:\n" + result.stdout[-8000:], file=sys.stderr)
        return 1
    if result.returncode != 0:  # ctest failed although its result file shows no failure: trust ctest
        print(f"\nctest failed (exit code {result.returncode}) although its results show no failed test:\n"
              + (result.stdout + result.stderr)[-8000:], file=sys.stderr)  # fmt: skip
        return 1
    return 0 if rows else 1
