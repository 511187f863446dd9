// The planner's memory and time model (see cost_model.h for the structure and its sources).
#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "models/gpt/gpt_memory.h"
#include "pipeline/schedule.h"
#include "plan/memory_model.h"

namespace megatron::plan {

namespace {

double d(int64_t v) {
  return static_cast<double>(v);
}

// The ranks of a group of `size` whose members are `stride` ranks apart (Megatron's order
// tp-cp-ep-dp-pp) stay inside a node when the group's span fits in one.
const Link& link_of(const Cluster& c, int64_t stride, int64_t size) {
  return stride * size <= c.devices_per_node ? c.intra : c.inter;
}

double seconds(const Link& link, double bytes, double steps) {
  return steps * link.latency + bytes / (link.bandwidth * link.efficiency);
}
double all_reduce(const Link& link, int64_t n, double bytes) {
  if (n <= 1) return 0;
  return seconds(link, 2.0 * d(n - 1) / d(n) * bytes, 2.0 * d(n - 1));
}
// All-gather, reduce-scatter and all-to-all of `bytes` (the whole, gathered size).
double gather(const Link& link, int64_t n, double bytes) {
  if (n <= 1) return 0;
  return seconds(link, d(n - 1) / d(n) * bytes, d(n - 1));
}

// The global layer numbers of each of pipeline stage `stage`'s vpp chunks (Megatron's
// interleaving, with the layout's split).
std::vector<std::vector<int64_t>> stage_chunk_layers(const TransformerConfig& c, const Layout& l,
                                                     int64_t stage) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t v = 0; v < l.vpp; ++v) {
    const LayerRange r = chunk_layer_range(c.num_layers, l.pp, l.vpp, l.split, stage, v);
    std::vector<int64_t>& chunk = out.emplace_back();
    for (int64_t i = 0; i < r.count; ++i) chunk.push_back(r.first + i);
  }
  return out;
}

// All of them, chunk after chunk.
// parameters: the layers holding parameters (a repeated MTP block once), else the layers run
// (every depth).
std::vector<int64_t> stage_layers(const TransformerConfig& c, const Layout& l, int64_t stage,
                                  bool parameters = false) {
  std::vector<int64_t> out;
  for (const std::vector<int64_t>& chunk : stage_chunk_layers(c, l, stage))
    out.insert(out.end(), chunk.begin(), chunk.end());
  // Multi-token prediction's layers (numbered after the decoder's) run on the last stage.
  const int64_t mtp = parameters ? c.mtp_blocks() : c.mtp_num_layers;
  if (stage == l.pp - 1)
    for (int64_t k = 0; k < mtp; ++k) out.push_back(c.num_layers + k);
  return out;
}

// One layer's costs for one micro-batch on one rank.
struct LayerCost {
  // Compute seconds by kind, forward and backward.
  double gemm_fwd = 0, gemm_bwd = 0, att_fwd = 0, att_bwd = 0, ew_fwd = 0, ew_bwd = 0;
  double fwd() const { return gemm_fwd + att_fwd + ew_fwd; }
  double bwd() const { return gemm_bwd + att_bwd + ew_bwd; }
  double tp_fwd = 0, tp_bwd = 0;  // collective seconds
  double cp_fwd = 0, cp_bwd = 0;
  double ep_fwd = 0, ep_bwd = 0;
};

class StageModel {
 public:
  StageModel(const Workload& w, const Layout& l, const Cluster& c) : w_(w), l_(l), c_(c) {
    const TransformerConfig& cfg = w.config;
    fp8_ = cfg.fp8.enabled();
    dtype_ = cfg.compute_dtype;
    // Activations in the collectives: 16-bit on GPUs, fp32 in this project's CPU runtime.
    act_bytes_ = w.runtime == ActivationRuntime::kThisProject ? 4.0 : (is_half(dtype_) ? 2.0 : 4.0);
    tokens_ = l.mbs * cfg.seq_length / l.cp;
    dense_ = layer(false);
    if (cfg.moe.num_experts > 0) moe_ = layer(true);
  }

  const LayerCost& cost(int64_t global_layer) const {
    return w_.config.moe.is_moe_layer(global_layer) ? moe_ : dense_;
  }

  double gemm3(int64_t m, int64_t n, int64_t k) const {
    // forward NT, input gradient NN, weight gradient TN
    return gemm_seconds(c_.device, m, n, k, false, true, dtype_, fp8_) +
           gemm_seconds(c_.device, m, k, n, false, false, dtype_, fp8_) +
           gemm_seconds(c_.device, n, k, m, true, false, dtype_, fp8_);
  }
  double gemm_fwd(int64_t m, int64_t n, int64_t k) const {
    return gemm_seconds(c_.device, m, n, k, false, true, dtype_, fp8_);
  }
  double elementwise(double bytes) const {
    return bytes / (c_.device.memory_bw * c_.device.memory_efficiency);
  }
  // A layer's elementwise passes: measured where the device can, else bytes per token in
  // fused 16-bit kernels: 11 h-rows forward (2 norms read + write, 2 residual adds with their
  // dropout), the activation's read and write of the MLP width, the QKV rows once for RoPE;
  // backward twice that.
  double elementwise_seconds(const ElementwiseWork& w) const {
    if (c_.device.elementwise_time) return c_.device.elementwise_time(w);
    const double bytes = act_bytes_ * (11.0 * d(w.h_rows) * d(w.hidden) +
                                       d(w.tokens) * d((w.gated ? 3 : 2) * w.ffn) +
                                       (w.rope ? 2.0 * d(w.tokens) * d(w.qkv) : 0.0));
    return elementwise(w.backward ? 2 * bytes : bytes);
  }

