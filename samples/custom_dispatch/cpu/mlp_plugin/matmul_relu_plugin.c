// A system plugin providing `fused_matmul_relu`: out = max(lhs @ rhs, 0), row
// major, called from the dispatch that matmul_relu_spec.mlir puts into the
// model. Its first call prints one line, so a test can see that it ran.

#include <stdint.h>
#include <stdio.h>

#include "iree/hal/local/executable_plugin.h"

// The argument block, field for field the operands of the `func.call` in the
// spec: (memref<f32>, index) pairs for lhs, rhs and out (llvm.bareptr = true
// makes each memref one pointer; the index is an offset in elements), then M,
// N, K as i32. Fields have their natural C alignment.
typedef struct {
  const float* lhs;
  size_t lhs_offset;
  const float* rhs;
  size_t rhs_offset;
  float* out;
  size_t out_offset;
  int32_t m;
  int32_t n;
  int32_t k;
} matmul_relu_args_t;

// The tuning knob (`pyree-build tune --param MATMUL_RELU_TILE=1,4,8`; CMakeLists.txt's
// pyree_tune): how many output columns one pass computes. 1 is the plain triple loop.
#ifndef MATMUL_RELU_TILE
#define MATMUL_RELU_TILE 1
#endif

static int fused_matmul_relu(void* params, void* context, void* reserved) {
  (void)context;
  (void)reserved;
  const matmul_relu_args_t* a = (const matmul_relu_args_t*)params;
  const float* lhs = a->lhs + a->lhs_offset;
  const float* rhs = a->rhs + a->rhs_offset;
  float* out = a->out + a->out_offset;
  // Once per process: enough for a test to see the call, and a benchmark times
  // the kernel rather than stdio.
  static int announced = 0;
  if (!announced) {
    announced = 1;
    fprintf(stdout, "[matmul_relu plugin] M = %d, N = %d, K = %d\n", a->m, a->n, a->k);
    fflush(stdout);
  }
  for (int32_t i = 0; i < a->m; ++i) {
    int32_t j = 0;
    // MATMUL_RELU_TILE columns of `out` at once: each element of lhs is loaded once per tile and
    // the tile's sums stay in registers. Every sum adds its products in the same order whatever
    // the tile, so every tile computes the same numbers.
    for (; j + MATMUL_RELU_TILE <= a->n; j += MATMUL_RELU_TILE) {
      float sum[MATMUL_RELU_TILE];
      for (int t = 0; t < MATMUL_RELU_TILE; ++t) sum[t] = 0.0f;
      for (int32_t p = 0; p < a->k; ++p) {
        const float x = lhs[i * a->k + p];
        const float* row = rhs + p * a->n + j;
        for (int t = 0; t < MATMUL_RELU_TILE; ++t) sum[t] += x * row[t];
      }
      for (int t = 0; t < MATMUL_RELU_TILE; ++t) out[i * a->n + j + t] = sum[t] > 0.0f ? sum[t] : 0.0f;
    }
    for (; j < a->n; ++j) {  // the columns left over
      float sum = 0.0f;
      for (int32_t p = 0; p < a->k; ++p) sum += lhs[i * a->k + p] * rhs[p * a->n + j];
      out[i * a->n + j] = sum > 0.0f ? sum : 0.0f;
    }
  }
  return 0;  // non-zero would tell the runtime the call failed
}

static iree_hal_executable_plugin_status_t plugin_load(
    const iree_hal_executable_plugin_environment_v0_t* environment,
    size_t param_count, const iree_hal_executable_plugin_string_pair_t* params,
    void** out_self) {
  (void)environment;
  (void)param_count;
  (void)params;
  *out_self = NULL;  // stateless
  return iree_hal_executable_plugin_ok_status();
}

static void plugin_unload(void* self) { (void)self; }

static iree_hal_executable_plugin_status_t plugin_resolve(
    void* self, const iree_hal_executable_plugin_resolve_params_v0_t* params,
    iree_hal_executable_plugin_resolution_t* out_resolution) {
  (void)self;
  *out_resolution = 0;
  int missing = 0;
  for (size_t i = 0; i < params->count; ++i) {
    if (params->out_fn_ptrs[i]) continue;  // a plugin asked earlier provided it
    const char* name = params->symbol_names[i];
    int optional = iree_hal_executable_plugin_import_is_optional(name);
    if (optional) ++name;
    if (iree_hal_executable_plugin_strcmp(name, "fused_matmul_relu") == 0) {
      params->out_fn_ptrs[i] = (void*)fused_matmul_relu;
      params->out_fn_contexts[i] = NULL;
    } else if (optional) {
      *out_resolution |= IREE_HAL_EXECUTABLE_PLUGIN_RESOLUTION_MISSING_OPTIONAL;
    } else {
      missing = 1;
    }
  }
  return missing ? iree_hal_executable_plugin_status_from_code(
                       IREE_HAL_EXECUTABLE_PLUGIN_STATUS_NOT_FOUND)
                 : iree_hal_executable_plugin_ok_status();
}

IREE_HAL_EXECUTABLE_PLUGIN_EXPORT const iree_hal_executable_plugin_header_t**
iree_hal_executable_plugin_query(iree_hal_executable_plugin_version_t max_version,
                                 void* reserved) {
  (void)reserved;
  static const iree_hal_executable_plugin_header_t header = {
      .version = IREE_HAL_EXECUTABLE_PLUGIN_VERSION_LATEST,
      .name = "matmul_relu",
      .description = "pyree_build sample: fused matmul + relu for a transform spec",
      .features = IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_NONE,
      .sanitizer = IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_KIND,
  };
  static const iree_hal_executable_plugin_v0_t plugin = {
      .header = &header,
      .load = plugin_load,
      .unload = plugin_unload,
      .resolve = plugin_resolve,
  };
  return max_version <= IREE_HAL_EXECUTABLE_PLUGIN_VERSION_LATEST
             ? (const iree_hal_executable_plugin_header_t**)&plugin
             : NULL;
}
