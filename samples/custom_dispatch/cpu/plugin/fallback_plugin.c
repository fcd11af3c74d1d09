// One source, built twice with different -D flags, to show the order in which
// the runtime searches plugins: the plugin registered *last* is asked first, and
// only imports it leaves unresolved fall through to earlier ones.
//
//   fallback (registered first):  simple_mul_workgroup (x * y) and
//                                 simple_add_workgroup (x + y)
//   override (registered last):   simple_mul_workgroup (x * y * MUL_SCALE)
//
// Macros: PLUGIN_NAME (string), MUL_SCALE (float), PROVIDE_ADD (0 or 1).

#include "iree/hal/local/executable_plugin.h"

#ifndef PLUGIN_NAME
#define PLUGIN_NAME "pyree_sample_fallback"
#endif
#ifndef MUL_SCALE
#define MUL_SCALE 1.0f
#endif
#ifndef PROVIDE_ADD
#define PROVIDE_ADD 1
#endif

typedef struct {
  const float* restrict lhs;
  size_t lhs_offset;
  const float* restrict rhs;
  size_t rhs_offset;
  float* out;
  size_t out_offset;
  size_t count;
  size_t workgroup;
  uint32_t processor_id;
  const uint64_t* restrict processor_data;
} binary_args_t;

static int simple_mul_workgroup(void* params, void* context, void* reserved) {
  (void)context;
  (void)reserved;
  const binary_args_t* a = (const binary_args_t*)params;
  for (size_t i = 0; i < a->count; ++i) {
    a->out[a->out_offset + i] =
        MUL_SCALE * a->lhs[a->lhs_offset + i] * a->rhs[a->rhs_offset + i];
  }
  return 0;
}

#if PROVIDE_ADD
// out and lhs may be the same buffer: each element is read before it is written.
static int simple_add_workgroup(void* params, void* context, void* reserved) {
  (void)context;
  (void)reserved;
  const binary_args_t* a = (const binary_args_t*)params;
  for (size_t i = 0; i < a->count; ++i) {
    float sum = a->lhs[a->lhs_offset + i] + a->rhs[a->rhs_offset + i];
    a->out[a->out_offset + i] = sum;
  }
  return 0;
}
#endif

typedef struct {
  const char* name;
  int (*fn)(void*, void*, void*);
} export_t;

static const export_t kExports[] = {
    {"simple_mul_workgroup", simple_mul_workgroup},
#if PROVIDE_ADD
    {"simple_add_workgroup", simple_add_workgroup},
#endif
};

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
    if (params->out_fn_ptrs[i]) continue;  // a later-registered plugin won
    const char* name = params->symbol_names[i];
    bool optional = iree_hal_executable_plugin_import_is_optional(name);
    if (optional) ++name;
    bool found = false;
    for (size_t e = 0; e < sizeof(kExports) / sizeof(kExports[0]); ++e) {
      if (iree_hal_executable_plugin_strcmp(name, kExports[e].name) == 0) {
        params->out_fn_ptrs[i] = (void*)kExports[e].fn;
        params->out_fn_contexts[i] = NULL;
        found = true;
        break;
      }
    }
    if (!found && optional) {
      *out_resolution |= IREE_HAL_EXECUTABLE_PLUGIN_RESOLUTION_MISSING_OPTIONAL;
    } else if (!found) {
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
      .name = PLUGIN_NAME,
      .description = "pyree_build sample: plugin search order",
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
