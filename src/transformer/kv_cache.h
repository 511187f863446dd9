// KvCache: the keys and values of every position a generation has run so far, per attention
// layer (Megatron's StaticInferenceContext and its key_value_memory_dict).
//
// A generation runs its prompts' shared prefix at once (prefill), then one position per step
// (decode). Every sequence of the batch sits at the same position (static batching: prompts of
// different lengths keep their own tokens until theirs run out), so one offset serves the whole
// batch. Each layer's K and V are [max_sequence, b, groups/tp, hn] in the compute dtype, after
// RoPE and --qk-layernorm, allocated at the layer's first forward; a forward of s new positions
// writes rows [offset, offset + s) of every layer and attends over rows [0, offset + s); the
// caller advances the offset once the whole model (every pipeline stage) has run them.
#pragma once

#include <cstdint>
#include <map>

#include "tensor/tensor.h"

namespace megatron {

class KvCache {
 public:
  struct Entry {
    Tensor k, v;  // [max_sequence, b, groups, hn]
  };

  explicit KvCache(int64_t max_sequence);

  // Positions already cached (Megatron's sequence_len_offset).
  int64_t offset() const { return offset_; }
  int64_t max_sequence() const { return max_sequence_; }
  // After a forward of n new positions through every layer this rank holds.
  void advance(int64_t n);
  // Forgets every position (the buffers stay for the next generation of the same shape) and
  // every cross-attention memory.
  void reset() {
    offset_ = 0;
    cross_.clear();
    recurrent_.clear();
  }

  // An encoder-decoder's cross-attention keys and values of layer `layer_number` over the
  // encoder's output ([sk, b, heads, 2, hn]): undefined until that layer's first decode step
  // sets it; every later step reuses it.
  Tensor& cross_kv(int64_t layer_number) { return cross_[layer_number]; }

  // A Mamba layer's carried state (transformer/mamba/mamba_mixer.h): the convolution's last
  // d_conv - 1 inputs [b, d_conv - 1, channels] and the scan's state [b, heads, head_dim, state];
  // undefined until the layer's first forward of a generation (which starts from zeros).
  struct Recurrent {
    Tensor conv, ssm;
  };
  Recurrent& recurrent(int64_t layer_number) { return recurrent_[layer_number]; }

  // Layer `layer_number`'s buffers for a forward of `s` new positions of b sequences with
  // `groups` key/value heads of hn channels: allocated at first use, checked afterwards (the
  // batch and the head layout cannot change within a generation; the positions must fit).
  Entry& layer(int64_t layer_number, int64_t s, int64_t b, int64_t groups, int64_t hn, DType dtype);

 private:
  int64_t max_sequence_;
  int64_t offset_ = 0;
  std::map<int64_t, Entry> layers_;
  std::map<int64_t, Tensor> cross_;
  std::map<int64_t, Recurrent> recurrent_;
};

}  // namespace megatron
