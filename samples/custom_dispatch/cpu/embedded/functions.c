// Functions linked *into* the compiled module: IREE's compiler links one object
// per target architecture into each executable it generates, so the deployed
// .vmfb carries this code and needs no plugin at run time.
//
// The code is freestanding (no libc): it runs inside IREE's executable
// environment on any OS. The calls arrive with the memref arguments of the
// MLIR declaration lowered to (base pointer, offset) pairs (`llvm.bareptr`).

#include <stddef.h>

// out[i] = lhs[i] * rhs[i] for `count` elements from each offset.
void simple_mul_workgroup(const float* restrict lhs, size_t lhs_offset,
                          const float* restrict rhs, size_t rhs_offset,
                          float* restrict out, size_t out_offset, size_t count,
                          size_t workgroup) {
  (void)workgroup;
  for (size_t i = 0; i < count; ++i) {
    out[out_offset + i] = lhs[lhs_offset + i] * rhs[rhs_offset + i];
  }
}

// inout[i] *= factor[i] for `count` elements from each offset.
void simple_mul_inplace_workgroup(const float* restrict factor,
                                  size_t factor_offset, float* restrict inout,
                                  size_t inout_offset, size_t count,
                                  size_t workgroup) {
  (void)workgroup;
  for (size_t i = 0; i < count; ++i) {
    inout[inout_offset + i] *= factor[factor_offset + i];
  }
}
