"""How pyree_build's cost grows with the work: a generated CMake project of N kernels.

    python benchmarks/scale.py [--n 10,50,200] [--repeat 3] [--jobs 2] [--no-remote] [--ctest-only]

Each kernel is a system plugin, a 3-arch standalone plugin (FatELF), 3-arch embedded objects,
PTX for one sm through NVRTC (no GPU needed), a module (iree-compile) and a ctest that runs
the module with the kernel's plugin. The same work is also written as plain Ninja rules that
call the raw tools with the flags pyree_build uses (no checks, no cache, no depfile reading
beyond the compiler's), and both are timed in the same run, alternating, with fresh zig
caches on both sides. Per N it prints, as medians with the min-max of the per-round ratios:

  cold     `cmake --build` with the cache off  vs  `ninja` of the raw rules
  warm     a fresh build tree from a full local cache  vs  cold
  no-op    `cmake --build` when nothing changed (seconds)
  ctest    `ctest` vs running the same iree-run-module commands from Ninja; also those
           commands as a hand-written CTest suite, and ctest's own cost (tests of `true`).
           Every round in one environment, as from one shell: from the second round on, each
           test is run by the native client from the plan its first run wrote
  remote   machine B (empty local cache, shared nginx server) vs machine A (built, uploaded)

then the per-kernel slope of each (least squares over the N values). Goals, at N = 200:
cold <= 1.10x raw; no-op <= 0.5 s; warm >= 5x faster than cold; ctest <= 2x raw; cost linear in N.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pyree_build.backends.llvm_cpu import plugins as cpu  # noqa: E402
from pyree_build.core import toolchain  # noqa: E402

SAMPLES = REPO / "samples" / "custom_dispatch"
ARCHS = ("x86_64", "aarch64", "riscv64")
SM = 80

PACK = """import struct, sys
out, elfs = sys.argv[1], [open(p, "rb").read() for p in sys.argv[2:]]
head = 8 + 24 * len(elfs)
offsets, at = [], (head + 4095) // 4096 * 4096
for e in elfs:
    offsets.append(at); at = (at + len(e) + 4095) // 4096 * 4096
blob = bytearray(struct.pack("<IHBB", 0x1F0E70FA, 1, len(elfs), 0))
for e, off in zip(elfs, offsets):
    machine, = struct.unpack_from("<H", e, 18)
    blob += struct.pack("<HBBBBBBQQ", machine, e[7], e[8], e[4], e[5], 0, 0, off, len(e))
for e, off in zip(elfs, offsets):
    blob += b"\\0" * (off - len(blob)) + e
