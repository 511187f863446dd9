// GPTBatch: a micro-batch in Megatron's layout, built from samples of a SampleSource, with the
// masks and positions of Megatron's _get_ltor_masks_and_position_ids:
// - loss_mask 0 where the input token is EOD (--eod-mask-loss);
// - position ids restart after every EOD (--reset-position-ids);
// - doc_start, the first position of each token's document, so attention stays inside documents
//   (--reset-attention-mask). The EOD token belongs to the document it ends.
// With inter_document_masking (core 0.19's --dataloader-inter-document-masking) the positions
// restart and attention stays inside each document part of the sample instead, its boundaries
// taken from the dataset (so documents need no EOD): Megatron's cu_seqlens, the extra label
// token taken off the last part and a padded sample's shortfall added to it.
// And GPTDataset.__getitem__'s padding rule after them: no loss where the label is the pad id,
// and pad ids in tokens and labels become 0 (so the embedding can look them up). The masks and
// positions are computed before that, on the pad ids.
#pragma once

#include <cstdint>
#include <string>

#include "data/sample_source.h"
#include "data/tokenizer.h"
#include "tensor/tensor.h"
#include "tensor/tensor_map.h"

namespace megatron {

struct GPTBatch {
  Tensor tokens;     // [b, s] i64
  Tensor labels;     // [b, s] i64, tokens shifted by one
  Tensor loss_mask;  // [b, s] f32
  Tensor positions;  // [b, s] i64
  Tensor doc_start;  // [b, s] i32, only with reset_attention_mask
};

struct BatchOptions {
  int64_t eod = -1;
  bool eod_mask_loss = false;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  int64_t pad = -1;  // gpt_pad_token(); -1 also fills short samples (GPTDatasetConfig)
  // --dataloader-inter-document-masking: positions and document starts from the documents the
  // sample was cut from (SampleSource::document_lengths), whatever EOD says.
  bool inter_document_masking = false;
};

// The batch's fields by name, as Megatron's get_batch names them (the names GPT's model chunks
// read, models/gpt/gpt_chunk.h), and the dtype of each.
inline constexpr const char* kTokens = "tokens";
inline constexpr const char* kLabels = "labels";
inline constexpr const char* kLossMask = "loss_mask";
inline constexpr const char* kPositionIds = "position_ids";
inline constexpr const char* kDocStart = "doc_start";
// Every defined field of b (doc_start only with reset_attention_mask).
TensorMap gpt_batch_fields(const GPTBatch& b);
// The dtype of the field `name`; refuses a name that is no GPT batch field.
DType gpt_batch_field_dtype(const std::string& name);

// The id GPT samples treat as padding: Megatron's MegatronDataset._pad_token_id. The tokenizer's
// pad (-1 when it has none); when that equals its EOD or EOS (the special tokens Megatron core
// 0.19 compares it with), masking it would silence real tokens, so it becomes -1 (no id of the
// data) unless allow_ambiguous (--allow-ambiguous-pad-tokens) keeps it. `ambiguous` says
// whether it collided, for the warning Megatron prints either way.
struct PadToken {
  int64_t id = -1;
  bool ambiguous = false;
};
PadToken gpt_pad_token(const Tokenizer& tokenizer, bool allow_ambiguous);
// Megatron's warning for an ambiguous pad (kept or dropped).
std::string ambiguous_pad_warning(bool allowed);

// Builds a batch from samples first, first + 1, ..., first + b - 1 of `data`.
GPTBatch make_batch(const SampleSource& data, int64_t first, int64_t b, const BatchOptions& opt);

}  // namespace megatron
