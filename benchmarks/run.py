"""On-demand benchmarks of pyree_build itself. Not part of the test suite.

    python benchmarks/run.py [--repeat N] [--only probe,verbs,large,cache,noop,samples]

Every section measures both sides in the same run, alternating them, and prints the
ratio of medians with the min-max of the per-round ratios:
  verbs    each verb against running the same tools by hand (cold: cache off)
  large    the same for realistic sizes, where a verb's fixed cost (Python start) is small
  cache    a 3-arch standalone plugin, cold cache against warm cache
  noop     `cmake --build` of all samples when nothing changed
  samples  `pyree-build samples` end to end, with the time of each step
  probe    the system plugin's query called in process against in a forked child (issue 13)
Targets: verb overhead <= 1.05x on cold builds; warm cache >= 20x faster than cold;
no-op rebuild < 0.3 s.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLUGIN = REPO / "samples" / "custom_dispatch" / "cpu" / "plugin"
EMBEDDED = REPO / "samples" / "custom_dispatch" / "cpu" / "embedded"
CUDA = REPO / "samples" / "custom_dispatch" / "cuda" / "kernels"
ARCHS = ("x86_64", "aarch64", "riscv64")


def timed(argv: Sequence[str | os.PathLike[str]], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run([os.fspath(a) for a in argv], check=True, capture_output=True, env=env)
    return time.perf_counter() - start


def timed_call(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# --rows: only the rows whose label contains one of these (all when empty).
ROWS: list[str] = []


def compare(label: str, a_label: str, a: Callable[[], float], b_label: str, b: Callable[[], float], repeat: int) -> float:
    """Alternate a and b `repeat` times; print median(b)/median(a) and the per-round spread."""
    if ROWS and not any(row in label for row in ROWS):
        return float("nan")
    a_times, b_times = [], []
    a()  # warm file caches and lazily built state (zig's libc stubs) on both sides
    b()
    for _ in range(repeat):
        a_times.append(a())
        b_times.append(b())
    ratio = statistics.median(b_times) / statistics.median(a_times)
    rounds = [bt / at for at, bt in zip(a_times, b_times)]
    print(
        f"{label:<44} {a_label} {statistics.median(a_times) * 1000:8.1f} ms   {b_label} {statistics.median(b_times) * 1000:8.1f} ms"
        f"   ratio {ratio:5.2f}x  (rounds {min(rounds):.2f}-{max(rounds):.2f})"
    )
    return ratio


def pyree(*args: str | os.PathLike[str]) -> list[str]:
    return [sys.executable, "-m", "pyree_build", *map(os.fspath, args)]


def cold_zig(work: Path) -> None:
    """Point zig's own compile cache at a fresh directory, for this process and its children.

    zig cc caches object files by command line; without this, the by-hand side (same
    paths every round) hits zig's cache while the verb (fresh scratch paths) does not.
    """
    fresh = Path(tempfile.mkdtemp(prefix="zig-cache.", dir=work))
    os.environ["ZIG_GLOBAL_CACHE_DIR"] = str(fresh / "global")
    os.environ["ZIG_LOCAL_CACHE_DIR"] = str(fresh / "local")


def section_verbs(work: Path, repeat: int) -> None:
    from pyree_build.actions import compile as compile_action
    from pyree_build.backends.cuda import ptx as cuda
    from pyree_build.backends.llvm_cpu import plugins as cpu
    from pyree_build.core import echo, toolchain

    print("\n== verbs against the same tools by hand (cache off, zig's cache cold on both sides) ==")

    def env() -> dict[str, str]:
        cold_zig(work)
        return dict(os.environ, PYREE_BUILD_CACHE="off")

    zig = toolchain.c_compiler("zig")
    lld = toolchain.iree_lld()
    inc = ["-I", str(toolchain.include_dir())]

    def hand_system() -> float:
        cold_zig(work)
        start = time.perf_counter()
        subprocess.run(zig.command(*cpu.SYSTEM_CFLAGS, *inc, "-c", PLUGIN / "system_plugin.c", "-o", work / "h.o"), check=True)
        subprocess.run(zig.command("-shared", work / "h.o", "-o", work / "h.so"), check=True)
        return time.perf_counter() - start

    compare(
        "plugin --kind system",
        "by hand",
        hand_system,
        "verb",
        lambda: timed(pyree("plugin", "-q", PLUGIN / "system_plugin.c", "-o", work / "v.so"), env()),
        repeat,
    )

    def hand_standalone() -> float:
        cold_zig(work)
        start = time.perf_counter()
        procs = []
        for arch in ARCHS:
            argv = zig.command(
                "-target", f"{arch}-freestanding-none", *cpu.FREESTANDING_CFLAGS, *inc, "-c", PLUGIN / "standalone_plugin.c", "-o", work / f"h_{arch}.o"
            )
            procs.append(subprocess.Popen(argv))
        for p in procs:
            assert p.wait() == 0
        procs = [subprocess.Popen(lld.command(*cpu.STANDALONE_LDFLAGS, work / f"h_{a}.o", "-o", work / f"h_{a}.so")) for a in ARCHS]
        for p in procs:
            assert p.wait() == 0
        from pyree_build.backends.llvm_cpu import fatelf

        (work / "h.sos").write_bytes(fatelf.pack([work / f"h_{a}.so" for a in ARCHS]))
        return time.perf_counter() - start

    arch_args = [x for a in ARCHS for x in ("--arch", a)]
    # The hand side runs one compiler per arch at once; the verb gets the same parallelism
    # (its default, -j = cores, would run 2 then 1 on a 2-core machine: a scheduling choice,
    # not pyree_build's overhead).
    same_jobs = ["-j", str(len(ARCHS))]
    compare(
        "plugin --kind standalone (3 arches, FatELF)", "by hand", hand_standalone, "verb",
        lambda: timed(pyree("plugin", "-q", *same_jobs, "--kind", "standalone", *arch_args, PLUGIN / "standalone_plugin.c", "-o", work / "v.sos"), env()),
        repeat,
    )  # fmt: skip

    def hand_objects() -> float:
        cold_zig(work)
        start = time.perf_counter()
        procs = [
            subprocess.Popen(
                zig.command("-target", f"{a}-freestanding-none", *cpu.FREESTANDING_CFLAGS, *inc, "-c", EMBEDDED / "functions.c", "-o", work / f"f_{a}.o")
            )
            for a in ARCHS
        ]
        for p in procs:
            assert p.wait() == 0
        return time.perf_counter() - start

    compare(
        "objects (3 arches)",
        "by hand",
        hand_objects,
        "verb",
        lambda: timed(pyree("objects", "-q", *same_jobs, *arch_args, EMBEDDED / "functions.c", "-o", work / "obj"), env()),
        repeat,
    )

    compiler = toolchain.iree_compile()
    flags = compile_action.target_flags("llvm-cpu")
    compare(
        "compile (llvm-cpu)", "by hand", lambda: timed(compiler.command(PLUGIN / "example.mlir", *flags, "-o", work / "h.vmfb")), "verb",
        lambda: timed(pyree("compile", "-q", PLUGIN / "example.mlir", "-o", work / "v.vmfb"), env()), repeat,
    )  # fmt: skip

    if shutil.which("nvcc"):
        nvcc = toolchain.nvcc()
        compare(
            "ptx --compiler nvcc (sm 75, 80)", "by hand",
            lambda: timed(nvcc.command("-ptx", "-arch=sm_75", CUDA / "kernels.cu", "-o", work / "h75.ptx"))
            + timed(nvcc.command("-ptx", "-arch=sm_80", CUDA / "kernels.cu", "-o", work / "h80.ptx")),
            "verb", lambda: timed(pyree("ptx", "-q", "--compiler", "nvcc", "--sm", "75", "--sm", "80", CUDA / "kernels.cu", "-o", work / "ptx"), env()),
            repeat,
        )  # fmt: skip

    def nvrtc_in_process() -> float:
        os.environ["PYREE_BUILD_CACHE"] = "off"  # by hand, NVRTC is a library call: compare with the same call

        echo.set_verbosity(0)
        return timed_call(lambda: cuda.ptx(CUDA / "kernels.cu", [75, 80], work / "ptx_inproc"))

    compare(
        "ptx (NVRTC, sm 75, 80)", "in-process", nvrtc_in_process, "verb", lambda: timed(pyree("ptx", "-q", "--sm", "75", "--sm", "80", CUDA / "kernels.cu", "-o", work / "ptx_verb"), env()), repeat,
    )  # fmt: skip


def large_plugin_source(work: Path, kernels: int = 400) -> Path:
    """The sample plugin plus `kernels` more functions: a plugin of realistic size (~1 s to build)."""
    text = (PLUGIN / "standalone_plugin.c").read_text()
    extra = "".join(
        f"""
