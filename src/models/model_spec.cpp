// The registry of model specs: every architecture compiled in.
#include "models/model_spec.h"

#include "core/error.h"
#include "models/bert/bert_classification_spec.h"
#include "models/bert/bert_spec.h"
#include "models/gpt/gpt_spec.h"

namespace megatron {

const std::vector<const ModelSpec*>& model_specs() {
  static const std::vector<const ModelSpec*> specs{&gpt_spec(), &bert_spec(),
                                                   &bert_classification_spec()};
  return specs;
}

std::string model_names() {
  std::string names;
  for (const ModelSpec* s : model_specs()) names += (names.empty() ? "" : ", ") + s->name;
  return names;
}

const ModelSpec& model_spec(const std::string& name) {
  for (const ModelSpec* s : model_specs()) {
    if (s->name == name || s->entry_point == name) return *s;
  }
  MEGATRON_CHECK(false, "--model: unknown model '", name, "'; choose one of ", model_names());
  return *model_specs().front();
}

}  // namespace megatron
