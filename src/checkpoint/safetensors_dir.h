// The weights of a Hugging Face model directory: one model.safetensors, or the shards listed by
// model.safetensors.index.json.
//
// Opening validates everything up front (every shard is opened and checked once, and every name
// in the index must be in its shard), so a broken download fails before any weight is used. This
// is not a model loader: it knows nothing of parameter names, config.json or tied weights, and
// it writes only single-file directories.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/safetensors.h"

namespace megatron::safetensors {

class SafetensorsDir {
 public:
  static constexpr char kSingleFile[] = "model.safetensors";
  static constexpr char kIndexFile[] = "model.safetensors.index.json";

  // Uses model.safetensors when present (as transformers does), else the index and its shards.
  // Throws InvalidArgument naming the directory and both file names when neither exists.
  static SafetensorsDir open(const std::string& dir);

  // Writes `tensors` to dir/model.safetensors with metadata {"format": "pt"}, which transformers
  // expects. The directory must exist.
  static void write(const std::string& dir,
                    const std::vector<std::pair<std::string, Tensor>>& tensors);

  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // Throws InvalidArgument naming the tensor and the directory when it is absent.
  const TensorInfo& info(const std::string& name) const;
  // A copy of the tensor, in the file's dtype and shape.
  Tensor read(const std::string& name) const;
  // Every tensor name, sorted. With an index, exactly the names in its weight_map.
  std::vector<std::string> names() const;
  const std::string& dir() const { return dir_; }

 private:
  SafetensorsDir() = default;
  const File& file_of(const std::string& name) const;

  std::string dir_;
  std::vector<File> files_;              // each shard once
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
};

}  // namespace megatron::safetensors
