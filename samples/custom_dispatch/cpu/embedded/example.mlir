// Hand-written functions linked into the module at compile time.
//
// The executable declares one object per target architecture. Object keys name
// only the backend and the format, so they match whatever variant the compiler
// generates for that architecture (its CPU, vector width, ...); the object files
// are found through --iree-hal-executable-object-search-path.
//
//   mixed_invocation(a, b):  p = a * b        (custom: simple_mul_workgroup)
//                            s = p + b        (generated)
//                            s = s * p        (custom: simple_mul_inplace_workgroup)
//   a = 2, b = 4  ->  p = 8, s = 12, result = 96

#x86_64 = #hal.executable.target<"llvm-cpu", "embedded-elf-x86_64">
#arm_64 = #hal.executable.target<"llvm-cpu", "embedded-elf-arm_64">
#riscv_64 = #hal.executable.target<"llvm-cpu", "embedded-elf-riscv_64">

module @embedded_sample {

  stream.executable private @linked_functions attributes {
    hal.executable.objects = #hal.executable.objects<{
      #x86_64 = [#hal.executable.object<{path = "functions_x86_64.o"}>],
      #arm_64 = [#hal.executable.object<{path = "functions_aarch64.o"}>],
      #riscv_64 = [#hal.executable.object<{path = "functions_riscv64.o"}>]
    }>
  } {
    stream.executable.export public @mul workgroups(%n: index) -> (index, index, index) {
      %groups = affine.apply affine_map<()[s0] -> (s0 ceildiv 64)>()[%n]
      %one = arith.constant 1 : index
      stream.return %groups, %one, %one : index, index, index
    }
    stream.executable.export public @mul_inplace workgroups(%n: index) -> (index, index, index) {
      %groups = affine.apply affine_map<()[s0] -> (s0 ceildiv 64)>()[%n]
      %one = arith.constant 1 : index
      stream.return %groups, %one, %one : index, index, index
    }

    builtin.module {
      // Linked statically from the objects above: plain C calls, no import table.
      func.func private @simple_mul_workgroup(
          memref<f32>, index, memref<f32>, index, memref<f32>, index, index, index)
          attributes {hal.import.static, llvm.bareptr = true}
      func.func private @simple_mul_inplace_workgroup(
          memref<f32>, index, memref<f32>, index, index, index)
          attributes {hal.import.static, llvm.bareptr = true}

      func.func @mul(%lhs_binding: !stream.binding, %rhs_binding: !stream.binding,
                     %out_binding: !stream.binding, %n: index) {
        %c0 = arith.constant 0 : index
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
        return
      }

      func.func @mul_inplace(%factor_binding: !stream.binding, %inout_binding: !stream.binding,
                             %n: index) {
        %c0 = arith.constant 0 : index
        %workgroup = stream.dispatch.workgroup.id[0] : index
        %begin = affine.apply affine_map<()[s0] -> (s0 * 64)>()[%workgroup]
        %count = affine.min affine_map<()[s0, s1] -> (64, s1 - s0)>()[%begin, %n]
        %factor = stream.binding.subspan %factor_binding[%c0] : !stream.binding -> memref<?xf32>{%n}
        %inout = stream.binding.subspan %inout_binding[%c0] : !stream.binding -> memref<?xf32>{%n}
        %factor_base, %factor_offset, %factor_size, %factor_stride = iree_codegen.extract_strided_metadata %factor
            : memref<?xf32> -> memref<f32>, index, index, index
        %inout_base, %inout_offset, %inout_size, %inout_stride = iree_codegen.extract_strided_metadata %inout
            : memref<?xf32> -> memref<f32>, index, index, index
        %factor_at = arith.addi %factor_offset, %begin : index
        %inout_at = arith.addi %inout_offset, %begin : index
        func.call @simple_mul_inplace_workgroup(%factor_base, %factor_at, %inout_base, %inout_at,
                                                %count, %workgroup)
            : (memref<f32>, index, memref<f32>, index, index, index) -> ()
        return
      }
    }
  }

  func.func @mixed_invocation(%a: tensor<?xf32>, %b: tensor<?xf32>) -> tensor<?xf32> {
    %c0 = arith.constant 0 : index
    %n = tensor.dim %a, %c0 : tensor<?xf32>
    %product = flow.dispatch @linked_functions::@mul[%n](%a, %b, %n)
        : (tensor<?xf32>{%n}, tensor<?xf32>{%n}, index) -> tensor<?xf32>{%n}
    %sum = arith.addf %product, %b : tensor<?xf32>
    %result = flow.dispatch @linked_functions::@mul_inplace[%n](%product, %sum, %n)
        : (tensor<?xf32>{%n}, tensor<?xf32>{%n}, index) -> %sum{%n}
    return %result : tensor<?xf32>
  }
}
