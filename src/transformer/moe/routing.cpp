// Router math in f64: scores, (group-limited) top-k, capacity, sinkhorn, load-balancing losses.
#include "transformer/moe/routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace megatron::moe {
namespace {

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// Row-wise softmax of x [rows, n].
std::vector<double> softmax_rows(const std::vector<double>& x, int64_t rows, int64_t n) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* in = x.data() + r * n;
    double* o = out.data() + r * n;
    const double m = *std::max_element(in, in + n);
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += (o[j] = std::exp(in[j] - m));
    for (int64_t j = 0; j < n; ++j) o[j] /= sum;
  }
  return out;
}

// dx_j += y_j (dy_j - sum_i y_i dy_i) over one softmax row of n.
void softmax_row_backward(const double* y, const double* dy, double* dx, int64_t n) {
  double dot = 0;
  for (int64_t j = 0; j < n; ++j) dot += y[j] * dy[j];
  for (int64_t j = 0; j < n; ++j) dx[j] += y[j] * (dy[j] - dot);
}

// Megatron's group_limited_topk: the experts of the group_topk groups with the highest sum of
// their top (k / group_topk) values, then the top k of those.
std::vector<int32_t> group_limited_topk(const std::vector<double>& v, int64_t rows, int64_t n,
                                        int64_t k, int64_t groups, int64_t group_topk) {
  const int64_t per = n / groups, take = k / group_topk;
  std::vector<double> group_scores(static_cast<size_t>(rows * groups));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      std::vector<double> in(v.begin() + r * n + g * per, v.begin() + r * n + (g + 1) * per);
      std::vector<int32_t> top = topk_rows(in, 1, per, take);
      double s = 0;
      for (int32_t i : top) s += in[static_cast<size_t>(i)];
      group_scores[static_cast<size_t>(r * groups + g)] = s;
    }
  }
  const std::vector<int32_t> chosen = topk_rows(group_scores, rows, groups, group_topk);
  std::vector<uint8_t> allowed(static_cast<size_t>(rows * n), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < group_topk; ++j) {
      const int64_t g = chosen[static_cast<size_t>(r * group_topk + j)];
      std::fill_n(allowed.begin() + r * n + g * per, per, uint8_t{1});
    }
  return topk_rows(v, rows, n, k, allowed);
}

std::vector<int32_t> select(const std::vector<double>& v, int64_t rows, int64_t n,
                            const MoeConfig& cfg) {
  if (cfg.group_topk > 0)
    return group_limited_topk(v, rows, n, cfg.router_topk, cfg.num_groups, cfg.group_topk);
  return topk_rows(v, rows, n, cfg.router_topk);
}

// Keeps at most `capacity` tokens per expert (apply_router_token_dropping).
void drop_tokens(Routing& r, const MoeConfig& cfg) {
  const int64_t T = r.tokens, E = r.experts;
  const int64_t cap = expert_capacity(T, E, cfg.router_topk, cfg.capacity_factor);
  std::vector<uint8_t> keep(r.map.size(), 0);
  std::vector<int64_t> order(static_cast<size_t>(T));
  for (int64_t e = 0; e < E; ++e) {
    std::iota(order.begin(), order.end(), 0);
    auto key = [&](int64_t t) {
      return cfg.drop_policy == MoeDropPolicy::kProbs
                 ? r.probs[static_cast<size_t>(t * E + e)]
                 : double(r.map[static_cast<size_t>(t * E + e)]);
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return key(a) > key(b); });
    for (int64_t i = 0; i < cap; ++i) keep[static_cast<size_t>(order[i] * E + e)] = 1;
  }
  for (size_t i = 0; i < keep.size(); ++i) {
    r.map[i] = cfg.pad_expert_input_to_capacity ? keep[i] : uint8_t(r.map[i] & keep[i]);
    if (!r.map[i]) r.probs[i] = 0;
  }
}

}  // namespace

std::vector<int32_t> topk_rows(const std::vector<double>& x, int64_t rows, int64_t n, int64_t k,
                               const std::vector<uint8_t>& allowed) {
  std::vector<int32_t> out(static_cast<size_t>(rows * k));
  std::vector<int32_t> idx;
  for (int64_t r = 0; r < rows; ++r) {
    idx.clear();
    for (int64_t j = 0; j < n; ++j)
      if (allowed.empty() || allowed[static_cast<size_t>(r * n + j)])
        idx.push_back(static_cast<int32_t>(j));
    MEGATRON_ASSERT(static_cast<int64_t>(idx.size()) >= k);
    const double* v = x.data() + r * n;
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
    std::copy_n(idx.begin(), k, out.begin() + r * k);
  }
  return out;
}

