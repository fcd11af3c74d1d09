"""pb.load_inline from a plain C function and its signature (`args=`), no MLIR (issue 48).

Real builds and runs: zig, iree-compile, the IREE runtime. The property test draws signatures
and sizes, writes a C function for each, and checks every call against numpy, in process,
before and after an edit of the C."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pyree_build as pb
from pyree_build.actions import signature
from pyree_build.backends.vulkan import devices as vulkan
from pyree_build.core import echo

C_TYPES = {"f32": "float", "f64": "double", "i32": "int32_t"}
DTYPES = {"f32": np.float32, "f64": np.float64, "i32": np.int32}

AXPY = textwrap.dedent("""\
    #include <stddef.h>
    void axpy(const float* x, const float* y, float a, float* out, size_t n) {
      for (size_t i = 0; i < n; ++i) out[i] = a * x[i] + y[i];
    }
    """)
AXPY_ARGS = "in:f32[n], in:f32[n], in:f32, out:f32[n]"


@dataclass(frozen=True)
class Drawn:
    """A signature of the family the property test draws: every buffer but the optional
    `whole` one is [n, *inner] (elementwise over them), `whole` is [k] and given whole."""

    items: tuple[tuple[str, str, str], ...]  # (role, kind, type): role row, whole or scalar
    inner: tuple[str | int, ...]
    tile: int | None
    build: str  # load_inline's kind: system, standalone or embedded

    def args(self) -> str:
        rows = "[" + ", ".join(["n", *map(str, self.inner)]) + "]"
        return ", ".join(f"{kind}:{t}" + {"row": rows, "whole": "[k]", "scalar": ""}[role] for role, kind, t in self.items)

    def sizes(self) -> list[str]:
        """The named sizes in order of first use: the C function's trailing parameters."""
        order: list[str] = []
        for role, _, _ in self.items:
            names = {"row": ["n", *(d for d in self.inner if isinstance(d, str))], "whole": ["k"], "scalar": []}[role]
            order += [name for name in names if name not in order]
        return order

    def c_source(self, factor: int) -> str:
        """out j = (sum of the row inputs + the scalars + the sum of `whole`) * (j + factor);
        an inout buffer gets that sum times factor added. Values are small integers: exact in every type."""
        params, ins, outs, inouts, scalars = [], [], [], [], []
        rows = " * ".join(["n", *(d if isinstance(d, str) else str(d) for d in self.inner)])
        for position, (role, kind, t) in enumerate(self.items):
            name = f"p{position}"
            if role == "scalar":
                params.append(f"{C_TYPES[t]} {name}")
                scalars.append(name)
            else:
                params.append(f"{'const ' if kind == 'in' else ''}{C_TYPES[t]}* {name}")
                (ins if kind == "in" and role == "row" else outs if kind == "out" else inouts if kind == "inout" else []).append(name)
        whole = next((f"p{i}" for i, (role, _, _) in enumerate(self.items) if role == "whole"), None)
        params += [f"size_t {s}" for s in self.sizes()]
        body = ["  double extra = 0;"]
        body += [f"  extra += (double){s};" for s in scalars]
        if whole:
            body.append(f"  for (size_t j = 0; j < k; ++j) extra += (double){whole}[j];")
        types = {f"p{i}": C_TYPES[t] for i, (_, _, t) in enumerate(self.items)}
        body.append(f"  for (size_t i = 0; i < {rows}; ++i) {{")
        body.append("    double acc = extra" + "".join(f" + (double){name}[i]" for name in ins) + ";")
        body += [f"    {name}[i] = ({types[name]})(acc * {j + factor});" for j, name in enumerate(outs)]
        body += [f"    {name}[i] = ({types[name]})((double){name}[i] + acc * {factor});" for name in inouts]
        body.append("  }")
        return "#include <stddef.h>\n#include <stdint.h>\n\nvoid drawn(" + ", ".join(params) + ") {\n" + "\n".join(body) + "\n}\n"

    def reference(self, values: list[object], factor: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(the out results, the inout buffers after the call), by numpy."""
        operands = [(role, kind, t) for role, kind, t in self.items if kind != "out"]
        extra, acc = 0.0, None
        for (role, kind, _), value in zip(operands, values):
            if role == "scalar":
                extra += float(value)  # type: ignore[arg-type]
            elif role == "whole":
                extra += float(np.asarray(value, np.float64).sum())
            elif kind == "in":
                acc = np.asarray(value, np.float64) if acc is None else acc + np.asarray(value, np.float64)
        row_shape = next(np.shape(v) for (role, _, _), v in zip(operands, values) if role == "row")
        acc = (np.zeros(row_shape) if acc is None else acc) + extra
        outs = [(acc * (j + factor)).astype(DTYPES[t]) for j, (_, _, t) in enumerate(i for i in self.items if i[1] == "out")]
        inouts = [(np.asarray(v, np.float64) + acc * factor).astype(DTYPES[t]) for (_, kind, t), v in zip(operands, values) if kind == "inout"]
        return outs, inouts


@st.composite
def drawn_signatures(draw: st.DrawFn) -> Drawn:
    types = st.sampled_from(["f32", "f64", "i32"])
    inner = tuple(draw(st.lists(st.sampled_from(["a", "b", 3, 1]), max_size=2, unique=True)))
    rows = draw(st.lists(st.tuples(st.sampled_from(["in", "in", "out", "inout"]), types), min_size=1, max_size=3))
    if not any(kind in ("out", "inout") for kind, _ in rows):
        rows.append(("out", draw(types)))
    if not any(kind != "out" for kind, _ in rows):  # n and the inner sizes must come from an input
        rows.insert(0, ("in", draw(types)))
    items = [("row", kind, t) for kind, t in rows]
    if draw(st.booleans()):
        items.insert(draw(st.integers(0, len(items))), ("whole", "in", draw(types)))
    for _ in range(draw(st.integers(0, 2))):
        items.insert(draw(st.integers(0, len(items))), ("scalar", "in", draw(types)))
    return Drawn(tuple(items), inner, draw(st.sampled_from([None, 0, 1, 3, 7])), draw(st.sampled_from(["system", "system", "standalone", "embedded"])))


def _values(drawn: Drawn, n: int, inner: dict[str | int, int], k: int, rng: np.random.Generator) -> list[object]:
    shape = (n, *(inner[d] for d in drawn.inner))
    values: list[object] = []
    for role, kind, t in drawn.items:
        if kind == "out":
            continue
        if role == "scalar":
            values.append(int(rng.integers(-3, 4)) if t == "i32" else float(rng.integers(-3, 4)))
        else:
            values.append(rng.integers(-4, 5, size=shape if role == "row" else (k,)).astype(DTYPES[t]))
    return values


def _check(kernel: pb.InlineKernel, drawn: Drawn, values: list[object], factor: int) -> None:
    outs, inouts = drawn.reference(values, factor)
    given_inouts = [v for (_, kind, _), v in zip([i for i in drawn.items if i[1] != "out"], values) if kind == "inout"]
    result = kernel(*values)
    got = [] if result is None else list(result) if isinstance(result, tuple) else [result]
    assert len(got) == len(outs)
    for have, want in zip(got, outs):
        assert have.dtype == want.dtype and have.shape == want.shape
        np.testing.assert_array_equal(have, want)
    for have, want in zip(given_inouts, inouts):  # updated in the caller's own arrays
        np.testing.assert_array_equal(have, want)


@given(drawn_signatures(), st.data())
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_drawn_signature_computes_what_numpy_does_at_every_size_and_after_an_edit(drawn, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    first = pb.load_inline(c_source=drawn.c_source(1), function="drawn", args=drawn.args(), tile=drawn.tile, kind=drawn.build)
    edited = pb.load_inline(c_source=drawn.c_source(5), function="drawn", args=drawn.args(), tile=drawn.tile, kind=drawn.build)
    if drawn.build == "embedded":  # the function is linked into the module: a module per edit
        assert not first.plugins and edited.module != first.module
    else:  # one program for both: only the plugin is new
        assert edited.module == first.module and edited.plugins != first.plugins
    for _ in range(3):
        n = data.draw(st.sampled_from([0, 1, 2, 5, 8, 17]), label="n")
        inner = {d: data.draw(st.sampled_from([0, 1, 2, 3]), label=str(d)) if isinstance(d, str) else d for d in drawn.inner}
        k = data.draw(st.sampled_from([0, 1, 4]), label="k")
        for kernel, factor in ((first, 1), (edited, 5), (first, 1)):  # the earlier callable keeps its own code
            _check(kernel, drawn, _values(drawn, n, inner, k, rng), factor)


@pytest.mark.parametrize("kind", ["standalone", "embedded"])
def test_the_other_kinds_build_the_same_function(kind):
    """standalone: a freestanding plugin; embedded: objects linked into the module (no plugin),
    where an edit compiles the module again and each module keeps its own code."""
    source = AXPY if kind == "standalone" else AXPY.replace("#include <stddef.h>\n", "")  # size_t comes with the generated call
    axpy = pb.load_inline(c_source=source, function="axpy", args=AXPY_ARGS, kind=kind)
    edited = pb.load_inline(c_source=source.replace("a * x[i]", "a * a * x[i]"), function="axpy", args=AXPY_ARGS, kind=kind)
    assert bool(axpy.plugins) == (kind == "standalone")
    x, y = np.arange(5000, dtype=np.float32), np.ones(5000, np.float32)
    np.testing.assert_array_equal(axpy(x, y, 3.0), 3 * x + y)
    np.testing.assert_array_equal(edited(x, y, 3.0), 9 * x + y)
    np.testing.assert_array_equal(axpy(x, y, 3.0), 3 * x + y)


def test_axpy_from_a_c_function_and_its_signature():
    axpy = pb.load_inline(c_source=AXPY, function="axpy", args=AXPY_ARGS)
    for n in (0, 1, 4095, 4096, 4097, 10_000):  # around the default tile of 4096 elements
        x, y = np.arange(n, dtype=np.float32), np.ones(n, np.float32)
        np.testing.assert_array_equal(axpy(x, y, 2.0), 2 * x + y)


def test_a_matmul_tiles_the_rows_and_gives_the_other_operand_whole():
    source = textwrap.dedent("""\
        #include <stddef.h>
        void mm(const double* a, const double* b, double* c, size_t m, size_t k, size_t n) {
          for (size_t i = 0; i < m; ++i)
            for (size_t j = 0; j < n; ++j) {
              double s = 0;
              for (size_t l = 0; l < k; ++l) s += a[i * k + l] * b[l * n + j];
              c[i * n + j] = s;
            }
        }
        """)
    sig = signature.parse("in:f64[m, k], in:f64[k, n], out:f64[m, n]", "mm")
    assert sig.tiled == "m"
    mm = pb.load_inline(c_source=source, function="mm", args="in:f64[m, k], in:f64[k, n], out:f64[m, n]", tile=5)
    rng = np.random.default_rng(1)
    for m, k, n in ((37, 5, 3), (1, 1, 1), (0, 2, 2), (16, 0, 4)):
        a, b = rng.random((m, k)), rng.random((k, n))
        np.testing.assert_allclose(mm(a, b), a @ b, rtol=1e-12, atol=0)


def test_outputs_of_numbered_sizes_and_the_other_element_types():
    """A result whose dims are all numbers (not tiled: one call sums everything), f16 buffers
    with an i64 scalar, and i8 in 2-D."""
    total = "#include <stddef.h>\nvoid total(const double* x, double* out, size_t n) { double s = 0; for (size_t i = 0; i < n; ++i) s += x[i]; out[0] = s; }\n"
    x = np.arange(10_001, dtype=np.float64)
    np.testing.assert_array_equal(pb.load_inline(c_source=total, function="total", args="in:f64[n], out:f64[1]")(x), [x.sum()])
    half = "#include <stddef.h>\n#include <stdint.h>\nvoid h(const _Float16* x, int64_t k, _Float16* y, size_t n) { for (size_t i = 0; i < n; ++i) y[i] = x[i] * (_Float16)k; }\n"
    h = np.arange(5, dtype=np.float16)
    np.testing.assert_array_equal(pb.load_inline(c_source=half, function="h", args="in:f16[n], in:i64, out:f16[n]")(h, 3), h * 3)
    neg = "#include <stddef.h>\n#include <stdint.h>\nvoid s(const int8_t* x, int8_t* y, size_t r, size_t c) { for (size_t i = 0; i < r * c; ++i) y[i] = -x[i]; }\n"
    b = np.arange(6, dtype=np.int8).reshape(2, 3)
    np.testing.assert_array_equal(pb.load_inline(c_source=neg, function="s", args="in:i8[r, c], out:i8[r, c]")(b), -b)


def test_a_size_used_off_the_lead_is_not_tiled():
    # `reverse` reads row n-1-i for row i: no tile of rows holds what it needs, so tile=0.
    source = "#include <stddef.h>\nvoid rev(const int* x, int* y, size_t n) { for (size_t i = 0; i < n; ++i) y[i] = x[n - 1 - i]; }\n"
    rev = pb.load_inline(c_source=source, function="rev", args="in:i32[n], out:i32[n]", tile=0)
    x = np.arange(9000, dtype=np.int32)
    np.testing.assert_array_equal(rev(x), x[::-1])
    assert signature.parse("in:f32[n, n], out:f32[n, n]", "t").tiled is None  # n is also an inner size


def test_an_edit_is_loaded_beside_the_first_in_process_and_the_program_is_not_compiled_again(capfd, monkeypatch):
    monkeypatch.setattr(echo, "VERBOSITY", 1)
    first = pb.load_inline(c_source=AXPY, function="axpy", args=AXPY_ARGS)
    capfd.readouterr()
    edited = pb.load_inline(c_source=AXPY.replace("a * x[i]", "a * a * x[i]"), function="axpy", args=AXPY_ARGS)
    log = capfd.readouterr().err
    assert "iree-compile" not in log, log
    x, y = np.arange(5, dtype=np.float32), np.ones(5, np.float32)
    np.testing.assert_array_equal(edited(x, y, 3.0), 9 * x + y)
    np.testing.assert_array_equal(first(x, y, 3.0), 3 * x + y)
    assert "note: pb.run" not in capfd.readouterr().err  # in process: nothing went to iree-run-module


def test_edits_in_a_fresh_process_never_leave_it():
    code = textwrap.dedent(f"""\
        import numpy as np, pyree_build as pb
        from pyree_build.actions import inprocess
        def refuse(*args, **kwargs):
            raise SystemExit("ran out of process")
        inprocess.run_to_arrays = refuse
        source = {AXPY!r}
        x, y = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
        kernels = [pb.load_inline(c_source=source.replace("a * x[i]", f"{{m}} * a * x[i]"), function="axpy", args={AXPY_ARGS!r}) for m in (1, 2, 3)]
        for kernel in kernels + kernels[::-1]:
            print(int(kernel(x, y, 1.0)[3]))
        """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["4", "7", "10", "10", "7", "4"]


class _Wrapped:
    """An array of another library: only `__dlpack__` says where its memory is."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __dlpack__(self, **kwargs: object) -> object:
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.array.__dlpack_device__()


def test_anything_with_dlpack_is_read_without_a_copy_and_updated_in_place():
    source = "#include <stddef.h>\nvoid bump(float* x, float by, size_t n) { for (size_t i = 0; i < n; ++i) x[i] += by; }\n"
    bump = pb.load_inline(c_source=source, function="bump", args="inout:f32[n], in:f32")
    memory = np.zeros(6, np.float32)
    assert bump(_Wrapped(memory), 2.5) is None
    np.testing.assert_array_equal(memory, np.full(6, 2.5, np.float32))
    assert np.shares_memory(signature.as_array(_Wrapped(memory)), memory)


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install '.[torch]')")
    axpy = pb.load_inline(c_source=AXPY, function="axpy", args=AXPY_ARGS)
    x, y = torch.arange(7, dtype=torch.float32), torch.ones(7)
    out = axpy(x, y, 2.0)
    assert isinstance(out, torch.Tensor)
    assert torch.equal(out, 2 * x + y)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("in:f32[n], out:f32", "argument 2 'out:f32'|item 2 'out:f32' is an output without a size"),
        ("in:f32[n], out:f32[m]", "size 'm' is used by no input"),
        ("in:f32[n-1], out:f32[n]", "size name in args item 1 'in:f32\\[n-1\\]'.* is not a C identifier"),
        ("in:f32[int], out:f32[int]", "a keyword"),
        ("in:f32[n], out:f32[?]", "name each size"),
        ("in:f31[n], out:f32[n]", "'f31' is not an element type"),
        ("input:f32[n], out:f32[n]", "'input' is not a kind"),
        ("in:f32[n]", "no out or inout argument"),
        ("in:f32[n],, out:f32[n]", "args item 2 is empty"),
        ("in:f16, out:f32[1]", "a scalar is one of"),
        ("scalar:f32[n], out:f32[n]", "a scalar has no dims"),
        ("in:f32[], out:f32[1]", "has no dims"),
        ("", "args= must be a non-empty string"),
    ],
)
def test_a_bad_signature_is_named_and_builds_nothing(args, message):
    with pytest.raises(pb.PyreeError, match=message):
        pb.load_inline(c_source=AXPY, function="axpy", args=args)


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"function": "2axpy"}, "function '2axpy' is not a C identifier"),
        ({"mlir": "module {}"}, "pass mlir= or args=, not both"),
        ({"kind": "shared"}, "unknown plugin kind 'shared'"),
        ({"tile": -1}, "tile=-1 is not a row count"),
        ({"c_source": None}, "no c_source= defines axpy"),
        ({"files": {"k.glsl": ""}}, "args= takes one C function \\(c_source=\\) or one compute shader"),
        ({"files": {"k.glsl": "void main() {}"}, "c_source": None}, "the shader declares no local_size_x"),
    ],
)
def test_bad_arguments_of_the_signature_form_are_named(keywords, message):
    with pytest.raises(pb.PyreeError, match=message):
        pb.load_inline(**{"c_source": AXPY, "function": "axpy", "args": AXPY_ARGS, **keywords})


