// Live and peak tensor bytes: two atomic counters updated by Storage's constructor and destructor.
#include "tensor/memory_stats.h"

#include <atomic>

namespace megatron {
namespace {
std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};
}  // namespace

int64_t live_tensor_bytes() {
  return g_live.load();
}
int64_t peak_tensor_bytes() {
  return g_peak.load();
}
void reset_peak_tensor_bytes() {
  g_peak.store(g_live.load());
}

namespace detail {
void note_storage_alloc(size_t bytes) {
  const int64_t now = g_live.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}
void note_storage_free(size_t bytes) {
  g_live.fetch_sub(static_cast<int64_t>(bytes));
}
}  // namespace detail

}  // namespace megatron