  // The logits' GEMMs and the vocabulary-parallel cross entropy, forward and backward.
  double head_seconds() const {
    const TransformerConfig& cfg = w_.config;
    const int64_t vp = cfg.padded_vocab_size / l_.tp;
    // Cross entropy: fp32 logits read for max, exp-sum, and again for the gradient (3 passes
    // of read + write).
    return gemm3(tokens_, vp, cfg.hidden_size) + elementwise(6.0 * 4.0 * d(tokens_) * d(vp)) +
           (l_.tp > 1 ? 3 * all_reduce(link_of(c_, 1, l_.tp), l_.tp, 4.0 * d(tokens_)) : 0);
  }
  double embedding_seconds() const {
    const int64_t h = w_.config.hidden_size;
    const double rows = d(tokens_) * d(h) * act_bytes_;
    return elementwise(4 * rows) + (l_.tp > 1
                                        ? (l_.sp ? gather(link_of(c_, 1, l_.tp), l_.tp, rows)
                                                 : all_reduce(link_of(c_, 1, l_.tp), l_.tp, rows))
                                        : 0);
  }
  double pp_message_seconds() const {
    // One activation [s/cp, b, h] (scattered over tp with SP) per send, between adjacent stages
    // tp x cp x dp ranks apart.
    const double bytes =
        d(tokens_) * d(w_.config.hidden_size) * act_bytes_ / (l_.sp ? d(l_.tp) : 1.0);
    const Link& link = l_.tp * l_.cp * l_.dp * 2 <= c_.devices_per_node ? c_.intra : c_.inter;
    return seconds(link, bytes, 1);
  }

