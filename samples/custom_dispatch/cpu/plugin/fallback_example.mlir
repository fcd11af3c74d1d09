// The plugin-search-order program: one dispatch calls two imports,
// `simple_mul_workgroup` and then `simple_add_workgroup` (in place), each of
// which may come from a different plugin.
//
//   fallback_invocation(a, b) = mul(a, b) + b
//     fallback plugin alone:            2 * 4 + 4       = 12
//     fallback, then override (x10):    2 * 4 * 10 + 4  = 84

module @fallback_sample {

  stream.executable private @mul_add_by_imports {
    // One workgroup per 64 elements.
    stream.executable.export public @mul_add workgroups(%n: index) -> (index, index, index) {
      %groups = affine.apply affine_map<()[s0] -> (s0 ceildiv 64)>()[%n]
      %one = arith.constant 1 : index
      stream.return %groups, %one, %one : index, index, index
    }

    builtin.module {
      // Provided at run time by the plugin. Memrefs arrive as bare pointers
      // plus offsets; the processor fields are appended to the argument block.
      func.func private @simple_mul_workgroup(
          memref<f32>, index, memref<f32>, index, memref<f32>, index,
          index, index) attributes {
        hal.import.fields = ["processor_id", "processor_data"],
        llvm.bareptr = true
      }
      func.func private @simple_add_workgroup(
          memref<f32>, index, memref<f32>, index, memref<f32>, index,
          index, index) attributes {
        hal.import.fields = ["processor_id", "processor_data"],
        llvm.bareptr = true
      }

      func.func @mul_add(%lhs_binding: !stream.binding, %rhs_binding: !stream.binding,
                     %out_binding: !stream.binding, %n: index) {
        %c0 = arith.constant 0 : index
        // This workgroup's tile: [begin, begin + count) with count <= 64.
        %workgroup = stream.dispatch.workgroup.id[0] : index
        %begin = affine.apply affine_map<()[s0] -> (s0 * 64)>()[%workgroup]
        %count = affine.min affine_map<()[s0, s1] -> (64, s1 - s0)>()[%begin, %n]
        %lhs = stream.binding.subspan %lhs_binding[%c0] : !stream.binding -> memref<?xf32>{%n}
        %rhs = stream.binding.subspan %rhs_binding[%c0] : !stream.binding -> memref<?xf32>{%n}
        %out = stream.binding.subspan %out_binding[%c0] : !stream.binding -> memref<?xf32>{%n}
        %lhs_base, %lhs_offset, %lhs_size, %lhs_stride = iree_codegen.extract_strided_metadata %lhs
            : memref<?xf32> -> memref<f32>, index, index, index
        %rhs_base, %rhs_offset, %rhs_size, %rhs_stride = iree_codegen.extract_strided_metadata %rhs
            : memref<?xf32> -> memref<f32>, index, index, index
        %out_base, %out_offset, %out_size, %out_stride = iree_codegen.extract_strided_metadata %out
            : memref<?xf32> -> memref<f32>, index, index, index
        %lhs_at = arith.addi %lhs_offset, %begin : index
        %rhs_at = arith.addi %rhs_offset, %begin : index
        %out_at = arith.addi %out_offset, %begin : index
        func.call @simple_mul_workgroup(%lhs_base, %lhs_at, %rhs_base, %rhs_at,
                                        %out_base, %out_at, %count, %workgroup)
            : (memref<f32>, index, memref<f32>, index, memref<f32>, index, index, index) -> ()
        func.call @simple_add_workgroup(%out_base, %out_at, %rhs_base, %rhs_at,
                                        %out_base, %out_at, %count, %workgroup)
            : (memref<f32>, index, memref<f32>, index, memref<f32>, index, index, index) -> ()
        return
      }
    }
  }

  func.func @fallback_invocation(%a: tensor<?xf32>, %b: tensor<?xf32>) -> tensor<?xf32> {
    %c0 = arith.constant 0 : index
    %n = tensor.dim %a, %c0 : tensor<?xf32>
    %product = flow.dispatch @mul_add_by_imports::@mul_add[%n](%a, %b, %n)
        : (tensor<?xf32>{%n}, tensor<?xf32>{%n}, index) -> tensor<?xf32>{%n}
    return %product : tensor<?xf32>
  }
}
