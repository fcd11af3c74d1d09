// Microkernel style: the dispatch region is ordinary tensor code that IREE
// generates, split into two tiles; each tile calls the plugin's
// `simple_mul_workgroup` as a microkernel on its slice.
//
//   ukernel_example(a, b) = a * b      (a = 2, b = 4  ->  8)

func.func @ukernel_example(%a: tensor<?xf32>, %b: tensor<?xf32>) -> tensor<?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %tiles = arith.constant 2 : index
  %n = tensor.dim %a, %c0 : tensor<?xf32>
  %init = tensor.empty(%n) : tensor<?xf32>
  %result = flow.dispatch.region[%tiles] -> (tensor<?xf32>{%n}) {
    %tile = flow.dispatch.workgroup.id[0] : index
    %tile_count = flow.dispatch.workgroup.count[0] : index
    %tile_size = affine.apply affine_map<()[s0, s1] -> (s0 ceildiv s1)>()[%n, %tile_count]
    %begin = affine.apply affine_map<()[s0, s1] -> (s0 * s1)>()[%tile, %tile_size]
    %count = affine.min affine_map<(d0)[s0, s1] -> (s1 - d0, s0)>(%begin)[%tile_size, %n]
    %lhs = tensor.extract_slice %a[%begin] [%count] [1] : tensor<?xf32> to tensor<?xf32>
    %rhs = tensor.extract_slice %b[%begin] [%count] [1] : tensor<?xf32> to tensor<?xf32>
    %out = tensor.extract_slice %init[%begin] [%count] [1] : tensor<?xf32> to tensor<?xf32>
    %product = iree_codegen.ukernel.generic "simple_mul_workgroup"
      ins(%lhs, %rhs : tensor<?xf32>, tensor<?xf32>)
      outs(%out : tensor<?xf32>)
      (%count, %tile : index, index)
      fn_def_attrs {hal.import.fields = ["processor_id", "processor_data"]}
      strided_dims([[], [], []]) -> tensor<?xf32>
    %whole = tensor.insert_slice %product into %init[%begin] [%count] [1] : tensor<?xf32> into tensor<?xf32>
    flow.return %whole : tensor<?xf32>
  } count(%workload: index) -> (index, index, index) {
    flow.return %workload, %c1, %c1 : index, index, index
  }
  return %result : tensor<?xf32>
}