open(out, "wb").write(bytes(blob))
"""

NVRTC = """import sys
from cuda.bindings import nvrtc
src, sm, out = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(src, "rb").read()
err, prog = nvrtc.nvrtcCreateProgram(text, src.encode(), 0, [], [])
opts = [f"--gpu-architecture=compute_{sm}".encode(), *(a.encode() for a in sys.argv[4:])]
(status,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
assert int(status) == 0, status
_, size = nvrtc.nvrtcGetPTXSize(prog)
ptx = bytearray(size)  # NVRTC writes into it: never a shared bytes object
nvrtc.nvrtcGetPTX(prog, ptx)
open(out, "wb").write(ptx.rstrip(b"\\0"))
"""


def generate(root: Path, n: int, tag: str = "kernel") -> tuple[Path, Path]:
    """Write the kernels' sources, the pyree_build CMake project and the raw build.ninja."""
    src = root / "src"
    src.mkdir(parents=True)
    texts = {
        "system.c": (SAMPLES / "cpu" / "plugin" / "system_plugin.c").read_text(),
        "standalone.c": (SAMPLES / "cpu" / "plugin" / "standalone_plugin.c").read_text(),
        "functions.c": (SAMPLES / "cpu" / "embedded" / "functions.c").read_text(),
        "kernels.cu": (SAMPLES / "cuda" / "kernels" / "kernels.cu").read_text(),
        "example.mlir": (SAMPLES / "cpu" / "plugin" / "example.mlir").read_text(),
    }
    cmake = [
        "cmake_minimum_required(VERSION 3.21)",
        "project(scale LANGUAGES NONE)",
        "find_package(pyree_build CONFIG REQUIRED)",
        "enable_testing()",
    ]
    for i in range(n):
        # Distinct bytes per kernel, so every action is its own cache entry.
        for name, text in texts.items():
            (src / f"k{i}_{name}").write_text(f"{text}\n// {tag} {i}\n")
        cmake += [
            f"pyree_cpu_plugin(NAME k{i}_system SYSTEM SRCS k{i}_system.c)",
            f"pyree_cpu_plugin(NAME k{i}_standalone STANDALONE ARCHS {' '.join(ARCHS)} SRCS k{i}_standalone.c)",
            f"pyree_cpu_objects(NAME k{i}_objects SRCS k{i}_functions.c ARCHS {' '.join(ARCHS)})",
            f"pyree_cuda_ptx(NAME k{i}_ptx SRCS k{i}_kernels.cu SMS {SM})",
            f"pyree_iree_module(NAME k{i}_module SRC k{i}_example.mlir TARGET llvm-cpu)",
            f'pyree_add_run_test(NAME k{i}_test MODULE k{i}_module FUNCTION mixed_invocation INPUTS "8xf32=2" "8xf32=4"'
            f' PLUGINS k{i}_system EXPECT "8xf32=12 12 12 12 12 12 12 12")',
        ]
    (src / "CMakeLists.txt").write_text("\n".join(cmake) + "\n")

    raw = root / "raw"
    raw.mkdir()
    (raw / "pack.py").write_text(PACK)
    (raw / "nvrtc_ptx.py").write_text(NVRTC)
    zig = " ".join(toolchain.c_compiler("zig").argv)
    lld = " ".join(toolchain.iree_lld().argv)
    compile_ = " ".join(toolchain.iree_compile().argv)
    run = " ".join(toolchain.iree_run_module().argv)
    inc = f"-I {toolchain.include_dir()}"
    free = " ".join(cpu.FREESTANDING_CFLAGS)
    py = f"{sys.executable} -I -S"
    lines = [
        f"rule cc_sys\n  command = {zig} {' '.join(cpu.SYSTEM_CFLAGS)} {inc} -MD -MF $out.d -c $in -o $out\n  depfile = $out.d\n  deps = gcc",
        f"rule link_sys\n  command = {zig} -shared $in -o $out",
        f"rule cc_free\n  command = {zig} -target ${{arch}}-freestanding-none {free} {inc} -MD -MF $out.d -c $in -o $out\n  depfile = $out.d\n  deps = gcc",
        f"rule link_free\n  command = {lld} {' '.join(cpu.STANDALONE_LDFLAGS)} $in -o $out",
        f"rule pack\n  command = {py} {raw / 'pack.py'} $out $in",
        f"rule ptx\n  command = {sys.executable} -I {raw / 'nvrtc_ptx.py'} $in {SM} $out --include-path={src}",
        f"rule module\n  command = {compile_} $in --iree-hal-target-device=local --iree-hal-local-target-device-backends=llvm-cpu"
        " --iree-llvmcpu-target-cpu=generic -o $out",
        f"rule run\n  command = {run} --device=local-sync --module=$module --executable_plugin=$plugin"
        " --function=mixed_invocation --input=8xf32=2 --input=8xf32=4 > $out",
    ]
    builds, tests = [], []
    for i in range(n):
        s = f"{src}/k{i}"
        lines += [
            f"build k{i}/system.o: cc_sys {s}_system.c",
            f"build k{i}/system.so: link_sys k{i}/system.o",
        ]
        elfs = []
        for arch in ARCHS:
            lines += [
                f"build k{i}/standalone_{arch}.o: cc_free {s}_standalone.c\n  arch = {arch}",
                f"build k{i}/standalone_{arch}.so: link_free k{i}/standalone_{arch}.o",
                f"build k{i}/functions_{arch}.o: cc_free {s}_functions.c\n  arch = {arch}",
            ]
            elfs.append(f"k{i}/standalone_{arch}.so")
            builds.append(f"k{i}/functions_{arch}.o")
        lines += [
            f"build k{i}/standalone.sos: pack {' '.join(elfs)}",
            f"build k{i}/kernels_sm_{SM}.ptx: ptx {s}_kernels.cu",
            f"build k{i}/module.vmfb: module {s}_example.mlir",
            f"build k{i}/test.out: run | k{i}/module.vmfb k{i}/system.so\n  module = k{i}/module.vmfb\n  plugin = k{i}/system.so",
        ]
        builds += [f"k{i}/system.so", f"k{i}/standalone.sos", f"k{i}/kernels_sm_{SM}.ptx", f"k{i}/module.vmfb"]
        tests.append(f"k{i}/test.out")
    lines += [f"build all: phony {' '.join(builds)}", f"build tests: phony {' '.join(tests)}", "default all"]
    (raw / "build.ninja").write_text("\n".join(lines) + "\n")
    return src, raw


class Timer:
    def __init__(self, jobs: int, work: Path) -> None:
        self.jobs = jobs
        self.work = work
        self.cmake = toolchain.cmake().argv
        self.ctest = toolchain.ctest().argv
        self.ninja = str(toolchain.ninja().path)
        self.zig_template: Path | None = None

    def warm_zig(self, root: Path) -> None:
        """Build one kernel of other bytes on both sides into a zig cache kept as the template."""
        src, raw = generate(root / "warmup", 1, tag="warm-up")
        self.zig_template = None
        env = self.env("off")
        self.configure(src, root / "warmup" / "build", env)
        self.build(root / "warmup" / "build", env)
        self.raw(raw, "all", env)
        self.zig_template = Path(env["ZIG_GLOBAL_CACHE_DIR"])

    def env(self, cache: str | Path, remote: str | None = None) -> dict[str, str]:
        """The cache and remote settings of one 'machine', with fresh zig caches on each
        call: zig caches compiles by command line, which only the raw side (fixed paths)
        would hit. The global one starts as a copy of `zig_template` (zig's own libc stubs
        and compiler_rt, built once by a warm-up), as on any machine that used zig before."""
        fresh = Path(tempfile.mkdtemp(prefix="zig.", dir=self.work))
        if self.zig_template is not None:
            shutil.copytree(self.zig_template, fresh / "g", symlinks=True)
        # Bytecode as a pip install leaves it (compiled once), not recompiled by every process.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYREE_BUILD_") and k != "PYTHONDONTWRITEBYTECODE"}
        env.update(ZIG_GLOBAL_CACHE_DIR=str(fresh / "g"), ZIG_LOCAL_CACHE_DIR=str(fresh / "l"), PYREE_BUILD_CACHE=str(cache))
        if remote:
            env["PYREE_BUILD_REMOTE_CACHE"] = remote
        return env

    def run(self, argv: list[str], env: dict[str, str], cwd: Path | None = None) -> float:
        start = time.perf_counter()
        proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"failed: {' '.join(argv)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return elapsed

    def configure(self, src: Path, build: Path, env: dict[str, str]) -> float:
        from pyree_build.cli import cmake_dir

        shutil.rmtree(build, ignore_errors=True)
        return self.run(
            [*self.cmake, "-G", "Ninja", "-S", str(src), "-B", str(build), f"-DCMAKE_MAKE_PROGRAM={self.ninja}",
             f"-Dpyree_build_DIR={cmake_dir()}", f"-DPYREE_BUILD_PYTHON={sys.executable}"],
            env,
        )  # fmt: skip

    def build(self, build: Path, env: dict[str, str]) -> float:
        return self.run([*self.cmake, "--build", str(build), "--", f"-j{self.jobs}"], env)

    def raw(self, raw: Path, target: str, env: dict[str, str]) -> float:
        return self.run([self.ninja, "-C", str(raw), f"-j{self.jobs}", target], env)

    def clean_raw(self, raw: Path) -> None:
        for sub in raw.iterdir():
            if sub.is_dir():
                shutil.rmtree(sub)
        for f in (".ninja_log", ".ninja_deps"):
            (raw / f).unlink(missing_ok=True)


def spread(a: list[float], b: list[float]) -> str:
    """median(b)/median(a) with the min-max of the per-round ratios."""
    rounds = [y / x for x, y in zip(a, b)]
    return f"{statistics.median(b) / statistics.median(a):5.2f}x ({min(rounds):.2f}-{max(rounds):.2f})"


class Nginx:
    """Debian's nginx serving a WebDAV PUT location on 127.0.0.1, as a child process."""

    def __init__(self, prefix: Path) -> None:
        self.prefix = prefix
        (prefix / "data").mkdir(parents=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        user = "user root;" if os.geteuid() == 0 else ""
        temps = "\n".join(f"{k}_temp_path {prefix}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        (prefix / "nginx.conf").write_text(
            f"worker_processes 2; daemon off; pid {prefix}/nginx.pid; error_log {prefix}/error.log; {user}\n"
            f"events {{ worker_connections 512; }}\nhttp {{ access_log off; {temps}\n"
            f"  server {{ listen 127.0.0.1:{self.port}; client_max_body_size 1g;\n"
            f"    location /cache/ {{ root {prefix}/data; dav_methods PUT; create_full_put_path on; }} }} }}\n"
        )
        self.proc = subprocess.Popen([shutil.which("nginx") or "/usr/sbin/nginx", "-p", str(prefix), "-c", str(prefix / "nginx.conf")])
        deadline = time.monotonic() + 10
        while socket.socket().connect_ex(("127.0.0.1", self.port)) != 0:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("nginx did not start")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}/cache"

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=10)


