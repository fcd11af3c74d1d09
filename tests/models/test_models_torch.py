"""From PyTorch (issue 49): a torch program imported with iree-turbine's aot.export, its ops named
by module; `verify` against torch itself; a load_inline kernel as a torch operator that eager
torch, torch.export, torch.compile and a compiled IREE module all call.

Everything real: torch, iree-turbine, iree-compile, zig cc, iree-run-module. Skipped where torch
or iree-turbine is not installed (pip install "pyree_build[torch]" and torch).
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_clean_error, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
pytest.importorskip("iree.turbine", reason='iree-turbine is not installed (pip install "pyree_build[torch]")')

import pyree_build as pb  # noqa: E402


class MLP(torch.nn.Module):
    def __init__(self, width: int = 16, hidden: int = 32, out: int = 8) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(width, hidden)
        self.act = torch.nn.GELU()
        self.fc2 = torch.nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Blocks(torch.nn.Module):
    """Modules nested in a ModuleList: names like blocks.1.fc1."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([MLP(16, 16, 16), MLP(16, 24, 16)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x)) + x
        return x


class ConvBlock(torch.nn.Module):
    def __init__(self, channels: int = 4, out: int = 8) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, out, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.conv(x)))


class Attention(torch.nn.Module):
    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.qkv, self.proj = heads, torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        qkv = self.qkv(x).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # indexed: unbind's tuple is a value the FX importer cannot import
        scores = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        return self.proj((scores @ v).transpose(1, 2).reshape(b, s, d))


