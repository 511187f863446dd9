// LLaVA <-> Hugging Face LlavaForConditionalGeneration: see the header.
#include "models/llava/llava_hf.h"

#include <filesystem>
#include <set>

#include "checkpoint/safetensors_dir.h"
#include "core/error.h"
#include "models/common/hf_tensors.h"
#include "models/gpt/gpt_hf.h"
#include "models/llava/llava_chunk.h"

namespace megatron {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kVision = "vision_tower.vision_model.";
constexpr const char* kProjector = "multi_modal_projector.";
constexpr const char* kText = "language_model.";

// Keys a config may omit, with transformers' defaults (LlamaConfig, CLIPVisionConfig,
// LlavaConfig), so that the values read are the ones transformers builds the model with.
void fill(json& j, const json& defaults) {
  for (const auto& [k, v] : defaults.items())
    if (!j.contains(k) || j[k].is_null()) j[k] = v;
}
const json kLlamaDefaults = {
    {"model_type", "llama"},           {"vocab_size", 32000},     {"hidden_size", 4096},
    {"intermediate_size", 11008},      {"num_hidden_layers", 32}, {"num_attention_heads", 32},
    {"max_position_embeddings", 2048}, {"rms_norm_eps", 1e-6},    {"tie_word_embeddings", false}};
const json kClipDefaults = {{"model_type", "clip_vision_model"},
                            {"hidden_size", 768},
                            {"intermediate_size", 3072},
                            {"num_hidden_layers", 12},
                            {"num_attention_heads", 12},
                            {"num_channels", 3},
                            {"image_size", 224},
                            {"patch_size", 32},
                            {"hidden_act", "quick_gelu"},
                            {"layer_norm_eps", 1e-5}};
const json kLlavaDefaults = {{"image_token_index", 32000},
                             {"projector_hidden_act", "gelu"},
                             {"vision_feature_select_strategy", "default"},
                             {"vision_feature_layer", -2},
                             {"multimodal_projector_bias", true}};

// transformers >= 4.52 names -> the Hub's (what the mappings use).
std::string hub_name(const std::string& n) {
  auto starts = [&](const std::string& p) { return n.rfind(p, 0) == 0; };
  if (starts("model.language_model.")) return "language_model.model." + n.substr(21);
  if (starts("model.vision_tower.")) return n.substr(6);
  if (starts("model.multi_modal_projector.")) return n.substr(6);
  if (n == "lm_head.weight") return "language_model.lm_head.weight";
  return n;
}

// The CLIP vision tower's tensors under `prefix` (the Hub's "vision_tower.vision_model." in a
// LLaVA directory, "vision_model." in a CLIP one).
std::vector<HfTensorMapping> vision_mappings(LlavaModel& m, const std::string& prefix) {
  MEGATRON_CHECK(m.vision_model != nullptr, "the vision encoder lives on the first stage");
  const TransformerConfig& lm = m.config();
  const TransformerConfig& v = m.vision_model->config();
  const int64_t h = v.hidden_size, ffn = v.ffn_hidden_size, np = v.num_attention_heads;
  const int64_t hn = v.head_dim(), p = lm.vision.patch_dim;
  std::vector<HfTensorMapping> maps;
  auto add = [&](const std::string& name, Param& param, Shape shape,
                 std::vector<int64_t> rows = {}) {
    maps.push_back(HfTensorMapping{name, &param, 0, std::move(rows), false, shape, 0.0});
  };
  auto norm = [&](const std::string& name, Norm& n, int64_t width) {
    add(name + ".weight", n.weight, {width});
    add(name + ".bias", n.bias, {width});
  };
  ClipVisionModel& vit = *m.vision_model;
  const std::string e = prefix + "embeddings.";
  add(e + "patch_embedding.weight", vit.conv1.weight, {h, 3, p, p});
  add(e + "class_embedding", vit.class_token, {h});
  add(e + "position_embedding.weight", vit.position_embeddings, {v.seq_length, h});
  norm(prefix + "pre_layrnorm", vit.ln_pre, h);
  for (int64_t i = 0; i < v.num_layers; ++i) {
    TransformerLayer& L = *vit.decoder->layers[static_cast<size_t>(i)];
    const std::string x = prefix + "encoder.layers." + std::to_string(i) + ".";
    const char* qkv[] = {"q_proj", "k_proj", "v_proj"};
    for (int part = 0; part < 3; ++part) {
      const std::string a = x + "self_attn." + qkv[part];
      add(a + ".weight", L.self_attention->linear_qkv->weight(), {np * hn, h},
          packed_qkv_rows(v, part));
      add(a + ".bias", L.self_attention->linear_qkv->bias(), {np * hn}, packed_qkv_rows(v, part));
    }
    add(x + "self_attn.out_proj.weight", L.self_attention->linear_proj.weight(), {h, np * hn});
    add(x + "self_attn.out_proj.bias", L.self_attention->linear_proj.bias, {h});
    norm(x + "layer_norm1", *L.input_layernorm, h);
    add(x + "mlp.fc1.weight", L.mlp->linear_fc1.weight(), {ffn, h});
    add(x + "mlp.fc1.bias", L.mlp->linear_fc1.bias(), {ffn});
    add(x + "mlp.fc2.weight", L.mlp->linear_fc2.weight(), {h, ffn});
    add(x + "mlp.fc2.bias", L.mlp->linear_fc2.bias, {h});
    norm(x + "layer_norm2", *L.pre_mlp_layernorm, h);
  }
  return maps;
}

std::vector<HfTensorMapping> mappings(LlavaModel& m) {
  MEGATRON_CHECK(m.vision_model && m.vision_projection && m.language_model.head,
                 "LLaVA's Hugging Face mapping needs the whole model in one process");
  const TransformerConfig& lm = m.config();
  const int64_t h = m.vision_model->config().hidden_size;
  std::vector<HfTensorMapping> maps = vision_mappings(m, kVision);
  auto add = [&](const std::string& name, Param& param, Shape shape) {
    maps.push_back(HfTensorMapping{name, &param, 0, {}, false, shape, 0.0});
  };
  VisionProjection& proj = *m.vision_projection;
  MEGATRON_CHECK(!proj.affine(),
                 "Hugging Face LLaVA's projector is the mlp one "
                 "(--vision-projection-type mlp)");
  const int64_t pf = proj.linear_fc1.out_features();
  add(std::string(kProjector) + "linear_1.weight", proj.linear_fc1.weight(), {pf, h});
  add(std::string(kProjector) + "linear_1.bias", proj.linear_fc1.bias(), {pf});
  add(std::string(kProjector) + "linear_2.weight", proj.linear_fc2->weight(), {lm.hidden_size, pf});
  add(std::string(kProjector) + "linear_2.bias", proj.linear_fc2->bias, {lm.hidden_size});
  // The text model: GPT's Llama mapping under language_model. (model.* and lm_head.weight).
  HfModelInfo text;
  text.arch = HfArch::kLlama;
  text.config = lm;
  text.model_type = "llama";
  for (HfTensorMapping mp : hf_tensor_mappings(text, m.language_model)) {
    mp.hf_name = kText + mp.hf_name;
    maps.push_back(std::move(mp));
  }
  return maps;
}

}  // namespace

