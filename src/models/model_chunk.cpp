// LossTerms: named (sum, count) pairs in first-added order.
#include "models/model_chunk.h"

#include "core/error.h"

namespace megatron {

void LossTerms::add(const std::string& name, double sum, double count) {
  for (Term& t : terms_) {
    if (t.name == name) {
      t.sum += sum;
      t.count += count;
      return;
    }
  }
  terms_.push_back(Term{name, sum, count});
}

void LossTerms::add(const LossTerms& other) {
  for (const Term& t : other.terms_) add(t.name, t.sum, t.count);
}

const LossTerms::Term& LossTerms::at(const std::string& name) const {
  for (const Term& t : terms_) {
    if (t.name == name) return t;
  }
  MEGATRON_ASSERT(false, "no loss term '", name, "'");
  return terms_.front();
}

TensorMap ModelChunk::infer(const TensorMap& /*in*/, const TensorMap& /*batch*/,
                            const ForwardMode& /*mode*/, bool /*last_only*/) const {
  MEGATRON_CHECK(false, "this model does not generate text (no inference forward)");
  return {};
}

std::vector<TensorSpec> ModelChunk::infer_specs(int64_t /*b*/, int64_t /*s*/) const {
  MEGATRON_CHECK(false, "this model does not generate text (no inference forward)");
  return {};
}

}  // namespace megatron
