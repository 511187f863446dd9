// The data flags as a DataConfig, and Megatron's per-split sample counts.
#include "train/datasets.h"

#include <algorithm>
#include <cmath>

#include "train/model_config.h"

namespace megatron {

SampleCounts sample_counts(const Arguments& a) {
  SampleCounts c;
  const int64_t gbs = a.global_batch_size;
  c.train = a.train_samples > 0 ? a.train_samples : a.train_iters * gbs;
  // Megatron core 0.19's get_train_valid_test_num_samples: evaluations of
  // --eval-global-batch-size samples, the ones before --start-eval-at-iter not counted. When the
  // start is a multiple of the interval its count is one short (the loop's evaluations from the
  // start on, and the one after training): Megatron then reads past its count into its
  // datasets' surplus; here the split is built for the evaluations the run makes, so that a
  // split without surplus (mock data, an exact blend) holds them too.
  const int64_t eval_gbs = a.eval_global_batch_size > 0 ? a.eval_global_batch_size : gbs;
  const int64_t megatron_count = std::max<int64_t>(
      0, a.train_iters / a.eval_interval + 1 - a.start_eval_at_iter / a.eval_interval);
  const int64_t first = std::max<int64_t>(a.start_eval_at_iter, 1);
  const int64_t in_loop =
      first > a.train_iters ? 0 : a.train_iters / a.eval_interval - (first - 1) / a.eval_interval;
  c.valid = std::max(megatron_count, in_loop + 1) * a.eval_iters * eval_gbs;
  c.test = a.eval_iters * eval_gbs;
  c.valid_one_epoch = a.full_validation;
  return c;
}

DataConfig data_config(const Arguments& a) {
  DataConfig d;
  d.mock_data = a.mock_data;
  d.data_path = a.data_path;
  d.split = a.split;
  d.train_data_path = a.train_data_path;
  d.valid_data_path = a.valid_data_path;
  d.test_data_path = a.test_data_path;
  d.multiple_validation_sets = a.multiple_validation_sets;
  d.mid_level_dataset_surplus = a.mid_level_dataset_surplus;
  d.sft = a.sft;
  d.sft_prompt_format = a.sft_tokenizer_prompt_format;
  d.data_cache_path = a.data_cache_path;
  d.per_dataset_sequences_path = a.per_dataset_sequences_path;
  d.sequences_per_dataset = a.sequences_per_dataset;
  d.seed = a.seed;
  d.eod_mask_loss = a.eod_mask_loss;
  d.reset_position_ids = a.reset_position_ids;
  d.reset_attention_mask = a.reset_attention_mask;
  d.allow_ambiguous_pad_tokens = a.allow_ambiguous_pad_tokens;
  d.inter_document_masking = a.dataloader_inter_document_masking;
  d.fim_data = a.fim_data;
  d.fim.rate = a.fim_rate;
  d.fim.spm_rate = a.fim_spm_rate;
  d.fim.split_sample = a.fim_split_sample;
  if (!std::isnan(a.fim_fragment_rate)) d.fim.fragment_rate = a.fim_fragment_rate;
  if (!a.fim_no_prefix.empty()) d.fim.no_prefix = a.fim_no_prefix;
  d.fim.prefix_token = a.fim_prefix_token;
  d.fim.middle_token = a.fim_middle_token;
  d.fim.suffix_token = a.fim_suffix_token;
  d.fim.pad_token = a.fim_pad_token;
  d.fim.eod_token = a.fim_eod_token;
  d.mask_prob = a.mask_prob;
  d.short_seq_prob = a.short_seq_prob;
  d.bert_binary_head = !a.bert_no_binary_head;
  d.decoder_seq_length = a.decoder_seq_length;
  if (const VisionConfig v = vision_config_from_args(a); v.enabled()) {
    d.img_h = v.img_h;
    d.img_w = v.img_w;
    d.text_seq_length = v.text_seq_length;
    d.image_embeddings = v.num_image_embeddings();
    d.language_seq_length = a.seq_length;
  }
  d.task = a.task;
  d.train_data = a.train_data;
  d.valid_data = a.valid_data;
  d.eval_batch = a.global_batch_size;
  return d;
}

}  // namespace megatron