int64_t expert_capacity(int64_t tokens, int64_t experts, int64_t topk, double capacity_factor) {
  const double c = std::ceil(static_cast<double>(tokens * topk) / static_cast<double>(experts) *
                             capacity_factor);
  return std::min<int64_t>(tokens, static_cast<int64_t>(c));
}

std::vector<double> sinkhorn(const std::vector<double>& cost, int64_t tokens, int64_t experts,
                             double tol) {
  const int64_t T = tokens, E = experts;
  std::vector<double> c(cost.size());
  for (size_t i = 0; i < c.size(); ++i) c[i] = std::exp(cost[i]);
  std::vector<double> d0(static_cast<size_t>(T), 1.0), d1(static_cast<size_t>(E), 1.0);
  const double eps = 1e-8;
  double error = 1e9;
  while (error > tol) {
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (int64_t e = 0; e < E; ++e) s += d1[e] * c[t * E + e];
      d0[t] = (1.0 / static_cast<double>(T)) / (s + eps);
    }
    std::vector<double> next(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      double s = 0;
      for (int64_t t = 0; t < T; ++t) s += d0[t] * c[t * E + e];
      next[e] = (1.0 / static_cast<double>(E)) / (s + eps);
    }
    error = 0;
    for (int64_t e = 0; e < E; ++e) error += std::abs(d1[e] - next[e]);
    error /= static_cast<double>(E);
    d1 = next;
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) c[t * E + e] *= d1[e] * d0[t];
  return c;
}

Routing route(const std::vector<double>& logits, int64_t tokens, const MoeConfig& cfg,
              const std::vector<double>& bias, bool training) {
  const int64_t T = tokens, E = cfg.num_experts, k = cfg.router_topk;
  MEGATRON_ASSERT(static_cast<int64_t>(logits.size()) == T * E);
  Routing r;
  r.tokens = T;
  r.experts = E;
  std::vector<double> sel_probs(static_cast<size_t>(T * k));  // probability of each selection
  const bool sinkhorn_lb = cfg.has(MoeLoadBalancing::kSinkhorn);
  if (sinkhorn_lb) {
    r.scores = k == 1 ? logits : softmax_rows(logits, T, E);
    if (k == 1)
      for (double& x : r.scores) x = sigmoid(x);
    r.topk = training ? topk_rows(sinkhorn(logits, T, E), T, E, k) : topk_rows(r.scores, T, E, k);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) sel_probs[t * k + j] = r.scores[t * E + r.topk[t * k + j]];
  } else if (cfg.score_function == MoeScoreFunction::kSoftmax && !cfg.pre_softmax) {
    r.topk = select(logits, T, E, cfg);
    r.softmax.resize(static_cast<size_t>(T * k));
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> v(static_cast<size_t>(k));
      for (int64_t j = 0; j < k; ++j) v[j] = logits[t * E + r.topk[t * k + j]];
      const std::vector<double> p = softmax_rows(v, 1, k);
      std::copy(p.begin(), p.end(), r.softmax.begin() + t * k);
      std::copy(p.begin(), p.end(), sel_probs.begin() + t * k);
    }
  } else if (cfg.score_function == MoeScoreFunction::kSoftmax) {
    r.scores = softmax_rows(logits, T, E);
    r.topk = select(r.scores, T, E, cfg);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) sel_probs[t * k + j] = r.scores[t * E + r.topk[t * k + j]];
  } else {
    r.scores.resize(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) r.scores[i] = sigmoid(logits[i]);
    std::vector<double> for_routing = r.scores;
    if (!bias.empty())
      for (int64_t t = 0; t < T; ++t)
        for (int64_t e = 0; e < E; ++e) for_routing[t * E + e] += bias[e];
    r.topk = select(for_routing, T, E, cfg);
    for (int64_t t = 0; t < T; ++t) {
      double sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += r.scores[t * E + r.topk[t * k + j]];
      for (int64_t j = 0; j < k; ++j) {
        const double s = r.scores[t * E + r.topk[t * k + j]];
        sel_probs[t * k + j] = k > 1 ? s / (sum + 1e-20) : s;
      }
    }
  }
  const double sf = !sinkhorn_lb && cfg.topk_scaling_factor > 0 ? cfg.topk_scaling_factor : 1.0;
  r.probs.assign(static_cast<size_t>(T * E), 0.0);
  r.map.assign(static_cast<size_t>(T * E), 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = r.topk[t * k + j];
      r.probs[t * E + e] = sel_probs[t * k + j] * sf;
      r.map[t * E + e] = 1;
    }
  if (!cfg.dropless()) drop_tokens(r, cfg);
  return r;
}

