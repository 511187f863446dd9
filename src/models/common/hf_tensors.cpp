// Shared Hugging Face directory helpers: see the header.
#include "models/common/hf_tensors.h"

#include <filesystem>
#include <fstream>

#include "checkpoint/safetensors_dir.h"

namespace megatron {

namespace fs = std::filesystem;

namespace {

// Row length of a parameter viewed as 2-D [rows, cols] (1-D params are one row per element).
int64_t row_len(const Param& p) {
  return p.shape.ndim() == 1 ? 1 : p.shape[1];
}

// Destination row (in the param) of HF row r.
int64_t dest_row(const HfTensorMapping& mp, int64_t r) {
  return mp.rows.empty() ? mp.row_begin + r : mp.rows[static_cast<size_t>(r)];
}

// Number of rows of the HF tensor viewed in our [out, in] orientation.
int64_t hf_rows(const HfTensorMapping& mp) {
  if (mp.hf_shape.ndim() == 1) return mp.hf_shape[0];
  return mp.transpose ? mp.hf_shape[1] : mp.hf_shape[0];
}

// Python's json module writes the floats inf and nan as bare Infinity, -Infinity and NaN (e.g.
// NemotronH's time_step_limit [0.0, Infinity]), which JSON has not: outside strings they become
// the strings "Infinity", "-Infinity" and "NaN".
std::string python_json_constants_as_strings(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      out += ch;
      if (ch == '\\' && i + 1 < text.size()) {
        out += text[++i];
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    if (ch == '"') in_string = true;
    bool replaced = false;
    for (const char* word : {"-Infinity", "Infinity", "NaN"}) {
      const std::string w(word);
      if (text.compare(i, w.size(), w) == 0) {
        out += '"' + w + '"';
        i += w.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += ch;
  }
  return out;
}

}  // namespace

std::vector<int64_t> packed_qkv_rows(const TransformerConfig& c, int part) {
  const int64_t hn = c.head_dim(), qpg = c.queries_per_group();
  const int64_t count = part == 0 ? c.num_attention_heads : c.num_query_groups;
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t g = part == 0 ? i / qpg : i;
    const int64_t slot = part == 0 ? i % qpg : qpg + part - 1;
    for (int64_t k = 0; k < hn; ++k) rows.push_back((g * (qpg + 2) + slot) * hn + k);
  }
  return rows;
}

const char* torch_dtype_name(DType t) {
  switch (t) {
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    default:
      return "float32";
  }
}

DType hf_dtype_from_torch(const std::string& s, const std::string& file) {
  if (s == "float32") return DType::kF32;
  if (s == "bfloat16") return DType::kBF16;
  if (s == "float16") return DType::kF16;
  MEGATRON_CHECK(false, file, ": torch_dtype '", s,
                 "' is not supported (float32, bfloat16, float16)");
  return DType::kF32;
}

nlohmann::json read_hf_config_json(const std::string& dir) {
  const std::string file = (fs::path(dir) / "config.json").string();
  MEGATRON_CHECK(fs::is_directory(dir), "--pretrained-checkpoint: '", dir,
                 "' is not a directory; pass a Hugging Face model directory (config.json + "
                 "model.safetensors)");
  std::ifstream in(file);
  MEGATRON_CHECK(in.good(), file,
                 ": cannot open; a Hugging Face model directory needs config.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(python_json_constants_as_strings(text));
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_CHECK(false, file, ": not valid JSON (", e.what(), ")");
  }
  MEGATRON_CHECK(j.is_object(), file, ": expected a JSON object");
  return j;
}

Shape HfTensorMapping::file_shape() const {
  if (slice < 0) return hf_shape;
  std::vector<int64_t> dims{slices};
  for (int i = 0; i < hf_shape.ndim(); ++i) dims.push_back(hf_shape[i]);
  return Shape(dims.begin(), dims.end());
}

void copy_mapped(const HfTensorMapping& mp, double* hf, double* ours, bool to_ours) {
  if (mp.slice >= 0) hf += mp.slice * mp.hf_shape.numel();  // this slice of a stacked tensor
  const int64_t cols = row_len(*mp.param), rows = hf_rows(mp);
  for (int64_t r = 0; r < rows; ++r) {
    double* row = ours + dest_row(mp, r) * cols;
    for (int64_t k = 0; k < cols; ++k) {
      const int64_t i = mp.hf_shape.ndim() == 1 ? r : mp.transpose ? k * rows + r : r * cols + k;
      // Without an offset the value itself: x + 0.0 would turn -0.0 (which MXFP4 weights hold)
      // into +0.0, and export would not give back the files' bytes.
      if (to_ours) {
        row[k] = mp.offset != 0 ? hf[i] - mp.offset : hf[i];
      } else {
        hf[i] = mp.offset != 0 ? row[k] + mp.offset : row[k];
      }
    }
  }
}

std::map<std::string, Tensor> mapped_hf_tensors(const std::vector<HfTensorMapping>& maps,
                                                bool grads) {
  std::map<std::string, Tensor> out;
  for (const HfTensorMapping& mp : maps) {
    // A frozen tensor (DeepSeek's expert bias, a buffer in Hugging Face) has no gradient.
    if (grads && (mp.param->frozen || !mp.param->main_grad.defined())) continue;
    // A stacked tensor is made by its first slice's mapping and filled by each slice's.
    auto it = out.find(mp.hf_name);
    if (it == out.end())
      it = out.emplace(mp.hf_name, Tensor::zeros(mp.file_shape(), DType::kF64)).first;
    Tensor src = to_host(grads ? mp.param->main_grad : mp.param->main).to(DType::kF64);
    HfTensorMapping values = mp;
    if (grads) values.offset = 0;  // d/dgamma = d/dweight: the offset moves values only
    copy_mapped(values, it->second.data<double>(), src.data<double>(), false);
  }
  return out;
}

bool is_peer_expert_tensor(const std::string& name, int64_t num_experts, int64_t first_local,
                           int64_t num_local) {
  const size_t at = name.find(".experts.");
  if (at == std::string::npos) return false;
  const size_t begin = at + 9, end = name.find('.', begin);
  const std::string index = name.substr(begin, end == std::string::npos ? end : end - begin);
  const std::string rest = end == std::string::npos ? "" : name.substr(end + 1);
  const bool expert_weight = rest == "w1.weight" || rest == "w2.weight" || rest == "w3.weight" ||
                             rest == "gate_proj.weight" || rest == "up_proj.weight" ||
                             rest == "down_proj.weight";
  if (!expert_weight || index.empty() || index.find_first_not_of("0123456789") != std::string::npos)
    return false;
  const int64_t e = std::stoll(index);
  return e >= 0 && e < num_experts && (e < first_local || e >= first_local + num_local);
}

std::set<std::string> read_mapped_tensors(const safetensors::SafetensorsDir& st,
                                          const std::map<std::string, std::string>& by_name,
                                          const std::vector<HfTensorMapping>& maps,
                                          std::map<Param*, Tensor>& staged, const std::string& dir,
                                          const HfDerivedTensors& derived) {
  std::set<std::string> used;
  // The last tensor read: a stacked tensor's slices are consecutive mappings, read once.
  std::string held_name;
  Tensor held;
  for (const HfTensorMapping& mp : maps) {
    auto it = by_name.find(mp.hf_name);
    MEGATRON_CHECK(it != by_name.end(), dir, ": tensor '", mp.hf_name,
                   "' is missing from the safetensors files; config.json and the weights disagree");
    used.insert(it->first);
    if (held_name != it->second) {
      const auto d = derived.find(it->second);
      held = (d != derived.end() ? d->second() : st.read(it->second)).to(DType::kF64);
      held_name = it->second;
    }
    MEGATRON_CHECK(held.shape() == mp.file_shape(), dir, ": tensor '", it->second, "' has shape ",
                   held.shape().str(), ", config.json implies ", mp.file_shape().str());
    copy_mapped(mp, held.data<double>(), staged.at(mp.param).data<double>(), true);
  }
  return used;
}

void write_hf_dir(const std::string& dir, const std::map<std::string, Tensor>& tensors, DType dtype,
                  const nlohmann::json& config) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  MEGATRON_CHECK(!ec, dir, ": cannot create the output directory (", ec.message(), ")");
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : tensors) out.emplace_back(name, t.to(dtype));
  safetensors::SafetensorsDir::write(dir, out);
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  std::ofstream f(cfg_path);
  MEGATRON_CHECK(f.good(), cfg_path, ": cannot write");
  f << config.dump(2) << "\n";
  MEGATRON_CHECK(f.good(), cfg_path, ": write failed");
}

}  // namespace megatron
