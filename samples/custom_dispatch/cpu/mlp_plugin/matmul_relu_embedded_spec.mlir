// The embedded-objects variant of matmul_relu_spec.mlir: the same match and
// rewrite, but the dispatch calls `matmul_relu_linked`, a function in an object
// file that iree-compile links into the module (matmul_relu_functions.c,
// compiled per arch by `pyree-build objects`). The module is hermetic: it runs
// with no plugin and with the object files gone.
//
// Used as `pyree-build compile mlp.mlir --transform-spec matmul_relu_embedded_spec.mlir
//          --object-search-path DIR` where DIR holds matmul_relu_functions_<arch>.o.

#x86_64 = #hal.executable.target<"llvm-cpu", "embedded-elf-x86_64">
#arm_64 = #hal.executable.target<"llvm-cpu", "embedded-elf-arm_64">

module attributes {transform.with_named_sequence} {

  // The dispatch: one workgroup, three buffers and the sizes as i32 operands.
  stream.executable private @matmul_relu_executable attributes {
    hal.executable.objects = #hal.executable.objects<{
      #x86_64 = [#hal.executable.object<{path = "matmul_relu_functions_x86_64.o"}>],
      #arm_64 = [#hal.executable.object<{path = "matmul_relu_functions_aarch64.o"}>]
    }>
  } {
    stream.executable.export public @matmul_relu_entry workgroups() -> (index, index, index) {
      %one = arith.constant 1 : index
      stream.return %one, %one, %one : index, index, index
    }
    builtin.module {
      // Linked statically from the objects above (hal.import.static): a plain C
      // call with these operands as arguments, no import table.
      func.func private @matmul_relu_linked(memref<f32>, index, memref<f32>, index,
                                            memref<f32>, index, i32, i32, i32)
          attributes {hal.import.static, llvm.bareptr = true}

      func.func @matmul_relu_entry(%lhs_b: !stream.binding, %rhs_b: !stream.binding,
                                   %m_i32: i32, %n_i32: i32, %k_i32: i32,
                                   %out_b: !stream.binding) {
        %c0 = arith.constant 0 : index
        %m = arith.index_cast %m_i32 : i32 to index
        %n = arith.index_cast %n_i32 : i32 to index
        %k = arith.index_cast %k_i32 : i32 to index
        %lhs = stream.binding.subspan %lhs_b[%c0] : !stream.binding -> memref<?x?xf32>{%m, %k}
        %rhs = stream.binding.subspan %rhs_b[%c0] : !stream.binding -> memref<?x?xf32>{%k, %n}
        %out = stream.binding.subspan %out_b[%c0] : !stream.binding -> memref<?x?xf32>{%m, %n}
        %lhs_base, %lhs_off, %lhs_sizes:2, %lhs_strides:2 = iree_codegen.extract_strided_metadata %lhs
            : memref<?x?xf32> -> memref<f32>, index, index, index, index, index
        %rhs_base, %rhs_off, %rhs_sizes:2, %rhs_strides:2 = iree_codegen.extract_strided_metadata %rhs
            : memref<?x?xf32> -> memref<f32>, index, index, index, index, index
        %out_base, %out_off, %out_sizes:2, %out_strides:2 = iree_codegen.extract_strided_metadata %out
            : memref<?x?xf32> -> memref<f32>, index, index, index, index, index
        func.call @matmul_relu_linked(%lhs_base, %lhs_off, %rhs_base, %rhs_off, %out_base, %out_off,
                                      %m_i32, %n_i32, %k_i32)
            : (memref<f32>, index, memref<f32>, index, memref<f32>, index, i32, i32, i32) -> ()
        return
      }
    }
  }

  // What the matched ops are replaced with: a call of this function.
  util.func private @call_matmul_relu(%lhs: tensor<?x?xf32>, %rhs: tensor<?x?xf32>,
                                      %acc_init: tensor<?x?xf32>, %relu_init: tensor<?x?xf32>) -> tensor<?x?xf32> {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %m = tensor.dim %lhs, %c0 : tensor<?x?xf32>
    %k = tensor.dim %lhs, %c1 : tensor<?x?xf32>
    %n = tensor.dim %rhs, %c1 : tensor<?x?xf32>
    %m_i32 = arith.index_cast %m : index to i32
    %n_i32 = arith.index_cast %n : index to i32
    %k_i32 = arith.index_cast %k : index to i32
    %result = flow.dispatch @matmul_relu_executable::@matmul_relu_entry(%lhs, %rhs, %m_i32, %n_i32, %k_i32)
        : (tensor<?x?xf32>{%m, %k}, tensor<?x?xf32>{%k, %n}, i32, i32, i32) -> tensor<?x?xf32>{%m, %n}
    util.return %result : tensor<?x?xf32>
  }

  // Matcher: the DAG fill -> matmul -> relu, any static or dynamic f32 shapes.
  transform.named_sequence @match_matmul_relu(%root: !transform.any_op {transform.readonly})
      -> (!transform.any_value, !transform.any_value) {
    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %root {
      ^bb0(%lhs: tensor<?x?xf32>, %rhs: tensor<?x?xf32>, %acc_init: tensor<?x?xf32>, %relu_init: tensor<?x?xf32>):
        %zero = arith.constant 0.0 : f32
        %acc = linalg.fill ins(%zero : f32) outs(%acc_init : tensor<?x?xf32>) -> tensor<?x?xf32>
        %mm = linalg.matmul ins(%lhs, %rhs : tensor<?x?xf32>, tensor<?x?xf32>)
                            outs(%acc : tensor<?x?xf32>) -> tensor<?x?xf32>
        %relu = linalg.generic {
            indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
            iterator_types = ["parallel", "parallel"]}
            ins(%mm : tensor<?x?xf32>) outs(%relu_init : tensor<?x?xf32>) {
          ^bb0(%v: f32, %unused: f32):
            %r = arith.maximumf %v, %zero : f32
            linalg.yield %r : f32
        } -> tensor<?x?xf32>
    } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    transform.yield %ins, %outs : !transform.any_value, !transform.any_value
  }

  // Rewriter: bring the executable and the function into the program, then
  // make the matched result's users use the call instead.
  transform.named_sequence @call_instead(%ins: !transform.any_value {transform.readonly},
                                         %out: !transform.any_value {transform.readonly}) {
    %root = transform.get_defining_op %out : (!transform.any_value) -> !transform.any_op
    %program = transform.util.get_nearest_symbol_table %root : (!transform.any_op) -> !transform.any_op
    %exe = transform.util.import_symbol @matmul_relu_executable into %program if undefined
        : (!transform.any_op) -> !transform.any_op
    %fn = transform.util.import_symbol @call_matmul_relu into %program if undefined
        : (!transform.any_op) -> !transform.any_op
    transform.util.cast_and_call %fn(%ins) -> %out after %root {
      transform.type_conversion.tensor.cast_shape_dynamic_dims
    } : (!transform.any_op, !transform.any_value, !transform.any_value, !transform.any_op) -> !transform.any_op
    transform.yield
  }

  // Entry point: IREE has turned func.func into util.func by the time specs run.
  transform.named_sequence @__transform_main(%program: !transform.any_op) {
    %fns = transform.structured.match ops{["util.func"]} in %program : (!transform.any_op) -> !transform.any_op
    transform.foreach %fns : !transform.any_op {
      ^bb0(%fn: !transform.any_op):
        transform.foreach_match in %fn
            @match_matmul_relu -> @call_instead
          : (!transform.any_op) -> (!transform.any_op)
    }
    transform.apply_dce to %program : !transform.any_op
    transform.yield
  }
}
