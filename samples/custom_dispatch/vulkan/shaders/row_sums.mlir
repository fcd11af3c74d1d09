// Generated code only: the sum of each row of a 4x1024 matrix. IREE reduces with
// subgroup operations sized for the --iree-vulkan-target it compiles for; on a device
// with other subgroups iree-run-module prints wrong numbers and exits 0 (a module for
// `rdna3` or `ampere` gives 256 on lavapipe, whose subgroups are 8 wide), which
// `pyree-build run` refuses to run. The sample compiles it
// with VULKAN_TARGET auto, the target of the Vulkan device found at build time, and
// checks the right answer, 1024 per row.
func.func @row_sums(%m: tensor<4x1024xf32>) -> tensor<4xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<4xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<4xf32>) -> tensor<4xf32>
  %sums = linalg.generic {
      indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i)>],
      iterator_types = ["parallel", "reduction"]}
      ins(%m : tensor<4x1024xf32>) outs(%init : tensor<4xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %s = arith.addf %x, %acc : f32
    linalg.yield %s : f32
  } -> tensor<4xf32>
  return %sums : tensor<4xf32>
}
