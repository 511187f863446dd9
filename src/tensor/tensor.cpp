// Tensor storage (64-byte aligned, large blocks reused), views and conversions.
#include "tensor/tensor.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "tensor/memory_stats.h"

namespace megatron {
namespace {

// Large freed blocks are kept for reuse. The trainer allocates the same activation buffers every
// micro-batch; handing them back to the OS (glibc maps anything above 32 MiB separately) would
// make every step pay page faults and page zeroing again, ~10% of a step. Blocks of at least
// 1 MiB are rounded up to 64 KiB and reused by exact rounded size; at most kMaxCached bytes are
// held. Process-wide by nature (it is memory), and thread-safe.
class BlockCache {
 public:
  static constexpr size_t kMinBytes = size_t{1} << 20;
  static constexpr size_t kGranule = size_t{1} << 16;
  static constexpr size_t kMaxCached = size_t{4} << 30;

  static BlockCache& instance() {
    static BlockCache* cache = new BlockCache();  // never destroyed: outlives static Tensors
    return *cache;
  }
  static size_t round(size_t bytes) {
    return bytes >= kMinBytes ? (bytes + kGranule - 1) / kGranule * kGranule
                              : (bytes + 63) / 64 * 64;
  }
  void* take(size_t rounded) {
    if (rounded < kMinBytes) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(rounded);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    cached_ -= rounded;
    return p;
  }
  bool give(void* p, size_t rounded) {
    if (rounded < kMinBytes) return false;
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_ + rounded > kMaxCached) return false;
    free_[rounded].push_back(p);
    cached_ += rounded;
    return true;
  }

 private:
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
};

}  // namespace

Storage::Storage(size_t bytes) : bytes_(bytes) {
  const size_t rounded = BlockCache::round(bytes == 0 ? 64 : bytes);
  data_ = BlockCache::instance().take(rounded);
  if (!data_) data_ = std::aligned_alloc(64, rounded);
  if (!data_) throw std::bad_alloc();
  detail::note_storage_alloc(bytes_);
}

Storage::~Storage() {
  detail::note_storage_free(bytes_);
  const size_t rounded = BlockCache::round(bytes_ == 0 ? 64 : bytes_);
  if (!BlockCache::instance().give(data_, rounded)) std::free(data_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  for (int64_t d : shape) MEGATRON_CHECK(d >= 0, "negative dimension in shape ", shape.str());
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(t.nbytes());
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.fill(value);
  return t;
}

Tensor Tensor::view(const Shape& shape) const {
  MEGATRON_CHECK(shape.numel() == numel(), "view: cannot view ", shape_.str(), " as ", shape.str());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice0(int64_t begin, int64_t end) const {
  MEGATRON_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= dim(0), "slice0: rows [",
                 begin, ", ", end, ") out of range for ", shape_.str());
  Tensor t = *this;
  int64_t row = dim(0) == 0 ? 0 : numel() / dim(0);
  t.offset_ += static_cast<size_t>(begin * row) * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::flat_view(int64_t offset, const Shape& shape) const {
  MEGATRON_CHECK(offset >= 0 && offset + shape.numel() <= numel(), "flat_view: ", shape.str(),
                 " at offset ", offset, " exceeds ", shape_.str());
  Tensor t = *this;
  t.offset_ += static_cast<size_t>(offset) * dtype_size(dtype_);
  t.shape_ = shape;
  return t;
}

Tensor Tensor::to(DType dtype) const {
  Tensor t = empty(shape_, dtype);
  convert(t.raw(), dtype, raw(), dtype_, numel());
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  MEGATRON_CHECK(src.numel() == numel(), "copy_from: ", src.str(), " into ", str());
  convert(raw(), dtype_, src.raw(), src.dtype_, numel());
}

void Tensor::fill(double value) {
  int64_t n = numel();
  switch (dtype_) {
    case DType::kF32: {
      float* p = data<float>();
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(value);
      break;
    }
    case DType::kF64: {
      double* p = data<double>();
      for (int64_t i = 0; i < n; ++i) p[i] = value;
      break;
    }
    default: {
      float v = static_cast<float>(value);
      for (int64_t i = 0; i < n; ++i)
        convert(static_cast<char*>(raw()) + i * dtype_size(dtype_), dtype_, &v, DType::kF32, 1);
    }
  }
}

void Tensor::zero() {
  std::memset(raw(), 0, nbytes());
}

double Tensor::item(int64_t i) const {
  MEGATRON_CHECK(i >= 0 && i < numel(), "item: index ", i, " out of range for ", str());
  double v;
  convert(&v, DType::kF64, static_cast<const char*>(raw()) + i * dtype_size(dtype_), dtype_, 1);
  return v;
}

void check_shape(const Tensor& t, const Shape& expected, const char* what) {
  MEGATRON_CHECK(t.shape() == expected, what, ": expected shape ", expected.str(), ", got ",
                 t.shape().str());
}

}  // namespace megatron
