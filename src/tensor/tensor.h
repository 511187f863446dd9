// Tensor: a contiguous row-major array with a dtype, sharing reference-counted storage.
//
// Views exist only where they stay contiguous: reshape (view) and slicing the first dim
// (slice0). Everything else is an explicit copy kernel in ops.h. Storage is 64-byte aligned for
// the vector units. This is not an autograd tensor: layers implement backward explicitly.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "tensor/device.h"
#include "tensor/shape.h"

namespace megatron {

namespace detail {
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kF32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::kF64;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::kBF16;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::kF16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::kI64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::kU8;
}
}  // namespace detail

class Allocator;

// Owns one aligned allocation from its device's allocator (tensor/allocator.h).
class Storage {
 public:
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  Allocator* allocator_;
};

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised, zero-filled, or filled with `value`.
  static Tensor empty(const Shape& shape, DType dtype = DType::kF32, Device device = Device::kCPU);
  static Tensor zeros(const Shape& shape, DType dtype = DType::kF32, Device device = Device::kCPU);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::kF32,
                     Device device = Device::kCPU);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return shape_.ndim(); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::kCPU; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  // Typed access; checks that T matches the dtype.
  template <typename T>
  T* data() const {
    MEGATRON_CHECK(detail::dtype_of<T>() == dtype_, "tensor has dtype ", dtype_name(dtype_),
                   ", accessed as ", dtype_name(detail::dtype_of<T>()));
    return static_cast<T*>(raw());
  }
  void* raw() const { return storage_ ? static_cast<char*>(storage_->data()) + offset_ : nullptr; }

  // Same storage, new shape with the same number of elements.
  Tensor view(const Shape& shape) const;
  // Rows [begin, end) of the first dimension; shares storage.
  Tensor slice0(int64_t begin, int64_t end) const;
  // A view of `shape` starting at element `offset` of this (flat) tensor's storage.
  Tensor flat_view(int64_t offset, const Shape& shape) const;
  // A new tensor with converted elements, on the same device.
  Tensor to(DType dtype) const;
  // A copy on another device (same dtype).
  Tensor to(Device device) const;
  Tensor clone() const { return to(dtype_); }
  // Copies (and converts) src's elements into this tensor; shapes must have equal numel.
  void copy_from(const Tensor& src);
  void fill(double value);
  void zero();

  // Element i (flat) as double, for tests and small reads.
  double item(int64_t i = 0) const;

  std::string str() const { return std::string(dtype_name(dtype_)) + shape_.str(); }

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  DType dtype_ = DType::kF32;
};

// `t` itself if its storage is host memory (the CPU and reference devices), else a copy of it on
// the CPU: for code that reads values on the host (file writers, checks, logs).
Tensor to_host(const Tensor& t);
// `t` itself if it is on `device` (or undefined), else a copy of it there.
Tensor on_device(const Tensor& t, Device device);

// Throws with both shapes when a and b differ: "<what>: expected [..], got [..]".
void check_shape(const Tensor& t, const Shape& expected, const char* what);

}  // namespace megatron
