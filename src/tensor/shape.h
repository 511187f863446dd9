// Shape: up to 6 dimensions, stored inline (no allocation).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/error.h"

namespace megatron {

class Shape {
 public:
  static constexpr int kMaxDims = 6;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) {
    MEGATRON_CHECK(dims.size() <= kMaxDims, "a tensor has at most 6 dims, got ", dims.size());
    for (int64_t d : dims) dims_[ndim_++] = d;
  }
  template <typename It>
  Shape(It begin, It end) {
    for (It it = begin; it != end; ++it) {
      MEGATRON_CHECK(ndim_ < kMaxDims, "a tensor has at most 6 dims");
      dims_[ndim_++] = static_cast<int64_t>(*it);
    }
  }

  int ndim() const { return ndim_; }
  // Negative indices count from the end, as in NumPy.
  int64_t operator[](int i) const { return dims_[i < 0 ? i + ndim_ : i]; }
  int64_t& operator[](int i) { return dims_[i < 0 ? i + ndim_ : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim_; ++i) n *= dims_[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (ndim_ != o.ndim_) return false;
    for (int i = 0; i < ndim_; ++i)
      if (dims_[i] != o.dims_[i]) return false;
    return true;
  }
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < ndim_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
    return s + "]";
  }
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + ndim_; }

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

}  // namespace megatron