LlavaHfInfo read_llava_hf_config(const std::string& dir) {
  const std::string file = (fs::path(dir) / "config.json").string();
  LlavaHfInfo info;
  info.raw = read_hf_config_json(dir);
  json j = info.raw;
  fill(j, kLlavaDefaults);
  MEGATRON_CHECK(
      hf_get_or<std::string>(j, "model_type", "", file) == "llava", file,
      ": model_type must be \"llava\" (LlavaForConditionalGeneration) for --model llava");
  json text = j.value("text_config", json::object());
  fill(text, kLlamaDefaults);
  if (!text.contains("torch_dtype") && !text.contains("dtype")) {
    text["torch_dtype"] = hf_get_or<std::string>(
        j, j.contains("torch_dtype") ? "torch_dtype" : "dtype", "float32", file);
  }
  const HfModelInfo lm = hf_info_from_json(text, file + " (text_config)");
  MEGATRON_CHECK(lm.arch == HfArch::kLlama && !lm.config.moe.enabled(), file,
                 ": text_config must be a dense Llama-style model (llama, mistral, qwen2)");
  json vision = j.value("vision_config", json::object());
  fill(vision, kClipDefaults);
  const std::string vfile = file + " (vision_config)";
  MEGATRON_CHECK(hf_get<std::string>(vision, "model_type", vfile) == "clip_vision_model", vfile,
                 ": model_type must be clip_vision_model (a CLIP vision tower)");
  MEGATRON_CHECK(hf_get<std::string>(vision, "hidden_act", vfile) == "quick_gelu", vfile,
                 ": hidden_act must be quick_gelu (CLIP's)");
  MEGATRON_CHECK(hf_get<int64_t>(vision, "num_channels", vfile) == 3, vfile,
                 ": num_channels must be 3 (RGB)");
  MEGATRON_CHECK(j["vision_feature_layer"].is_number_integer(), file,
                 ": vision_feature_layer must be one layer index (lists of layers are not "
                 "supported)");
  info.vision_layers_in_file = hf_get<int64_t>(vision, "num_hidden_layers", vfile);
  const int64_t feature = j["vision_feature_layer"].get<int64_t>();
  const int64_t used = feature < 0 ? info.vision_layers_in_file + 1 + feature : feature;
  MEGATRON_CHECK(used >= 1 && used <= info.vision_layers_in_file, file, ": vision_feature_layer ",
                 feature, " selects no layer of the ", info.vision_layers_in_file,
                 "-layer vision tower");
  const std::string strategy = hf_get<std::string>(j, "vision_feature_select_strategy", file);
  MEGATRON_CHECK(strategy == "default" || strategy == "full", file,
                 ": vision_feature_select_strategy '", strategy, "' (default or full)");
  MEGATRON_CHECK(hf_get<std::string>(j, "projector_hidden_act", file) == "gelu", file,
                 ": projector_hidden_act must be gelu");
  MEGATRON_CHECK(hf_get<bool>(j, "multimodal_projector_bias", file), file,
                 ": a projector without biases is not supported");

  info.config = lm.config;
  info.dtype = lm.dtype;
  VisionConfig& v = info.config.vision;
  v.model_type = "clip";
  v.num_layers = used;
  v.hidden_size = hf_get<int64_t>(vision, "hidden_size", vfile);
  v.num_attention_heads = hf_get<int64_t>(vision, "num_attention_heads", vfile);
  v.ffn_hidden_size = hf_get<int64_t>(vision, "intermediate_size", vfile);
  v.norm_epsilon = hf_get<double>(vision, "layer_norm_eps", vfile);
  v.patch_dim = hf_get<int64_t>(vision, "patch_size", vfile);
  v.img_h = v.img_w = hf_get<int64_t>(vision, "image_size", vfile);
  v.class_token = strategy == "full";
  v.projection_type = "mlp";
  v.projection_ffn_hidden_size = info.config.hidden_size;
  return info;
}

