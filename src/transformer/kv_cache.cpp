#include "transformer/kv_cache.h"

#include "core/error.h"

namespace megatron {

KvCache::KvCache(int64_t max_sequence) : max_sequence_(max_sequence) {
  MEGATRON_CHECK(max_sequence > 0, "KvCache: max_sequence must be positive, got ", max_sequence);
}

void KvCache::advance(int64_t n) {
  MEGATRON_CHECK(n >= 0 && offset_ + n <= max_sequence_, "KvCache: advancing by ", n, " from ",
                 offset_, " passes the cache's ", max_sequence_, " positions");
  offset_ += n;
}

KvCache::Entry& KvCache::layer(int64_t layer_number, int64_t s, int64_t b, int64_t groups,
                               int64_t hn, DType dtype) {
  MEGATRON_CHECK(offset_ + s <= max_sequence_, "KvCache: positions [", offset_, ", ", offset_ + s,
                 ") exceed the cache's ", max_sequence_);
  const Shape shape{max_sequence_, b, groups, hn};
  auto it = layers_.find(layer_number);
  if (it == layers_.end()) {
    Entry e{Tensor::empty(shape, dtype), Tensor::empty(shape, dtype)};
    it = layers_.emplace(layer_number, std::move(e)).first;
  }
  MEGATRON_CHECK(it->second.k.shape() == shape && it->second.k.dtype() == dtype, "KvCache: layer ",
                 layer_number, " holds ", it->second.k.str(), ", a forward of ",
                 Shape{max_sequence_, b, groups, hn}.str(), " ", dtype_name(dtype),
                 " cannot use it (a new batch shape needs a new cache)");
  return it->second;
}

}  // namespace megatron