def measure(n: int, work: Path, repeat: int, jobs: int, remote: bool) -> dict[str, float]:
    root = work / f"n{n}"
    src, raw = generate(root, n)
    t = Timer(jobs, work)
    t.warm_zig(root)
    build = root / "build"
    conf = t.configure(src, build, t.env("off"))
    print(f"\nN = {n}: {6 * n} custom commands, {n} tests (configure {conf:.1f} s, jobs {jobs}, load {os.getloadavg()[0]:.1f})")

    cold, cold_raw = [], []
    for _ in range(repeat):
        t.configure(src, build, t.env("off"))
        cold.append(t.build(build, t.env("off")))
        t.clean_raw(raw)
        cold_raw.append(t.raw(raw, "all", t.env("off")))
    print(f"  cold build       pyree {statistics.median(cold):7.1f} s   raw {statistics.median(cold_raw):7.1f} s   ratio {spread(cold_raw, cold)}")

    cache = root / "cache"
    t.configure(src, build, t.env(cache))
    t.build(build, t.env(cache))  # fills the local cache
    warm = []
    for _ in range(repeat):
        t.configure(src, build, t.env(cache))
        warm.append(t.build(build, t.env(cache)))
    print(f"  warm build       pyree {statistics.median(warm):7.1f} s   cold {statistics.median(cold):7.1f} s   cold/warm {spread(warm, cold)}")

    noop = [t.build(build, t.env(cache)) for _ in range(max(repeat, 3))]
    print(f"  no-op rebuild    {statistics.median(noop):.3f} s (min {min(noop):.3f}, max {max(noop):.3f})")

    ctest, ctest_raw = _ctest_rounds(t, build, raw, cache, repeat, jobs)

    result = {"cold": statistics.median(cold), "raw": statistics.median(cold_raw), "warm": statistics.median(warm),
              "noop": statistics.median(noop), "ctest": statistics.median(ctest), "ctest_raw": statistics.median(ctest_raw)}  # fmt: skip
    if remote and (shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")):
        a_times, b_times = [], []
        for r in range(repeat):
            server = Nginx(root / f"nginx{r}")
            try:
                for label, times in (("a", a_times), ("b", b_times)):
                    machine = root / f"remote{r}-{label}"
                    env = t.env(machine / "cache", server.url)
                    t.configure(src, machine / "build", env)
                    times.append(t.build(machine / "build", env))
            finally:
                server.stop()
        print(
            f"  remote           A (builds, uploads) {statistics.median(a_times):6.1f} s   B (empty local cache) "
            f"{statistics.median(b_times):6.1f} s   A/B {spread(b_times, a_times)}   A/cold {spread(cold, a_times)}"
        )
        result.update(remote_a=statistics.median(a_times), remote_b=statistics.median(b_times))
    elif remote:
        print("  remote           skipped: nginx is not installed (apt-get install nginx)")
    return result


def _ctest_project(directory: Path, tests: list[str], t: Timer) -> Path:
    """A configured CTest-only project of these `add_test` lines; returns its build tree."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "CMakeLists.txt").write_text(f"cmake_minimum_required(VERSION 3.20)\nproject(bench NONE)\nenable_testing()\n{''.join(tests)}")
    t.run([*t.cmake, "-G", "Ninja", "-S", str(directory), "-B", str(directory / "build"), f"-DCMAKE_MAKE_PROGRAM={t.ninja}"], t.env("off"))
    return directory / "build"


def _ctest_rounds(t: Timer, build: Path, raw: Path, cache: Path, repeat: int, jobs: int) -> tuple[list[float], list[float]]:
    """`ctest` of the built tree against the same runs from the raw Ninja rules, alternating;
    the same raw commands as ctest tests of their own (what a hand-written CTest suite costs:
    the fair comparison for pyree's share); and ctest's own cost, as many tests of `true`."""
    n = len(list(raw.glob("k*")))
    noop = _ctest_project(raw.parent / "ctest_noop", [f"add_test(NAME t{i} COMMAND true)\n" for i in range(n)], t)
    run = toolchain.iree_run_module().argv
    by_hand = _ctest_project(
        raw.parent / "ctest_raw",
        [
            "add_test(NAME t{i} COMMAND {argv})\n".format(i=i, argv=" ".join(
                f'"{a}"' for a in [*run, "--device=local-sync", f"--module={raw / f'k{i}' / 'module.vmfb'}", f"--executable_plugin={raw / f'k{i}' / 'system.so'}",
                                   "--function=mixed_invocation", "--input=8xf32=2", "--input=8xf32=4"]))
            for i in range(n)
        ],
        t,
    )  # fmt: skip
    ctest, ctest_raw, ctest_by_hand, floor = [], [], [], []
    # One environment per side for every round, as a user's shell is between two `ctest`s: a run
    # that passed is run by the native client from its plan (client/plans.py), keyed by the
    # whole environment, and t.env() gives each call fresh zig cache directories (for builds).
    pyree_env, raw_env = t.env(cache), t.env("off")
    for _ in range(repeat):
        ctest.append(t.run([*t.ctest, "--test-dir", str(build), f"-j{jobs}"], pyree_env))
        for f in raw.glob("k*/test.out"):
            f.unlink()
        ctest_raw.append(t.raw(raw, "tests", raw_env))
        ctest_by_hand.append(t.run([*t.ctest, "--test-dir", str(by_hand), f"-j{jobs}"], raw_env))
        floor.append(t.run([*t.ctest, "--test-dir", str(noop), f"-j{jobs}"], raw_env))
    print(f"  ctest            pyree {statistics.median(ctest):7.1f} s   raw {statistics.median(ctest_raw):7.1f} s   ratio {spread(ctest_raw, ctest)}")
    print(f"  ctest's first round (each passing run writes its plan): {ctest[0]:.2f} s, {ctest[0] / ctest_raw[0]:.2f}x that round's raw runs")
    print(
        f"  ctest of the raw commands {statistics.median(ctest_by_hand):.2f} s: {spread(ctest_raw, ctest_by_hand)} the raw runs; pyree's ctest is {spread(ctest_by_hand, ctest)} it"
    )
    print(f"  ctest's own      {n} tests of `true`: {statistics.median(floor):.2f} s, {spread(ctest_raw, floor)} the raw runs")
    return ctest, ctest_raw


def measure_ctest(n: int, work: Path, repeat: int, jobs: int) -> dict[str, float]:
    """Only the ctest row: one build of each side (the cache on), then the alternating rounds."""
    root = work / f"n{n}"
    src, raw = generate(root, n)
    t = Timer(jobs, work)
    t.warm_zig(root)
    build, cache = root / "build", root / "cache"
    t.configure(src, build, t.env(cache))
    seconds = t.build(build, t.env(cache))
    t.raw(raw, "all", t.env("off"))
    print(f"\nN = {n}: {n} tests (built in {seconds:.1f} s, jobs {jobs}, load {os.getloadavg()[0]:.1f})")
    ctest, ctest_raw = _ctest_rounds(t, build, raw, cache, repeat, jobs)
    return {"ctest": statistics.median(ctest), "ctest_raw": statistics.median(ctest_raw)}


def slope(ns: list[int], values: list[float]) -> tuple[float, float]:
    """Least-squares seconds per kernel and intercept."""
    if len(ns) < 2:
        return float("nan"), float("nan")
    mean_n, mean_v = statistics.fmean(ns), statistics.fmean(values)
    k = sum((n - mean_n) * (v - mean_v) for n, v in zip(ns, values)) / sum((n - mean_n) ** 2 for n in ns)
    return k, mean_v - k * mean_n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", default="10,50,200", help="kernel counts, comma-separated (default 10,50,200)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-remote", action="store_true", help="skip the nginx remote-cache section")
    parser.add_argument("--keep", action="store_true", help="keep the generated projects")
    parser.add_argument("--ctest-only", action="store_true", help="only the ctest row (one build of each side first)")
    args = parser.parse_args()
    ns = sorted(int(x) for x in args.n.split(","))
    work = Path(tempfile.mkdtemp(prefix="pyree-scale."))
    print(f"scale benchmark: N = {ns}, {args.repeat} rounds, -j{args.jobs}, {os.cpu_count()} cores, work in {work}")
    try:
        if args.ctest_only:
            results = [measure_ctest(n, work, args.repeat, args.jobs) for n in ns]
        else:
            results = [measure(n, work, args.repeat, args.jobs, not args.no_remote) for n in ns]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("\nper-kernel slope (least squares over N), seconds per kernel + fixed seconds:")
    for key in ("cold", "raw", "warm", "noop", "ctest", "ctest_raw", "remote_a", "remote_b"):
        if all(key in r for r in results):
            k, c = slope(ns, [r[key] for r in results])
            print(f"  {key:<10} {k:8.4f} s/kernel  + {c:6.2f} s")


if __name__ == "__main__":
    main()