void check_llava_exportable(const TransformerConfig& c) {
  MEGATRON_CHECK(
      c.vision.projection_type == "mlp" && (c.vision.projection_ffn_hidden_size == 0 ||
                                            c.vision.projection_ffn_hidden_size == c.hidden_size),
      "Hugging Face LLaVA's projector is linear_1 (to the text hidden size), GELU, "
      "linear_2: export needs --vision-projection-type mlp with "
      "--vision-projection-ffn-hidden-size equal to --hidden-size");
  MEGATRON_CHECK(infer_hf_arch(c) == HfArch::kLlama,
                 "Hugging Face LLaVA's text model is Llama-style: export needs "
                 "--position-embedding-type rope, --normalization RMSNorm, --swiglu, "
                 "--disable-bias-linear, --untie-embeddings-and-output-weights");
  MEGATRON_CHECK(c.vision.img_h == c.vision.img_w,
                 "Hugging Face CLIP vision towers take square images: --img-h must equal --img-w");
}

LlavaHfInfo llava_hf_info_from_config(const TransformerConfig& c) {
  check_llava_exportable(c);
  LlavaHfInfo info;
  info.config = c;
  info.dtype = DType::kF32;
  TransformerConfig text_cfg = c;
  text_cfg.vision = VisionConfig{};
  json text = hf_info_from_config(text_cfg, HfArch::kLlama).raw;
  text.erase("architectures");
  const TransformerConfig v = vision_transformer_config(c);
  info.vision_layers_in_file = v.num_layers;
  info.raw = {{"architectures", {"LlavaForConditionalGeneration"}},
              {"model_type", "llava"},
              {"image_token_index", kLlavaDefaults["image_token_index"]},
              {"projector_hidden_act", "gelu"},
              {"multimodal_projector_bias", true},
              {"vision_feature_layer", -1},
              {"vision_feature_select_strategy", c.vision.class_token ? "full" : "default"},
              {"tie_word_embeddings", false},
              {"torch_dtype", "float32"},
              {"text_config", text},
              {"vision_config",
               {{"model_type", "clip_vision_model"},
                {"hidden_size", v.hidden_size},
                {"intermediate_size", v.ffn_hidden_size},
                {"num_hidden_layers", v.num_layers},
                {"num_attention_heads", v.num_attention_heads},
                {"num_channels", 3},
                {"image_size", c.vision.img_h},
                {"patch_size", c.vision.patch_dim},
                {"hidden_act", "quick_gelu"},
                {"layer_norm_eps", v.norm_epsilon}}}};
  return info;
}

