#include "data/mock_gpt_dataset.h"

#include <algorithm>

#include "core/philox.h"

namespace megatron {

namespace {
constexpr int64_t kMaxDocLength = 4096;
}

MockGPTDataset::MockGPTDataset(int64_t seq_length, int64_t eod, uint64_t seed)
    : seq_length_(seq_length), eod_(eod), seed_(seed) {
  MEGATRON_CHECK(eod >= 1, "mock data needs a vocabulary of at least 2 tokens");
}

void MockGPTDataset::locate(int64_t pos, int64_t& doc, int64_t& offset) {
  while (doc_starts_.back() <= pos) {
    const uint64_t k = doc_starts_.size() - 1;
    const int64_t len = 1 + static_cast<int64_t>(Philox::block(seed_, k, 0x3d0c)[0] %
                                                 static_cast<uint32_t>(kMaxDocLength - 1));
    doc_starts_.push_back(doc_starts_.back() + len);
  }
  auto it = std::upper_bound(doc_starts_.begin(), doc_starts_.end(), pos);
  doc = (it - doc_starts_.begin()) - 1;
  offset = pos - doc_starts_[static_cast<size_t>(doc)];
}

void MockGPTDataset::sample(int64_t index, int64_t* out) {
  int64_t doc, offset;
  const int64_t start = index * seq_length_;
  locate(start + seq_length_, doc, offset);  // grows the table far enough
  for (int64_t i = 0; i <= seq_length_; ++i) {
    locate(start + i, doc, offset);
    const int64_t len =
        doc_starts_[static_cast<size_t>(doc) + 1] - doc_starts_[static_cast<size_t>(doc)];
    out[i] = offset == len - 1 ? eod_ : (offset + 1) % eod_;
  }
}

GPTBatch make_batch(MockGPTDataset& data, int64_t first, int64_t b, bool eod_mask_loss) {
  const int64_t s = data.seq_length();
  GPTBatch batch{Tensor::empty({b, s}, DType::kI64), Tensor::empty({b, s}, DType::kI64),
                 Tensor::full({b, s}, 1.0)};
  std::vector<int64_t> buf(static_cast<size_t>(s + 1));
  for (int64_t i = 0; i < b; ++i) {
    data.sample(first + i, buf.data());
    for (int64_t t = 0; t < s; ++t) {
      batch.tokens.data<int64_t>()[i * s + t] = buf[t];
      batch.labels.data<int64_t>()[i * s + t] = buf[t + 1];
      if (eod_mask_loss && buf[t] == data.eod()) batch.loss_mask.data<float>()[i * s + t] = 0;
    }
  }
  return batch;
}

}  // namespace megatron
