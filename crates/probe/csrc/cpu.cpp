// The counting CPU allocator, inference mode and grad mode.
//
// Every CPU tensor storage that libtorch allocates after `ll_cpu_install` goes through
// `CountingAllocator`, which forwards to c10::alloc_cpu / c10::free_cpu (what the default
// allocator does) and keeps exact counts. Each block carries a 64-byte header in front of the
// data (64 keeps the data at c10's alignment) that records its size, the context (request
// stage) it was born in, and links it into a list of live blocks, so a snapshot can list
// every live block and frees can be attributed without a hash map.
#include "probe.h"
#include "util.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <torch/csrc/profiler/unwind/unwind.h>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr size_t kHeader = 64;

struct Header {
  size_t size;
  int64_t time_us;
  Header* prev;
  Header* next;
  int32_t context;
  int32_t stack;  // interned stack id, 0 when none was captured
};
static_assert(sizeof(Header) <= kHeader, "header must fit in front of the data");

thread_local int32_t tl_context = 0;

// The context of allocations made on a thread that has none of its own (context 0). A leak
// check sets it for its duration, so memory its body hands to worker threads, pools or
// spawn_blocking is counted too; 0 (the default) leaves such memory in `other`.
std::atomic<int32_t> g_default_context{0};

int32_t birth_context() {
  return tl_context != 0 ? tl_context : g_default_context.load(std::memory_order_relaxed);
}

int64_t now_us() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

using leaklab::write_err;

struct Counters {
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> blocks{0};
  std::atomic<uint64_t> allocs{0};
  std::atomic<uint64_t> frees{0};
  std::atomic<uint64_t> total{0};
  std::atomic<int64_t> by_context[LL_MAX_CONTEXTS];
  Counters() {
    for (auto& c : by_context) c.store(0);
  }
};

Counters g_counters;

// A hard cap on live bytes (0: none). An allocation that would pass it fails the way libtorch's
// own allocators fail, with c10::OutOfMemoryError, so callers exercise their real OOM path.
std::atomic<int64_t> g_limit{0};

// The live list and the history share one mutex: both change on every alloc and free, and
// a snapshot must see them consistently.
std::mutex g_mu;
Header g_live_head{0, 0, &g_live_head, &g_live_head, 0, 0};
std::deque<ll_event_t> g_history;
std::atomic<size_t> g_history_max{0};

// Frames captured per allocation while the history is on (0: no stacks).
std::atomic<int> g_stack_depth{0};
constexpr size_t kMaxStacks = 1 << 16;

// Interned stacks, guarded by g_mu: stack id i (from 1) is g_stacks[i - 1]. Bounded, so a
// process with endlessly new stacks (JIT code, say) stops interning rather than growing.
std::vector<std::vector<void*>> g_stacks;
std::unordered_multimap<uint64_t, int32_t> g_stack_index;

struct Captured {
  void* frames[LL_MAX_FRAMES];
  int n = 0;
  uint64_t hash = 0;
};

// Captures the stack from `caller` (the allocator's return address) outwards, innermost
// first, so the unwinder's and the allocator's own frames are left out however they inline. Takes no lock of ours. Never throws: an unwinding failure leaves no stack.
void capture(Captured& c, int depth, void* caller) {
  std::vector<void*> raw;
  try {
    raw = torch::unwind::unwind();
  } catch (...) {
    c.n = 0;
    return;
  }
  size_t skip = 0;
  while (skip < raw.size() && raw[skip] != caller) ++skip;
  if (skip == raw.size()) skip = 0;  // not found (an unusual unwind): keep every frame
  const size_t kSkip = skip;
  size_t n = raw.size() - kSkip;
  c.n = static_cast<int>(n < static_cast<size_t>(depth) ? n : depth);
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the addresses
  for (int i = 0; i < c.n; ++i) {
    c.frames[i] = raw[i + kSkip];
    h = (h ^ reinterpret_cast<uint64_t>(c.frames[i])) * 1099511628211ull;
  }
  c.hash = h;
}