__attribute__((used)) float extra_kernel_{i}(const float* a, const float* b, float* out, int n) {{
  float acc = {i}.0f;
  for (int j = 0; j < n; ++j) {{ float x = a[j] * b[(j * {i % 7 + 1}) % n] + acc; out[j] = x > 0 ? x : -x; acc += x * 0.5f; }}
  for (int j = n - 1; j > 0; --j) out[j] = out[j] * 0.25f + out[j - 1] * {i % 5 + 1}.0f;
  return acc;
}}
"""
        for i in range(kernels)
    )
    path = work / "large_plugin.c"
    path.write_text(text + extra)
    return path


def large_program(work: Path) -> Path:
    """A program with a few hundred dispatches' worth of work: iree-compile takes seconds."""
    lines = ["func.func @main(%a: tensor<64x64xf32>, %b: tensor<64x64xf32>) -> tensor<64x64xf32> {", "  %zero = arith.constant 0.0 : f32"]
    prev = "%a"
    for i in range(240):
        lines += [
            f"  %e{i} = tensor.empty() : tensor<64x64xf32>",
            f"  %f{i} = linalg.fill ins(%zero : f32) outs(%e{i} : tensor<64x64xf32>) -> tensor<64x64xf32>",
            f"  %m{i} = linalg.matmul ins({prev}, %b : tensor<64x64xf32>, tensor<64x64xf32>) outs(%f{i} : tensor<64x64xf32>) -> tensor<64x64xf32>",
            f"  %x{i} = math.exp %m{i} : tensor<64x64xf32>",
            f"  %s{i} = arith.addf %x{i}, %a : tensor<64x64xf32>",
        ]
        prev = f"%s{i}"
    lines += [f"  return {prev} : tensor<64x64xf32>", "}"]
    path = work / "large_program.mlir"
    path.write_text("\n".join(lines) + "\n")
    return path