 private:
  LayerCost layer(bool moe) const {
    const TransformerConfig& cfg = w_.config;
    const int64_t T = tokens_, h = cfg.hidden_size, t = l_.tp;
    const int64_t np = cfg.num_attention_heads, ng = cfg.num_query_groups, hn = cfg.head_dim();
    LayerCost lc;
    // Attention GEMMs: QKV [T, h] x [h, (np + 2 ng) hn / t], projection [T, np hn / t] x [.., h].
    const int64_t qkv = (np + 2 * ng) * hn / t, proj = np * cfg.v_head_dim() / t;
    double gemm_f = 0, gemm_all = 0;
    if (cfg.mla.enabled) {
      // Multi-latent attention: the replicated down projections, the column-parallel up
      // projections (or the full-rank query projection), then linear_proj.
      const MlaConfig& m = cfg.mla;
      const int64_t q_out = np * m.q_head_dim() / t,
                    kv_out = np * (m.qk_head_dim + m.v_head_dim) / t;
      const auto both = [&](int64_t rows, int64_t out, int64_t in) {
        gemm_f += gemm_fwd(rows, out, in);
        gemm_all += gemm3(rows, out, in);
      };
      // The replicated down projections see this rank's T / tp tokens under SP.
      const int64_t local = l_.sp ? T / t : T;
      if (m.q_lora_rank > 0) {
        both(local, m.q_lora_rank, h);
        both(T, q_out, m.q_lora_rank);
      } else {
        both(T, q_out, h);
      }
      both(local, m.kv_lora_rank + m.qk_pos_emb_head_dim, h);
      both(T, kv_out, m.kv_lora_rank);
      both(T, h, proj);
    } else {
      gemm_f = gemm_fwd(T, qkv, h) + gemm_fwd(T, h, proj);
      gemm_all = gemm3(T, qkv, h) + gemm3(T, h, proj);
    }
    // Core attention: each rank's T/b local queries against the sequence's keys (CP exchanges
    // the rest), np/t heads.
    const int64_t b = l_.mbs, sq = cfg.seq_length / l_.cp, skv = cfg.seq_length;
    const bool causal = true;
    double att_f = 0, att_b = 0;
    if (c_.device.attention_time) {
      const double p = cfg.attention_dropout;
      att_f = c_.device.attention_time(b, np / t, sq, skv, hn, causal, p, dtype_, false);
      att_b = c_.device.attention_time(b, np / t, sq, skv, hn, causal, p, dtype_, true);
    } else {
      const double share = c_.device.flash_attention ? 0.5 : 1.0;
      const double flops = 4.0 * d(b) * d(np / t) * d(sq) * d(skv) * d(hn) * share;
      const double rate = peak_flops(c_.device, dtype_, false) * c_.device.gemm_e_max *
                          c_.device.attention_efficiency;
      att_f = flops / rate;
      att_b = 2.5 * flops / rate;  // dQ, dK, dV and the recomputed scores: 5 GEMMs to 2
      if (!c_.device.flash_attention) {
        // Unfused: the [s, s] scores written, masked, softmaxed and dropped out (about 12
        // bytes per score forward in 16-bit, twice that backward).
        const double scores = d(b) * d(np / t) * d(sq) * d(skv);
        att_f += elementwise(12.0 * scores);
        att_b += elementwise(24.0 * scores);
      }
    }
    lc.att_fwd = att_f;
    lc.att_bwd = att_b;
    // MLP or experts.
    const int64_t glu = cfg.gated_mlp() ? 2 : 1;
    double mlp_f = 0, mlp_all = 0, routing_bytes = 0;
    int64_t f_local = 0;  // per-token MLP width on this rank (elementwise bytes)
    if (!moe) {
      const int64_t f = cfg.ffn_hidden_size / t;
      mlp_f = gemm_fwd(T, glu * f, h) + gemm_fwd(T, h, f);
      mlp_all = gemm3(T, glu * f, h) + gemm3(T, h, f);
      f_local = f;
    } else {
      const MoeConfig& m = cfg.moe;
      const int64_t E = m.num_experts, k = m.router_topk, fe = m.ffn_hidden_size / l_.etp;
      const int64_t local = E / l_.ep;
      // Tokens per expert: each of ep ranks sends T etp / tp tokens k times, spread evenly.
      const int64_t me = std::max<int64_t>(1, l_.ep * T * l_.etp * k / (t * E));
      mlp_f = d(local) * (gemm_fwd(me, glu * fe, h) + gemm_fwd(me, h, fe)) + gemm_fwd(T, E, h);
      mlp_all = d(local) * (gemm3(me, glu * fe, h) + gemm3(me, h, fe)) + gemm3(T, E, h);
      f_local = local * me * fe / std::max<int64_t>(T, 1);
      if (m.shared_expert_intermediate_size > 0) {
        const int64_t fs = m.shared_expert_intermediate_size / t;
        mlp_f += gemm_fwd(T, glu * fs, h) + gemm_fwd(T, h, fs);
        mlp_all += gemm3(T, glu * fs, h) + gemm3(T, h, fs);
        f_local += fs;
      }
      // Dispatch and combine: this rank's T etp / tp routed rows of h, k times, over the
      // expert group (ep ranks, etp apart inside the tp x cp x dp ranks).
      const double rows = d(T * l_.etp / t) * d(k) * d(h) * act_bytes_;
      const Link& link = link_of(c_, l_.etp, l_.ep);
      lc.ep_fwd = 2 * gather(link, l_.ep, rows);
      lc.ep_bwd = 2 * gather(link, l_.ep, rows);
      // Routing: the router's scores and top-k over E (fp32, a few passes), the rows permuted
      // into expert order and back with their probabilities (read + write each), twice as much
      // backward.
      routing_bytes = 3.0 * 4.0 * d(T) * d(E) + 4.0 * rows;
    }
    ElementwiseWork ew;
    ew.h_rows = l_.sp ? T / t : T;
    ew.tokens = T;
    ew.hidden = h;
    ew.ffn = f_local;
    ew.qkv = qkv;
    ew.gated = cfg.gated_mlp();
    ew.layernorm = cfg.normalization == Normalization::kLayerNorm;
    ew.bias = cfg.add_bias_linear;
    ew.rope = cfg.position_embedding == PositionEmbedding::kRope;
    ew.dropout = cfg.hidden_dropout;
    lc.gemm_fwd = gemm_f + mlp_f;
    lc.gemm_bwd = (gemm_all - gemm_f) + (mlp_all - mlp_f);
    // FP8 GEMMs quantise their inputs (read 16-bit, write 8-bit) forward, and backward the
    // output gradients plus transposed copies for the weight gradients.
    const double gemm_inputs = d(T) * d(2 * h + proj + f_local);
    const double fp8_bytes = fp8_ ? 3.0 * gemm_inputs : 0.0;
    lc.ew_fwd = elementwise_seconds(ew) + elementwise(routing_bytes + fp8_bytes);
    ew.backward = true;
    lc.ew_bwd = elementwise_seconds(ew) + elementwise(2 * routing_bytes + 2 * fp8_bytes);
    // Tensor parallelism: [T, h] activations.
    if (t > 1) {
      const Link& link = link_of(c_, 1, t);
      const double S = d(T) * d(h) * act_bytes_;
      if (l_.sp) {
        lc.tp_fwd = 4 * gather(link, t, S);
        lc.tp_bwd = 6 * gather(link, t, S);  // + the inputs gathered again for weight gradients
      } else {
        lc.tp_fwd = 2 * all_reduce(link, t, S);
        lc.tp_bwd = 2 * all_reduce(link, t, S);
      }
    }
    // Context parallelism: K and V of this rank's tokens [T, ng hn / t] travel.
    if (l_.cp > 1) {
      const Link& link = link_of(c_, t, l_.cp);
      const double kv = 2.0 * d(T) * d(ng * hn / std::max<int64_t>(t, 1)) * act_bytes_;
      double fwd = 0, bwd = 0;
      if (l_.cp_comm_type == "a2a") {
        // Ulysses: Q, K, V in and the output out, forward; the same backward.
        const double q = d(T) * d(np * hn / t) * act_bytes_;
        fwd = gather(link, l_.cp, 2 * q + kv);
        bwd = fwd;
        lc.cp_fwd = fwd;
        lc.cp_bwd = bwd;
      } else {
        // Ring (p2p) and all-gather move (cp - 1) blocks forward, K/V and their gradients
        // backward, hidden behind the attention they overlap.
        fwd = seconds(link, d(l_.cp - 1) * kv, d(l_.cp - 1));
        bwd = 2 * fwd;
        lc.cp_fwd = std::max(0.0, fwd - att_f);
        lc.cp_bwd = std::max(0.0, bwd - att_b);
      }
    }
    return lc;
  }