// The id of a captured stack, interning it if new. Caller holds g_mu.
int32_t intern(const Captured& c) {
  if (c.n == 0) return 0;
  auto range = g_stack_index.equal_range(c.hash);
  for (auto it = range.first; it != range.second; ++it) {
    const auto& s = g_stacks[it->second - 1];
    if (s.size() == static_cast<size_t>(c.n) && std::memcmp(s.data(), c.frames, c.n * sizeof(void*)) == 0) return it->second;
  }
  if (g_stacks.size() >= kMaxStacks) return 0;
  g_stacks.emplace_back(c.frames, c.frames + c.n);
  auto id = static_cast<int32_t>(g_stacks.size());
  g_stack_index.emplace(c.hash, id);
  return id;
}

void record(int32_t action, const Header* h, int64_t t) {
  size_t max = g_history_max.load(std::memory_order_relaxed);
  if (max == 0) return;
  g_history.push_back(ll_event_t{t, reinterpret_cast<uint64_t>(reinterpret_cast<const char*>(h) + kHeader),
                                 h->size, action, h->context, h->stack});
  while (g_history.size() > max) g_history.pop_front();
}

// Every block's deleter, given the data pointer (the DataPtr's context is its data, as c10's own
// CPU allocator's is, so `raw_allocate`/`raw_deallocate` work: ideep's engine allocator, which
// oneDNN's conv uses for its buffers, allocates through them); the header sits just before.
void counting_delete(void* data) {
  if (data == nullptr) return;
  auto* h = reinterpret_cast<Header*>(static_cast<char*>(data) - kHeader);
  auto size = static_cast<int64_t>(h->size);
  g_counters.live.fetch_sub(size, std::memory_order_relaxed);
  g_counters.blocks.fetch_sub(1, std::memory_order_relaxed);
  g_counters.frees.fetch_add(1, std::memory_order_relaxed);
  g_counters.by_context[h->context].fetch_sub(size, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    h->prev->next = h->next;
    h->next->prev = h->prev;
    record(1, h, now_us());
  }
  c10::free_cpu(h);
}

struct CountingAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) {
      return {nullptr, nullptr, &counting_delete, c10::Device(c10::DeviceType::CPU)};
    }
    int64_t limit = g_limit.load(std::memory_order_relaxed);
    if (limit > 0 && g_counters.live.load(std::memory_order_relaxed) + static_cast<int64_t>(n) > limit) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "leaklab CPU memory limit: allocating ", n, " bytes would pass the limit of ",
                       limit, " bytes (", g_counters.live.load(), " live)");
    }
    // The stack is captured before the lock: unwinding is the slow part, and needs none.
    Captured stack;
    int depth = g_history_max.load(std::memory_order_relaxed) > 0 ? g_stack_depth.load(std::memory_order_relaxed) : 0;
    if (depth > 0) capture(stack, depth, __builtin_return_address(0));
    auto* h = static_cast<Header*>(c10::alloc_cpu(n + kHeader));
    int64_t t = now_us();
    h->size = n;
    h->time_us = t;
    h->context = birth_context();
    h->stack = 0;
    auto size = static_cast<int64_t>(n);
    int64_t live = g_counters.live.fetch_add(size, std::memory_order_relaxed) + size;
    int64_t peak = g_counters.peak.load(std::memory_order_relaxed);
    while (live > peak && !g_counters.peak.compare_exchange_weak(peak, live)) {
    }
    g_counters.blocks.fetch_add(1, std::memory_order_relaxed);
    g_counters.allocs.fetch_add(1, std::memory_order_relaxed);
    g_counters.total.fetch_add(n, std::memory_order_relaxed);
    g_counters.by_context[h->context].fetch_add(size, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(g_mu);
      h->next = &g_live_head;
      h->prev = g_live_head.prev;
      g_live_head.prev->next = h;
      g_live_head.prev = h;
      if (depth > 0) h->stack = intern(stack);
      record(0, h, t);
    }
    void* data = reinterpret_cast<char*>(h) + kHeader;
    return {data, data, &counting_delete, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &counting_delete; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

CountingAllocator g_allocator;
std::atomic<bool> g_installed{false};

}  // namespace