def test_load_inline_without_a_program_says_what_to_pass():
    with pytest.raises(pb.PyreeError, match="needs the program: args="):
        pb.load_inline(c_source=AXPY, function="axpy")


def test_calls_that_do_not_fit_the_signature_are_named():
    axpy = pb.load_inline(c_source=AXPY, function="axpy", args=AXPY_ARGS)
    x = np.ones(4, np.float32)
    with pytest.raises(pb.PyreeError, match=r"size 'n' is 4 in argument 1 \('in:f32\[n\]'\) but 5 in argument 2"):
        axpy(x, np.ones(5, np.float32), 1.0)
    with pytest.raises(pb.PyreeError, match="argument 2 .* is an array of float64, not float32"):
        axpy(x, np.ones(4), 1.0)
    with pytest.raises(pb.PyreeError, match="has 2 dims"):
        axpy(x, np.ones((2, 2), np.float32), 1.0)
    with pytest.raises(pb.PyreeError, match="takes 3 arguments"):
        axpy(x, x)
    with pytest.raises(pb.PyreeError, match="argument 3 .* is a number, not str"):
        axpy(x, x, "2")


def test_a_function_that_does_not_fit_its_signature_says_the_order():
    wrong = "#include <stddef.h>\nvoid axpy(const float* x, float* out, size_t n) { (void)x; (void)out; (void)n; }\n"
    with pytest.raises(pb.PyreeError) as caught:
        pb.load_inline(c_source=wrong, function="axpy", args=AXPY_ARGS)
    assert "args_call" in caught.value.what and "in args= order" in (caught.value.fix or "")


