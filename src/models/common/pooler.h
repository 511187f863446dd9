// Pooler: Megatron's Pooler, a sequence's summary vector for classification heads (BERT's
// sentence-order prediction, finetuning tasks): the hidden state at one position (0: the [CLS]
// token) through a dense h -> h layer and tanh.
//
// Its weights are replicated over tensor parallelism (pooler.dense.weight [h, h] and
// pooler.dense.bias [h]). Under --sequence-parallel each rank holds s/tp positions, so the
// hidden state is gathered first; every rank then holds the whole input and the whole gradient,
// so the backward of that gather is a split, not a reduce-scatter (Megatron's
// gather_from_sequence_parallel_region with tensor_parallel_output_grad=False).
#pragma once

#include "parallel/linear.h"
#include "transformer/tensor_parallel_context.h"

namespace megatron {

class Pooler {
 public:
  struct Ctx {
    int64_t s = 0, b = 0;  // the full sequence length and the batch
    Linear::Ctx dense;
    Tensor y;  // tanh output [b, h], for the backward
  };

  Pooler(const std::string& name, int64_t hidden_size, double init_std,
         const TensorParallelContext& tp, int64_t sequence_index = 0);
  Pooler(const Pooler&) = delete;
  Pooler& operator=(const Pooler&) = delete;

  // hidden [s', b, h] -> pooled [b, h] (f32, or f64 in f64 models).
  Tensor forward(const Tensor& hidden, Ctx& ctx) const;
  // dpooled [b, h] -> the gradient of hidden [s', b, h] (zero except at sequence_index).
  Tensor backward(const Tensor& dpooled, Ctx& ctx) const;

  void collect(std::vector<Param*>& out);
  Linear dense;  // pooler.dense.{weight, bias}

 private:
  TensorParallelContext tp_;
  int64_t h_, index_;
};

}  // namespace megatron
