// HIP kernels for IREE's HIP target, compiled to one AMDGPU code object per gfx by
// `pyree-build hsaco` (ziglang's clang + iree-lld; no ROCm needed to build).
//
// IREE launches them with the export's bindings first (one pointer each, in layout
// order) and then the dispatch's i32 operands. extern "C" keeps the symbol names the
// MLIR exports use.
#include <hip/hip_runtime.h>

// out[i] = a[i] * b[i] for i < n.
extern "C" __global__ void simple_mul(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] * b[i];
}

// acc[i] *= a[i] for i < n.
extern "C" __global__ void simple_mul_inplace(const float* __restrict__ a, float* __restrict__ acc, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) acc[i] *= a[i];
}