std::vector<uint8_t> pad_routing_map(const std::vector<uint8_t>& map, int64_t tokens,
                                     int64_t experts, int64_t multiple) {
  std::vector<uint8_t> out = map;
  for (int64_t e = 0; e < experts; ++e) {
    int64_t count = 0;
    for (int64_t t = 0; t < tokens; ++t) count += map[static_cast<size_t>(t * experts + e)] != 0;
    int64_t missing = (multiple - count % multiple) % multiple;
    for (int64_t t = 0; t < tokens && missing > 0; ++t) {
      uint8_t& v = out[static_cast<size_t>(t * experts + e)];
      if (v == 0) {
        v = 1;
        --missing;
      }
    }
  }
  return out;
}

void route_backward(const Routing& r, const MoeConfig& cfg, const std::vector<double>& dprobs,
                    std::vector<double>& dlogits) {
  const int64_t T = r.tokens, E = r.experts, k = cfg.router_topk;
  const bool sinkhorn_lb = cfg.has(MoeLoadBalancing::kSinkhorn);
  const double sf = !sinkhorn_lb && cfg.topk_scaling_factor > 0 ? cfg.topk_scaling_factor : 1.0;
  std::vector<double> g(static_cast<size_t>(k)), dense(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* idx = r.topk.data() + t * k;
    // A dropped assignment's probability is 0 whatever the logits: no gradient.
    for (int64_t j = 0; j < k; ++j) {
      const size_t i = static_cast<size_t>(t * E + idx[j]);
      g[j] = r.map[i] ? dprobs[i] * sf : 0.0;
    }
    double* dl = dlogits.data() + t * E;
    const bool dense_softmax =
        (sinkhorn_lb && k > 1) ||
        (!sinkhorn_lb && cfg.score_function == MoeScoreFunction::kSoftmax && cfg.pre_softmax);
    if (dense_softmax) {
      std::fill(dense.begin(), dense.end(), 0.0);
      for (int64_t j = 0; j < k; ++j) dense[idx[j]] = g[j];
      softmax_row_backward(r.scores.data() + t * E, dense.data(), dl, E);
    } else if (sinkhorn_lb) {  // k = 1: sigmoid
      const double s = r.scores[t * E + idx[0]];
      dl[idx[0]] += g[0] * s * (1 - s);
    } else if (cfg.score_function == MoeScoreFunction::kSoftmax) {  // post-softmax over k
      const double* p = r.softmax.data() + t * k;
      double dot = 0;
      for (int64_t j = 0; j < k; ++j) dot += p[j] * g[j];
      for (int64_t j = 0; j < k; ++j) dl[idx[j]] += p[j] * (g[j] - dot);
    } else {  // sigmoid, normalised over the k selected when k > 1
      double sum = 1e-20, dot = 0;
      for (int64_t j = 0; j < k; ++j) {
        const double s = r.scores[t * E + idx[j]];
        sum += s;
        dot += g[j] * s;
      }
      for (int64_t j = 0; j < k; ++j) {
        const double s = r.scores[t * E + idx[j]];
        const double ds = k > 1 ? g[j] / sum - dot / (sum * sum) : g[j];
        dl[idx[j]] += ds * s * (1 - s);
      }
    }
  }
}

AuxScores aux_scores(const std::vector<double>& logits, int64_t tokens, const MoeConfig& cfg) {
  const int64_t T = tokens, E = cfg.num_experts;
  AuxScores a;
  if (cfg.score_function == MoeScoreFunction::kSigmoid) {
    a.scores.resize(logits.size());
    for (int64_t t = 0; t < T; ++t) {
      double sum = 1e-20;
      for (int64_t e = 0; e < E; ++e) sum += (a.scores[t * E + e] = sigmoid(logits[t * E + e]));
      for (int64_t e = 0; e < E; ++e) a.scores[t * E + e] /= sum;
    }
  } else {
    a.scores = softmax_rows(logits, T, E);
  }
  const std::vector<int32_t> top = topk_rows(a.scores, T, E, cfg.router_topk);
  a.map.assign(static_cast<size_t>(T * E), 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < cfg.router_topk; ++j) a.map[t * E + top[t * cfg.router_topk + j]] = 1;
  return a;
}