def test_a_c_error_in_the_function_names_its_line():
    broken = AXPY.replace("out[i] = a * x[i] + y[i];", "out[i] = a * x[i] + z[i];")
    with pytest.raises(pb.PyreeError, match="c_source line 3"):
        pb.load_inline(c_source=broken, function="axpy", args=AXPY_ARGS)


def test_the_program_is_generated_from_the_signature_alone():
    sig = signature.parse("in:f32[m, 4], in:f32, inout:i32[m], out:f64[m, 4]", "f")
    text = signature.program(sig)
    assert "func.func @f(%a1: tensor<?x4xf32>, %a2: f32, %a3: tensor<?xi32>) -> (tensor<?xi32>, tensor<?x4xf64>)" in text
    assert sig.compile_flags == signature.F64_FLAGS
    assert sig.sizes == ("m",) and sig.tiled == "m"


SHADER = """\
#version 450
layout(local_size_x = 32) in;
layout(set = 0, binding = 0) buffer readonly X { float v[]; } x;
layout(set = 0, binding = 1) buffer readonly Y { float v[]; } y;
layout(set = 0, binding = 2) buffer writeonly Out { float v[]; } result;
layout(push_constant) uniform Constants { float a; uint n; } constants;
void main() {
  uint i = gl_GlobalInvocationID.x;
  if (i < constants.n) result.v[i] = constants.a * x.v[i] + y.v[i];
}
"""


