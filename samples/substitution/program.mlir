// A small program with two dispatches, to dump, edit and substitute:
//   main_dispatch_0: sum = a + b            (elementwise)
//   main_dispatch_1: product = sum x b      (4x4 matmul)
// With a = 1 and b = 2 every element is 4 * (1 + 2) * 2 = 24.
func.func @main(%a: tensor<4x4xf32>, %b: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %sum = arith.addf %a, %b : tensor<4x4xf32>
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<4x4xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<4x4xf32>) -> tensor<4x4xf32>
  %product = linalg.matmul ins(%sum, %b : tensor<4x4xf32>, tensor<4x4xf32>)
                           outs(%acc : tensor<4x4xf32>) -> tensor<4x4xf32>
  return %product : tensor<4x4xf32>
}