void load_llava_hf_weights(const std::string& dir, const LlavaHfInfo& info, LlavaModel& model,
                           ParamSet& params) {
  auto st = safetensors::SafetensorsDir::open(dir);
  std::map<std::string, std::string> by_hub;
  for (const std::string& n : st.names()) by_hub[hub_name(n)] = n;
  std::map<Param*, Tensor> staged;
  for (Param* p : params.params()) staged[p] = Tensor::zeros(p->shape, DType::kF64);
  const std::set<std::string> used = read_mapped_tensors(st, by_hub, mappings(model), staged, dir);
  const int64_t kept = info.config.vision.num_layers;
  for (const auto& [hub, full] : by_hub) {
    if (used.count(hub)) continue;
    // What LLaVA never reads: the tower's post_layernorm and position_ids buffer, the layers
    // after the feature layer, the text model's rotary buffers.
    bool unused = hub == std::string(kVision) + "post_layernorm.weight" ||
                  hub == std::string(kVision) + "post_layernorm.bias" ||
                  hub == std::string(kVision) + "embeddings.position_ids" ||
                  hub.find("rotary_emb.inv_freq") != std::string::npos;
    const std::string layers = std::string(kVision) + "encoder.layers.";
    if (hub.rfind(layers, 0) == 0) {
      const int64_t i = std::atoll(hub.c_str() + layers.size());
      unused = unused || (i >= kept && i < info.vision_layers_in_file);
    }
    MEGATRON_CHECK(unused, dir, ": unexpected tensor '", full,
                   "' for a LLaVA model as config.json describes it");
  }
  for (auto& [p, t] : staged) params.set_main(*p, t);
  params.sync_compute_from_main();
}

std::map<std::string, Tensor> llava_to_hf_tensors(const LlavaHfInfo& /*info*/,
                                                  const LlavaModel& model, bool grads) {
  return mapped_hf_tensors(mappings(const_cast<LlavaModel&>(model)), grads);
}

void save_llava_hf(const std::string& dir, const LlavaHfInfo& info, const LlavaModel& model,
                   const std::string& source_dir) {
  std::map<std::string, Tensor> tensors = llava_to_hf_tensors(info, model, false);
  if (!source_dir.empty()) {  // what the model does not use, unchanged
    auto st = safetensors::SafetensorsDir::open(source_dir);
    for (const std::string& n : st.names()) {
      const std::string hub = hub_name(n);
      if (!tensors.count(hub)) tensors[hub] = st.read(n).to(DType::kF64);
    }
  }
  write_hf_dir(dir, tensors, info.dtype, info.raw);
}