  const Workload& w_;
  const Layout& l_;
  const Cluster& c_;
  bool fp8_ = false;
  DType dtype_ = DType::kF32;
  double act_bytes_ = 2;
  int64_t tokens_ = 0;
  LayerCost dense_, moe_;
};

// Megatron's activation bytes per layer and micro-batch in a 16-bit run (Korthikanti et al.,
// Table 2, generalised): per token the attention keeps the QKV GEMM's input (2h), Q, K and V
// (2(np + 2ng)hn), the projection's input (2 np hn) and a dropout mask (h); the MLP its input
// (2h), fc1's output (2 f glu) and fc2's input (2f) and a mask (h); two norms' inputs (4h).
// Tensor parallelism divides what lies between the column- and row-parallel GEMMs; sequence
// parallelism divides the rest too. Unfused attention adds the scores (5 bytes each: softmax
// output 2, its dropout mask 1, dropout output 2) unless selective recomputation drops them;
// flash attention keeps only their log-sum-exp.
double megatron_layer_bytes(const TransformerConfig& c, const Layout& l, bool moe, bool flash) {
  const double s = d(c.seq_length / l.cp), b = d(l.mbs), h = d(c.hidden_size), t = d(l.tp);
  const double np = d(c.num_attention_heads), ng = d(c.num_query_groups), hn = d(c.head_dim());
  const double glu = c.gated_mlp() ? 2 : 1;
  const double masks = c.hidden_dropout > 0 ? 1.0 : 0.0;
  const double sb = s * b;
  // Replicated across tp without SP: the GEMM inputs and norm inputs, the masks.
  const double outer = sb * h * (2 + 2 + 4 + 2 * masks);
  double inner = sb * (2 * (np + 2 * ng) * hn + 2 * np * hn);
  double latents = 0;  // multi-latent attention's, replicated over TP like the norms' inputs
  if (c.mla.enabled) {
    // Q and K (np heads of q_head_dim), V and the projection's input (v_head_dim); the latents
    // and their normed copies (the up projections' inputs) and the rotary key.
    const MlaConfig& m = c.mla;
    inner = sb * (4 * np * d(m.q_head_dim()) + 4 * np * d(m.v_head_dim));
    latents = sb * (4 * d(m.q_lora_rank + m.kv_lora_rank) + 2 * d(m.qk_pos_emb_head_dim));
  }
  if (!moe) {
    const double f = d(c.ffn_hidden_size);
    inner += sb * (2 * f * glu + 2 * f);
  } else {
    const MoeConfig& m = c.moe;
    const double fe = d(m.ffn_hidden_size), k = d(m.router_topk);
    // Routed rows: k copies of the input and of each expert's intermediates; their split is
    // the expert layout's (etp x ep over the attention's tp x cp x dp ranks), which on average
    // gives every rank 1/tp of the routed work, as the dense MLP.
    inner += sb * k * (2 * h + 2 * fe * glu + 2 * fe);
    if (m.shared_expert_intermediate_size > 0) {
      const double fs = d(m.shared_expert_intermediate_size);
      inner += sb * (2 * fs * glu + 2 * fs);
    }
  }
  // Flash attention keeps the log-sum-exp (fp32) instead of scores.
  const double scores = flash
                            ? 4.0 * np * s * b
                            : (c.attention_dropout > 0 ? 5.0 : 2.0) * np * s * d(c.seq_length) * b;
  return (l.sp ? (outer + latents) / t : outer + latents) + inner / t +
         (l.recompute == Recompute::kNone || flash ? scores / t : 0.0);
}

}  // namespace

