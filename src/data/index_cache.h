// Dataset index caches in Megatron's layout: NumPy .npy arrays plus a description file, named
// `<md5 of the description>-<class>-<split>-<suffix>` inside the cache directory.
//
// NpyArray reads and writes the .npy format (version 1.0 written byte for byte as numpy.save
// writes it; versions 1-3 read), little-endian, C order, for the integer types the indices use:
// int16, int32, int64 and uint32. Loading maps the file read-only, as Megatron's
// numpy.load(mmap_mode="r") does, and rejects anything it cannot fully account for (bad magic,
// unknown dtype, Fortran order, a size that does not match the header).
//
// IndexCache is the protocol around the files: writes are atomic (temporary name, fsync, rename)
// and the description is written last, so its presence marks a complete cache; a cache with a
// missing, truncated or unparsable file is reported as a miss, to be rebuilt. Checking that the
// arrays fit the dataset (shapes, value ranges) is the caller's part, since only it knows them.
// This is not a general NumPy reader: no floats, no structured dtypes, no pickles.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace megatron {

enum class NpyDType : uint8_t { kInt16, kInt32, kInt64, kUInt32 };

size_t npy_dtype_size(NpyDType t);
// NumPy's descr string: "<i2", "<i4", "<i8", "<u4".
const char* npy_descr(NpyDType t);
// NumPy's dtype name: "int16", "int32", "int64", "uint32".
const char* npy_dtype_name(NpyDType t);

template <typename T>
constexpr NpyDType npy_dtype_of();
template <>
constexpr NpyDType npy_dtype_of<int16_t>() {
  return NpyDType::kInt16;
}
template <>
constexpr NpyDType npy_dtype_of<int32_t>() {
  return NpyDType::kInt32;
}
template <>
constexpr NpyDType npy_dtype_of<int64_t>() {
  return NpyDType::kInt64;
}
template <>
constexpr NpyDType npy_dtype_of<uint32_t>() {
  return NpyDType::kUInt32;
}

// An integer array of rank 0-2 (row-major), held in memory or mapped from a .npy file.
class NpyArray {
 public:
  NpyArray() = default;
  // A zero-filled array in memory.
  NpyArray(NpyDType dtype, std::vector<int64_t> shape);
  NpyArray(NpyArray&& other) noexcept;
  NpyArray& operator=(NpyArray&& other) noexcept;
  NpyArray(const NpyArray&) = delete;
  NpyArray& operator=(const NpyArray&) = delete;
  ~NpyArray();

  // Maps `path` read-only. Throws InvalidArgument naming the file and what is wrong with it.
  static NpyArray load(const std::string& path);
  // Writes the array as numpy.save would (format 1.0), atomically: a temporary file in the same
  // directory, fsync, rename. Throws InvalidArgument naming the path when it cannot.
  void save(const std::string& path) const;

  NpyDType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * npy_dtype_size(dtype_); }
  const void* data() const { return data_; }

  // Element i of the flattened array, widened to int64 (any dtype).
  int64_t get(int64_t i) const {
    switch (dtype_) {
      case NpyDType::kInt16:
        return static_cast<const int16_t*>(data_)[i];
      case NpyDType::kInt32:
        return static_cast<const int32_t*>(data_)[i];
      case NpyDType::kInt64:
        return static_cast<const int64_t*>(data_)[i];
      case NpyDType::kUInt32:
        return static_cast<const uint32_t*>(data_)[i];
    }
    return 0;
  }

  // Typed views; T must be the array's dtype.
  template <typename T>
  std::span<const T> values() const {
    MEGATRON_ASSERT(npy_dtype_of<T>() == dtype_, "NpyArray holds ", npy_dtype_name(dtype_));
    return {static_cast<const T*>(data_), static_cast<size_t>(numel_)};
  }
  // Only for arrays held in memory (a mapped array is read-only).
  template <typename T>
  std::span<T> mutable_values() {
    MEGATRON_ASSERT(npy_dtype_of<T>() == dtype_, "NpyArray holds ", npy_dtype_name(dtype_));
    MEGATRON_ASSERT(!storage_.empty() || numel_ == 0, "a mapped NpyArray is read-only");
    return {reinterpret_cast<T*>(storage_.data()), static_cast<size_t>(numel_)};
  }

 private:
  void release();

  NpyDType dtype_ = NpyDType::kInt64;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  // In memory: storage_ (operator new aligns it for every dtype). Mapped: map_/map_size_.
  std::vector<std::byte> storage_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const void* data_ = nullptr;
};

// Lower-case hex MD5 of `text` (Megatron's hashlib.md5(description).hexdigest()).
std::string md5_hex(std::string_view text);

// Writes `text` to `path` atomically (temporary file, fsync, rename).
void write_file_atomic(const std::string& path, std::string_view bytes);

// One cached index: files `<dir>/<md5(description)>-<class_name>-<split>-<suffix>`.
class IndexCache {
 public:
  // split "" for classes whose names carry no split (Megatron's masked-LM datasets).
  IndexCache(std::string dir, std::string_view class_name, std::string_view split,
             std::string description);

  const std::string& description() const { return description_; }
  // Full path of the file with this suffix ("description.txt", "document_index.npy", ...).
  std::string path(std::string_view suffix) const;

  // The arrays stored under `suffixes`, in that order, if the description file is present and
  // equal to ours and every array loads; otherwise nullopt, with the reason in *why.
  std::optional<std::vector<NpyArray>> load(std::span<const std::string_view> suffixes,
                                            std::string* why) const;
  // Creates the directory, removes the description (so a crash mid-way leaves no marker), writes
  // every array atomically, then the description. Throws InvalidArgument naming the directory.
  void save(std::span<const std::string_view> suffixes,
            std::span<const NpyArray* const> arrays) const;

 private:
  std::string dir_, base_, description_;
};

}  // namespace megatron
