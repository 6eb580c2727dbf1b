// The CUDA caching allocator's statistics, empty_cache and memory_viz snapshots.
//
// Compiled whenever the CUDA headers are found next to libtorch (the PyPI wheel ships them),
// so the code is type-checked and linked on GPU-less machines too. Every entry point checks
// c10::cuda::device_count() first: on a machine without a GPU it returns 0 without throwing,
// and the call reports "CUDA not available" instead of touching the allocator.
#include "probe.h"
#include "util.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/cuda/memory_snapshot.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using leaklab::write_err;

bool require_cuda(char* err, size_t errlen) {
  if (c10::cuda::device_count() > 0) return true;
  write_err(err, errlen, "CUDA not available: no CUDA device is visible to this process");
  return false;
}

template <typename F>
int guarded(char* err, size_t errlen, F&& body) {
  try {
    if (!require_cuda(err, errlen)) return 1;
    body();
    return 0;
  } catch (const std::exception& e) {
    write_err(err, errlen, e.what());
    return 2;
  }
}

}  // namespace

extern "C" {

int ll_cuda_compiled(void) { return 1; }

int ll_cuda_device_count(void) { return static_cast<int>(c10::cuda::device_count()); }

int ll_cuda_stats(int device, ll_cuda_stats_t* out, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    using c10::CachingAllocator::StatType;
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
    auto agg = static_cast<size_t>(StatType::AGGREGATE);
    out->allocated_current = stats.allocated_bytes[agg].current;
    out->allocated_peak = stats.allocated_bytes[agg].peak;
    out->reserved_current = stats.reserved_bytes[agg].current;
    out->reserved_peak = stats.reserved_bytes[agg].peak;
    out->active_current = stats.active_bytes[agg].current;
    out->active_peak = stats.active_bytes[agg].peak;
    out->inactive_split_current = stats.inactive_split_bytes[agg].current;
    out->inactive_split_peak = stats.inactive_split_bytes[agg].peak;
    out->num_alloc_retries = stats.num_alloc_retries;
    out->num_ooms = stats.num_ooms;
  });
}

int ll_cuda_empty_cache(char* err, size_t errlen) {
  return guarded(err, errlen, [] { c10::cuda::CUDACachingAllocator::emptyCache(); });
}

int ll_cuda_reset_peak(int device, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
  });
}

int ll_cuda_record_history(int enabled, size_t max_entries, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    // As torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="all"):
    // stacks must be "python" or "all"; "all" adds C++ frames, the only ones a Rust host has.
    std::optional<std::string> mode = enabled ? std::optional<std::string>("all") : std::nullopt;
    torch::cuda::_record_memory_history(mode, "all", "all", max_entries);
  });
}

int ll_cuda_snapshot(char** buf, size_t* len, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    std::string pickled = torch::cuda::_memory_snapshot_pickled();
    *buf = static_cast<char*>(std::malloc(pickled.size()));
    std::memcpy(*buf, pickled.data(), pickled.size());
    *len = pickled.size();
  });
}

int ll_cuda_synchronize(int device, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    // Make `device` current for the call and restore the previous one after (c10's CUDAGuard
    // would do this too, but pulls in the CUDA runtime's symbols, which the shim does not link).
    auto previous = c10::cuda::current_device();
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    c10::cuda::device_synchronize();
    c10::cuda::set_device(previous);
  });
}

}  // extern "C"