int in_flight_microbatches(int64_t pp, int64_t vpp, int64_t stage, int64_t m, int64_t group) {
  const int p = static_cast<int>(pp), r = static_cast<int>(stage), n = static_cast<int>(m);
  if (pp == 1) return 1;
  if (vpp == 1) return std::min(one_f_one_b_warmup(p, r, n) + 1, n);
  return std::min(interleaved_warmup(p, r, n, static_cast<int>(vpp), static_cast<int>(group)) + 1,
                  n * static_cast<int>(vpp));
}

RankParams rank_params(const TransformerConfig& c, const Layout& l, int64_t stage) {
  RankParams p;
  const double h = d(c.hidden_size), t = d(l.tp);
  const double np = d(c.num_attention_heads), ng = d(c.num_query_groups), hn = d(c.head_dim());
  const double glu = c.gated_mlp() ? 2 : 1;
  const double norm = c.normalization == Normalization::kLayerNorm ? 2 * h : h;
  const bool bias = c.add_bias_linear;
  for (int64_t layer : stage_layers(c, l, stage, /*parameters=*/true)) {
    // Attention: QKV (+ bias, column-parallel), projection (row-parallel: its bias replicated).
    p.replicated += 2 * norm + (bias ? h : 0);
    const double norm_params = c.normalization == Normalization::kLayerNorm ? 2 : 1;
    if (c.mla.enabled) {
      // Multi-latent attention: the down projections and latent norms replicated, the up
      // projections and linear_proj split.
      const MlaConfig& m = c.mla;
      const double rq = d(m.q_lora_rank), rkv = d(m.kv_lora_rank), dq = d(m.q_head_dim());
      p.dense += ((rq > 0 ? rq * np * dq : h * np * dq) +
                  rkv * np * d(m.qk_head_dim + m.v_head_dim) + np * d(m.v_head_dim) * h) /
                 t;
      p.replicated += h * (rq + rkv + d(m.qk_pos_emb_head_dim));
      if (c.qk_layernorm) p.replicated += norm_params * (rq + rkv);
    } else {
      p.dense +=
          (h * (np + 2 * ng) * hn + (c.qkv_bias() ? (np + 2 * ng) * hn : 0) + np * hn * h) / t;
      if (c.qk_layernorm) p.replicated += 2 * norm_params * hn;
    }
    if (c.softmax_type == SoftmaxType::kLearnable) p.dense += np / t;  // the heads' sinks
    if (!c.moe.is_moe_layer(layer)) {
      const double f = d(c.ffn_hidden_size);
      p.dense += (h * f * glu + (bias ? f * glu : 0) + f * h) / t;
      p.replicated += bias ? h : 0;
    } else {
      const MoeConfig& m = c.moe;
      const double fe = d(m.ffn_hidden_size);
      p.expert += d(m.num_experts) * (h * fe * glu + fe * h) / d(l.ep * l.etp);
      p.replicated += d(m.num_experts) * h;  // router
      if (bias) {  // the router's bias and the experts' (fc2's whole: ETP 1 with biases)
        p.replicated += d(m.num_experts);
        p.expert += d(m.num_experts) * (fe * glu / d(l.etp) + h) / d(l.ep);
      }
      if (m.shared_expert_intermediate_size > 0) {
        const double fs = d(m.shared_expert_intermediate_size);
        p.dense += (h * fs * glu + fs * h) / t;
      }
    }
  }
  const double vocab = d(c.padded_vocab_size) * h / t;
  if (stage == 0) {
    p.embedding += vocab;
    if (c.position_embedding == PositionEmbedding::kLearnedAbsolute)
      p.replicated += d(c.max_position_embeddings) * h;
  }
  if (stage == l.pp - 1) {
    p.replicated += norm;  // final norm
    // The output layer: its own weight when untied; tied, the last stage keeps a copy of the
    // embedding when it is not also the first.
    if (c.untie_embeddings_and_output_weights || l.pp > 1) p.embedding += vocab;
    // Multi-token prediction: per depth two input norms, the final norm and eh_proj [h, 2h]
    // (column parallel); a last stage that is not the first also keeps a copy of the word
    // embeddings for the rolled tokens (the tied output weight's copy serves when tied).
    const double mtp = d(c.mtp_blocks());
    p.replicated += mtp * 3 * norm;
    p.dense += mtp * 2 * h * h / t;
    if (mtp > 0 && l.pp > 1 && c.untie_embeddings_and_output_weights) p.embedding += vocab;
  }
  return p;
}