def _seeded(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    for p in module.parameters():
        torch.nn.init.uniform_(p, -0.5, 0.5)
    return module.eval()


def _saved(tmp_path: Path, module: torch.nn.Module, args: tuple, name: str = "model", **export: object) -> Path:
    path = tmp_path / f"{name}.pt2"
    torch.export.save(torch.export.export(module, args, **export), path)  # type: ignore[arg-type]
    return path


def test_ops_are_named_by_their_modules(tmp_path):
    mlir = pb.import_torch(_seeded(Blocks()), (torch.randn(4, 16),), output=tmp_path / "blocks.mlir")
    sources = {name for g in pb.ops(mlir) for name in g.source}
    assert {"blocks.0.fc1", "blocks.0.act", "blocks.1.fc2"} <= sources, sources
    assert "relu" in sources or "add" in sources  # an op of the top module: the node's own name


def test_dynamic_dims_from_torch_export_are_dynamic_in_the_program(tmp_path):
    batch = torch.export.Dim("batch")
    mlir = pb.import_torch(_seeded(MLP()), (torch.randn(4, 16),), output=tmp_path / "mlp.mlir", dynamic_shapes={"x": {0: batch}})
    assert "!torch.vtensor<[?,16],f32>" in mlir.read_text()


def test_cli_imports_a_saved_program_and_verify_compares_it_with_torch(tmp_path):
    pt2 = _saved(tmp_path, _seeded(MLP()), (torch.randn(4, 16),))
    mlir, module = tmp_path / "mlp.mlir", tmp_path / "mlp.vmfb"
    assert run_cli("import", pt2, "-o", mlir).returncode == 0
    assert run_cli("compile", mlir, "-o", module).returncode == 0
    result = run_cli("verify", module, "--torch", pt2)
    assert result.returncode == 0, result
    assert "verified main against torch" in result.stderr


def test_verify_against_torch_catches_a_module_of_other_weights(tmp_path):
    pt2 = _saved(tmp_path, _seeded(MLP(), seed=1), (torch.randn(4, 16),), name="one")
    other = pb.import_torch(_seeded(MLP(), seed=2), (torch.randn(4, 16),), output=tmp_path / "other.mlir")
    module = pb.compile(other, tmp_path / "other.vmfb", target="llvm-cpu")
    result = pb.verify(module, torch=torch.export.load(pt2))
    assert not result.passed
    assert result.outputs[0].reference == "torch"
    failed = run_cli("verify", module, "--torch", pt2)
    assert_clean_error(failed, "differ from torch's")


class Unpacks(torch.nn.Module):
    """A tensor unpacked into three (unbind): saved and loaded, its tuple has no tensor_meta,
    which the FX importer cannot import."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = x.reshape(1, 5, 3, 2, 4).permute(2, 0, 3, 1, 4)
        return q @ k.transpose(-1, -2) @ v


def test_a_construct_the_importer_cannot_import_is_a_clear_error(tmp_path):
    pt2 = _saved(tmp_path, Unpacks(), (torch.randn(1, 5, 24),))
    result = run_cli("import", pt2, "-o", tmp_path / "u.mlir")
    assert_clean_error(result, "aot.export could not import the program")
    assert "unbind" in result.stderr and not (tmp_path / "u.mlir").exists()


def test_a_saved_program_holding_a_pickle_is_refused_and_runs_nothing(tmp_path):
    """torch.export.load would unpickle this payload with Python's full unpickler (it tries
    again without weights_only when the safe load fails): a model is data, never code."""
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple:
            return (Path.touch, (marker,))

    good = _saved(tmp_path, _seeded(MLP()), (torch.randn(4, 16),))
    evil = tmp_path / "evil.pt2"
    with zipfile.ZipFile(good) as source, zipfile.ZipFile(evil, "w") as out:
        for name in source.namelist():
            out.writestr(name, pickle.dumps(Payload()) if name.endswith("sample_inputs/model.pt") else source.read(name))
    result = run_cli("import", evil, "-o", tmp_path / "evil.mlir")
    assert_clean_error(result, "would unpickle with Python's full unpickler")
    assert not marker.exists() and not (tmp_path / "evil.mlir").exists()


def test_a_replaced_group_of_a_torch_model_verifies_against_torch(tmp_path):
    model = _seeded(MLP())
    pt2 = _saved(tmp_path, model, (torch.randn(4, 16),))
    mlir = pb.import_torch(torch.export.load(pt2), output=tmp_path / "mlp.mlir")
    (group,) = [g for g in pb.ops(mlir) if "act" in g.source]
    assert group.replaceable and "fc1" in group.source  # Linear + GELU: one group
    out = tmp_path / "k"
    pb.replace(mlir, out, ops=[group.index], imports=["fc1_gelu"])
    plugin = pb.plugin(out / "fc1_gelu.c", out / "fc1_gelu.so", kind="system")
    compiled = run_cli("compile", mlir, "-o", out / "m.vmfb", "--transform-spec", out / "spec.mlir", "--expect-import", "fc1_gelu")
    assert compiled.returncode == 0, compiled
    assert pb.verify(out / "m.vmfb", torch=pt2, plugins=[plugin]).passed


ARCHITECTURES = {
    "mlp": lambda w: (MLP(w, 2 * w, w), (torch.randn(3, w),)),
    "conv": lambda w: (ConvBlock(w, w + 2), (torch.randn(1, w, 6, 6),)),
    "attention": lambda w: (Attention(4 * w, 2), (torch.randn(1, 5, 4 * w),)),
}


@settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(ARCHITECTURES)), width=st.integers(2, 6), seed=st.integers(0, 100))
def test_every_replaceable_group_of_a_drawn_torch_model_at_once_verifies_against_torch(tmp_path_factory, name, width, seed):
    """0 wrong: each drawn model (an MLP, a conv block, an attention block, of drawn widths and
    weights) with every group `ops` marks replaceable replaced at once matches torch."""
    tmp_path = tmp_path_factory.mktemp(name)
    module, args = ARCHITECTURES[name](width)
    pt2 = _saved(tmp_path, _seeded(module, seed), args)
    mlir = pb.import_torch(torch.export.load(pt2), output=tmp_path / "m.mlir")
    chosen = [g.index for g in pb.ops(mlir) if g.replaceable]
    assert chosen, f"no group of {name} is replaceable"
    names = [f"g{i}" for i in chosen]
    out = tmp_path / "k"
    pb.replace(mlir, out, ops=chosen, imports=names)
    plugins = [pb.plugin(out / f"{n}.c", out / f"{n}.so", kind="system") for n in names]
    expects = [a for n in names for a in ("--expect-import", n)]
    compiled = run_cli("compile", mlir, "-o", out / "m.vmfb", "--transform-spec", out / "spec.mlir", *expects)
    assert compiled.returncode == 0, compiled
    result = pb.verify(out / "m.vmfb", torch=pt2, plugins=plugins)
    assert result.passed, "\n".join(o.render() for t in result.trials for o in t.outputs if not o.passed)


# --- a kernel as a torch operator ------------------------------------------------------------

AXPY = textwrap.dedent("""\
    #include <stddef.h>
    void axpy(const float* x, const float* y, float a, float* out, size_t n) {
      for (size_t i = 0; i < n; ++i) out[i] = a * x[i] + y[i];
    }
    """)
AXPY_ARGS = "in:f32[n], in:f32[n], in:f32, out:f32[n]"


class UsesAxpy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(torch.ops.pyree_test.axpy(x, y, 3.0)))


def test_a_kernel_is_a_torch_op_in_eager_export_and_torch_compile():
    axpy = pb.torch_op(pb.load_inline(c_source=AXPY, function="axpy", args=AXPY_ARGS), "pyree_test::axpy")
    x, y = torch.arange(6.0), torch.ones(6)
    assert torch.equal(axpy(x, y, 2.0), 2 * x + y)
    model = _seeded(UsesAxpy())
    exported = torch.export.export(model, (torch.randn(8), torch.randn(8)))
    assert any("pyree_test.axpy" in str(n.target) for n in exported.graph.nodes)  # traced through its fake
    a, b = torch.randn(8), torch.randn(8)
    torch.testing.assert_close(exported.module()(a, b), model(a, b))
    # torch.compile traces it with its meta implementation (dynamo; backend "eager" needs no C++ compiler).
    torch.testing.assert_close(torch.compile(model, backend="eager", fullgraph=True)(a, b), model(a, b))


def test_a_module_calling_the_op_compiles_to_a_call_of_the_kernel_and_matches_eager(tmp_path):
    kernel = pb.load_inline(c_source=AXPY, function="axpy", args=AXPY_ARGS)
    pb.torch_op(kernel, "pyree_test::axpy")
    model = _seeded(UsesAxpy())
    x, y = torch.randn(8), torch.randn(8)
    mlir = pb.import_torch(model, (x, y), output=tmp_path / "uses.mlir")
    module = pb.compile(mlir, tmp_path / "uses.vmfb", target="llvm-cpu", expect_imports=["pyree_call_axpy"])
    (result,) = pb.run(module, "main", [x.numpy(), y.numpy()], plugins=list(kernel.plugins))
    np.testing.assert_allclose(result, model(x, y).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_loading_the_op_again_after_an_edit_runs_the_new_code():
    code = textwrap.dedent(f"""\
        import torch, pyree_build as pb
        source, args = {AXPY!r}, {AXPY_ARGS!r}
        for factor in (1, 4):
            pb.torch_op(pb.load_inline(c_source=source.replace("a * x[i]", f"{{factor}} * a * x[i]"), function="axpy", args=args), "edits::axpy")
            print(int(torch.ops.edits.axpy(torch.ones(3), torch.zeros(3), 2.0)[0]))
        """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2", "8"]


@pytest.mark.parametrize(
    ("args", "name", "message"),
    [
        ("inout:f32[n], in:f32", "lib::bump", "without inout buffers"),
        (AXPY_ARGS, "axpy", "is not an operator name NAMESPACE::NAME"),
    ],
)
def test_bad_torch_ops_are_named(args, name, message):
    source = AXPY if not args.startswith("inout") else "#include <stddef.h>\nvoid axpy(float* x, float a, size_t n) { (void)x; (void)a; (void)n; }\n"
    with pytest.raises(pb.PyreeError, match=message):
        pb.torch_op(pb.load_inline(c_source=source, function="axpy", args=args), name)


def test_verify_names_a_missing_or_doubled_reference(tmp_path):
    mlir = pb.import_torch(_seeded(MLP()), (torch.randn(4, 16),), output=tmp_path / "m.mlir")
    module = pb.compile(mlir, tmp_path / "m.vmfb", target="llvm-cpu")
    with pytest.raises(pb.PyreeError, match="verify needs a reference"):
        pb.verify(module)
    with pytest.raises(pb.PyreeError, match="both an ONNX model and a torch program"):
        pb.verify(module, tmp_path / "x.onnx", torch=tmp_path / "x.pt2")
    with pytest.raises(pb.PyreeError, match="torch= takes a torch.export.ExportedProgram"):
        pb.verify(module, torch=42)
