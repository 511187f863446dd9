// Micro-batch construction with Megatron's EOD-driven loss mask, position ids and document starts.
#include "data/gpt_batch.h"

#include <string>
#include <vector>

#include "core/error.h"

namespace megatron {

GPTBatch make_batch(const SampleSource& data, int64_t first, int64_t b, const BatchOptions& opt) {
  const int64_t s = data.seq_length();
  GPTBatch batch{Tensor::empty({b, s}, DType::kI64), Tensor::empty({b, s}, DType::kI64),
                 Tensor::full({b, s}, 1.0), Tensor::empty({b, s}, DType::kI64), Tensor()};
  if (opt.reset_attention_mask || opt.inter_document_masking)
    batch.doc_start = Tensor::empty({b, s}, DType::kI32);
  std::vector<int64_t> buf(static_cast<size_t>(s + 1));
  for (int64_t i = 0; i < b; ++i) {
    data.sample(first + i, buf.data());
    int64_t* tok = batch.tokens.data<int64_t>() + i * s;
    int64_t* lab = batch.labels.data<int64_t>() + i * s;
    float* mask = batch.loss_mask.data<float>() + i * s;
    int64_t* pos = batch.positions.data<int64_t>() + i * s;
    int32_t* start = batch.doc_start.defined() ? batch.doc_start.data<int32_t>() + i * s : nullptr;
    int64_t doc_begin = 0;  // position after the last EOD seen
    for (int64_t t = 0; t < s; ++t) {
      // Megatron's order: the EOD rules read the ids as sampled (pads included); then a pad
      // label loses its loss and pad ids become 0.
      tok[t] = buf[t] == opt.pad ? 0 : buf[t];
      lab[t] = buf[t + 1] == opt.pad ? 0 : buf[t + 1];
      pos[t] = opt.reset_position_ids ? t - doc_begin : t;
      if (start) start[t] = static_cast<int32_t>(doc_begin);
      const bool is_eod = buf[t] == opt.eod;
      if ((opt.eod_mask_loss && is_eod) || buf[t + 1] == opt.pad) mask[t] = 0;
      if (is_eod) doc_begin = t + 1;
    }
    if (opt.inter_document_masking) {
      std::vector<int64_t> lengths = data.document_lengths(first + i);
      if (!lengths.empty() && --lengths.back() == 0) lengths.pop_back();
      int64_t covered = 0;
      for (const int64_t n : lengths) covered += n;
      MEGATRON_ASSERT(covered <= s, "sample ", first + i, "'s documents hold ", covered,
                      " input tokens, more than the sequence's ", s);
      if (covered < s) {
        if (lengths.empty()) lengths.push_back(0);
        lengths.back() += s - covered;
      }
      int64_t t = 0;
      for (const int64_t n : lengths) {
        for (int64_t k = 0; k < n; ++k, ++t) {
          pos[t] = k;
          start[t] = static_cast<int32_t>(t - k);
        }
      }
    }
  }
  return batch;
}

PadToken gpt_pad_token(const Tokenizer& tokenizer, bool allow_ambiguous) {
  PadToken pad{tokenizer.pad(), false};
  if (pad.id < 0) return pad;
  // Core 0.19 compares with tokenizer.special_tokens_dict, which none of its tokenizers has, so
  // in effect with EOS and EOD only.
  pad.ambiguous = pad.id == tokenizer.eod() || pad.id == tokenizer.special_tokens().eos;
  if (pad.ambiguous && !allow_ambiguous) pad.id = -1;
  return pad;
}

std::string ambiguous_pad_warning(bool allowed) {
  std::string w =
      "The pad token id in the tokenizer collides with another special token id. This may "
      "cause instability and lack of convergence during training. ";
  if (allowed) {
    return w +
           "Do not ignore this warning if you do not understand the implications "
           "(--allow-ambiguous-pad-tokens masks every such token out of the loss).";
  }
  return w +
         "As such, the training flow will avoid masking out any pad tokens already present "
         "in the dataset. If you would like to disable this behavior, please provide a "
         "tokenizer with a uniquely-defined pad token id (or pass "
         "--allow-ambiguous-pad-tokens).";
}

TensorMap gpt_batch_fields(const GPTBatch& b) {
  TensorMap m{{kTokens, b.tokens},
              {kLabels, b.labels},
              {kLossMask, b.loss_mask},
              {kPositionIds, b.positions}};
  if (b.doc_start.defined()) m.set(kDocStart, b.doc_start);
  return m;
}

DType gpt_batch_field_dtype(const std::string& name) {
  if (name == kTokens || name == kLabels || name == kPositionIds) return DType::kI64;
  if (name == kLossMask) return DType::kF32;
  MEGATRON_ASSERT(name == kDocStart, "no GPT batch field '", name, "'");
  return DType::kI32;
}

}  // namespace megatron