void predict_memory(const Workload& w, const Layout& l, const Device& dev, Prediction* out_ptr) {
  const TransformerConfig& cfg = w.config;
  Prediction& out = *out_ptr;
  const int64_t m = l.microbatches(w.global_batch);
  const bool full = l.recompute == Recompute::kFull,
             selective = l.recompute == Recompute::kSelective;
  ShardedState sharded;
  sharded.moments = l.sharding != Sharding::kNone;
  sharded.main = l.sharding != Sharding::kNone && is_half(cfg.compute_dtype);
  sharded.grads = l.sharding == Sharding::kFsdp || l.sharding == Sharding::kFsdpGrads;
  sharded.compute = l.sharding == Sharding::kFsdp;
  sharded.moment_bytes = l.sharding != Sharding::kNone ? w.moment_bytes : w.plain_moment_bytes;
  // With several optimizer instances the state shards over one instance's dp / K ranks.
  const double per_param =
      weight_and_optimizer_bytes_per_param(cfg.compute_dtype, l.dp / l.instances, sharded);
  double worst = 0;
  for (int64_t s = 0; s < l.pp; ++s) {
    const RankParams p = rank_params(cfg, l, s);
    double weights = p.total() * per_param;
    if (w.emerging) {  // the stage's own mix of matrices and the rest (their state unsharded)
      ShardedState none = sharded;
      none.moment_bytes = 0;
      weights = p.total() * weight_and_optimizer_bytes_per_param(cfg.compute_dtype,
                                                                 l.dp / l.instances, none) +
                (p.dense + p.expert) * w.matrix_state_bytes +
                (p.replicated + p.embedding) * w.other_state_bytes;
    }
    // Micro-batches (chunks) this stage holds at once under its schedule.
    const int in_flight = in_flight_microbatches(l.pp, l.vpp, s, m, l.vpp_group);
    const std::vector<std::vector<int64_t>> chunks = stage_chunk_layers(cfg, l, s);
    const std::vector<int64_t> layers = stage_layers(cfg, l, s);
    // Bytes of one micro-batch in one chunk, held by each of the in-flight forwards, and bytes
    // the stage holds once: the working set of the layer being recomputed, and on the last
    // stage the logits and their gradient (its micro-batch's backward follows its forward).
    double per_chunk = 0, once = 0;
    const double sb = d(l.mbs * cfg.seq_length / l.cp);
    // fp32 [s b, V / tp], once more per multi-token prediction depth
    const double logits = 4.0 * sb * d(cfg.padded_vocab_size / l.tp) * d(1 + cfg.mtp_num_layers);
    if (w.runtime == ActivationRuntime::kThisProject) {
      TransformerConfig rc = cfg;
      rc.recompute_granularity = full        ? RecomputeGranularity::kFull
                                 : selective ? RecomputeGranularity::kSelective
                                             : RecomputeGranularity::kNone;
      rc.recompute_method = full ? RecomputeMethod::kUniform : RecomputeMethod::kNone;
      rc.recompute_num_layers = full ? 1 : 0;
      ActivationShape a;
      a.micro_batch_size = l.mbs;
      a.tp = static_cast<int>(l.tp);
      a.sequence_parallel = l.sp;
      a.cp = static_cast<int>(l.cp);
      for (int64_t v = 0; v < l.vpp; ++v) {
        const std::vector<int64_t>& chunk = chunks[static_cast<size_t>(v)];
        a.num_layers = static_cast<int64_t>(chunk.size());
        // The last chunk of the last stage runs multi-token prediction's layers after its own.
        if (s == l.pp - 1 && v == l.vpp - 1)
          a.num_layers += cfg.mtp_num_layers * cfg.mtp_layers_per_depth();
        a.first_layer = chunk.empty() ? 0 : chunk.front();
        a.pre_process = s == 0 && v == 0;
        a.post_process = false;
        per_chunk = std::max(per_chunk, d(activation_bytes_per_microbatch(rc, a)));
      }
      if (s == l.pp - 1) {
        // The head's share (final norm, output GEMM input, logits) and the logits' gradient.
        a.num_layers = 0;
        a.pre_process = false;
        a.post_process = true;
        once += d(activation_bytes_per_microbatch(rc, a)) + logits;
      }
      if (full && !layers.empty()) {
        TransformerConfig kept = rc;
        kept.recompute_granularity = RecomputeGranularity::kNone;
        a.num_layers = 1;
        a.first_layer = layers.front();
        a.pre_process = a.post_process = false;
        once += d(activation_bytes_per_microbatch(kept, a));
      }
    } else {
      const bool flash = dev.flash_attention;
      for (const std::vector<int64_t>& chunk : chunks) {
        double bytes = 0;
        std::vector<int64_t> run = chunk;
        // The last chunk of the last stage runs multi-token prediction's layers after its own.
        if (s == l.pp - 1 && &chunk == &chunks.back())
          for (int64_t k = 0; k < cfg.mtp_num_layers; ++k) run.push_back(cfg.num_layers + k);
        for (int64_t layer : run) {
          const bool moe = cfg.moe.is_moe_layer(layer);
          // Full recomputation keeps each layer's input (2 bytes per element, / tp with SP).
          bytes += full ? 2.0 * sb * d(cfg.hidden_size) / (l.sp ? d(l.tp) : 1.0)
                        : megatron_layer_bytes(cfg, l, moe, flash);
        }
        per_chunk = std::max(per_chunk, bytes);
      }
      if (full && !layers.empty()) {
        Layout kept = l;
        kept.recompute = Recompute::kNone;
        once += megatron_layer_bytes(cfg, kept, cfg.moe.is_moe_layer(layers.front()), flash);
      }
      if (s == l.pp - 1) once += 2 * logits;
    }
    const double act = per_chunk * in_flight + once;
    // This project's gradient reduction hands MPI whole buckets, whose reduction allocates a
    // temporary of the bucket's size (fp32 gradients, at most Megatron's 40M-element bucket).
    double buffers = w.runtime == ActivationRuntime::kThisProject && l.dp * l.cp > 1
                         ? 4.0 * std::min(p.total(), 40e6)
                         : 0.0;
    // Megatron-FSDP gathers a unit's weights (and gives its gradients a full-size buffer) for
    // the layer running and the one prefetched: the largest unit, a layer or the embedding.
    if (l.sharding == Sharding::kFsdp) {
      const double unit =
          std::max((p.total() - p.embedding) / d(std::max<size_t>(layers.size(), 1)), p.embedding);
      buffers += 2.0 * unit * ((is_half(cfg.compute_dtype) ? 2.0 : 4.0) + 4.0);
    }
    const double total = weights + act * (1 + dev.fragmentation) + dev.runtime_bytes + buffers;
    if (total > worst) {
      worst = total;
      out.weight_and_optimizer_bytes = weights;
      out.activation_bytes = act;
      out.runtime_bytes = act * dev.fragmentation + dev.runtime_bytes + buffers;
      out.total_bytes = total;
      out.most_loaded_stage = static_cast<int>(s);
      out.params = p;
    }
  }
}

