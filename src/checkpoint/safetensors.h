// Safetensors files: a validating, memory-mapped reader and an atomic writer.
//
// The format is Hugging Face's: an 8-byte little-endian header length N, N bytes of JSON mapping
// each tensor name to {dtype, shape, data_offsets} (plus an optional "__metadata__" map of
// strings), then the raw tensor bytes. The reader accepts exactly the files the reference
// implementation accepts, restricted to the dtypes megatron-cpp has (F64, F32, BF16, F16, I64,
// I32); the writer produces byte-for-byte the layout the reference writer produces. This is not
// a lazy or sliced loader: read() copies a whole tensor, and data() exposes the mapped bytes for
// callers that want to convert without the copy. Nothing here knows about model names; see
// safetensors_dir.h for Hugging Face model directories.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "tensor/shape.h"
#include "tensor/tensor.h"

namespace megatron::safetensors {

// One tensor's header entry. Offsets are relative to the start of the data buffer (the byte
// after the header), as in the file.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

// The header's dtype string for a dtype: "F32", "BF16", ...
const char* dtype_string(DType dtype);

// A validated safetensors file, mapped read-only. Tensors read from it are copies, so they stay
// valid after the File is gone; pointers from data() do not. Rewriting the file through write()
// is safe while it is open here (the writer renames a new file into place, and this mapping
// keeps the old one); truncating it in place from elsewhere is not.
class File {
 public:
  // Maps and validates the file; throws InvalidArgument naming the file and the problem.
  static File open(const std::string& path);

  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  // Every tensor, by name.
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws InvalidArgument naming the tensor and the file when it is absent.
  const TensorInfo& info(const std::string& name) const;
  // A copy of the tensor, in the file's dtype and shape.
  Tensor read(const std::string& name) const;
  // The tensor's bytes inside the mapping, valid while this File lives. Only files whose header
  // length is a multiple of 8 (as every conforming writer makes it) give aligned pointers.
  const void* data(const std::string& name) const;
  // The "__metadata__" map; empty when the file has none.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  File() = default;
  void unmap();

  std::string path_;
  const unsigned char* base_ = nullptr;  // the whole file, mapped
  size_t size_ = 0;                      // bytes mapped (the file size)
  size_t data_start_ = 0;                // 8 + header length
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` to `path` in the reference layout: tensors sorted by descending dtype
// alignment (ties in the reference's dtype order: I64, F64, F32, I32, BF16, F16) then by name,
// header padded with spaces to a multiple of 8, data contiguous in that order. "__metadata__" is
// written only when `metadata` is non-empty. The write is atomic: a temporary sibling file is
// written, synced and renamed over `path`, so a failure (disk full, permission) throws
// InvalidArgument with the path and the system's reason, leaves no temporary file, and leaves
// any previous file at `path` as it was. Duplicate or reserved names are an error.
// after_tensor, when given, runs after each tensor's bytes are written (a test hook); returning
// false fails the write there as the disk would, with the errno it set.
void write(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
           const std::map<std::string, std::string>& metadata = {},
           const std::function<bool()>& after_tensor = {});

}  // namespace megatron::safetensors
