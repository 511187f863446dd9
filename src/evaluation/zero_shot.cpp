// Zero-shot samples, the batched scorer and the metrics (zero_shot.h).
#include "evaluation/zero_shot.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "inference/pipeline_forward.h"
#include "tensor/ops.h"

namespace megatron::evaluation {

namespace {
bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
std::string strip(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}
}  // namespace

Scorer::Scorer(const ModelChunk& chunk, ProcessGroup& pp, int64_t vocab_size, int64_t micro_batch)
    : chunk_(chunk), pp_(pp), vocab_(vocab_size), micro_batch_(micro_batch) {
  MEGATRON_CHECK(micro_batch_ >= 1, "--micro-batch-size must be >= 1");
}

std::vector<TokenScores> Scorer::score(const std::vector<Sample>& samples) const {
  std::vector<TokenScores> out(samples.size());
  const bool last = pp_.rank() == pp_.size() - 1;
  for (size_t first = 0; first < samples.size(); first += static_cast<size_t>(micro_batch_)) {
    const size_t count = std::min(static_cast<size_t>(micro_batch_), samples.size() - first);
    const auto b = static_cast<int64_t>(count);
    int64_t s = 1;  // targets per row: the longest sample's
    for (size_t i = 0; i < count; ++i) {
      const Sample& x = samples[first + i];
      MEGATRON_ASSERT(x.tokens.size() >= 2 && x.mask.size() == x.tokens.size() - 1,
                      "a sample needs at least two tokens and a mask per target");
      s = std::max(s, static_cast<int64_t>(x.tokens.size()) - 1);
    }
    Tensor inputs = Tensor::zeros({b, s}, DType::kI64);
    Tensor targets = Tensor::zeros({s * b}, DType::kI64);  // row t b + i, the logits' order
    for (size_t i = 0; i < count; ++i) {
      const std::vector<int64_t>& t = samples[first + i].tokens;
      for (size_t k = 0; k + 1 < t.size(); ++k) {
        inputs.data<int64_t>()[static_cast<int64_t>(i) * s + static_cast<int64_t>(k)] = t[k];
        targets.data<int64_t>()[static_cast<int64_t>(k) * b + static_cast<int64_t>(i)] = t[k + 1];
      }
    }
    // Per row of the logits: [loss, correct] in f64, broadcast from the last stage.
    Tensor result = Tensor::zeros({s * b, 2}, DType::kF64);
    const Tensor logits = inference::pipeline_logits(chunk_, pp_, inputs, nullptr, false);
    if (last) {
      Tensor lp = Tensor::empty({s * b}, DType::kF32);
      ops::log_softmax_gather(lp, logits, targets, vocab_);
      const int64_t vp = logits.dim(1);
      for (int64_t r = 0; r < s * b; ++r) {
        const float* row = logits.data<float>() + r * vp;
        const int64_t best = std::max_element(row, row + vocab_) - row;
        result.data<double>()[2 * r] = -static_cast<double>(lp.data<float>()[r]);
        result.data<double>()[2 * r + 1] = best == targets.data<int64_t>()[r] ? 1.0 : 0.0;
      }
    }
    if (pp_.size() > 1) pp_.broadcast(result, pp_.size() - 1);
    for (size_t i = 0; i < count; ++i) {
      TokenScores& ts = out[first + i];
      const size_t n = samples[first + i].tokens.size() - 1;
      for (size_t k = 0; k < n; ++k) {
        const int64_t r = static_cast<int64_t>(k) * b + static_cast<int64_t>(i);
        ts.loss.push_back(result.data<double>()[2 * r]);
        ts.correct.push_back(result.data<double>()[2 * r + 1] != 0 ? 1 : 0);
      }
    }
  }
  return out;
}

std::vector<Sample> lm_windows(const std::vector<int64_t>& tokens, int64_t seq_len, int64_t stride,
                               int64_t pad) {
  MEGATRON_CHECK(seq_len >= 1, "--seq-length must be >= 1");
  stride = std::max<int64_t>(1, stride);
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t targets = std::max<int64_t>(n - 1 - stride, 0);
  const int64_t windows = std::max<int64_t>((targets + stride - 1) / stride + 1, 1);
  std::vector<Sample> out;
  for (int64_t w = 0; w < windows; ++w) {
    Sample x;
    const int64_t start = w * stride, end = std::min(n, start + seq_len + 1);
    std::vector<uint8_t> real;
    for (int64_t k = start; k < end; ++k) {
      x.tokens.push_back(tokens[static_cast<size_t>(k)]);
      real.push_back(1);
    }
    while (static_cast<int64_t>(x.tokens.size()) < seq_len + 1) {
      x.tokens.push_back(pad);
      real.push_back(0);
    }
    x.mask.assign(real.begin() + 1, real.end());  // Megatron's pad_mask[1:]
    if (stride != seq_len && w != 0) {            // only the last `stride` targets count
      for (int64_t k = 0; k < seq_len - stride; ++k) x.mask[static_cast<size_t>(k)] = 0;
    }
    out.push_back(std::move(x));
  }
  return out;
}

LmMetrics lm_metrics(const std::vector<Sample>& windows, const std::vector<TokenScores>& scores,
                     int64_t tokenized, int64_t original) {
  LmMetrics m;
  for (size_t w = 0; w < windows.size(); ++w) {
    for (size_t k = 0; k < windows[w].mask.size(); ++k) {
      if (windows[w].mask[k]) m.loss_sum += scores[w].loss[k];
    }
  }
  m.tokenized = tokenized;
  m.original = original;
  m.avg_loss = m.loss_sum / static_cast<double>(tokenized - 1);
  m.ppl = std::exp(std::min(20.0, m.avg_loss));
  m.token_ratio = static_cast<double>(tokenized - 1) / static_cast<double>(original - 1);
  m.adjusted_ppl = std::exp(std::min(20.0, m.avg_loss * m.token_ratio));
  return m;
}

int64_t original_token_count(const std::string& text) {
  const std::string s = strip(text);  // Python's str.strip() (ASCII whitespace here)
  int64_t n = 1;
  for (char c : s) n += c == ' ';
  return n;
}

Sample lambada_sample(const std::string& text, const Tokenizer& tokenizer, bool strict,
                      int64_t seq_len) {
  std::vector<int64_t> context, target;
  if (!strict) {
    const std::vector<int64_t> all = tokenizer.encode(text);
    MEGATRON_CHECK(all.size() >= 2, "a LAMBADA text needs at least two tokens");
    context.assign(all.begin(), all.end() - 1);
    target.assign(all.end() - 1, all.end());
  } else {
    size_t e = text.size();
    while (e > 0 && is_space(text[e - 1])) --e;
    size_t b = e;
    while (b > 0 && !is_space(text[b - 1])) --b;
    MEGATRON_CHECK(b < e, "a LAMBADA text needs a last word");
    const std::string word = text.substr(b, e - b);
    const size_t at = text.rfind(word);  // Megatron's text.rfind(last word)
    context = tokenizer.encode(strip(text.substr(0, at)));
    target = tokenizer.encode(" " + word);
    MEGATRON_CHECK(!context.empty() && !target.empty(),
                   "a LAMBADA text needs context before its last word");
  }
  Sample x;
  x.tokens = context;
  x.tokens.insert(x.tokens.end(), target.begin(), target.end());
  MEGATRON_CHECK(static_cast<int64_t>(x.tokens.size()) <= seq_len + 1, "the text has ",
                 x.tokens.size(), " tokens, more than --seq-length + 1 = ", seq_len + 1);
  std::vector<uint8_t> mask(context.size(), 0);
  mask.resize(x.tokens.size(), 1);
  while (static_cast<int64_t>(x.tokens.size()) < seq_len + 1) {
    x.tokens.push_back(tokenizer.eod());
    mask.push_back(0);
  }
  x.mask.assign(mask.begin() + 1, mask.end());
  return x;
}

ChoiceItem choice_item(const std::string& context, const std::vector<std::string>& choices,
                       int64_t answer, const Tokenizer& tokenizer, int64_t seq_len) {
  MEGATRON_CHECK(!choices.empty(), "\"choices\" is empty");
  MEGATRON_CHECK(answer >= 0 && answer < static_cast<int64_t>(choices.size()), "\"answer\" ",
                 answer, " is not an index of the ", choices.size(), " choices");
  const std::vector<int64_t> ctx = tokenizer.encode(context);
  MEGATRON_CHECK(!ctx.empty(), "\"context\" has no tokens");
  ChoiceItem item;
  item.answer = answer;
  for (const std::string& c : choices) {
    const std::vector<int64_t> ids = tokenizer.encode(c);
    MEGATRON_CHECK(!ids.empty(), "choice '", c, "' has no tokens");
    Sample x;
    x.tokens = ctx;
    x.tokens.insert(x.tokens.end(), ids.begin(), ids.end());
    MEGATRON_CHECK(static_cast<int64_t>(x.tokens.size()) <= seq_len + 1, "context and choice have ",
                   x.tokens.size(), " tokens, more than --seq-length + 1 = ", seq_len + 1);
    x.mask.assign(ctx.size() - 1, 0);
    x.mask.resize(x.tokens.size() - 1, 1);
    item.choices.push_back(std::move(x));
    item.choice_chars.push_back(static_cast<int64_t>(c.size()));
  }
  return item;
}

AccuracyMetrics lambada_metrics(const std::vector<Sample>& samples,
                                const std::vector<TokenScores>& scores) {
  AccuracyMetrics m;
  for (size_t i = 0; i < samples.size(); ++i) {
    bool all = true;
    for (size_t k = 0; k < samples[i].mask.size(); ++k) {
      if (samples[i].mask[k] && !scores[i].correct[k]) all = false;
    }
    m.correct += all;
    ++m.total;
  }
  return m;
}

void choice_metrics(const std::vector<ChoiceItem>& items, const std::vector<TokenScores>& scores,
                    AccuracyMetrics* acc, AccuracyMetrics* acc_norm) {
  size_t next = 0;
  for (const ChoiceItem& item : items) {
    int64_t best = 0, best_norm = 0;
    double top = 0, top_norm = 0;
    for (size_t c = 0; c < item.choices.size(); ++c, ++next) {
      double ll = 0;
      for (size_t k = 0; k < item.choices[c].mask.size(); ++k) {
        if (item.choices[c].mask[k]) ll -= scores[next].loss[k];
      }
      const double norm = ll / static_cast<double>(std::max<int64_t>(item.choice_chars[c], 1));
      if (c == 0 || ll > top) top = ll, best = static_cast<int64_t>(c);
      if (c == 0 || norm > top_norm) top_norm = norm, best_norm = static_cast<int64_t>(c);
    }
    acc->correct += best == item.answer;
    acc_norm->correct += best_norm == item.answer;
    ++acc->total;
    ++acc_norm->total;
  }
}

}  // namespace megatron::evaluation
