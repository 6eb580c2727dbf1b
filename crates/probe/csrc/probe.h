// leaklab probe shim: the C ABI between Rust and libtorch's C++ memory APIs.
// Every function is noexcept from Rust's point of view: C++ exceptions are caught here and
// turned into an error string written to `err` (NUL-terminated, truncated to `errlen`).
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LL_MAX_CONTEXTS 64
// Most native frames captured per allocation.
#define LL_MAX_FRAMES 128

typedef struct {
  int64_t live_bytes;
  int64_t peak_bytes;
  int64_t live_blocks;
  uint64_t alloc_count;
  uint64_t free_count;
  uint64_t alloc_bytes_total;
} ll_cpu_stats_t;

typedef struct {
  int64_t time_us;
  uint64_t addr;
  uint64_t size;
  int32_t action;   // 0 alloc, 1 free
  int32_t context;  // index into the Rust-side label table
  int32_t stack;    // interned native stack id (0: none captured)
} ll_event_t;

typedef struct {
  uint64_t addr;
  uint64_t size;
  int64_t time_us;
  int32_t context;
  int32_t stack;
} ll_block_t;

// CPU: the counting allocator.
int ll_cpu_install(char* err, size_t errlen);
int ll_cpu_installed(void);
void ll_cpu_stats(ll_cpu_stats_t* out);
void ll_cpu_reset_peak(void);
void ll_cpu_set_limit(int64_t bytes);
void ll_context_set(int32_t id);
int32_t ll_context_get(void);
// The context of allocations on threads that have none of their own (0: leave them in `other`).
void ll_context_set_default(int32_t id);
int32_t ll_context_get_default(void);
void ll_cpu_live_by_context(int64_t* out, size_t n);
void ll_history_enable(size_t max_entries);
size_t ll_history_len(void);
size_t ll_history_copy(ll_event_t* out, size_t cap);
size_t ll_live_blocks_copy(ll_block_t* out, size_t cap);
// Native stacks of allocations while the history is on: `depth` frames each (0: off).
void ll_stacks_enable(int depth);
size_t ll_stack_count(void);
// Copies stack `id`'s return addresses, innermost first; returns how many.
size_t ll_stack_frames(int32_t id, uint64_t* out, size_t cap);

// Autograd and inference mode.
void* ll_inference_mode_enter(int enabled);
void ll_inference_mode_exit(void* guard);
int ll_inference_mode_is_enabled(void);
int ll_grad_mode_is_enabled(void);

// CUDA caching allocator (stubs that say why when compiled without CUDA headers).
typedef struct {
  int64_t allocated_current, allocated_peak;
  int64_t reserved_current, reserved_peak;
  int64_t active_current, active_peak;
  int64_t inactive_split_current, inactive_split_peak;
  int64_t num_alloc_retries, num_ooms;
} ll_cuda_stats_t;

int ll_cuda_compiled(void);
int ll_cuda_device_count(void);
int ll_cuda_stats(int device, ll_cuda_stats_t* out, char* err, size_t errlen);
int ll_cuda_empty_cache(char* err, size_t errlen);
int ll_cuda_reset_peak(int device, char* err, size_t errlen);
int ll_cuda_record_history(int enabled, size_t max_entries, char* err, size_t errlen);
int ll_cuda_snapshot(char** buf, size_t* len, char* err, size_t errlen);
int ll_cuda_synchronize(int device, char* err, size_t errlen);
void ll_free(void* p);

#ifdef __cplusplus
}
#endif
