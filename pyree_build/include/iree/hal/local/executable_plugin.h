/*
 * IREE executable plugin ABI (version 0.1), written for pyree_build.
 *
 * The IREE Python wheels ship no C headers, so pyree_build ships this one at the
 * same include path, `iree/hal/local/executable_plugin.h`. It declares the same
 * names, values and struct layouts as the runtime's loader expects, so a plugin
 * source written against IREE's header compiles unchanged against this one.
 *
 * It depends only on the freestanding C headers, so it can be used both by
 * system plugins (ordinary shared libraries) and by standalone plugins (built
 * with -ffreestanding and loaded by IREE's own ELF loader).
 *
 * Find it with `pyree-build --include-dir`.
 */
#ifndef IREE_HAL_LOCAL_EXECUTABLE_PLUGIN_H_
#define IREE_HAL_LOCAL_EXECUTABLE_PLUGIN_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Versioning ------------------------------------------------------- */

typedef uint32_t iree_hal_executable_plugin_version_t;

#define IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1 0x00000001u
#define IREE_HAL_EXECUTABLE_PLUGIN_VERSION_LATEST \
  IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1

/* ---- Features --------------------------------------------------------- */

enum iree_hal_executable_plugin_feature_bits_t {
  IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_NONE = 0u,
  /* Built freestanding: no libc, no imports; loadable by the embedded ELF loader. */
  IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_STANDALONE = 1u << 0,
  /* Returns full status objects; needs a runtime built with status messages. */
  IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_FULL_STATUS = 1u << 1,
};
typedef uint32_t iree_hal_executable_plugin_features_t;

/* ---- Sanitizers ------------------------------------------------------- */

typedef enum iree_hal_executable_plugin_sanitizer_kind_e {
  IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_NONE = 0,
  IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_ADDRESS = 1,
  IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_MEMORY = 2,
  IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_THREAD = 3,
  IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_UNDEFINED = 4,
  IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_MAX_ENUM = INT32_MAX,
} iree_hal_executable_plugin_sanitizer_kind_t;

/* The sanitizer this translation unit is compiled with (UNDEFINED is never
 * chosen automatically). The runtime refuses a plugin whose sanitizer differs
 * from its own. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_KIND \
  IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_ADDRESS
#elif __has_feature(memory_sanitizer)
#define IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_KIND \
  IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_MEMORY
#elif __has_feature(thread_sanitizer)
#define IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_KIND \
  IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_THREAD
#endif
#endif
#if !defined(IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_KIND)
#define IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_KIND \
  IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_NONE
#endif

/* ---- Host size type --------------------------------------------------- */

#if !defined(IREE_HOST_SIZE_T)
#define IREE_HOST_SIZE_T size_t
#endif
typedef IREE_HOST_SIZE_T iree_host_size_t;

/* ---- Header and query export ----------------------------------------- */

typedef struct iree_hal_executable_plugin_header_t {
  iree_hal_executable_plugin_version_t version;
  const char* name;        /* short identifier, e.g. "my_plugin" */
  const char* description; /* free text, may be NULL */
  iree_hal_executable_plugin_features_t features;
  iree_hal_executable_plugin_sanitizer_kind_t sanitizer;
  uint64_t reserved[8];    /* zero */
} iree_hal_executable_plugin_header_t;

/* The one symbol a plugin exports. It returns a pointer to its versioned plugin
 * struct (whose first member is the header pointer), or NULL when the oldest
 * version it implements is newer than `max_version`. */
typedef const iree_hal_executable_plugin_header_t** (
    *iree_hal_executable_plugin_query_fn_t)(
    iree_hal_executable_plugin_version_t max_version, void* reserved);

#define IREE_HAL_EXECUTABLE_PLUGIN_EXPORT_NAME \
  "iree_hal_executable_plugin_query"

#if defined(_WIN32) || defined(__CYGWIN__)
#define IREE_HAL_EXECUTABLE_PLUGIN_EXPORT __declspec(dllexport)
#else
#define IREE_HAL_EXECUTABLE_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* ---- Status ----------------------------------------------------------- */

/* Same numbering as iree_status_code_t. */
typedef enum iree_hal_executable_plugin_status_code_e {
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OK = 0,
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_CANCELLED = 1,
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_UNKNOWN = 2,
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_INVALID_ARGUMENT = 3,
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_DEADLINE_EXCEEDED = 4,
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_NOT_FOUND = 5,
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_ALREADY_EXISTS = 6,
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_PERMISSION_DENIED = 7,
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_RESOURCE_EXHAUSTED = 8,
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_FAILED_PRECONDITION = 9,
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_ABORTED = 10,
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OUT_OF_RANGE = 11,
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_UNIMPLEMENTED = 12,
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_INTERNAL = 13,
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_UNAVAILABLE = 14,
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_DATA_LOSS = 15,
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_UNAUTHENTICATED = 16,
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_DEFERRED = 17,
  IREE_HAL_EXECUTABLE_PLUGIN_STATUS_CODE_MASK = 0x1Fu,
} iree_hal_executable_plugin_status_code_t;

/* Pointer-sized; a plain code is carried in the pointer value itself, and the
 * runtime reads it as an iree_status_t. */
typedef struct iree_status_handle_t* iree_hal_executable_plugin_status_t;

#define iree_hal_executable_plugin_status_from_code(code)              \
  ((iree_hal_executable_plugin_status_t)(                              \
      (uintptr_t)((iree_hal_executable_plugin_status_code_t)(code)) &  \
      IREE_HAL_EXECUTABLE_PLUGIN_STATUS_CODE_MASK))
#define iree_hal_executable_plugin_status_code(value)          \
  ((iree_hal_executable_plugin_status_code_t)(                 \
      (uintptr_t)(value) & IREE_HAL_EXECUTABLE_PLUGIN_STATUS_CODE_MASK))
