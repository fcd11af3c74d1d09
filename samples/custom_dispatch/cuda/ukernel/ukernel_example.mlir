// A kernel IREE generates for CUDA that calls a CUDA __device__ microkernel from
// bitcode (ukernel.cu -> ukernel_sm_80.bc, linked with --iree-link-bitcode).
//
// One workgroup of 32 threads computes the whole 32-element result: the dispatch
// region calls the microkernel through iree_codegen.ukernel.generic, and the
// squaring after it is ordinary generated code.
//
// Run (on an NVIDIA GPU): --device=cuda --function=scaled_add_squared
//   --input=32xf32=1 --input=32xf32=3  prints 32xf32=25 25 ... 25 (all 32): (2*1 + 3)^2 = 25.
// Compiled without the bitcode, the PTX would call an undefined scaled_add_workgroup
// that only the driver notices; pyree-build compile checks the PTX and refuses it.

func.func @scaled_add_squared(%x: tensor<32xf32>, %y: tensor<32xf32>) -> tensor<32xf32> {
  %one = arith.constant 1 : index
  %count = arith.constant 32 : index
  %empty = tensor.empty() : tensor<32xf32>
  %sum = flow.dispatch.region[] -> (tensor<32xf32>)
      attributes {iree_codegen.export_config = #iree_codegen.export_config<workgroup_size = [32]>} {
    %xs = tensor.extract_slice %x[0] [%count] [1] : tensor<32xf32> to tensor<?xf32>
    %ys = tensor.extract_slice %y[0] [%count] [1] : tensor<32xf32> to tensor<?xf32>
    %outs = tensor.extract_slice %empty[0] [%count] [1] : tensor<32xf32> to tensor<?xf32>
    %r = iree_codegen.ukernel.generic "scaled_add_workgroup"
      ins(%xs, %ys : tensor<?xf32>, tensor<?xf32>)
      outs(%outs : tensor<?xf32>)
      (%count : index)
      strided_dims([[], [], []]) -> tensor<?xf32>
    %whole = tensor.insert_slice %r into %empty[0] [%count] [1] : tensor<?xf32> into tensor<32xf32>
    flow.return %whole : tensor<32xf32>
  } count() -> (index, index, index) {
    flow.return %one, %one, %one : index, index, index
  }
  %squared = arith.mulf %sum, %sum : tensor<32xf32>
  return %squared : tensor<32xf32>
}