void load_clip_vision_weights(const std::string& dir, LlavaModel& model, ParamSet& params) {
  const std::string file = (fs::path(dir) / "config.json").string();
  json j = read_hf_config_json(dir);
  const std::string type = hf_get_or<std::string>(j, "model_type", "", file);
  MEGATRON_CHECK(type == "clip_vision_model" || type == "clip" || type == "llava", file,
                 ": model_type '", type,
                 "': --pretrained-vision-checkpoint takes a CLIP (CLIPModel or CLIPVisionModel) or "
                 "LLaVA directory");
  json vision = type == "clip_vision_model" ? j : j.value("vision_config", json::object());
  fill(vision, kClipDefaults);
  const std::string vfile = file + (type == "clip_vision_model" ? "" : " (vision_config)");
  const TransformerConfig& v = model.vision_model->config();
  const VisionConfig& vc = model.config().vision;
  auto same = [&](const char* key, int64_t ours, const char* flag) {
    const auto theirs = hf_get<int64_t>(vision, key, vfile);
    MEGATRON_CHECK(theirs == ours, vfile, ": ", key, " is ", theirs, " but ", flag, " makes ", ours,
                   "; set ", flag, " ", theirs);
  };
  same("hidden_size", v.hidden_size, "--vision-hidden-size");
  same("num_attention_heads", v.num_attention_heads, "--vision-num-attention-heads");
  same("intermediate_size", v.ffn_hidden_size, "--vision-ffn-hidden-size");
  same("patch_size", vc.patch_dim, "--patch-dim");
  same("image_size", vc.img_h, "--img-h");
  same("image_size", vc.img_w, "--img-w");
  const auto layers = hf_get<int64_t>(vision, "num_hidden_layers", vfile);
  MEGATRON_CHECK(layers >= v.num_layers, vfile, ": the tower has ", layers,
                 " layers, fewer than "
                 "--encoder-num-layers ",
                 v.num_layers);
  MEGATRON_CHECK(hf_get<std::string>(vision, "hidden_act", vfile) == "quick_gelu", vfile,
                 ": hidden_act must be quick_gelu (CLIP's)");
  auto st = safetensors::SafetensorsDir::open(dir);
  std::map<std::string, std::string> by_hub;
  for (const std::string& n : st.names()) by_hub[hub_name(n)] = n;
  const std::string prefix = type == "llava" ? kVision : "vision_model.";
  // Each parameter staged whole (q, k and v fill parts of one) and written once.
  const std::vector<HfTensorMapping> maps = vision_mappings(model, prefix);
  std::map<Param*, Tensor> staged;
  for (const HfTensorMapping& mp : maps)
    staged.try_emplace(mp.param, Tensor::zeros(mp.param->shape, DType::kF64));
  read_mapped_tensors(st, by_hub, maps, staged, dir);
  for (auto& [param, t] : staged) params.set_main(*param, t);
  params.sync_compute_from_main();
}

HfMapping llava_hf_mapping() {
  auto model_of = [](const ModelChunk& whole) -> LlavaModel& {
    const auto* c = dynamic_cast<const LlavaChunk*>(&whole);
    MEGATRON_ASSERT(c != nullptr, "a LLaVA mapping was given another model's chunk");
    return const_cast<LlavaModel&>(c->model());
  };
  HfMapping h;
  h.read_config = [](const std::string& dir) { return read_llava_hf_config(dir).config; };
  h.load = [model_of](const std::string& dir, ModelChunk& whole, ParamSet& params) {
    load_llava_hf_weights(dir, read_llava_hf_config(dir), model_of(whole), params);
  };
  h.save = [model_of](const std::string& dir, const ModelChunk& whole,
                      const std::string& source_dir, std::optional<DType> dtype) {
    LlavaModel& m = model_of(whole);
    LlavaHfInfo info = source_dir.empty() ? llava_hf_info_from_config(m.config())
                                          : read_llava_hf_config(source_dir);
    if (dtype) {
      info.dtype = *dtype;
      info.raw["torch_dtype"] = torch_dtype_name(*dtype);
    }
    save_llava_hf(dir, info, m, source_dir);
  };
  h.check_exportable = check_llava_exportable;
  h.load_vision = [model_of](const std::string& dir, ModelChunk& first, ParamSet& params) {
    load_clip_vision_weights(dir, model_of(first), params);
  };
  return h;
}

}  // namespace megatron
