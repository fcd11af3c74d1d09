// A *system* executable plugin: an ordinary shared library that IREE's runtime
// opens with dlopen when it is passed `--executable_plugin=system_plugin.so`.
// Being a normal library it may use libc (here: calloc and free for its state).
//
// It provides one import, `simple_mul_workgroup`, which the program in
// example.mlir calls from inside its dispatch.

#include <stdlib.h>

#include "iree/hal/local/executable_plugin.h"

// The argument block IREE's generated code passes to the import: one field per
// operand of the `func.call` (memrefs are passed as base pointer + offset since
// the import is declared with `llvm.bareptr = true`), followed by the fields
// requested with `hal.import.fields`.
typedef struct {
  const float* lhs;
  size_t lhs_offset;
  const float* rhs;
  size_t rhs_offset;
  float* out;
  size_t out_offset;
  size_t count;      // elements to multiply, starting at each offset
  size_t workgroup;  // the calling workgroup (unused here)
  uint32_t processor_id;
  const uint64_t* processor_data;
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

// Per-load state. A system plugin may allocate as it likes; this one keeps a
// counter only to show where state would live.
typedef struct {
  size_t resolve_calls;
} plugin_state_t;

static iree_hal_executable_plugin_status_t plugin_load(
    const iree_hal_executable_plugin_environment_v0_t* environment,
    size_t param_count, const iree_hal_executable_plugin_string_pair_t* params,
    void** out_self) {
  (void)environment;
  (void)param_count;
  (void)params;
  plugin_state_t* state = (plugin_state_t*)calloc(1, sizeof(*state));
  if (!state) {
    return iree_hal_executable_plugin_status_from_code(
        IREE_HAL_EXECUTABLE_PLUGIN_STATUS_RESOURCE_EXHAUSTED);
  }
  *out_self = state;
  return iree_hal_executable_plugin_ok_status();
}

static void plugin_unload(void* self) { free(self); }

static iree_hal_executable_plugin_status_t plugin_resolve(
    void* self, const iree_hal_executable_plugin_resolve_params_v0_t* params,
    iree_hal_executable_plugin_resolution_t* out_resolution) {
  plugin_state_t* state = (plugin_state_t*)self;
  ++state->resolve_calls;
  *out_resolution = 0;
  int missing_required = 0;
  for (size_t i = 0; i < params->count; ++i) {
    if (params->out_fn_ptrs[i]) continue;  // an earlier-scanned plugin won
    const char* name = params->symbol_names[i];
    int optional = iree_hal_executable_plugin_import_is_optional(name);
    if (optional) ++name;
    if (iree_hal_executable_plugin_strcmp(name, "simple_mul_workgroup") == 0) {
      params->out_fn_ptrs[i] = (void*)simple_mul_workgroup;
      params->out_fn_contexts[i] = NULL;
    } else if (optional) {
      *out_resolution |= IREE_HAL_EXECUTABLE_PLUGIN_RESOLUTION_MISSING_OPTIONAL;
    } else {
      missing_required = 1;
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
      .name = "pyree_sample_system",
      .description = "pyree_build sample: simple_mul_workgroup as a system library",
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
