// A *standalone* executable plugin: freestanding C (no libc, no imports of any
// kind) compiled once per architecture and linked by iree-lld into a shared
// ELF that IREE's own ELF loader can map on any OS. pyree_build packs the ELFs
// for x86_64, aarch64 and riscv64 into one FatELF `.sos`; the runtime picks the
// one for the machine it runs on.
//
// It provides the same import as system_plugin.c, so example.mlir runs with
// either plugin unchanged.

#include "iree/hal/local/executable_plugin.h"

typedef struct {
  const float* restrict lhs;
  size_t lhs_offset;
  const float* restrict rhs;
  size_t rhs_offset;
  float* restrict out;
  size_t out_offset;
  size_t count;      // elements to multiply, starting at each offset
  size_t workgroup;  // the calling workgroup (unused here)
  uint32_t processor_id;
  const uint64_t* restrict processor_data;
} mul_args_t;

static int simple_mul_workgroup(void* params_ptr, void* context, void* reserved) {
  (void)context;
  (void)reserved;
  const mul_args_t* a = (const mul_args_t*)params_ptr;
  for (size_t i = 0; i < a->count; ++i) {
    a->out[a->out_offset + i] = a->lhs[a->lhs_offset + i] * a->rhs[a->rhs_offset + i];
  }
  return 0;
}

// No per-load state: a standalone plugin that needs memory must take it from
// environment->host_allocator, since it cannot call malloc.
static iree_hal_executable_plugin_status_t plugin_load(
    const iree_hal_executable_plugin_environment_v0_t* environment,
    size_t param_count, const iree_hal_executable_plugin_string_pair_t* params,
    void** out_self) {
  (void)environment;
  (void)param_count;
  (void)params;
  *out_self = NULL;
  return iree_hal_executable_plugin_ok_status();
}

static void plugin_unload(void* self) { (void)self; }

static iree_hal_executable_plugin_status_t plugin_resolve(
    void* self, const iree_hal_executable_plugin_resolve_params_v0_t* params,
    iree_hal_executable_plugin_resolution_t* out_resolution) {
  (void)self;
  *out_resolution = 0;
  bool missing_required = false;
  for (size_t i = 0; i < params->count; ++i) {
    if (params->out_fn_ptrs[i]) continue;  // resolved by a plugin scanned earlier
    const char* name = params->symbol_names[i];
    bool optional = iree_hal_executable_plugin_import_is_optional(name);
    if (optional) ++name;
    if (iree_hal_executable_plugin_strcmp(name, "simple_mul_workgroup") == 0) {
      params->out_fn_ptrs[i] = (void*)simple_mul_workgroup;
      params->out_fn_contexts[i] = NULL;
    } else if (optional) {
      *out_resolution |= IREE_HAL_EXECUTABLE_PLUGIN_RESOLUTION_MISSING_OPTIONAL;
    } else {
      missing_required = true;
    }
  }
  return missing_required ? iree_hal_executable_plugin_status_from_code(
                                IREE_HAL_EXECUTABLE_PLUGIN_STATUS_NOT_FOUND)
                          : iree_hal_executable_plugin_ok_status();
}

IREE_HAL_EXECUTABLE_PLUGIN_EXPORT const iree_hal_executable_plugin_header_t**
iree_hal_executable_plugin_query(iree_hal_executable_plugin_version_t max_version,
                                 void* reserved) {
  (void)reserved;
  static const iree_hal_executable_plugin_header_t header = {
      .version = IREE_HAL_EXECUTABLE_PLUGIN_VERSION_LATEST,
      .name = "pyree_sample_standalone",
      .description = "pyree_build sample: simple_mul_workgroup, freestanding",
      .features = IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_STANDALONE,
      .sanitizer = IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_NONE,
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
