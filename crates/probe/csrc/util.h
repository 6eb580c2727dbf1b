// Helpers shared by the shim's translation units (not part of the C ABI in probe.h).
#pragma once
#include <cstddef>
#include <cstring>
#include <string>

namespace leaklab {

// Writes `msg` into the caller's buffer, NUL-terminated and truncated to `errlen`.
inline void write_err(char* err, size_t errlen, const std::string& msg) {
  if (err == nullptr || errlen == 0) return;
  size_t n = msg.size() < errlen - 1 ? msg.size() : errlen - 1;
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

}  // namespace leaklab