std::vector<double> aux_counts(const AuxScores& a, int64_t tokens, int64_t experts, int64_t batch) {
  const int64_t E = experts;
  std::vector<double> c(static_cast<size_t>(batch > 0 ? batch * E : E), 0.0);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t base = batch > 0 ? (t % batch) * E : 0;
    for (int64_t e = 0; e < E; ++e) c[base + e] += a.map[t * E + e];
  }
  return c;
}

double aux_loss(const AuxScores& a, int64_t tokens, int64_t experts, int64_t topk,
                const std::vector<double>& counts, double total_tokens, double coeff,
                double grad_scale, std::vector<double>* dscores) {
  const int64_t E = experts;
  const double factor =
      coeff * static_cast<double>(E) / (static_cast<double>(topk) * total_tokens * total_tokens);
  double loss = 0;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t e = 0; e < E; ++e) loss += a.scores[t * E + e] * counts[e];
  if (dscores)
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t e = 0; e < E; ++e) (*dscores)[t * E + e] += grad_scale * factor * counts[e];
  return loss * factor;
}

double seq_aux_loss(const AuxScores& a, int64_t tokens, int64_t experts, int64_t topk,
                    int64_t batch, const std::vector<double>& counts, double seq_tokens,
                    double coeff, double grad_scale, std::vector<double>* dscores) {
  const int64_t E = experts;
  const double factor = coeff * static_cast<double>(E) /
                        (static_cast<double>(topk) * seq_tokens * seq_tokens) /
                        static_cast<double>(batch);
  double loss = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const double* c = counts.data() + (t % batch) * E;
    for (int64_t e = 0; e < E; ++e) {
      loss += a.scores[t * E + e] * c[e];
      if (dscores) (*dscores)[t * E + e] += grad_scale * factor * c[e];
    }
  }
  return loss * factor;
}

void aux_scores_backward(const std::vector<double>& logits, int64_t tokens, const MoeConfig& cfg,
                         const std::vector<double>& dscores, std::vector<double>& dlogits) {
  const int64_t T = tokens, E = cfg.num_experts;
  if (cfg.score_function == MoeScoreFunction::kSigmoid) {
    for (int64_t t = 0; t < T; ++t) {
      double sum = 1e-20, dot = 0;
      for (int64_t e = 0; e < E; ++e) {
        const double s = sigmoid(logits[t * E + e]);
        sum += s;
        dot += dscores[t * E + e] * s;
      }
      for (int64_t e = 0; e < E; ++e) {
        const double s = sigmoid(logits[t * E + e]);
        const double ds = dscores[t * E + e] / sum - dot / (sum * sum);
        dlogits[t * E + e] += ds * s * (1 - s);
      }
    }
    return;
  }
  const std::vector<double> p = softmax_rows(logits, T, E);
  for (int64_t t = 0; t < T; ++t)
    softmax_row_backward(p.data() + t * E, dscores.data() + t * E, dlogits.data() + t * E, E);
}

double z_loss(const std::vector<double>& logits, int64_t tokens, int64_t experts, double coeff,
              double grad_scale, std::vector<double>* dlogits) {
  const int64_t T = tokens, E = experts;
  double sum = 0;
  for (int64_t t = 0; t < T; ++t) {
    const double* x = logits.data() + t * E;
    const double m = *std::max_element(x, x + E);
    double s = 0;
    for (int64_t e = 0; e < E; ++e) s += std::exp(x[e] - m);
    const double lse = m + std::log(s);
    sum += lse * lse;
    if (dlogits) {
      // d(lse^2)/dx_e = 2 lse softmax_e
      const double g = grad_scale * coeff * 2.0 * lse / static_cast<double>(T);
      for (int64_t e = 0; e < E; ++e) (*dlogits)[t * E + e] += g * std::exp(x[e] - lse);
    }
  }
  return sum / static_cast<double>(std::max<int64_t>(T, 1));
}

}  // namespace megatron::moe
