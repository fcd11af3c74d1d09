// A CUDA __device__ microkernel that kernels IREE generates call directly.
// `pyree-build bitcode` compiles it to NVPTX LLVM bitcode (ziglang's clang, no CUDA
// SDK) and iree-compile links that bitcode into its own kernel, where it is inlined.
//
// The signature follows iree_codegen.ukernel.generic with no strides: each buffer
// operand arrives as (base pointer, element offset), then the extra operands, here the
// element count. extern "C" keeps the name the MLIR calls.

// out[i] = 2 * x[i] + y[i] for every i < count, the workgroup's threads striding over the
// elements: the kernel that calls it decides the workgroup size (iree-compile 3.13 launches
// it with fewer threads than the dispatch's export_config asks for), so the microkernel
// must not assume one thread per element. On an H200, one thread per element computed
// only out[0].
extern "C" __device__ void scaled_add_workgroup(const float* x, size_t x_offset, const float* y, size_t y_offset,
                                                float* out, size_t out_offset, size_t count) {
  for (size_t i = threadIdx.x; i < count; i += blockDim.x) {
    out[out_offset + i] = 2.0f * x[x_offset + i] + y[y_offset + i];
  }
}
