// Hugging Face model directories, the parts every architecture's mapping shares: typed
// config.json fields with errors that name the file and key, the tensor <-> parameter mapping
// (one HF tensor is a slice of one of our parameters, with a layout transform), and writing a
// directory (config.json + safetensors).
//
// A mapping copies in f64 both ways through one index function, so import and export cannot
// disagree, and import -> export reproduces the files' tensors bit for bit.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors_dir.h"
#include "core/error.h"
#include "parallel/param.h"
#include "tensor/tensor.h"
#include "transformer/config.h"

namespace megatron {

// A typed config.json field: errors name the file and key.
template <typename T>
T hf_get(const nlohmann::json& j, const std::string& key, const std::string& file) {
  MEGATRON_CHECK(j.contains(key) && !j[key].is_null(), file, ": missing key '", key,
                 "'; is this a Hugging Face config.json?");
  try {
    return j[key].get<T>();
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_CHECK(false, file, ": key '", key, "' has the wrong type (", e.what(), ")");
  }
  return T{};
}

template <typename T>
T hf_get_or(const nlohmann::json& j, const std::string& key, T fallback, const std::string& file) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return hf_get<T>(j, key, file);
}

// config.json's name of a weights dtype: "float32", "bfloat16" or "float16".
const char* torch_dtype_name(DType t);
// config.json's torch_dtype -> ours (float32, bfloat16, float16); errors name the file.
DType hf_dtype_from_torch(const std::string& s, const std::string& file);

// dir/config.json parsed (an object). Errors name the directory or file and the fix.
nlohmann::json read_hf_config_json(const std::string& dir);

// One HF tensor <-> one slice of a model parameter.
struct HfTensorMapping {
  std::string hf_name;
  Param* param = nullptr;
  int64_t row_begin = 0;      // the HF tensor fills rows [row_begin, row_begin + rows) of param ...
  std::vector<int64_t> rows;  // ... or, if non-empty, exactly these rows (in HF row order)
  bool transpose = false;     // HF stores [in, out] (GPT-2 Conv1D)
  Shape hf_shape;
  double offset = 0;  // HF value = ours + offset (1 for a zero-centred norm weight)
  // A stacked HF tensor (gpt-oss's experts, [E, ...]): the mapping covers slice `slice` of its
  // first dimension (of `slices`), hf_shape being one slice's shape. -1: the whole tensor.
  int64_t slice = -1, slices = 0;
  // The HF tensor's whole shape (slices prepended for a stacked one).
  Shape file_shape() const;
};

// Copies between the HF tensor `hf` and the param's flat buffer `ours` (both f64): element (r, k)
// of the HF tensor in our [out, in] orientation <-> row r of the slice, column k.
void copy_mapped(const HfTensorMapping& mp, double* hf, double* ours, bool to_ours);

// The mapped tensors (f64, HF names and shapes) of the params' main weights, or of their
// gradients (grads = true; offsets then do not apply).
std::map<std::string, Tensor> mapped_hf_tensors(const std::vector<HfTensorMapping>& maps,
                                                bool grads);

// Rows of Megatron's packed linear_qkv ([ng, qpg + 2, hn] per output row block) that hold every
// query head (part 0), every key head (1) or every value head (2), in Hugging Face's head order.
std::vector<int64_t> packed_qkv_rows(const TransformerConfig& cfg, int part);

// Under expert parallelism a rank holds experts [first_local, first_local + num_local) of
// num_experts: whether `name` is another rank's expert weight (".experts.E." followed by one of
// Mixtral's, Llama's or NemotronH's projection names), which this rank's loader leaves alone.
bool is_peer_expert_tensor(const std::string& name, int64_t num_experts, int64_t first_local,
                           int64_t num_local);

// Reads every tensor `maps` names from the directory `st` (by_name: a mapping's name -> the file's
// name) into `staged` (each Param's f64 staging buffer, which must be there), checking that each
// is present with the shape the mapping expects (errors name `dir` and the tensor). Returns the
// mapping names read, so that the caller can refuse the file's other tensors.
// Tensors a loader makes from others (gpt-oss's MXFP4 experts from their blocks and scales): a
// file name -> a function that returns the tensor (called once per run of mappings that read it).
using HfDerivedTensors = std::map<std::string, std::function<Tensor()>>;
std::set<std::string> read_mapped_tensors(const safetensors::SafetensorsDir& st,
                                          const std::map<std::string, std::string>& by_name,
                                          const std::vector<HfTensorMapping>& maps,
                                          std::map<Param*, Tensor>& staged, const std::string& dir,
                                          const HfDerivedTensors& derived = {});

// Writes dir/model.safetensors (tensors cast to dtype) and dir/config.json, creating dir.
void write_hf_dir(const std::string& dir, const std::map<std::string, Tensor>& tensors, DType dtype,
                  const nlohmann::json& config);

}  // namespace megatron
