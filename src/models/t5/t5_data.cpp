// T5 datasets per split and T5 micro-batches.
#include "models/t5/t5_data.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/logging.h"
#include "data/gpt_batch.h"
#include "data/indexed_dataset.h"
#include "data/t5_dataset.h"
#include "models/common/sentence_datasets.h"
#include "models/t5/t5_chunk.h"

namespace megatron {

Datasets t5_datasets(const DataConfig& a, const Tokenizer& tokenizer, int64_t seq_length,
                     const SampleCounts& n, bool log) {
  T5DatasetConfig config;
  config.random_seed = a.seed;
  config.sequence_length = seq_length;
  config.sequence_length_decoder = a.decoder_seq_length;
  config.tokenizer_json = nlohmann::json(tokenizer.identity()).dump();
  config.path_to_cache = a.data_cache_path;
  config.short_sequence_probability = a.short_seq_prob;
  config.masking.masking_probability = a.mask_prob;
  config.log = log;
  return sentence_datasets(
      a, n, "T5",
      [&](std::shared_ptr<const IndexedDataset> data, DocumentRange documents, int64_t count,
          Split which, const std::optional<std::string>& split) -> std::unique_ptr<SampleSource> {
        T5DatasetConfig c = config;
        c.split = split;
        return std::make_unique<T5Dataset>(std::move(data), documents, count, which, c, tokenizer);
      },
      log);
}

BatchFn t5_batch_maker(const DataConfig& config, const Tokenizer& tokenizer) {
  (void)tokenizer;  // T5Dataset checks the special tokens and sentinels when it is built
  const int64_t s_dec = config.decoder_seq_length;
  MEGATRON_CHECK(s_dec > 0, "T5 needs --decoder-seq-length");
  return [s_dec](const SampleSource& data, int64_t first, int64_t b) {
    const int64_t s_enc = data.seq_length(), width = data.sample_width();
    MEGATRON_CHECK(width == T5Record::width(s_enc, s_dec), "T5 batches need T5 samples");
    Tensor enc = Tensor::empty({b, s_enc}, DType::kI64),
           dec = Tensor::empty({b, s_dec}, DType::kI64);
    Tensor labels = Tensor::empty({b, s_dec}, DType::kI64);
    Tensor loss_mask = Tensor::empty({b, s_dec}, DType::kF32);
    Tensor enc_mask = Tensor::empty({b, s_enc}, DType::kI32);
    Tensor dec_mask = Tensor::empty({b, s_dec}, DType::kI32);
    std::vector<int64_t> record(static_cast<size_t>(width));
    for (int64_t i = 0; i < b; ++i) {
      data.sample(first + i, record.data());
      const T5Record r(record.data(), s_enc, s_dec);
      for (int64_t t = 0; t < s_enc; ++t) {
        enc.data<int64_t>()[i * s_enc + t] = r.text_enc[t];
        enc_mask.data<int32_t>()[i * s_enc + t] = r.enc_mask[t] != 0 ? 1 : 0;
      }
      for (int64_t t = 0; t < s_dec; ++t) {
        dec.data<int64_t>()[i * s_dec + t] = r.text_dec[t];
        labels.data<int64_t>()[i * s_dec + t] = r.labels[t];
        loss_mask.data<float>()[i * s_dec + t] = static_cast<float>(r.loss_mask[t]);
        dec_mask.data<int32_t>()[i * s_dec + t] = r.dec_mask[t] != 0 ? 1 : 0;
      }
    }
    return TensorMap{{kT5TextEnc, enc},      {kT5TextDec, dec},      {kLabels, labels},
                     {kLossMask, loss_mask}, {kT5EncMask, enc_mask}, {kT5DecMask, dec_mask}};
  };
}

}  // namespace megatron
