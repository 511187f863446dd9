// Static generation (generator.h): the token matrix, prefill and decode through the KV cache,
// sampling on the last pipeline stage and the broadcast of each new column.
#include "inference/generator.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>

#include "core/error.h"
#include "core/philox.h"
#include "core/timer.h"
#include "inference/pipeline_forward.h"
#include "tensor/ops.h"
#include "transformer/kv_cache.h"

namespace megatron::inference {

namespace {
// GPT-2's "\n" and "\n\n", which Megatron's stop_on_eol and stop_on_double_eol hard-code.
constexpr int64_t kGpt2Eol = 198, kGpt2DoubleEol = 628;

// Columns [begin, end) of a [b, n] i64 matrix, contiguous.
Tensor columns(const Tensor& m, int64_t begin, int64_t end) {
  Tensor out = Tensor::empty({m.dim(0), end - begin}, DType::kI64);
  ops::slice_last_dim(out, m, begin);
  return out;
}
// The n most likely of the first `vocab` logits of a row (best first, ties by lower id) with
// their log-softmax values.
void top_log_probs(const float* logits, int64_t vocab, int64_t n, int64_t* ids, float* lp) {
  const float top = *std::max_element(logits, logits + vocab);
  double total = 0;
  for (int64_t v = 0; v < vocab; ++v) total += std::exp(static_cast<double>(logits[v]) - top);
  const double lse = static_cast<double>(top) + std::log(total);
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int64_t a, int64_t c) {
    return logits[a] > logits[c] || (logits[a] == logits[c] && a < c);
  });
  for (int64_t j = 0; j < n; ++j) {
    ids[j] = order[static_cast<size_t>(j)];
    lp[j] = static_cast<float>(static_cast<double>(logits[ids[j]]) - lse);
  }
}
}  // namespace

Generator::Generator(const ModelChunk& chunk, ProcessGroup& pp, GeneratorConfig config)
    : chunk_(chunk), pp_(pp), config_(config) {
  MEGATRON_CHECK(config_.vocab_size > 0 && config_.max_positions > 0 && config_.max_batch_size > 0,
                 "Generator: vocabulary, positions and batch size must be positive");
}

void check_request(const GenerationRequest& r, const GeneratorConfig& config) {
  MEGATRON_CHECK(!r.prompts.empty(), "prompts: no prompt to generate from");
  MEGATRON_CHECK(r.tokens_to_generate >= 0, "tokens_to_generate must be an integer >= 0, got ",
                 r.tokens_to_generate);
  MEGATRON_CHECK(r.tokens_to_generate > 0 || r.return_log_probs,
                 "tokens_to_generate=0 implies logprobs should be True (it scores the prompts)");
  check_sampling(r.sampling, config.vocab_size);
  MEGATRON_CHECK(r.top_n_logprobs >= 0 && r.top_n_logprobs <= config.vocab_size &&
                     (r.top_n_logprobs == 0 || r.tokens_to_generate == 0),
                 "top-n log-probabilities are computed when scoring (tokens_to_generate 0) only");
  MEGATRON_CHECK(r.streams.empty() || r.streams.size() == r.prompts.size(),
                 "GenerationRequest: ", r.streams.size(), " sampling streams for ",
                 r.prompts.size(), " prompts");
  for (size_t i = 0; i < r.prompts.size(); ++i) {
    const auto n = static_cast<int64_t>(r.prompts[i].size());
    MEGATRON_CHECK(n > 0, "prompt ", i, " has no tokens (an empty prompt needs add_BOS)");
    MEGATRON_CHECK(n + r.tokens_to_generate <= config.max_positions, "prompt ", i, " has ", n,
                   " tokens; with tokens_to_generate ", r.tokens_to_generate,
                   " that is longer than the model's ", config.max_positions,
                   " positions (--max-position-embeddings)");
    MEGATRON_CHECK(
        config.max_sequence_length <= 0 || n + r.tokens_to_generate <= config.max_sequence_length,
        "prompt ", i, " has ", n, " tokens; with tokens_to_generate ", r.tokens_to_generate,
        " that is longer than --inference-max-seq-length ", config.max_sequence_length, " allows");
    for (int64_t t : r.prompts[i]) {
      MEGATRON_CHECK(t >= 0 && t < config.vocab_size, "prompt ", i, " holds token id ", t,
                     " outside the vocabulary [0, ", config.vocab_size, ")");
    }
  }
}

