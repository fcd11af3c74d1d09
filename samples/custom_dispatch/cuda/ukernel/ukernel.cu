// A CUDA __device__ microkernel that kernels IREE generates call directly.
// `pyree-build bitcode` compiles it to NVPTX LLVM bitcode (ziglang's clang, no CUDA
// SDK) and iree-compile links that bitcode into its own kernel, where it is inlined.
//
// The signature follows iree_codegen.ukernel.generic with no strides: each buffer
// operand arrives as (base pointer, element offset), then the extra operands, here the
// element count. extern "C" keeps the name the MLIR calls.

// out[i] = 2 * x[i] + y[i] for this thread's element i (one element per thread).
extern "C" __device__ void scaled_add_workgroup(const float* x, size_t x_offset, const float* y, size_t y_offset,
                                                float* out, size_t out_offset, size_t count) {
  size_t i = threadIdx.x;
  if (i < count) {
    out[out_offset + i] = 2.0f * x[x_offset + i] + y[y_offset + i];
  }
}
