// Vocabulary parallelism: the word embedding and the softmax cross-entropy with the vocabulary
// split over the tensor-parallel group (Megatron's VocabParallelEmbedding and
// vocab_parallel_cross_entropy), as free functions in the ops.h style: outputs first, backward
// writes input gradients and accumulates parameter gradients.
//
// Layout: the padded vocabulary of Vp rows (Vp a multiple of the group size p) is split into p
// equal contiguous blocks; rank r holds rows [vocab_start, vocab_start + Vp/p) of the embedding
// table, vocab_start = r * Vp/p (vocab_range), and the same block of columns of the output
// layer's logits. Rows and columns >= vocab_size are padding (Megatron pads the vocabulary to a
// multiple of --make-vocab-size-divisible-by times p): never a target, zero probability, zero
// gradient, as in ops::cross_entropy_forward/backward. A rank whose block is all padding is
// allowed.
//
// Embedding, E = [E_1; ...; E_p] split along its rows:
//   forward:  out[i, :] = sum over ranks r of (ids[i] in rank r's block ? E_r[ids[i] - start_r]
//             : 0), one all-reduce: exactly the full lookup E[ids[i]], since only one term of
//             each sum is nonzero.
//   backward: dE_r[v - start_r, :] += sum of dout[i, :] over tokens i with ids[i] = v in this
//             rank's block; no communication (dout is the replicated gradient of the output).
// Cross entropy over logits X = [X_1, ..., X_p] split along the vocabulary:
//   m[i]   = max over ranks of (max over this rank's valid columns of X_r[i, :])   all-reduce max
//   S[i]   = sum over ranks of sum_j exp(X_r[i, j] - m[i])                         } one all-reduce
//   x_t[i] = X[i, targets[i]], from the rank holding the target, 0 elsewhere       } sum of 2n
//   lse[i] = m[i] + log S[i];  loss[i] = lse[i] - x_t[i]       (the same on every rank)
//   backward: dX_r[i, j] = dloss[i] * (exp(X_r[i, j] - lse[i]) - [start_r + j == targets[i]])
//   for valid columns, 0 for padding; no communication.
//
// Every rank must pass the same ids / targets (they are replicated over TP), and every argument
// is checked before the first collective, so a caller error throws on every rank instead of
// leaving the others waiting. This is not a layer (no Param, no initialisation) and not the
// sequence-parallel scatter of the embedding output (see mappings.h).
#pragma once

#include <cstdint>

#include "comm/process_group.h"
#include "tensor/tensor.h"

namespace megatron {

// This rank's block [start, end) of a padded vocabulary of `padded_vocab_size` split over `size`
// ranks (Megatron's VocabUtility.vocab_range_from_global_vocab_size). Throws unless size divides
// padded_vocab_size.
struct VocabRange {
  int64_t start = 0, end = 0;
};
VocabRange vocab_range(int64_t padded_vocab_size, int rank, int size);

// out [n, h] = the embedding rows of ids, whole on every rank of `tp`. ids: i64 (or i32), any
// shape, n = numel, each in [0, Vp) with Vp = table_shard.dim(0) * tp.size(); table_shard
// [Vp/p, h] f32, f64 or bf16; out: f32 for an f32 or bf16 table (bf16 rows are widened exactly),
// f64 for an f64 table, any shape with n*h elements and last dim h. vocab_start must be this
// rank's vocab_range(Vp, ...).start. On a size-1 group this is ops::embedding_forward.
void vocab_parallel_embedding_forward(Tensor& out, const Tensor& ids, const Tensor& table_shard,
                                      int64_t vocab_start, ProcessGroup& tp);

// dtable_shard [Vp/p, h] (f32 or f64 main gradient) += the rows of dout [n, h] (same dtype)
// whose id falls in [vocab_start, vocab_start + Vp/p); tokens of other ranks' blocks are
// skipped. Each element is summed in token order (parallel over hidden columns, not tokens), so
// the result is deterministic and equals the matching rows of ops::embedding_backward.
void vocab_parallel_embedding_backward(Tensor& dtable_shard, const Tensor& dout, const Tensor& ids,
                                       int64_t vocab_start);

// loss [n], lse [n] from logits_shard [..., Vp/p] (f32 or f64; n = rows, all leading dims
// flattened) and targets i64 [n] in [0, vocab_size), vocab_size in (0, Vp]. loss and lse have the
// logits' dtype and are identical on every rank of `tp`. Two collectives: an all-reduce max of n
// values of the logits' dtype and an all-reduce sum of 2n doubles (exp-sums, target logits).
void vocab_parallel_cross_entropy_forward(Tensor& loss, Tensor& lse, const Tensor& logits_shard,
                                          const Tensor& targets, int64_t vocab_start,
                                          int64_t vocab_size, ProcessGroup& tp);

// dlogits_shard (shape and dtype of logits_shard) = dloss[r] * (softmax - one-hot target) on this
// rank's valid columns, 0 on padding; dloss, lse [n] in the logits' dtype, lse from the forward.
// May alias logits_shard (in place). No communication.
void vocab_parallel_cross_entropy_backward(Tensor& dlogits_shard, const Tensor& dloss,
                                           const Tensor& logits_shard, const Tensor& lse,
                                           const Tensor& targets, int64_t vocab_start,
                                           int64_t vocab_size);

}  // namespace megatron