@pytest.mark.skipif(not vulkan.status()[0], reason=vulkan.status()[1])
def test_a_compute_shader_from_its_signature_runs_on_vulkan():
    axpy = pb.load_inline(files={"axpy.glsl": SHADER}, function="axpy", args=AXPY_ARGS)
    assert axpy.device == "vulkan"
    for n in (1, 33, 1000):
        x, y = np.arange(n, dtype=np.float32), np.ones(n, np.float32)
        np.testing.assert_array_equal(axpy(x, y, 2.0), 2 * x + y)


def test_a_shader_program_takes_32_bit_scalars_only():
    with pytest.raises(pb.PyreeError, match="push constants are 32-bit words"):
        pb.load_inline(files={"axpy.glsl": SHADER}, function="axpy", args="in:f32[n], in:f32[n], in:f64, out:f32[n]")


def test_the_generated_files_show_the_signature_as_parsed_not_as_written():
    """Whitespace the caller wrote (a newline inside an item) never reaches the generated C or
    MLIR, where it would end a // comment."""
    sig = signature.parse("in: \nf32[ n ], out:f32[n]", "f")
    assert sig.text() == "in:f32[n], out:f32[n]"
    assert "\nf32" not in signature.adapter(sig, "kernel.c") and "\nf32" not in signature.program(sig)