std::vector<GenerationResult> Generator::generate(const GenerationRequest& request,
                                                  std::vector<BatchTimes>* times) const {
  check_request(request, config_);
  std::vector<GenerationResult> out;
  for (size_t first = 0; first < request.prompts.size();
       first += static_cast<size_t>(config_.max_batch_size)) {
    const size_t count =
        std::min(static_cast<size_t>(config_.max_batch_size), request.prompts.size() - first);
    BatchTimes batch_times{.prompts = static_cast<int64_t>(count)};
    for (GenerationResult& r : generate_batch(request, first, count, batch_times))
      out.push_back(std::move(r));
    if (times != nullptr) times->push_back(batch_times);
  }
  return out;
}

std::vector<GenerationResult> Generator::generate_batch(const GenerationRequest& request,
                                                        size_t first, size_t count,
                                                        BatchTimes& times) const {
  const auto b = static_cast<int64_t>(count);
  const int64_t ttg = request.tokens_to_generate, vocab = config_.vocab_size;
  const bool last_stage = pp_.rank() == pp_.size() - 1;
  std::vector<int64_t> prompt_len(count), length(count);
  int64_t min_len = 0, max_len = 0;
  for (size_t i = 0; i < count; ++i) {
    prompt_len[i] = static_cast<int64_t>(request.prompts[first + i].size());
    length[i] = prompt_len[i] + ttg;
    min_len = i == 0 ? prompt_len[i] : std::min(min_len, prompt_len[i]);
    max_len = std::max(max_len, length[i]);
  }
  // The token matrix, padded with the end-of-document id (never read: a sequence's padding is
  // overwritten by its own samples before the model sees it).
  Tensor tokens = Tensor::full({b, max_len}, static_cast<double>(config_.eod), DType::kI64);
  int64_t* tok = tokens.data<int64_t>();
  for (size_t i = 0; i < count; ++i) {
    std::copy(request.prompts[first + i].begin(), request.prompts[first + i].end(),
              tok + static_cast<int64_t>(i) * max_len);
  }
  // logprob[i, t] = log p(token t + 1 of sequence i | its tokens 0..t).
  Tensor logprobs = Tensor::zeros({b, std::max<int64_t>(max_len - 1, 1)}, DType::kF32);
  const int64_t lp_stride = logprobs.dim(1);
  // Rows t b + i of `logits` ([rows b, Vp]) are positions begin + t; their targets are the
  // next tokens.
  auto record_logprobs = [&](const Tensor& logits, int64_t begin, int64_t rows) {
    Tensor targets = Tensor::empty({rows * b}, DType::kI64);
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t i = 0; i < b; ++i)
        targets.data<int64_t>()[t * b + i] = tok[i * max_len + begin + t + 1];
    Tensor lp = Tensor::empty({rows * b}, DType::kF32);
    ops::log_softmax_gather(lp, logits, targets, vocab);
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t i = 0; i < b; ++i)
        logprobs.data<float>()[i * lp_stride + begin + t] = lp.data<float>()[t * b + i];
  };

  // Scoring's top-n: [b, max_len - 1, n] ids and log-probabilities, filled on the last stage.
  const int64_t top_n = request.top_n_logprobs;
  Tensor top_ids, top_lp;
  if (ttg == 0 && max_len > 1) {  // scoring: one forward over every token but the last
    const Tensor logits =
        pipeline_logits(chunk_, pp_, columns(tokens, 0, max_len - 1), nullptr, false);
    if (last_stage) record_logprobs(logits, 0, max_len - 1);
    if (top_n > 0) {
      const int64_t rows = std::max<int64_t>(max_len - 1, 1);
      top_ids = Tensor::zeros({b, rows, top_n}, DType::kI64);
      top_lp = Tensor::zeros({b, rows, top_n}, DType::kF32);
      if (last_stage) {
        for (int64_t t = 0; t + 1 < max_len; ++t)
          for (int64_t i = 0; i < b; ++i)
            top_log_probs(logits.data<float>() + (t * b + i) * logits.dim(1), vocab, top_n,
                          top_ids.data<int64_t>() + (i * rows + t) * top_n,
                          top_lp.data<float>() + (i * rows + t) * top_n);
      }
      if (pp_.size() > 1) {
        pp_.broadcast(top_ids, pp_.size() - 1);
        pp_.broadcast(top_lp, pp_.size() - 1);
      }
    }
  } else if (ttg > 0) {
    KvCache cache(max_len);
    std::vector<bool> done(count, false);
    SamplingParams sampling = request.sampling;
    Tensor column = Tensor::empty({b}, DType::kI64);
    int64_t prev = 0;
    for (int64_t ctx = min_len; ctx < max_len; ++ctx) {
      const Timer step_timer;
      const bool with_logprobs = request.return_log_probs;
      const Tensor step = columns(tokens, prev, ctx);
      Tensor logits = pipeline_logits(chunk_, pp_, step, &cache, !with_logprobs);
      cache.advance(ctx - prev);
      if (last_stage) {
        const int64_t rows = with_logprobs ? ctx - prev : 1, vp = logits.dim(1);
        float* lg = logits.data<float>();
        for (int64_t i = 0; i < b; ++i) {
          float* row = lg + ((rows - 1) * b + i) * vp;
          if (request.prevent_newline_after_colon && request.colon_id >= 0 &&
              request.newline_id >= 0 && tok[i * max_len + ctx - 1] == request.colon_id) {
            row[request.newline_id] = -1e10f;
          }
          const bool started = prompt_len[static_cast<size_t>(i)] <= ctx;
          int64_t next = tok[i * max_len + ctx];
          if (started && !done[static_cast<size_t>(i)]) {
            const size_t p = first + static_cast<size_t>(i);
            const GenerationRequest::Stream rng = request.streams.empty()
                                                      ? GenerationRequest::Stream{request.seed, p}
                                                      : request.streams[p];
            const double u = Philox::uniform(rng.seed, rng.stream, static_cast<uint64_t>(ctx));
            next = sample_token(std::span<const float>(row, static_cast<size_t>(vocab)), sampling,
                                vocab, u);
          }
          column.data<int64_t>()[i] = next;
        }
        for (int64_t i = 0; i < b; ++i) tok[i * max_len + ctx] = column.data<int64_t>()[i];
        if (with_logprobs) record_logprobs(logits, prev, rows);
      }
      if (pp_.size() > 1) pp_.broadcast(column, pp_.size() - 1);
      for (int64_t i = 0; i < b; ++i) tok[i * max_len + ctx] = column.data<int64_t>()[i];
      // Which sequences stopped: the same verdict on every rank, from the same tokens.
      bool all_done = true;
      for (size_t i = 0; i < count; ++i) {
        const auto row = static_cast<int64_t>(i) * max_len;
        if (!done[i] && prompt_len[i] <= ctx) {
          const int64_t t = tok[row + ctx];
          bool hit = false;
          if (request.stop_on_double_eol) {
            hit = t == kGpt2DoubleEol || (t == kGpt2Eol && tok[row + ctx - 1] == kGpt2Eol);
          } else if (request.stop_on_eol) {
            hit = t == kGpt2DoubleEol || t == kGpt2Eol;
          } else {
            hit = request.stop_on_eod && t == config_.eod;
          }
          if (hit) length[i] = ctx + 1;
          done[i] = hit || ctx + 1 >= length[i];
        }
        all_done = all_done && done[i];
      }
      if (sampling.top_p > 0 && request.top_p_decay > 0) {
        sampling.top_p = std::max(sampling.top_p * request.top_p_decay, request.top_p_bound);
      }
      (prev == 0 ? times.prefill_seconds : times.decode_seconds) += step_timer.elapsed();
      (prev == 0 ? times.prefill_positions : times.decode_positions) += b * (ctx - prev);
      prev = ctx;
      if (all_done) break;
    }
  }
  if (request.return_log_probs && pp_.size() > 1) pp_.broadcast(logprobs, pp_.size() - 1);

  std::vector<GenerationResult> out(count);
  for (size_t i = 0; i < count; ++i) {
    const auto row = static_cast<int64_t>(i) * max_len;
    out[i].prompt_length = prompt_len[i];
    out[i].tokens.assign(tok + row, tok + row + length[i]);
    if (request.return_log_probs) {
      const float* lp = logprobs.data<float>() + static_cast<int64_t>(i) * lp_stride;
      out[i].logprobs.assign(lp, lp + length[i] - 1);
    }
    if (top_n > 0) {
      const int64_t rows = top_ids.dim(1);
      for (int64_t t = 0; t + 1 < length[i]; ++t) {
        std::vector<std::pair<int64_t, float>> best;
        for (int64_t j = 0; j < top_n; ++j) {
          const int64_t at = (static_cast<int64_t>(i) * rows + t) * top_n + j;
          best.emplace_back(top_ids.data<int64_t>()[at], top_lp.data<float>()[at]);
        }
        out[i].top_logprobs.push_back(std::move(best));
      }
    }
  }
  return out;
}

}  // namespace megatron::inference
