// A one-layer perceptron as a model exporter would write it:
//
//   mlp(x, w, b) = relu(x @ w) + b      x: 4x3, w: 3x5, b: 5
//
// Nothing here mentions a plugin. Compiled with matmul_relu_spec.mlir, the
// fill + matmul + relu part is replaced by a dispatch that calls the import
// `fused_matmul_relu` (matmul_relu_plugin.c); the bias add stays IREE's own
// code. Compiled without the spec, all of it is IREE's code: both modules must
// print the same numbers.

func.func @mlp(%x: tensor<4x3xf32>, %w: tensor<3x5xf32>, %b: tensor<5xf32>) -> tensor<4x5xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<4x5xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<4x5xf32>) -> tensor<4x5xf32>
  %xw = linalg.matmul ins(%x, %w : tensor<4x3xf32>, tensor<3x5xf32>)
                      outs(%acc : tensor<4x5xf32>) -> tensor<4x5xf32>
  %hidden = linalg.generic {
      indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%xw : tensor<4x5xf32>) outs(%empty : tensor<4x5xf32>) {
    ^bb0(%v: f32, %unused: f32):
      %r = arith.maximumf %v, %zero : f32
      linalg.yield %r : f32
  } -> tensor<4x5xf32>
  %out = linalg.generic {
      indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (j)>,
                       affine_map<(i, j) -> (i, j)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%hidden, %b : tensor<4x5xf32>, tensor<5xf32>) outs(%empty : tensor<4x5xf32>) {
    ^bb0(%h: f32, %bias: f32, %unused: f32):
      %s = arith.addf %h, %bias : f32
      linalg.yield %s : f32
  } -> tensor<4x5xf32>
  return %out : tensor<4x5xf32>
}
