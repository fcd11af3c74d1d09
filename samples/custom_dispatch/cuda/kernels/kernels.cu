// Two hand-written CUDA kernels that an IREE program dispatches by name.
//
// The calling convention is set by the program's `hal.pipeline.layout`: one
// pointer per binding, in binding order, then each push constant (here the
// element count). `extern "C"` keeps the names unmangled, so the MLIR export
// `@simple_mul` finds the PTX entry `simple_mul`.

// out[i] = a[i] * b[i]
extern "C" __global__ void simple_mul(const float* __restrict__ a,
                                      const float* __restrict__ b,
                                      float* __restrict__ out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] * b[i];
}

// acc[i] *= a[i], in place on the second binding.
extern "C" __global__ void simple_mul_inplace(const float* __restrict__ a,
                                              float* __restrict__ acc, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) acc[i] *= a[i];
}
