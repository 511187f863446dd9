// Micro-batch construction and sampling: Megatron's masks and position ids around end-of-document
// tokens, and the sampler's order (prefetching and data-parallel sharding never change which
// samples a micro-batch holds).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "data/gpt_batch.h"
#include "data/mock_gpt_dataset.h"
#include "data/null_tokenizer.h"
#include "train/batch_prefetcher.h"

namespace megatron {
namespace {

// Sample i is seq_length + 1 consecutive ids of an arithmetic stream, with EOD (= 7, not 0, so a
// confusion of EOD with the zero id shows) at every 5th position.
constexpr int64_t kEod = 7;

class StreamSource : public SampleSource {
 public:
  StreamSource(int64_t n, int64_t s) : n_(n), s_(s) {}
  int64_t size() const override { return n_; }
  int64_t seq_length() const override { return s_; }
  void sample(int64_t index, int64_t* out) const override {
    for (int64_t t = 0; t <= s_; ++t) {
      const int64_t pos = index * s_ + t;
      out[t] = pos % 5 == 4 ? kEod : 100 + pos;
    }
  }

 private:
  int64_t n_, s_;
};

TEST(GPTBatch, MasksAndPositionsFollowMegatron) {
  StreamSource src(4, 8);
  BatchOptions opt{kEod, true, true, true};
  GPTBatch b = make_batch(src, 1, 1, opt);
  // Sample 1 covers stream positions 8..16: EOD at 9 and 14 (inputs t = 1 and 6).
  const int64_t want_tokens[] = {108, kEod, 110, 111, 112, 113, kEod, 115};
  const int64_t want_pos[] = {0, 1, 0, 1, 2, 3, 4, 0};    // restart after each EOD
  const int32_t want_start[] = {0, 0, 2, 2, 2, 2, 2, 7};  // the EOD ends its document
  const float want_mask[] = {1, 0, 1, 1, 1, 1, 0, 1};     // no loss on EOD inputs
  for (int64_t t = 0; t < 8; ++t) {
    EXPECT_EQ(b.tokens.data<int64_t>()[t], want_tokens[t]) << t;
    EXPECT_EQ(b.labels.data<int64_t>()[t], t == 7 ? 116 : want_tokens[t + 1]) << t;
    EXPECT_EQ(b.positions.data<int64_t>()[t], want_pos[t]) << t;
    EXPECT_EQ(b.doc_start.data<int32_t>()[t], want_start[t]) << t;
    EXPECT_EQ(b.loss_mask.data<float>()[t], want_mask[t]) << t;
  }
  GPTBatch plain = make_batch(src, 1, 1, BatchOptions{kEod, false, false, false});
  EXPECT_FALSE(plain.doc_start.defined());
  for (int64_t t = 0; t < 8; ++t) {
    EXPECT_EQ(plain.positions.data<int64_t>()[t], t);
    EXPECT_EQ(plain.loss_mask.data<float>()[t], 1.0f);
  }
}

// One fixed sample (seq_length + 1 ids), whatever the index.
class FixedSource : public SampleSource {
 public:
  explicit FixedSource(std::vector<int64_t> ids) : ids_(std::move(ids)) {}
  int64_t size() const override { return 1; }
  int64_t seq_length() const override { return static_cast<int64_t>(ids_.size()) - 1; }
  void sample(int64_t, int64_t* out) const override { std::copy(ids_.begin(), ids_.end(), out); }

