// SampleSource: what the trainer reads samples from. A GPT sample is seq_length + 1 token ids
// (inputs are the first seq_length, labels the last seq_length). Implemented by GPTDataset
// (Megatron's document/sample/shuffle indices over an IndexedDataset), BlendedDataset (weighted
// mixture), MockGPTDataset, BertDataset and T5Dataset (records of several fields,
// data/bert_dataset.h, data/t5_dataset.h).
#pragma once

#include <cstdint>
#include <vector>

namespace megatron {

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // Number of samples (a GPTDataset is built for the number of samples the run needs).
  virtual int64_t size() const = 0;
  virtual int64_t seq_length() const = 0;
  // int64 values per sample: seq_length + 1 token ids for GPT; datasets with more fields per
  // sample (BERT's record) say how many.
  virtual int64_t sample_width() const { return seq_length() + 1; }
  // Writes sample `index` (sample_width() values) into out. Safe to call from several threads.
  virtual void sample(int64_t index, int64_t* out) const = 0;
  // GPT samples: the tokens each document contributes to sample `index`, in order (Megatron's
  // document_lengths: the extra label token counted in the last; a padded sample's sum falls
  // short). By default the sample is one document, as Megatron's FIM dataset reports it.
  virtual std::vector<int64_t> document_lengths(int64_t index) const;
};

inline std::vector<int64_t> SampleSource::document_lengths(int64_t) const {
  return {seq_length() + 1};
}

}  // namespace megatron
