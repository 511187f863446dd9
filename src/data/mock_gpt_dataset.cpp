// Mock documents laid out once up to the last sample; a sample is a window over that stream.
#include "data/mock_gpt_dataset.h"

#include <algorithm>

#include "core/error.h"
#include "core/philox.h"

namespace megatron {

namespace {
constexpr int64_t kMaxDocLength = 4096;
}

MockGPTDataset::MockGPTDataset(int64_t num_samples, int64_t seq_length, int64_t eod, uint64_t seed)
    : num_samples_(num_samples), seq_length_(seq_length), eod_(eod) {
  MEGATRON_CHECK(eod >= 1, "mock documents hold the ids below the end-of-document id, here ", eod,
                 "; pass a --vocab-size of at least 2 (or a --null-tokenizer-eod-id >= 1)");
  const int64_t stream_end = num_samples * seq_length + 1;
  while (doc_starts_.back() < stream_end) {
    const uint64_t k = doc_starts_.size() - 1;
    const int64_t len = 1 + static_cast<int64_t>(Philox::block(seed, k, 0x3d0c)[0] %
                                                 static_cast<uint32_t>(kMaxDocLength - 1));
    doc_starts_.push_back(doc_starts_.back() + len);
  }
}

void MockGPTDataset::sample(int64_t index, int64_t* out) const {
  MEGATRON_CHECK(index >= 0 && index < num_samples_, "mock dataset: sample ", index,
                 " out of range [0, ", num_samples_, ")");
  const int64_t start = index * seq_length_;
  auto it = std::upper_bound(doc_starts_.begin(), doc_starts_.end(), start) - 1;
  for (int64_t i = 0; i <= seq_length_; ++i) {
    const int64_t pos = start + i;
    while (*(it + 1) <= pos) ++it;
    const int64_t offset = pos - *it, len = *(it + 1) - *it;
    out[i] = offset == len - 1 ? eod_ : (offset + 1) % eod_;
  }
}

std::vector<int64_t> MockGPTDataset::document_lengths(int64_t index) const {
  MEGATRON_CHECK(index >= 0 && index < num_samples_, "mock dataset: sample ", index,
                 " out of range [0, ", num_samples_, ")");
  const int64_t start = index * seq_length_, end = start + seq_length_ + 1;
  std::vector<int64_t> lengths;
  for (auto it = std::upper_bound(doc_starts_.begin(), doc_starts_.end(), start) - 1; *it < end;
       ++it)
    lengths.push_back(std::min(*(it + 1), end) - std::max(*it, start));
  return lengths;
}

}  // namespace megatron
