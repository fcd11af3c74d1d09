"""The C around a plugin's import functions: load, unload, a resolve that hands out each
import by name, and the query the runtime calls. Written after C that defines the imports as
`int NAME(void* params, void* context, void* reserved)`; `new --import`, `replace` and
`pb.load_inline` all use it, so every generated plugin resolves imports the same way."""

from __future__ import annotations

from collections.abc import Mapping

# One `if ... else ` per import, chained: the last one's `else` continues into `if (optional)`.
_MATCH = """\
if (iree_hal_executable_plugin_strcmp(symbol, "{symbol}") == 0) {{
      params->out_fn_ptrs[i] = (void*){function};
      params->out_fn_contexts[i] = NULL;
    }} else """

_TEMPLATE = """\
static iree_hal_executable_plugin_status_t plugin_load(
    const iree_hal_executable_plugin_environment_v0_t* environment,
    size_t param_count, const iree_hal_executable_plugin_string_pair_t* params,
    void** out_self) {{
  (void)environment;
  (void)param_count;
  (void)params;
  *out_self = NULL;
  return iree_hal_executable_plugin_ok_status();
}}

static void plugin_unload(void* self) {{ (void)self; }}

// The runtime asks each plugin (last registered first) for the imports still
// unresolved; names starting with '?' are optional.
static iree_hal_executable_plugin_status_t plugin_resolve(
    void* self, const iree_hal_executable_plugin_resolve_params_v0_t* params,
    iree_hal_executable_plugin_resolution_t* out_resolution) {{
  (void)self;
  *out_resolution = 0;
  int missing = 0;
  for (size_t i = 0; i < params->count; ++i) {{
    if (params->out_fn_ptrs[i]) continue;
    const char* symbol = params->symbol_names[i];
    int optional = iree_hal_executable_plugin_import_is_optional(symbol);
    if (optional) ++symbol;
    {matches}if (optional) {{
      *out_resolution |= IREE_HAL_EXECUTABLE_PLUGIN_RESOLUTION_MISSING_OPTIONAL;
    }} else {{
      missing = 1;
    }}
  }}
  return missing ? iree_hal_executable_plugin_status_from_code(
                       IREE_HAL_EXECUTABLE_PLUGIN_STATUS_NOT_FOUND)
                 : iree_hal_executable_plugin_ok_status();
}}

IREE_HAL_EXECUTABLE_PLUGIN_EXPORT const iree_hal_executable_plugin_header_t**
iree_hal_executable_plugin_query(iree_hal_executable_plugin_version_t max_version,
                                 void* reserved) {{
  (void)reserved;
  static const iree_hal_executable_plugin_header_t header = {{
      .version = IREE_HAL_EXECUTABLE_PLUGIN_VERSION_LATEST,
      .name = "{name}",
      .description = "{description}",
      .features = IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_NONE,
      .sanitizer = IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_KIND,
  }};
  static const iree_hal_executable_plugin_v0_t plugin = {{
      .header = &header,
      .load = plugin_load,
      .unload = plugin_unload,
      .resolve = plugin_resolve,
  }};
  return max_version <= IREE_HAL_EXECUTABLE_PLUGIN_VERSION_LATEST
             ? (const iree_hal_executable_plugin_header_t**)&plugin
             : NULL;
}}
"""


def plugin_entry(name: str, description: str, imports: Mapping[str, str]) -> str:
    """The plugin named `name` resolving each import symbol in `imports` to its C function."""
    matches = "".join(_MATCH.format(symbol=symbol, function=function) for symbol, function in imports.items())
    return _TEMPLATE.format(name=name, description=description, matches=matches)
