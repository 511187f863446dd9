// The registry of model specs: every architecture compiled in.
#include "models/model_spec.h"

#include <algorithm>

#include "core/error.h"
#include "models/bert/bert_classification_spec.h"
#include "models/bert/bert_spec.h"
#include "models/gpt/gpt_spec.h"
#include "models/llava/llava_spec.h"
#include "models/mamba/mamba_spec.h"
#include "models/t5/t5_spec.h"

namespace megatron {

std::vector<ChunkLayers> chunk_layers(int64_t num_layers, const ChunkPlacement& p) {
  const int64_t stages = static_cast<int64_t>(p.pp_size) * p.virtual_stages;
  validate_pipeline_split(num_layers, p.pp_size, p.virtual_stages, p.split);
  std::vector<ChunkLayers> out;
  for (int c = 0; c < p.virtual_stages; ++c) {
    const int64_t g = static_cast<int64_t>(c) * p.pp_size + p.pp_rank;
    const LayerRange r =
        chunk_layer_range(num_layers, p.pp_size, p.virtual_stages, p.split, p.pp_rank, c);
    out.push_back({r.first, r.count, g == 0, g == stages - 1});
  }
  return out;
}

const std::vector<const ModelSpec*>& model_specs() {
  static const std::vector<const ModelSpec*> specs{
      &gpt_spec(), &bert_spec(),  &bert_classification_spec(),
      &t5_spec(),  &llava_spec(), &mamba_spec()};
  return specs;
}

bool ModelSpec::answers_to(const std::string& command) const {
  return command == entry_point || std::find(entry_point_aliases.begin(), entry_point_aliases.end(),
                                             command) != entry_point_aliases.end();
}

std::string model_names() {
  std::string names;
  for (const ModelSpec* s : model_specs()) names += (names.empty() ? "" : ", ") + s->name;
  return names;
}

const ModelSpec& model_spec(const std::string& name) {
  for (const ModelSpec* s : model_specs()) {
    if (s->name == name) return *s;
  }
  MEGATRON_CHECK(false, "--model: unknown model '", name, "'; choose one of ", model_names());
  return *model_specs().front();
}

}  // namespace megatron
