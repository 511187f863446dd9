// The CUDA device's ops, one per op of tensor/ops.h with the same signature and contract (cuBLASLt
// GEMMs, the kernels of tensor/cuda/*.cu); reached only through the dispatch in tensor/ops.cpp.
// f32 and f64 (and bf16/f16 GEMM inputs and embedding tables); device memory.
#pragma once

#include "tensor/ops.h"

namespace megatron::cuda {

using ops::AdamWSpec;
using ops::AttentionSpec;
using ops::AttentionView;
using ops::MaskedSum;
using ops::QkvPart;
using ops::RopeSpec;

void matmul(Tensor& out, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, float beta);
void grouped_matmul(Tensor& out, const Tensor& a, const std::vector<Tensor>& b, bool trans_b,
                    const std::vector<int64_t>& sizes, float beta);
void grouped_matmul_at(std::vector<Tensor>& out, const Tensor& a, const Tensor& c,
                       const std::vector<int64_t>& sizes, float beta);
void add(Tensor& out, const Tensor& a, const Tensor& b);
void add_inplace(Tensor& out, const Tensor& a);
void mul(Tensor& out, const Tensor& a, const Tensor& b);
void scale_rows(Tensor& x, const Tensor& scale);
void row_dots(Tensor& out, const Tensor& a, const Tensor& b);
void bias_add(Tensor& x, const Tensor& bias);
void bias_backward(Tensor& dbias, const Tensor& dy);
void scale_inplace(Tensor& x, double factor);
void gelu_forward(Tensor& out, const Tensor& x, bool tanh_approx);
void gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, bool tanh_approx);
void tanh_forward(Tensor& out, const Tensor& x);
void tanh_backward(Tensor& dx, const Tensor& dout, const Tensor& y);
void squared_relu_forward(Tensor& out, const Tensor& x);
void squared_relu_backward(Tensor& dx, const Tensor& dout, const Tensor& x);
void swiglu_forward(Tensor& out, const Tensor& x);
void swiglu_backward(Tensor& dx, const Tensor& dout, const Tensor& x);
void dropout_forward(Tensor& out, const Tensor& x, float p, uint64_t seed, uint64_t stream,
                     uint64_t offset);
void dropout_backward(Tensor& dx, const Tensor& dout, float p, uint64_t seed, uint64_t stream,
                      uint64_t offset);
void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x,
                       const Tensor& weight, const Tensor& bias, float eps);
void layernorm_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                        const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd);
void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& weight, float eps);
void rmsnorm_backward(Tensor& dx, Tensor& dweight, const Tensor& dout, const Tensor& x,
                      const Tensor& weight, const Tensor& rstd);
void embedding_forward(Tensor& out, const Tensor& ids, const Tensor& table);
void embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& ids);
void embedding_forward_shard(Tensor& out, const Tensor& ids, const Tensor& table_shard,
                             int64_t vocab_start);
void embedding_backward_shard(Tensor& dtable_shard, const Tensor& dout, const Tensor& ids,
                              int64_t vocab_start);
void rope_inplace(Tensor& x, const Tensor& positions, const RopeSpec& spec, bool inverse);
void attention_forward(Tensor& out, Tensor& lse, const AttentionView& q, const AttentionView& k,
                       const AttentionView& v, const AttentionSpec& spec);
void attention_backward(const AttentionView& dq, const AttentionView& dk, const AttentionView& dv,
                        const Tensor& dbias, const Tensor& dout, const AttentionView& q,
                        const AttentionView& k, const AttentionView& v, const Tensor& out,
                        const Tensor& lse, const AttentionSpec& spec);
void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b);
void cross_entropy_forward(Tensor& loss, Tensor& lse, const Tensor& logits, const Tensor& targets,
                           int64_t vocab_size);
void cross_entropy_backward(Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                            const Tensor& lse, const Tensor& targets, int64_t vocab_size);
void log_softmax_gather(Tensor& logprob, const Tensor& logits, const Tensor& targets,
                        int64_t vocab_size);
void cross_entropy_shard_max(Tensor& row_max, const Tensor& logits_shard, int64_t valid);
void cross_entropy_shard_sums(Tensor& sums, const Tensor& logits_shard, const Tensor& row_max,
                              const Tensor& targets, int64_t vocab_start, int64_t valid);
void cross_entropy_shard_finish(Tensor& loss, Tensor& lse, const Tensor& row_max,
                                const Tensor& sums);
void cross_entropy_shard_backward(Tensor& dlogits_shard, const Tensor& dloss,
                                  const Tensor& logits_shard, const Tensor& lse,
                                  const Tensor& targets, int64_t vocab_start, int64_t valid);
MaskedSum masked_sum(const Tensor& loss, const Tensor& mask);
void transpose_2d(Tensor& out, const Tensor& x);
void slice_last_dim(Tensor& out, const Tensor& x, int64_t start);
void gather_rows(Tensor& out, const Tensor& x, const Tensor& index);
void scatter_add_rows(Tensor& out, const Tensor& x, const Tensor& index);
void concat_last_dim(Tensor& out, const std::vector<Tensor>& parts);
void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad,
                const AdamWSpec& spec);
double sum_squares(const Tensor& x);
int64_t count_zeros(const Tensor& x);

}  // namespace megatron::cuda