 private:
  std::vector<int64_t> ids_;
};

// The fields of sample 0 as plain vectors.
struct Row {
  std::vector<int64_t> tokens, labels, positions;
  std::vector<float> mask;
  std::vector<int32_t> start;
};
Row row_of(const GPTBatch& b) {
  const int64_t s = b.tokens.numel();
  Row r;
  r.tokens.assign(b.tokens.data<int64_t>(), b.tokens.data<int64_t>() + s);
  r.labels.assign(b.labels.data<int64_t>(), b.labels.data<int64_t>() + s);
  r.positions.assign(b.positions.data<int64_t>(), b.positions.data<int64_t>() + s);
  r.mask.assign(b.loss_mask.data<float>(), b.loss_mask.data<float>() + s);
  if (b.doc_start.defined())
    r.start.assign(b.doc_start.data<int32_t>(), b.doc_start.data<int32_t>() + s);
  return r;
}

// GPTDataset.__getitem__ after _get_ltor_masks_and_position_ids: loss_mask[labels == pad] = 0,
// then tokens and labels equal to pad become 0. EOD = 7, pad = 3.
TEST(GPTBatch, PadLabelsLoseTheirLossAndPadIdsBecomeZero) {
  constexpr int64_t kPad = 3;
  FixedSource src({5, kPad, kEod, kPad, 9, kPad, kPad, 11, kPad});
  BatchOptions opt{kEod, true, true, true, kPad};
  const Row r = row_of(make_batch(src, 0, 1, opt));
  EXPECT_EQ(r.tokens, (std::vector<int64_t>{5, 0, kEod, 0, 9, 0, 0, 11}));
  EXPECT_EQ(r.labels, (std::vector<int64_t>{0, kEod, 0, 9, 0, 0, 11, 0}));
  // No loss where the label is a pad (t = 0, 2, 4, 5, 7) or the input is EOD (t = 2); the
  // pads as inputs keep theirs (t = 1, 3, 6 predict EOD, 9, 11).
  EXPECT_EQ(r.mask, (std::vector<float>{0, 1, 0, 1, 0, 0, 1, 0}));
  EXPECT_EQ(r.positions, (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 4}));
  EXPECT_EQ(r.start, (std::vector<int32_t>{0, 0, 0, 3, 3, 3, 3, 3}));

  // Without a pad id (-1) the same sample is untouched...
  opt.pad = -1;
  const Row plain = row_of(make_batch(src, 0, 1, opt));
  EXPECT_EQ(plain.tokens, (std::vector<int64_t>{5, kPad, kEod, kPad, 9, kPad, kPad, 11}));
  EXPECT_EQ(plain.mask, (std::vector<float>{1, 1, 0, 1, 1, 1, 1, 1}));
  // ... and a short sample's -1 filling (GPTDatasetConfig's pad when partial samples are kept)
  // is masked and read as 0.
  FixedSource short_sample({4, 5, 6, -1, -1});
  const Row filled = row_of(make_batch(short_sample, 0, 1, BatchOptions{kEod}));
  EXPECT_EQ(filled.tokens, (std::vector<int64_t>{4, 5, 6, 0}));
  EXPECT_EQ(filled.labels, (std::vector<int64_t>{5, 6, 0, 0}));
  EXPECT_EQ(filled.mask, (std::vector<float>{1, 1, 0, 0}));
}

// A pad shared with EOD (--allow-ambiguous-pad-tokens): the EOD rules read the ids before the
// pads become 0, as Megatron computes the masks first.
TEST(GPTBatch, AnAmbiguousPadStillEndsDocuments) {
  FixedSource src({5, kEod, 8, 9, kEod});
  const Row r = row_of(make_batch(src, 0, 1, BatchOptions{kEod, true, true, true, kEod}));
  EXPECT_EQ(r.tokens, (std::vector<int64_t>{5, 0, 8, 9}));
  EXPECT_EQ(r.labels, (std::vector<int64_t>{0, 8, 9, 0}));
  EXPECT_EQ(r.mask, (std::vector<float>{0, 0, 1, 0}));
  EXPECT_EQ(r.positions, (std::vector<int64_t>{0, 1, 0, 1}));
  EXPECT_EQ(r.start, (std::vector<int32_t>{0, 0, 2, 2}));
}

// A fixed sample cut from documents of the given lengths.
class DocumentSource : public FixedSource {
 public:
  DocumentSource(std::vector<int64_t> ids, std::vector<int64_t> lengths)
      : FixedSource(std::move(ids)), lengths_(std::move(lengths)) {}
  std::vector<int64_t> document_lengths(int64_t) const override { return lengths_; }

