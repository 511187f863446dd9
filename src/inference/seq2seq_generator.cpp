// Encoder-decoder generation: encode once, decode a column per step (see the header).
#include "inference/seq2seq_generator.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "core/error.h"
#include "core/philox.h"
#include "transformer/kv_cache.h"

namespace megatron::inference {

void check_seq2seq_request(const Seq2SeqRequest& request, const TransformerConfig& cfg) {
  MEGATRON_CHECK(!request.prompts.empty(), "no prompts to generate from");
  MEGATRON_CHECK(request.tokens_to_generate >= 1,
                 "--num-tokens-to-generate must be >= 1 for an encoder-decoder model, got ",
                 request.tokens_to_generate);
  const bool learned = cfg.position_embedding == PositionEmbedding::kLearnedAbsolute;
  for (size_t i = 0; i < request.prompts.size(); ++i) {
    const auto n = static_cast<int64_t>(request.prompts[i].size());
    MEGATRON_CHECK(n > 0, "prompt ", i, " is empty");
    MEGATRON_CHECK(!learned || n <= cfg.max_position_embeddings, "prompt ", i, " has ", n,
                   " tokens, beyond the ", cfg.max_position_embeddings,
                   " learned positions (--max-position-embeddings)");
  }
  // The start token and every generated one but the last take a decoder position.
  MEGATRON_CHECK(!learned || request.tokens_to_generate <= cfg.max_position_embeddings,
                 "--num-tokens-to-generate ", request.tokens_to_generate, " exceeds the ",
                 cfg.max_position_embeddings, " learned positions (--max-position-embeddings)");
}

namespace {

// One batch of prompts [first, first + b).
void generate_batch(const T5Model& model, const Seq2SeqRequest& request,
                    const Seq2SeqConfig& config, bool use_cache, size_t first, int64_t b,
                    std::vector<Seq2SeqResult>& results) {
  const int64_t vp = model.config().padded_vocab_size, vocab = config.vocab_size;
  int64_t se = 0;
  for (int64_t i = 0; i < b; ++i)
    se = std::max<int64_t>(se, static_cast<int64_t>(request.prompts[first + i].size()));
  Tensor enc = Tensor::full({b, se}, static_cast<double>(config.pad), DType::kI64);
  Tensor valid = Tensor::zeros({b, se}, DType::kI32);
  for (int64_t i = 0; i < b; ++i) {
    const std::vector<int64_t>& p = request.prompts[first + i];
    for (size_t t = 0; t < p.size(); ++t) {
      enc.data<int64_t>()[i * se + static_cast<int64_t>(t)] = p[t];
      valid.data<int32_t>()[i * se + static_cast<int64_t>(t)] = 1;
    }
  }
  const ForwardMode plain{};
  const Tensor memory = model.encode(enc, valid, plain);
  const int64_t steps = request.tokens_to_generate;
  KvCache cache(steps);
  ForwardMode cached{};
  cached.kv_cache = &cache;
  // The decoder's input so far: [b, 1 + generated], the start token first.
  std::vector<std::vector<int64_t>> dec(static_cast<size_t>(b), std::vector<int64_t>{config.start});
  std::vector<char> done(static_cast<size_t>(b), 0);
  for (int64_t step = 0; step < steps; ++step) {
    Tensor logits;
    if (use_cache) {  // the newest column only
      Tensor col = Tensor::empty({b, 1}, DType::kI64);
      for (int64_t i = 0; i < b; ++i) col.data<int64_t>()[i] = dec[static_cast<size_t>(i)].back();
      logits = model.decode(col, memory, valid, cached, /*last_only=*/true);
      cache.advance(1);
    } else {  // the whole decoder input again
      const int64_t s = step + 1;
      Tensor all = Tensor::empty({b, s}, DType::kI64);
      for (int64_t i = 0; i < b; ++i)
        for (int64_t t = 0; t < s; ++t)
          all.data<int64_t>()[i * s + t] = dec[static_cast<size_t>(i)][static_cast<size_t>(t)];
      logits = model.decode(all, memory, valid, plain, /*last_only=*/true);
    }
    bool all_done = true;
    for (int64_t i = 0; i < b; ++i) {
      const auto ii = static_cast<size_t>(i);
      const float* row = logits.data<float>() + i * vp;
      int64_t next = config.pad;
      if (!done[ii]) {
        const double u = Philox::uniform(request.seed, first + ii, static_cast<uint64_t>(step));
        next = sample_token(std::span<const float>(row, static_cast<size_t>(vocab)),
                            request.sampling, vocab, u);
        Seq2SeqResult& r = results[first + ii];
        r.tokens.push_back(next);
        if (request.return_log_probs) {
          double mx = row[0];
          for (int64_t v = 1; v < vocab; ++v) mx = std::max<double>(mx, row[v]);
          double sum = 0;
          for (int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - mx);
          r.logprobs.push_back(static_cast<float>(row[next] - mx - std::log(sum)));
        }
        if (next == config.end) done[ii] = 1;
      }
      dec[ii].push_back(next);
      all_done = all_done && done[ii];
    }
    if (all_done) break;
  }
}

}  // namespace

std::vector<Seq2SeqResult> generate_seq2seq(const T5Model& model, const Seq2SeqRequest& request,
                                            const Seq2SeqConfig& config, bool use_cache) {
  check_seq2seq_request(request, model.config());
  check_sampling(request.sampling, config.vocab_size);
  std::vector<Seq2SeqResult> results(request.prompts.size());
  const size_t n = request.prompts.size(),
               per = static_cast<size_t>(std::max<int64_t>(1, config.max_batch));
  for (size_t first = 0; first < n; first += per) {
    const auto b = static_cast<int64_t>(std::min(per, n - first));
    generate_batch(model, request, config, use_cache, first, b, results);
  }
  return results;
}

}  // namespace megatron::inference
