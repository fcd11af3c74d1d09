// The embedded-objects variant of the plugin's kernel: the same fused
// matmul + relu as a plain freestanding C function, linked into the module by
// iree-compile (see matmul_relu_embedded_spec.mlir). No libc, no plugin at run
// time: the .vmfb carries this code.
//
// A static import is called with the MLIR operands as C arguments, memrefs as
// (base pointer, offset) pairs under llvm.bareptr.

#include <stddef.h>
#include <stdint.h>

void matmul_relu_linked(const float* lhs, size_t lhs_offset, const float* rhs,
                        size_t rhs_offset, float* out, size_t out_offset,
                        int32_t m, int32_t n, int32_t k) {
  lhs += lhs_offset;
  rhs += rhs_offset;
  out += out_offset;
  for (int32_t i = 0; i < m; ++i) {
    for (int32_t j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (int32_t p = 0; p < k; ++p) sum += lhs[i * k + p] * rhs[p * n + j];
      out[i * n + j] = sum > 0.0f ? sum : 0.0f;
    }
  }
}