Prediction predict(const Workload& w, const Layout& l, const Cluster& c) {
  const TransformerConfig& cfg = w.config;
  Prediction out;
  StageModel model(w, l, c);
  const int64_t m = l.microbatches(w.global_batch);
  const bool full = l.recompute == Recompute::kFull,
             selective = l.recompute == Recompute::kSelective;

  // Per micro-batch seconds of each stage (compute + exposed collectives).
  const size_t stages = static_cast<size_t>(l.pp);
  std::vector<double> stage_time(stages, 0.0), stage_fwd(stages, 0.0), stage_bwd(stages, 0.0);
  double slowest = 0;
  for (int64_t s = 0; s < l.pp; ++s) {
    double compute = 0, fwd = 0, bwd = 0, tp = 0, cp = 0, ep = 0, gemm = 0, att = 0, ew = 0;
    for (int64_t layer : stage_layers(cfg, l, s)) {
      const LayerCost& lc = model.cost(layer);
      gemm += lc.gemm_fwd + lc.gemm_bwd + (full ? lc.gemm_fwd : 0);
      att += lc.att_fwd + lc.att_bwd + (full || selective ? lc.att_fwd : 0);
      ew += lc.ew_fwd + lc.ew_bwd + (full ? lc.ew_fwd : 0);
      tp += lc.tp_fwd + lc.tp_bwd + (full ? lc.tp_fwd : 0);
      cp += lc.cp_fwd + lc.cp_bwd + (full ? lc.cp_fwd : 0);
      ep += lc.ep_fwd + lc.ep_bwd + (full ? lc.ep_fwd : 0);
      fwd += lc.fwd() + lc.tp_fwd + lc.cp_fwd + lc.ep_fwd;
      // Backward with the recomputation it runs first.
      bwd += lc.bwd() + lc.tp_bwd + lc.cp_bwd + lc.ep_bwd +
             (full        ? lc.fwd() + lc.tp_fwd + lc.cp_fwd + lc.ep_fwd
              : selective ? lc.att_fwd
                          : 0.0);
    }
    const double ends = (s == 0 ? model.embedding_seconds() : 0.0) +
                        (s == l.pp - 1 ? d(1 + cfg.mtp_num_layers) * model.head_seconds() : 0.0);
    compute = gemm + att + ew + ends;
    const double pp_comm = l.pp > 1 ? 2.0 * d(l.vpp) * model.pp_message_seconds() : 0.0;
    stage_time[static_cast<size_t>(s)] = compute + tp + cp + ep + pp_comm;
    stage_fwd[static_cast<size_t>(s)] = fwd;
    stage_bwd[static_cast<size_t>(s)] = bwd;
    // The parts reported are the slowest stage's.
    if (stage_time[static_cast<size_t>(s)] >= slowest) {
      slowest = stage_time[static_cast<size_t>(s)];
      out.compute = compute * d(m);
      out.gemm = gemm * d(m);
      out.attention = att * d(m);
      out.elementwise = ew * d(m);
      out.ends = ends * d(m);
      out.tp_comm = tp * d(m);
      out.cp_comm = cp * d(m);
      out.ep_comm = ep * d(m);
      out.pp_comm = pp_comm * d(m);
    }
  }
  double mean = 0;
  for (double v : stage_time) mean += v / d(l.pp);
  out.bubble = l.pp > 1 ? d(l.pp - 1) / d(l.vpp) * mean : 0.0;
  // Ranks sharing cores (times measured shared): the critical path runs at the unshared speed
  // while others wait, but the cores must still do every rank's work.
  const double pipeline = std::max((d(m) * slowest + out.bubble) / c.oversubscription, d(m) * mean);
  if (c.oversubscription > 1) out.bubble = std::max(0.0, pipeline - d(m) * slowest);

  // Data parallelism over dp ranks tp x cp apart; the experts' gradients over their own
  // data-parallel group (the tp x cp x dp ranks / (ep x etp)).
  // The stage with the most parameters reduces the most gradients.
  RankParams rp;
  int64_t most = 0;
  for (int64_t s = 0; s < l.pp; ++s) {
    const RankParams p = rank_params(cfg, l, s);
    if (s == 0 || p.total() > rp.total()) {
      rp = p;
      most = s;
    }
  }
  const double grad_bytes = w.grad_reduce_in_bf16 ? 2.0 : 4.0;
  const double param_bytes = is_half(cfg.compute_dtype) ? 2.0 : 4.0;
  const int64_t edp = l.tp * l.cp * l.dp / (l.ep * l.etp);
  // Several optimizer instances (K): the sharded reductions and gathers run within an instance of
  // dp / K consecutive data-parallel ranks, then each shard is all-reduced over the K ranks
  // holding it (strided by the instance).
  const int64_t k = l.instances;
  const Link& dp_link = link_of(c, l.tp * l.cp, l.dp / k);
  const Link& edp_link = link_of(c, l.ep * l.etp, edp / k);
  const double dense_params = rp.total() - rp.expert;
  // stride: the ranks between two members of the reduction's group (tp x cp for the dense
  // layers, ep x etp for the experts); the K instances lie n of them apart.
  auto reduce = [&](const Link& link, int64_t stride, int64_t n, double params) {
    const double grads = params * grad_bytes, weights = params * param_bytes;
    const double across = k > 1 ? all_reduce(link_of(c, stride * n, k), k, grads / d(n)) : 0;
    switch (l.sharding) {
      case Sharding::kNone:
        return all_reduce(link, n, grads);
      case Sharding::kDistributedOptimizer:  // reduce-scatter, then gather the updated weights
        return gather(link, n, grads) + across + gather(link, n, weights);
      case Sharding::kFsdpGrads:  // each micro-batch's gradients scattered, weights gathered once
        return d(m) * gather(link, n, grads) + across + gather(link, n, weights);
      case Sharding::kFsdp:  // weights gathered for each forward and backward, gradients scattered
        return d(m) * (2 * gather(link, n, weights) + gather(link, n, grads)) + across;
    }
    return 0.0;
  };
  double dp = reduce(dp_link, l.tp * l.cp, l.dp / k, dense_params) +
              reduce(edp_link, l.ep * l.etp, edp / k, rp.expert);
  const bool fsdp = l.sharding == Sharding::kFsdp || l.sharding == Sharding::kFsdpGrads;
  if (l.overlap_grad_reduce || fsdp) {
    // Buckets reduce while the last micro-batch's backward runs (FSDP's every micro-batch's,
    // and its gathers run ahead of each layer's forward); what that does not cover stays
    // exposed, at least one bucket.
    const size_t st = static_cast<size_t>(most);
    const double hide = l.sharding == Sharding::kFsdp ? d(m) * (stage_fwd[st] + stage_bwd[st])
                        : l.sharding == Sharding::kFsdpGrads ? d(m) * stage_bwd[st]
                                                             : stage_bwd[st];
    const double bucket_share = std::min(1.0, 40e6 / std::max(1.0, rp.total()));
    dp = std::max(dp * bucket_share, dp - hide);
  }
  out.dp_comm = dp;

  // Optimizer: Adam reads gradient, main weight and both moments and writes the three back, then
  // the 16-bit copy (about 34 bytes per element), plus the gradient norm's read and the gradient
  // zeroing (8): over this rank's shard (Workload::optimizer_traffic_bytes: fewer for SGD).
  const double shard = l.sharding == Sharding::kNone ? 1.0 : d(l.dp / l.instances);
  out.optimizer = (w.optimizer_traffic_bytes * rp.total() / shard) /
                  (c.device.memory_bw * c.device.memory_efficiency);
  out.overhead = c.iteration_overhead;
  out.step = pipeline + out.dp_comm + out.optimizer + out.overhead;

  predict_memory(w, l, c.device, &out);

  const double devices = d(l.world());
  out.tflops_per_device = w.model_flops / (out.step * devices) / 1e12;
  out.mfu = w.model_flops / (out.step * devices * peak_flops(c.device, cfg.compute_dtype, false));
  out.tokens_per_second = d(w.global_batch * cfg.seq_length) / out.step;
  return out;
}

}  // namespace megatron::plan