extern "C" {

int ll_cpu_install(char* err, size_t errlen) {
  try {
    bool expected = false;
    if (g_installed.compare_exchange_strong(expected, true)) {
      // Priority 100 beats the default registration (0), so every later CPU storage is ours.
      c10::SetCPUAllocator(&g_allocator, 100);
    }
    if (c10::GetCPUAllocator() != &g_allocator) {
      write_err(err, errlen, "another CPU allocator with a higher priority is registered");
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    write_err(err, errlen, e.what());
    return 1;
  }
}

int ll_cpu_installed(void) { return g_installed.load() ? 1 : 0; }

void ll_cpu_stats(ll_cpu_stats_t* out) {
  out->live_bytes = g_counters.live.load();
  out->peak_bytes = g_counters.peak.load();
  out->live_blocks = g_counters.blocks.load();
  out->alloc_count = g_counters.allocs.load();
  out->free_count = g_counters.frees.load();
  out->alloc_bytes_total = g_counters.total.load();
}

void ll_cpu_set_limit(int64_t bytes) { g_limit.store(bytes > 0 ? bytes : 0); }

void ll_cpu_reset_peak(void) { g_counters.peak.store(g_counters.live.load()); }

void ll_context_set(int32_t id) {
  tl_context = (id >= 0 && id < LL_MAX_CONTEXTS) ? id : 0;
}

int32_t ll_context_get(void) { return tl_context; }

void ll_context_set_default(int32_t id) {
  g_default_context.store((id >= 0 && id < LL_MAX_CONTEXTS) ? id : 0);
}

int32_t ll_context_get_default(void) { return g_default_context.load(); }

void ll_cpu_live_by_context(int64_t* out, size_t n) {
  for (size_t i = 0; i < n && i < LL_MAX_CONTEXTS; ++i) out[i] = g_counters.by_context[i].load();
}

void ll_history_enable(size_t max_entries) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_history_max.store(max_entries);
  if (max_entries == 0) g_history.clear();
  while (g_history.size() > max_entries) g_history.pop_front();
}

void ll_stacks_enable(int depth) {
  g_stack_depth.store(depth < 0 ? 0 : depth > LL_MAX_FRAMES ? LL_MAX_FRAMES : depth);
  if (depth > 0) {
    // The unwinder reads the loaded objects' unwind tables on its first call: do it here,
    // not inside an allocation.
    try {
      (void)torch::unwind::unwind();
    } catch (...) {
    }
  }
}

size_t ll_stack_count(void) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_stacks.size();
}

size_t ll_stack_frames(int32_t id, uint64_t* out, size_t cap) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (id < 1 || static_cast<size_t>(id) > g_stacks.size()) return 0;
  const auto& s = g_stacks[id - 1];
  size_t n = 0;
  for (; n < s.size() && n < cap; ++n) out[n] = reinterpret_cast<uint64_t>(s[n]);
  return n;
}

size_t ll_history_len(void) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_history.size();
}

size_t ll_history_copy(ll_event_t* out, size_t cap) {
  std::lock_guard<std::mutex> lock(g_mu);
  size_t n = 0;
  for (const auto& e : g_history) {
    if (n == cap) break;
    out[n++] = e;
  }
  return n;
}

size_t ll_live_blocks_copy(ll_block_t* out, size_t cap) {
  std::lock_guard<std::mutex> lock(g_mu);
  size_t n = 0;
  for (Header* h = g_live_head.next; h != &g_live_head && n < cap; h = h->next) {
    out[n++] = ll_block_t{reinterpret_cast<uint64_t>(reinterpret_cast<char*>(h) + kHeader), h->size,
                          h->time_us, h->context, h->stack};
  }
  return n;
}

// Returns null when the guard cannot be made (out of memory, or libtorch refused): the shim
// never lets a C++ exception cross into Rust.
void* ll_inference_mode_enter(int enabled) {
  try {
    return new c10::InferenceMode(enabled != 0);
  } catch (...) {
    return nullptr;
  }
}

void ll_inference_mode_exit(void* guard) { delete static_cast<c10::InferenceMode*>(guard); }  // delete of null is a no-op

int ll_inference_mode_is_enabled(void) { return c10::InferenceMode::is_enabled() ? 1 : 0; }

int ll_grad_mode_is_enabled(void) { return c10::GradMode::is_enabled() ? 1 : 0; }

void ll_free(void* p) { std::free(p); }

}  // extern "C"
