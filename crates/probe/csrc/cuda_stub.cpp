// Built instead of cuda.cpp when no CUDA headers are found: every call says why it cannot work.
#include "probe.h"

#include <cstring>

namespace {
const char kMsg[] = "CUDA not available: leaklab-probe was built without the CUDA headers";
int fail(char* err, size_t errlen) {
  if (err != nullptr && errlen > 0) {
    size_t n = sizeof(kMsg) - 1 < errlen - 1 ? sizeof(kMsg) - 1 : errlen - 1;
    std::memcpy(err, kMsg, n);
    err[n] = '\0';
  }
  return 1;
}
}  // namespace

extern "C" {
int ll_cuda_compiled(void) { return 0; }
int ll_cuda_device_count(void) { return 0; }
int ll_cuda_stats(int, ll_cuda_stats_t*, char* err, size_t errlen) { return fail(err, errlen); }
int ll_cuda_empty_cache(char* err, size_t errlen) { return fail(err, errlen); }
int ll_cuda_reset_peak(int, char* err, size_t errlen) { return fail(err, errlen); }
int ll_cuda_record_history(int, size_t, char* err, size_t errlen) { return fail(err, errlen); }
int ll_cuda_snapshot(char**, size_t*, char* err, size_t errlen) { return fail(err, errlen); }
int ll_cuda_synchronize(int, char* err, size_t errlen) { return fail(err, errlen); }
}
