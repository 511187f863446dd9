// Hugging Face model directories of safetensors weights; see safetensors_dir.h.
//
// The index format is {"metadata": {...}, "weight_map": {tensor name: shard file name}}; shard
// names are relative to the directory. Tensors a shard holds but the index does not list are
// ignored, as transformers ignores them.
#include "checkpoint/safetensors_dir.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace megatron::safetensors {

namespace fs = std::filesystem;

SafetensorsDir SafetensorsDir::open(const std::string& dir) {
  SafetensorsDir d;
  d.dir_ = dir;
  const fs::path single = fs::path(dir) / kSingleFile;
  const fs::path index = fs::path(dir) / kIndexFile;
  std::error_code ec;

  if (fs::exists(single, ec)) {
    d.files_.push_back(File::open(single.string()));
    for (const auto& entry : d.files_[0].tensors()) d.where_[entry.first] = 0;
    return d;
  }
  MEGATRON_CHECK(fs::exists(index, ec), "no safetensors weights in ", dir, ": expected ",
                 kSingleFile, " (one file) or ", kIndexFile, " (sharded), found neither",
                 fs::is_directory(dir, ec) ? "" : " (the directory does not exist)",
                 "; is this a Hugging Face model directory saved with safetensors?");

  const std::string where = "safetensors index " + index.string();
  std::ifstream in(index, std::ios::binary);
  MEGATRON_CHECK(in, "cannot read ", where);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    MEGATRON_CHECK(false, where, " is not valid JSON (", e.what(), ")");
  }
  MEGATRON_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), where,
                 " must be a JSON object with a \"weight_map\" object mapping tensor names to ",
                 "shard files");

  std::map<std::string, size_t> shard_index;  // shard file name -> index into files_
  for (const auto& [name, shard] : j["weight_map"].items()) {
    MEGATRON_CHECK(shard.is_string(), where, ": weight_map entry for tensor '", name,
                   "' must be a shard file name, got ", shard.dump());
    const std::string shard_name = shard.get<std::string>();
    auto it = shard_index.find(shard_name);
    if (it == shard_index.end()) {
      const fs::path shard_path = fs::path(dir) / shard_name;
      MEGATRON_CHECK(fs::exists(shard_path, ec), where, " lists shard ", shard_name,
                     " (for tensor '", name, "'), but ", shard_path.string(),
                     " is missing; the download is incomplete");
      d.files_.push_back(File::open(shard_path.string()));
      it = shard_index.emplace(shard_name, d.files_.size() - 1).first;
    }
    MEGATRON_CHECK(d.files_[it->second].contains(name), where, " maps tensor '", name,
                   "' to shard ", shard_name, ", but that shard has no such tensor");
    d.where_[name] = it->second;
  }
  return d;
}

void SafetensorsDir::write(const std::string& dir,
                           const std::vector<std::pair<std::string, Tensor>>& tensors) {
  safetensors::write((fs::path(dir) / kSingleFile).string(), tensors, {{"format", "pt"}});
}

const File& SafetensorsDir::file_of(const std::string& name) const {
  auto it = where_.find(name);
  MEGATRON_CHECK(it != where_.end(), "tensor '", name, "' not found in the safetensors weights of ",
                 dir_, " (", where_.size(), " tensors)");
  return files_[it->second];
}

const TensorInfo& SafetensorsDir::info(const std::string& name) const {
  return file_of(name).info(name);
}

Tensor SafetensorsDir::read(const std::string& name) const {
  return file_of(name).read(name);
}

std::vector<std::string> SafetensorsDir::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& entry : where_) out.push_back(entry.first);
  return out;
}

}  // namespace megatron::safetensors
