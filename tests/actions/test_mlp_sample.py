"""The mlp_plugin sample by the CLI: spec replacement, the differential check, and a benchmark
whose plugin prints to stdout."""

from __future__ import annotations

from conftest import SAMPLES, run_cli

MLP = SAMPLES / "custom_dispatch" / "cpu" / "mlp_plugin"
INPUTS = ["--input", "4x3xf32=[[1,2,3],[-1,-2,-3],[0.5,0.5,0.5],[2,0,-2]]", "--input", "3x5xf32=1", "--input", "5xf32=[0 1 2 3 4]"]
EXPECTED = "4x5xf32=[6 7 8 9 10][0 1 2 3 4][1.5 2.5 3.5 4.5 5.5][0 1 2 3 4]"


def test_plugin_and_reference_agree_and_compare_in_a_benchmark(tmp_path):
    plugin, with_plugin, reference = tmp_path / "p.so", tmp_path / "with.vmfb", tmp_path / "ref.vmfb"
    steps = [
        ("plugin", "--kind", "system", MLP / "matmul_relu_plugin.c", "-o", plugin),
        ("compile", MLP / "mlp.mlir", "-o", with_plugin, "--transform-spec", MLP / "matmul_relu_spec.mlir", "--expect-import", "fused_matmul_relu"),
        ("compile", MLP / "mlp.mlir", "-o", reference),
    ]
    for step in steps:
        result = run_cli(*step)
        assert result.returncode == 0, result
    ran = run_cli("run", with_plugin, "--function", "mlp", *INPUTS, "--plugin", plugin)
    assert ran.returncode == 0, ran
    assert "[matmul_relu plugin] M = 4, N = 5, K = 3" in ran.stdout
    ref = run_cli("run", reference, "--function", "mlp", *INPUTS)
    assert ref.returncode == 0, ref
    assert "[matmul_relu plugin]" not in ref.stdout
    assert ran.stdout.strip().splitlines()[-1] == ref.stdout.strip().splitlines()[-1] == EXPECTED
    # The plugin prints into iree-benchmark-module's stdout; the JSON must still be read.
    bench = run_cli("bench", "--compare", reference, with_plugin, "--function", "mlp", *INPUTS, "--plugin", plugin,
                    "--repetitions", "2", "--rounds", "2")  # fmt: skip
    assert bench.returncode == 0, bench
    assert "B/A =" in bench.stdout