#define iree_hal_executable_plugin_ok_status() \
  iree_hal_executable_plugin_status_from_code( \
      IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OK)
#define iree_hal_executable_plugin_status_is_ok(value) \
  ((uintptr_t)(value) == IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OK)

/* ---- Host allocator (same layout as iree_allocator_t) ----------------- */

typedef enum iree_hal_executable_plugin_allocator_command_e {
  IREE_HAL_EXECUTABLE_PLUGIN_ALLOCATOR_COMMAND_MALLOC = 0,
  IREE_HAL_EXECUTABLE_PLUGIN_ALLOCATOR_COMMAND_CALLOC = 1,
  IREE_HAL_EXECUTABLE_PLUGIN_ALLOCATOR_COMMAND_REALLOC = 2,
  IREE_HAL_EXECUTABLE_PLUGIN_ALLOCATOR_COMMAND_FREE = 3,
} iree_hal_executable_plugin_allocator_command_t;

typedef struct iree_hal_executable_plugin_allocator_alloc_params_t {
  iree_host_size_t byte_length;
} iree_hal_executable_plugin_allocator_alloc_params_t;

typedef iree_hal_executable_plugin_status_t (
    *iree_hal_executable_plugin_allocator_ctl_fn_t)(
    void* self, iree_hal_executable_plugin_allocator_command_t command,
    const void* params, void** inout_ptr);

typedef struct iree_hal_executable_plugin_allocator_t {
  void* self;
  iree_hal_executable_plugin_allocator_ctl_fn_t ctl;
} iree_hal_executable_plugin_allocator_t;

static inline iree_hal_executable_plugin_status_t
iree_hal_executable_plugin_allocator_malloc(
    iree_hal_executable_plugin_allocator_t allocator,
    iree_host_size_t byte_length, void** inout_ptr) {
  iree_hal_executable_plugin_allocator_alloc_params_t request;
  request.byte_length = byte_length;
  return allocator.ctl(allocator.self,
                       IREE_HAL_EXECUTABLE_PLUGIN_ALLOCATOR_COMMAND_MALLOC,
                       &request, inout_ptr);
}

static inline iree_hal_executable_plugin_status_t
iree_hal_executable_plugin_allocator_free(
    iree_hal_executable_plugin_allocator_t allocator, void* ptr) {
  return allocator.ctl(allocator.self,
                       IREE_HAL_EXECUTABLE_PLUGIN_ALLOCATOR_COMMAND_FREE, NULL,
                       &ptr);
}

/* ---- Strings (not NUL-terminated) ------------------------------------- */

typedef struct iree_hal_executable_plugin_string_view_t {
  const char* data;
  iree_host_size_t size;
} iree_hal_executable_plugin_string_view_t;

typedef struct iree_hal_executable_plugin_string_pair_t {
  union {
    iree_hal_executable_plugin_string_view_t first;
    iree_hal_executable_plugin_string_view_t key;
  };
  union {
    iree_hal_executable_plugin_string_view_t second;
    iree_hal_executable_plugin_string_view_t value;
  };
} iree_hal_executable_plugin_string_pair_t;

/* ---- Import resolution ------------------------------------------------ */

enum iree_hal_executable_plugin_resolution_bits_e {
  /* At least one optional ("?"-prefixed) import was left unresolved. */
  IREE_HAL_EXECUTABLE_PLUGIN_RESOLUTION_MISSING_OPTIONAL = 1u << 0,
};
typedef uint32_t iree_hal_executable_plugin_resolution_t;

/* Optional imports carry a leading '?' in their symbol name. */
static inline bool iree_hal_executable_plugin_import_is_optional(
    const char* symbol_name) {
  return symbol_name != NULL && symbol_name[0] == '?';
}

/* strcmp for freestanding plugins, which have no libc. */
static inline int iree_hal_executable_plugin_strcmp(const char* lhs,
                                                    const char* rhs) {
  const unsigned char* a = (const unsigned char*)lhs;
  const unsigned char* b = (const unsigned char*)rhs;
  while (*a != '\0' && *a == *b) {
    ++a;
    ++b;
  }
  return (int)*a - (int)*b;
}

/* ---- Version 0 interface ---------------------------------------------- */

typedef struct iree_hal_executable_plugin_environment_v0_t {
  iree_hal_executable_plugin_allocator_t host_allocator;
} iree_hal_executable_plugin_environment_v0_t;

/* Names arrive sorted; entries whose out_fn_ptrs slot is already set were
 * resolved by a plugin scanned earlier and must be left alone. */
typedef struct iree_hal_executable_plugin_resolve_params_v0_t {
  size_t count;
  const char* const* symbol_names;
  void** out_fn_ptrs;
  void** out_fn_contexts;
} iree_hal_executable_plugin_resolve_params_v0_t;

typedef iree_hal_executable_plugin_status_t (
    *iree_hal_executable_plugin_resolve_fn_v0_t)(
    void* self, const iree_hal_executable_plugin_resolve_params_v0_t* params,
    iree_hal_executable_plugin_resolution_t* out_resolution);

typedef struct iree_hal_executable_plugin_v0_t {
  const iree_hal_executable_plugin_header_t* header;
  iree_hal_executable_plugin_status_t (*load)(
      const iree_hal_executable_plugin_environment_v0_t* environment,
      size_t param_count,
      const iree_hal_executable_plugin_string_pair_t* params, void** out_self);
  void (*unload)(void* self);
  iree_hal_executable_plugin_resolve_fn_v0_t resolve;
} iree_hal_executable_plugin_v0_t;

#ifdef __cplusplus
}
#endif

#endif /* IREE_HAL_LOCAL_EXECUTABLE_PLUGIN_H_ */