def section_large(work: Path, repeat: int) -> None:
    from pyree_build.actions import compile as compile_action
    from pyree_build.core import toolchain

    print("\n== verbs on realistic sizes (cache off) ==")
    compiler = toolchain.iree_compile()
    program = large_program(work)
    flags = compile_action.target_flags("llvm-cpu")
    env = dict(os.environ, PYREE_BUILD_CACHE="off")
    compare(
        "compile (240 matmul+exp+add stages)", "by hand", lambda: timed(compiler.command(program, *flags, "-o", work / "hl.vmfb")), "verb",
        lambda: timed(pyree("compile", "-q", program, "-o", work / "vl.vmfb"), env), max(2, repeat // 2),
    )  # fmt: skip


def section_cache(work: Path, repeat: int) -> None:
    arch_args = [x for a in ARCHS for x in ("--arch", a)]
    for label, source in (("sample plugin", PLUGIN / "standalone_plugin.c"), ("plugin with 400 more functions", large_plugin_source(work))):
        print(f"\n== cache: cold against warm, 3-arch standalone {label} ==")
        cache = work / "cache"
        env = dict(os.environ, PYREE_BUILD_CACHE=str(cache))
        argv = pyree("plugin", "-q", "--kind", "standalone", *arch_args, source, "-o", work / "c.sos")

        def cold() -> float:
            shutil.rmtree(cache, ignore_errors=True)
            cold_zig(work)  # a cold build on a fresh machine: zig's own cache is empty too
            return timed(argv, dict(env, ZIG_GLOBAL_CACHE_DIR=os.environ["ZIG_GLOBAL_CACHE_DIR"], ZIG_LOCAL_CACHE_DIR=os.environ["ZIG_LOCAL_CACHE_DIR"]))

        def warm() -> float:
            return timed(argv, env)

        ratio = compare(f"standalone, {label}", "cold", cold, "warm", warm, repeat)
        if not math.isnan(ratio):  # a row --rows left out
            print(f"{'':44} warm is {1 / ratio:.1f}x faster than cold (target >= 20x)")


def _samples_build(work: Path) -> Path:
    build = work / "samples"
    if not (build / "build.ninja").exists():
        subprocess.run(pyree("samples", "--build-dir", build), check=True, capture_output=True)
    return build


def section_noop(work: Path, repeat: int) -> None:
    from pyree_build.core import toolchain

    print("\n== no-op rebuild of every sample ==")
    build = _samples_build(work)
    times = [timed([*toolchain.cmake().argv, "--build", build, "--target", "iree-sample-deps"]) for _ in range(repeat)]
    ninja_times = [timed([*toolchain.ninja().argv, "-C", build, "iree-sample-deps"]) for _ in range(repeat)]
    print(f"{'cmake --build (nothing changed)':<44} median {statistics.median(times) * 1000:7.1f} ms (target < 300 ms)")
    print(
        f"{'ninja alone, for reference':<44} median {statistics.median(ninja_times) * 1000:7.1f} ms   cmake/ninja {statistics.median(times) / statistics.median(ninja_times):.2f}x"
    )


def section_samples(work: Path, repeat: int) -> None:
    print("\n== pyree-build samples, end to end ==")
    build = work / "samples_e2e"
    shutil.rmtree(build, ignore_errors=True)
    env = dict(os.environ, PYREE_BUILD_CACHE=str(work / "e2e_cache"))
    start = time.perf_counter()
    result = subprocess.run(pyree("samples", "--build-dir", build), capture_output=True, text=True, env=env)
    total = time.perf_counter() - start
    steps = [line.strip() for line in result.stderr.splitlines() if line.strip().startswith(("configure", "build", "ctest", "samples:"))]
    for line in steps:
        print(f"  {line}")
    print(f"{'total (cold cache, fresh build dir)':<44} {total:7.2f} s, exit {result.returncode}")
    shutil.rmtree(build, ignore_errors=True)
    start = time.perf_counter()
    subprocess.run(pyree("samples", "--build-dir", build), capture_output=True, env=env)
    warm = time.perf_counter() - start
    print(f"{'total (warm cache, fresh build dir)':<44} {warm:7.2f} s   cold/warm {total / warm:.2f}x")


def section_probe(work: Path, repeat: int) -> None:
    """The system plugin probe: its query called in this process (before issue 13) against in a
    forked child with a timeout (now), and what that costs the whole `plugin` verb (cold)."""
    sys.path.insert(0, str(REPO))
    from pyree_build.backends.llvm_cpu import elf as elfcheck

    so = work / "probe" / "system_plugin.so"
    subprocess.run(pyree("plugin", "-q", PLUGIN / "system_plugin.c", "-o", so), check=True, env=dict(os.environ, PYREE_BUILD_CACHE="off"))
    compare(
        "probe: in process -> forked child",
        "in-process", lambda: timed_call(lambda: elfcheck._query_plugin(str(so))),
        "child", lambda: timed_call(lambda: elfcheck.probe_plugin(so)),
        repeat * 4,
    )  # fmt: skip
    cold = dict(os.environ, PYREE_BUILD_CACHE="off")
    verb = pyree("plugin", "-q", PLUGIN / "system_plugin.c", "-o", so)
    total = statistics.median(timed(verb, cold) for _ in range(repeat))
    print(f"{'plugin --kind system (cold cache), whole verb':<44} {total * 1000:8.1f} ms")


SECTIONS = {"probe": section_probe, "verbs": section_verbs, "large": section_large, "cache": section_cache, "noop": section_noop, "samples": section_samples}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", default=",".join(SECTIONS))
    parser.add_argument("--rows", default="", help="only rows whose label contains one of these, comma-separated (e.g. objects,standalone)")
    args = parser.parse_args()
    ROWS[:] = [r.strip() for r in args.rows.split(",") if r.strip()]
    with tempfile.TemporaryDirectory(prefix="pyree-bench.") as tmp:
        for name in args.only.split(","):
            SECTIONS[name.strip()](Path(tmp), args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