 private:
  std::vector<int64_t> lengths_;
};

// --dataloader-inter-document-masking: Megatron core 0.19's cu_seqlens from document_lengths
// (the extra label token off the last part, a short sample's remainder added to it), positions
// restarting in each part; the EOD rules no longer place them, the loss mask still follows EOD.
TEST(GPTBatch, InterDocumentMaskingTakesTheDatasetsDocuments) {
  BatchOptions opt{kEod, true, true, true};
  opt.inter_document_masking = true;
  // 9 ids from parts of 3, 4 and 2 (EOD inside the second part, not at a boundary).
  const Row r = row_of(
      make_batch(DocumentSource({10, 11, 12, 13, kEod, 15, 16, 17, 18}, {3, 4, 2}), 0, 1, opt));
  EXPECT_EQ(r.positions, (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 0}));
  EXPECT_EQ(r.start, (std::vector<int32_t>{0, 0, 0, 3, 3, 3, 3, 7}));
  EXPECT_EQ(r.mask, (std::vector<float>{1, 1, 1, 1, 0, 1, 1, 1}));  // --eod-mask-loss still
  // The last part only the extra token: it goes; a padded sample's shortfall joins the last.
  const Row tail =
      row_of(make_batch(DocumentSource({1, 2, 3, 4, 5, 6, 8, 9, 10}, {4, 4, 1}), 0, 1, opt));
  EXPECT_EQ(tail.start, (std::vector<int32_t>{0, 0, 0, 0, 4, 4, 4, 4}));
  const Row padded =
      row_of(make_batch(DocumentSource({1, 2, 3, 4, 5, -1, -1, -1, -1}, {2, 3}), 0, 1, opt));
  EXPECT_EQ(padded.positions, (std::vector<int64_t>{0, 1, 0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(padded.start, (std::vector<int32_t>{0, 0, 2, 2, 2, 2, 2, 2}));
  // Without the flag the same sample follows EOD (restart after position 4).
  opt.inter_document_masking = false;
  const Row eod = row_of(
      make_batch(DocumentSource({10, 11, 12, 13, kEod, 15, 16, 17, 18}, {3, 4, 2}), 0, 1, opt));
  EXPECT_EQ(eod.start, (std::vector<int32_t>{0, 0, 0, 0, 0, 5, 5, 5}));
}

// Mock documents end in EOD: the parts MockGPTDataset reports end exactly there.
TEST(GPTBatch, MockDocumentLengthsEndAtTheirEod) {
  const MockGPTDataset mock(400, 64, 99, 7);  // documents of up to 4095 tokens: a dozen ends
  int boundaries = 0;
  for (int64_t i = 0; i < mock.size(); ++i) {
    std::vector<int64_t> ids(65);
    mock.sample(i, ids.data());
    const std::vector<int64_t> lengths = mock.document_lengths(i);
    int64_t end = 0;
    for (size_t k = 0; k < lengths.size(); ++k) {
      ASSERT_GT(lengths[k], 0);
      end += lengths[k];
      if (k + 1 < lengths.size()) {
        EXPECT_EQ(ids[static_cast<size_t>(end - 1)], 99) << "sample " << i << " part " << k;
        ++boundaries;
      }
    }
    EXPECT_EQ(end, 65);
    for (int64_t t = 0; t + 1 < end - lengths.back(); ++t) {
      // every EOD before the last part ends a part
      if (ids[static_cast<size_t>(t)] == 99) {
        int64_t at = 0;
        bool is_end = false;
        for (const int64_t n : lengths) is_end = is_end || (at += n) == t + 1;
        EXPECT_TRUE(is_end) << "sample " << i << " EOD at " << t;
      }
    }
  }
  EXPECT_GT(boundaries, 0);
}

// A tokenizer with chosen special ids.
class SpecialsTokenizer : public NullTokenizer {
 public:
  SpecialsTokenizer(int64_t pad, SpecialTokens sp) : NullTokenizer(64), pad_(pad), sp_(sp) {}
  int64_t pad() const override { return pad_; }
  SpecialTokens special_tokens() const override { return sp_; }

 private:
  int64_t pad_;
  SpecialTokens sp_;
};

// MegatronDataset's pad: the tokenizer's, unless it is also EOD or EOS (then -1, no id of the
// data, unless --allow-ambiguous-pad-tokens keeps it). Core 0.19 compares with nothing else.
TEST(GPTBatch, PadTokenFollowsMegatronsCollisionRule) {
  auto check = [](const Tokenizer& tok, int64_t want, bool ambiguous, const char* what) {
    const PadToken p = gpt_pad_token(tok, false);
    EXPECT_EQ(p.id, want) << what;
    EXPECT_EQ(p.ambiguous, ambiguous) << what;
    const PadToken kept = gpt_pad_token(tok, true);
    EXPECT_EQ(kept.id, tok.pad()) << what;
    EXPECT_EQ(kept.ambiguous, ambiguous) << what;
  };
  check(NullTokenizer(16), -1, false, "no pad");
  check(NullTokenizer(16, -1, 3), 3, false, "pad 3, EOD 15");
  check(NullTokenizer(16, -1, 15), -1, true, "pad = EOD = V - 1");
  check(NullTokenizer(16, 4, 4), -1, true, "pad = --null-tokenizer-eod-id");
  SpecialTokens sp;
  sp.cls = 10;
  sp.sep = 11;
  sp.mask = 12;
  sp.bos = 20;
  sp.eos = 21;
  check(SpecialsTokenizer(0, sp), 0, false, "[PAD] 0 apart from the others");
  check(SpecialsTokenizer(21, sp), -1, true, "pad = EOS");
  check(SpecialsTokenizer(63, sp), -1, true, "pad = EOD (V - 1)");
  for (int64_t id : {10, 11, 12, 20})
    check(SpecialsTokenizer(id, sp), id, false, "pad = CLS/SEP/MASK/BOS: not compared");
}

// Every token of the next n micro-batches, flattened.
std::vector<int64_t> all_tokens(BatchPrefetcher& p, int n) {
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) {
    const Tensor tokens = p.next().at(kTokens);
    out.insert(out.end(), tokens.data<int64_t>(), tokens.data<int64_t>() + tokens.numel());
  }
  return out;
}

// The tokens of samples [first, first + count) as a micro-batch holds them.
std::vector<int64_t> tokens_of(const SampleSource& src, int64_t first, int64_t count) {
  std::vector<int64_t> out, buf(static_cast<size_t>(src.seq_length() + 1));
  for (int64_t i = first; i < first + count; ++i) {
    src.sample(i, buf.data());
    out.insert(out.end(), buf.begin(), buf.end() - 1);
  }
  return out;
}

TEST(BatchPrefetcher, PrefetchingAndShardingKeepMegatronsSampleOrder) {
  StreamSource src(64, 3);
  const BatchOptions options{kEod, false, false, false};
  const BatchFn opt = [options](const SampleSource& data, int64_t first, int64_t b) {
    return gpt_batch_fields(make_batch(data, first, b, options));
  };
  BatchPrefetcher sync(src, opt, 2, 4, 0), ahead(src, opt, 2, 4, 3);
  const std::vector<int64_t> got = all_tokens(sync, 10);
  EXPECT_EQ(got, all_tokens(ahead, 10));
  EXPECT_EQ(got, tokens_of(src, 4, 20));  // resumed at 4 consumed samples, in order
  // dp = 2, micro-batch 2, resuming from 4 consumed samples: rank 0 takes samples 4-5, 8-9, ...;
  // rank 1 takes 6-7, 10-11, ...
  BatchPrefetcher r0(src, opt, 2, 4, 2, 0, 2), r1(src, opt, 2, 4, 2, 1, 2);
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(all_tokens(r0, 1), tokens_of(src, 4 + 4 * k, 2)) << "rank 0, micro-batch " << k;
    EXPECT_EQ(all_tokens(r1, 1), tokens_of(src, 4 + 4 * k + 2, 2)) << "rank 1, micro-batch " << k;
  }
}

TEST(BatchPrefetcher, ExhaustedSourceIsAnErrorNotAHang) {
  StreamSource src(4, 3);
  BatchPrefetcher p(
      src,
      [](const SampleSource& data, int64_t first, int64_t b) {
        return gpt_batch_fields(make_batch(data, first, b, BatchOptions{}));
      },
      2, 0, 2);
  p.next();
  p.next();
  EXPECT_THROW(p.next(), InvalidArgument);
}

}  // namespace
}  // namespace megatron
