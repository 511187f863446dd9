// The routing math of Megatron's TopKRouter, as pure functions on one rank's router logits
// [T, E] (T tokens, flattened s-major: row s_idx * b + b_idx; E experts), in f64.
//
// Forward (route), in Megatron's order (moe_utils.topk_routing_with_score_function,
// apply_router_token_dropping, sinkhorn_load_balancing):
//   softmax, post (default): idx = topk(logits); probs = softmax(logits[idx]) over the k selected
//   softmax, pre:            scores = softmax(logits) over E; idx = topk(scores); probs =
//   scores[idx] sigmoid:                 scores = sigmoid(logits); idx = topk(scores +
//   expert_bias);
//                            probs = scores[idx] / (sum scores[idx] + 1e-20) (k > 1), scores[idx]
//   group-limited (num_groups): topk restricted to the group_topk groups whose top
//                            (k / group_topk) scores sum highest
//   then probs *= topk_scaling_factor (if set).
//   sinkhorn (training): idx = topk(sinkhorn(logits)); probs = act(logits) at idx, act = sigmoid
//                        (k = 1) or softmax over E; at evaluation idx = topk(act(logits)).
//   capacity (capacity_factor > 0): capacity = ceil(T k / E * factor) (at most T) per expert;
//   each expert keeps the `capacity` tokens with the largest probs (policy probs) or the first
//   routed ones (policy position); the rest of its column is dropped, or with padding the column
//   is exactly the capacity mask (tokens routed with probability 0).
// Backward (route_backward): d(probs) -> d(logits), through the same selection (constant).
//
// Load-balancing losses (aux_scores, aux_loss_grad, seq_aux_loss_grad, z_loss_grad) take the
// counts already summed over the tensor x context parallel ranks by the caller (the router):
//   aux:     L = coeff E / (k T^2) sum_e (sum_t P[t,e]) c_e,        T = all tokens of the batch
//   seq aux: the same per sequence (T = the sequence length) and averaged over the b sequences
//   z:       L = coeff / |TP x CP| mean_t (logsumexp_e logits[t,e])^2
// where P are softmax(logits) (sigmoid: sigmoid(logits) normalised over E) and c_e counts the
// plain top-k of P (no bias, group limit or dropping): Megatron's
// compute_routing_scores_for_aux_loss.
//
// Top-k ties: among equal values the lower index wins (experts, and tokens for capacity). Torch
// promises nothing there; tests are tie-free where they compare with PyTorch.
#pragma once

#include <cstdint>
#include <vector>

#include "transformer/moe/moe_config.h"

namespace megatron::moe {

// One rank's routing of T tokens.
struct Routing {
  int64_t tokens = 0, experts = 0;
  std::vector<double> probs;    // [T, E], 0 off the map
  std::vector<uint8_t> map;     // [T, E], 1 where a token goes to an expert (after dropping)
  std::vector<int32_t> topk;    // [T, k] the selected experts before dropping
  std::vector<double> scores;   // [T, E] what the backward differentiates (see route_backward)
  std::vector<double> softmax;  // [T, k] the post-softmax probabilities (softmax, post only)
};

// `bias`: the expert bias [E] (sigmoid with --moe-router-enable-expert-bias), else empty.
// `training`: sinkhorn selects by its normalisation only in training.
Routing route(const std::vector<double>& logits, int64_t tokens, const MoeConfig& cfg,
              const std::vector<double>& bias, bool training);

// Megatron's pad_routing_map (--moe-router-padding-for-fp8): each expert's column of map [T, E]
// gains its first zeros in token order until its count is a multiple of `multiple` (or it has no
// zeros left). Only the dispatch takes the padded map: the probabilities stay 0 there, and the
// routing's own map (losses, counts, the backward) is unchanged.
std::vector<uint8_t> pad_routing_map(const std::vector<uint8_t>& map, int64_t tokens,
                                     int64_t experts, int64_t multiple);

// dlogits [T, E] += the gradient of sum(dprobs * probs) with respect to the logits. dprobs [T, E]:
// the gradient of the routing probabilities (only entries on the map matter).
void route_backward(const Routing& r, const MoeConfig& cfg, const std::vector<double>& dprobs,
                    std::vector<double>& dlogits);

// The expert capacity of T tokens (Megatron's get_capacity, clamped to T).
int64_t expert_capacity(int64_t tokens, int64_t experts, int64_t topk, double capacity_factor);

// Sinkhorn normalisation of exp(cost) [T, E] to tolerance tol (Megatron's moe_utils.sinkhorn).
std::vector<double> sinkhorn(const std::vector<double>& cost, int64_t tokens, int64_t experts,
                             double tol = 1e-4);

// Row-wise top-k of x [rows, n] restricted to the entries where allowed (empty: all), by value,
// the lower index first among equals; indices in descending order of value.
std::vector<int32_t> topk_rows(const std::vector<double>& x, int64_t rows, int64_t n, int64_t k,
                               const std::vector<uint8_t>& allowed = {});

// The scores of the load-balancing losses [T, E] and their plain top-k map [T, E].
struct AuxScores {
  std::vector<double> scores;
  std::vector<uint8_t> map;
};
AuxScores aux_scores(const std::vector<double>& logits, int64_t tokens, const MoeConfig& cfg);

// The aux loss of this rank (its share of the TP x CP sum), and d(loss)/d(scores) added to
// dscores [T, E] times grad_scale. counts [E]: the map's column sums over TP x CP;
// total_tokens: T x |TP x CP|.
double aux_loss(const AuxScores& a, int64_t tokens, int64_t experts, int64_t topk,
                const std::vector<double>& counts, double total_tokens, double coeff,
                double grad_scale, std::vector<double>* dscores);
// Sequence-level: rows are s_idx * b + b_idx, counts [b * E] per (sequence, expert) over TP x CP,
// seq_tokens: the full sequence length (s_local x |TP x CP|).
double seq_aux_loss(const AuxScores& a, int64_t tokens, int64_t experts, int64_t topk,
                    int64_t batch, const std::vector<double>& counts, double seq_tokens,
                    double coeff, double grad_scale, std::vector<double>* dscores);
// Column sums of the aux map: [E], or with batch > 0 per sequence [b * E].
std::vector<double> aux_counts(const AuxScores& a, int64_t tokens, int64_t experts,
                               int64_t batch = 0);
// dlogits += the gradient of the aux scores' dscores through softmax (or normalised sigmoid).
void aux_scores_backward(const std::vector<double>& logits, int64_t tokens, const MoeConfig& cfg,
                         const std::vector<double>& dscores, std::vector<double>& dlogits);
// z-loss with coefficient `coeff` (already divided by |TP x CP|): returns mean_t lse_t^2 (the
// logged value) and adds coeff d(mean lse^2)/d(logits) x grad_scale to dlogits (if non-null).
double z_loss(const std::vector<double>& logits, int64_t tokens, int64_t experts, double coeff,
              double grad_scale, std::vector<double>* dlogits);

}  // namespace megatron::moe
