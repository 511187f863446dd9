// Tensor storage (from its device's allocator), views and conversions.
#include "tensor/tensor.h"

#include <cstring>

#include "tensor/allocator.h"
#include "tensor/device_memory.h"
#include "tensor/memory_stats.h"

namespace megatron {
Storage::Storage(size_t bytes, Device device)
    : bytes_(bytes), device_(device), allocator_(&allocator_for(device)) {
  data_ = allocator_->allocate(bytes);
  detail::note_storage_alloc(bytes_);
}

Storage::~Storage() {
  detail::note_storage_free(bytes_);
  allocator_->release(data_, bytes_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) MEGATRON_CHECK(d >= 0, "negative dimension in shape ", shape.str());
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero();
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
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
  Tensor t = empty(shape_, dtype, device());
  detail::convert_on(device(), t.raw(), dtype, raw(), dtype_, numel());
  return t;
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  detail::copy_bytes(t.raw(), device, raw(), this->device(), nbytes());
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  MEGATRON_CHECK(src.numel() == numel(), "copy_from: ", src.str(), " into ", str());
  if (src.device() == device() || (is_host_memory(src.device()) && is_host_memory(device()))) {
    detail::convert_on(device(), raw(), dtype_, src.raw(), src.dtype_, numel());
    return;
  }
  // Across host and GPU memory: move the bytes, then convert where they landed.
  if (src.dtype_ == dtype_) {
    detail::copy_bytes(raw(), device(), src.raw(), src.device(), nbytes());
  } else {
    const Tensor moved = src.to(device());
    detail::convert_on(device(), raw(), dtype_, moved.raw(), src.dtype_, numel());
  }
}

void Tensor::fill(double value) {
  int64_t n = numel();
  if (!is_host_memory(device())) {
    detail::fill_on(device(), raw(), dtype_, value, n);
    return;
  }
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
      // One conversion, then its bytes repeated: convert() opens a parallel region per call,
      // which per element made a bf16 fill of a vocabulary-sized matrix take seconds.
      if (n == 0) break;
      const float v = static_cast<float>(value);
      char* p = static_cast<char*>(raw());
      const size_t size = dtype_size(dtype_);
      convert(p, dtype_, &v, DType::kF32, 1);
      for (int64_t i = 1; i < n; ++i) std::memcpy(p + i * size, p, size);
    }
  }
}

void Tensor::zero() {
  detail::zero_bytes(raw(), device(), nbytes());
}

double Tensor::item(int64_t i) const {
  MEGATRON_CHECK(i >= 0 && i < numel(), "item: index ", i, " out of range for ", str());
  const char* at = static_cast<const char*>(raw()) + i * dtype_size(dtype_);
  char host[8];
  detail::copy_bytes(host, Device::kCPU, at, device(), dtype_size(dtype_));
  double v;
  convert(&v, DType::kF64, host, dtype_, 1);
  return v;
}

Tensor to_host(const Tensor& t) {
  return !t.defined() || is_host_memory(t.device()) ? t : t.to(Device::kCPU);
}

Tensor on_device(const Tensor& t, Device device) {
  return !t.defined() || t.device() == device ? t : t.to(device);
}

void check_shape(const Tensor& t, const Shape& expected, const char* what) {
  MEGATRON_CHECK(t.shape() == expected, what, ": expected shape ", expected.str(), ", got ",
                 t.shape().str());
}

}  // namespace megatron
