// Param: one named weight of a model, and ParamSet: the flat buffers behind all of them.
//
// A layer declares its Params (name, shape, init, attributes) at construction; ParamSet then lays
// every Param out contiguously in three flat buffers: fp32 main weights, compute weights (the
// same buffer in fp32 runs, a bf16 copy in --bf16 runs) and fp32 gradients (main_grad). The
// optimizer works on the flat buffers; layers see views. Layout is in reverse registration order,
// as Megatron's gradient buffers are (the last layer's gradients are ready first in backward).
//
// Under tensor parallelism a Param is this rank's shard of a full tensor; its attributes say how
// the shard sits in the full tensor (Megatron's tensor_model_parallel / partition_dim /
// partition_stride), so initialisation, gradient norms and checkpoints can reason about the full
// tensor. Names are always the full tensor's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace megatron {

class Fp8GemmScaling;

enum class Init : uint8_t {
  kNormal,  // N(0, std)
  kZeros,
  kOnes,
  // U(-a, a), a = sqrt(6 / (fan_in + fan_out)) of the full [out, in] matrix (torch's
  // xavier_uniform_ on the whole tensor, so the same values in every parallel layout).
  kXavierUniform,
  kUniform,  // U(-init_std, init_std) (torch's kaiming_uniform_ bound, e.g. Mamba's conv1d)
  // Mamba's A_log: log of U(1, 16) (Megatron's A_init_range).
  kMambaALog,
  // Mamba's dt_bias: softplus^-1 of dt, dt log-uniform in [0.001, 0.1] floored at 1e-4
  // (Megatron's dt_min, dt_max, dt_init_floor), so that softplus(dt_bias) starts in that range.
  kMambaDtBias,
};

struct Param {
  std::string name;  // Megatron-core name, e.g. "decoder.layers.0.mlp.linear_fc1.weight"
  Shape shape;
  Init init = Init::kNormal;
  double init_std = 0.02;
  bool no_weight_decay = false;  // biases and norm weights (Megatron's param groups)
  bool is_embedding_or_output = false;
  // Megatron's number of dimensions where this tensor is stored with fewer (Mamba's conv1d weight:
  // 3-D there, [channels, d_conv] here); 0: shape's. --optimizer muon decides by it which
  // parameters are matrices.
  int megatron_ndim = 0;
  // A fused linear_qkv weight's rows per query group: its queries, its key and its value
  // (Megatron's qkv_split_shapes), which --optimizer muon orthogonalises apart. Empty otherwise.
  std::vector<int64_t> qkv_split;

  // Tensor parallelism. tp_partition_dim: the dim split over the TP group (-1: every TP rank
  // holds the whole tensor). tp_partition_stride: the full dim is first cut into this many equal
  // blocks and each block is split over the ranks, so a shard is the concatenation of its
  // slices of every block (2 for SwiGLU's fc1 [gate | up]: rank r holds [gate_r | up_r]).
  int tp_partition_dim = -1;
  int tp_partition_stride = 1;
  // Unequal blocks instead of a stride: the full sizes of consecutive blocks of the partition
  // dim, each split over the ranks (Mamba's in-projection [z | x | B | C | dt]: rank r holds
  // [z_r | x_r | B_r | C_r | dt_r]). Empty: tp_partition_stride equal blocks.
  std::vector<int64_t> tp_partition_sections;
  int tp_rank = 0, tp_size = 1;
  // Replicated while each TP rank sees only its s/tp tokens (norm weights and row-parallel
  // biases under --sequence-parallel): the gradient is partial, summed over TP before the step.
  bool sequence_parallel = false;
  // The last pipeline stage's copy of the tied word embeddings (the output weight): its gradient
  // is summed with the first stage's over the embedding group, and it is counted once in the
  // gradient norm (on the first stage).
  bool shared_embedding = false;
  // An MoE expert's weight (Megatron's allreduce=False): held by one expert-parallel rank and
  // replicated only over the expert-data-parallel group, where its gradient is reduced. Buckets
  // never mix expert and dense parameters (ParamSet, GradBuckets).
  bool expert_parallel = false;
  // Not trained (Megatron keeps such state in buffers, e.g. the MoE router's expert bias): no
  // gradient ever reaches it, the optimizer leaves it as it is (zero gradient, no decay), and it
  // is left out of gradient and parameter norms, zero counts and the parameter count. It is
  // saved and resharded like any parameter.
  bool frozen = false;
  // false (--freeze-LM, --freeze-ViT; PyTorch's requires_grad): frozen, and besides no gradient
  // storage at all (main_grad stays undefined, so backward computes no weight gradient for it)
  // and no optimizer state: the ParamSet lays it out after every bucket, where no gradient
  // reduction, parameter gather or optimizer looks. Its weights are still saved and loaded.
  // Set before the ParamSet is built, together with frozen.
  bool requires_grad = true;
  // Megatron's grad_norm_group 'mtp' (--mtp-detach-heads): left out of the main gradient norm
  // and clipped by the norm of its own group (the trainer's step).
  bool separate_norm = false;
  // --use-mup's parameter class (set by the trainer for its optimizer, Megatron core 0.19's
  // get_mup_config_overrides): kHidden takes StepRates::hidden_lr (and Adam's eps scaled),
  // kVector StepRates::vector_lr (SGD's vectors and embeddings); kNone the group's rate.
  enum class MupClass : uint8_t { kNone, kHidden, kVector };
  MupClass mup_class = MupClass::kNone;
  // --fp8-param-gather: the weight of this FP8 GEMM, kept as E4M3 codes of one byte (Megatron's
  // FP8 primary weights): `value` is u8 (ParamSet::codes()), the distributed optimizer quantises
  // the fp32 main weights into it after each step with the GEMM's weight scale
  // (Fp8GemmScaling::primary_weight_scale) and the codes are what the all-gathers move. The GEMM
  // decodes them around each use (Fp8GemmScaling::weight). Null for every other parameter.
  // Buckets never mix these weights with other parameters.
  Fp8GemmScaling* fp8 = nullptr;

  Tensor value;      // compute weights (f32 or bf16; u8 codes with fp8), view into the ParamSet
  Tensor main;       // fp32 main weights, view into ParamSet::main()
  Tensor main_grad;  // fp32 gradient, view into ParamSet::grads(); accumulated (+=) by backward
  // main_grad holds zeros: set when the ParamSet zeroes the gradients (every step). The first
  // weight-gradient GEMM of the step then writes its product instead of adding it (beta 0: the
  // GEMM neither reads main_grad nor sums into it; grad_beta()), and every writer of a weight that
  // a GEMM writes too clears it (the tied word embeddings' lookup backward).
  mutable bool main_grad_zero = false;
  // The beta of a GEMM accumulating into main_grad: 0 while it holds zeros, else 1. Clears the
  // flag.
  float grad_beta() const {
    const float beta = main_grad_zero ? 0.0f : 1.0f;
    main_grad_zero = false;
    return beta;
  }

  // value in dtype t: the tensor itself when it already is, else a converted copy (bf16 runs use
  // this for the small 1-D parameters that feed f32 elementwise kernels).
  Tensor value_as(DType t) const { return value.dtype() == t ? value : value.to(t); }

  bool is_tensor_parallel() const { return tp_partition_dim >= 0 && tp_size > 1; }
  // The full tensor's shape (= shape unless tensor parallel).
  Shape full_shape() const;
  // Row-major index in the full tensor of element i of this shard.
  int64_t full_index(int64_t i) const;
  // Along the partition dim: the full position of local position j, and the local end of the
  // block (stride block or section) that holds it.
  int64_t full_partition_position(int64_t j) const;
  int64_t local_block_end(int64_t j) const;
  // A copy that another rank of the model-parallel group also holds and counts (replicated over
  // TP on a TP rank > 0, or the pipeline's second copy of the tied embeddings): left out of the
  // gradient norm so that every element is counted once, as Megatron's clip_grad_norm does.
  bool is_duplicate() const { return shared_embedding || (!is_tensor_parallel() && tp_rank != 0); }
};

// An optional layout of a ParamSet in data-parallel buckets, for the distributed optimizer
// (Megatron's padded bucket layout). The buffer, in layout order, is cut at parameter boundaries
// into buckets; each bucket's end is padded with zeros to a multiple of `pad_multiple`, so that
// it splits into dp equal shards whose ends are not tied to parameter boundaries. A bucket closes
// at the first parameter end where it holds at least bucket_size elements (alignment included:
// GradBuckets' rule). FP8 primary weights (Param::fp8) are laid out after all other parameters,
// in buckets of their own (Megatron keeps them in a buffer of their own dtype), each part in
// reverse registration order. A parameter with is_embedding_or_output has a bucket of its own, so
// that the first and the last pipeline stage's copies of the tied embeddings sit at the same place
// of equally padded buckets and their shards hold the same elements: the embedding group's sum of
// the two copies then works on reduce-scattered shards (Megatron does the same). A bucket also
// closes where the parameters change from dense to expert-parallel or back: the two kinds reduce
// over different groups. Only the gaps between parameters change; every Param stays contiguous and
// 16-aligned.
struct BucketLayout {
  int64_t bucket_size = 0;    // elements per bucket at least (the last takes the rest); <= 0: one
  int64_t pad_multiple = 16;  // every bucket's length is a multiple of this; a multiple of 16
  // Megatron-FSDP's units instead of sizes: a bucket closes exactly where fsdp_unit() of the
  // parameters changes (each transformer layer, the embeddings, ...), so a unit's weights can be
  // gathered, and its gradients reduce-scattered, as one flat bucket. bucket_size is then unused.
  bool per_unit = false;
};

// The FSDP unit a parameter belongs to, from its name: "decoder.layers.3" for every parameter of
// that transformer layer (Megatron-FSDP's TransformerLayer units), "embedding" for the embeddings
// (LanguageModelEmbedding), and for everything else the module that holds it
// ("decoder.final_layernorm", "output_layer", "lm_head", ...).
std::string fsdp_unit(const std::string& param_name);

// Which of a bucketed ParamSet's buffers keep only this rank's part of every bucket (Megatron-FSDP
// with optim_grads: the gradients, ZeRO-2; optim_grads_params: the weights too, ZeRO-3), and over
// which group each bucket is sharded: bucket [begin, end) of a group of size n is cut into n equal
// shards, rank r keeping [begin + r (end - begin) / n, begin + (r + 1) (end - begin) / n) (the
// distributed optimizer's and GradBuckets' shards). A bucket of expert-parallel parameters is
// sharded over the expert group when expert_size > 0 (experts reduced over expert data
// parallelism), else over the dense one.
struct Sharding {
  bool grads = false;    // the fp32 gradients
  bool weights = false;  // the fp32 main weights and the compute copy
  // The fp32 main weights only, the 16-bit compute copy staying whole (mixed precision; the
  // distributed optimizer then all-gathers the compute copy after each step: Megatron's layout,
  // 6 + 12/dp bytes per parameter). Frozen Params (buffers such as the routers' expert bias) keep
  // whole private copies whenever the main weights are sharded: code outside the optimizer reads
  // and updates them.
  bool main = false;
  int dense_rank = 0, dense_size = 1;
  int expert_rank = 0, expert_size = 0;
};

class ParamSet {
 public:
  // Lays out `params` (owned by the layers, which outlive this set) and allocates the buffers on
  // `device` (the layers then compute wherever their weights are: activations follow inputs).
  ParamSet(std::vector<Param*> params, DType compute_dtype, Device device = Device::kCPU);
  // The same in buckets (see BucketLayout); bucket_ranges() then lists them. With a sharding
  // (see Sharding and the sharded-storage comment below) the sharded buffers are only ever
  // allocated as this rank's shards: the whole model is never held.
  ParamSet(std::vector<Param*> params, DType compute_dtype, const BucketLayout& layout,
           Device device = Device::kCPU, const Sharding& sharding = {});

  // Fills main weights from the init spec of each Param: element i gets the value that element
  // full_index(i) of the full tensor gets from (seed, name), so values never depend on the layout
  // or the number of ranks (with sharded weights, only the elements of this rank's shards). Then
  // copies main -> compute.
  void initialize(uint64_t seed);
  // Sets p's fp32 main weights to `t` (p's shape), wherever they are kept: p's view, or with
  // sharded weights the parts of it this rank's shards hold (the rest of `t` is not needed).
  // Call sync_compute_from_main() after the last one.
  void set_main(const Param& p, const Tensor& t);
  // After the optimizer changed main(): refresh the compute copy (no-op in fp32 runs).
  void sync_compute_from_main();
  // Only the private compute copies of frozen parameters kept outside the sharded buffers (for an
  // optimizer that rounded the compute copy of its shards itself, ops::adamw_step's `rounded`).
  void sync_frozen_compute();
  // The same for the elements [begin, end) of the flat buffers.
  void sync_compute_from_main(int64_t begin, int64_t end);
  void zero_grads();
  // Elements of the trained part of the flat buffers, [0, trainable_numel()): every Param with
  // requires_grad sits there (and every bucket); the others after it.
  int64_t trainable_numel() const { return trainable_; }

  const std::vector<Param*>& params() const { return params_; }
  Param& find(const std::string& name) const;  // error naming the missing parameter
  Tensor& main() { return main_; }
  Tensor& grads() { return grads_; }
  // The compute copy of every bucket but the FP8 ones, whose codes are codes() (u8; both
  // compact when the weights are sharded).
  Tensor& compute() { return compute_; }
  Tensor& codes() { return codes_; }
  DType compute_dtype() const { return compute_dtype_; }
  // Bucket i holds FP8 primary weights (Param::fp8): its compute storage is u8 codes. They are
  // the buckets from first_fp8_bucket() on (none when it is the number of buckets).
  bool fp8_bucket(int64_t bucket) const { return bucket >= first_fp8_bucket_; }
  int64_t first_fp8_bucket() const { return first_fp8_bucket_; }
  bool has_fp8_weights() const { return first_fp8_bucket_ < static_cast<int64_t>(buckets_.size()); }
  // Bucket i's whole compute storage (compute dtype, or u8 codes for an FP8 bucket); buffers that
  // are not sharded only.
  Tensor compute_bucket(int64_t bucket);
  Device device() const { return device_; }
  int64_t numel() const { return main_.numel(); }
  // Offset of a param inside the flat buffers.
  int64_t offset_of(const Param& p) const;
  // Laid out in buckets (the second constructor)?
  bool bucketed() const { return bucketed_; }
  const BucketLayout& bucket_layout() const { return layout_; }
  // [begin, end) of every bucket in buffer order, tiling [0, numel()); empty unless bucketed().
  const std::vector<std::pair<int64_t, int64_t>>& bucket_ranges() const { return buckets_; }
  // The bucket holding p (bucketed sets only).
  int64_t bucket_of(const Param& p) const;
  // The Params of bucket i, in buffer order.
  const std::vector<Param*>& bucket_params(int64_t i) const { return bucket_params_[i]; }

  // Sharded storage (Megatron-FSDP; see Sharding): main(), grads() and compute() of the sharded
  // kinds hold only this rank's shards, concatenated in bucket order (shard i at
  // shard_offset(i)), and the Params' views of a sharded kind are undefined except while their
  // bucket is attached (attach_weights / attach_grads), which is how the FSDP runtime
  // (parallel/fsdp.h) lends a layer its gathered weights and a gradient buffer for its backward.
  bool weights_sharded() const { return sharding_.weights; }
  bool main_sharded() const { return sharding_.weights || sharding_.main; }
  bool grads_sharded() const { return sharding_.grads; }
  // This rank's shard of bucket i, [end - begin] elements, as views into the buffers that hold it
  // (the full buffers when that kind is not sharded): fp32 main weights, fp32 gradients, compute
  // (u8 codes for an FP8 bucket).
  // Unsharded bucketed sets: bucket i itself; unbucketed: the whole buffers.
  Tensor main_shard(int64_t bucket);
  Tensor grad_shard(int64_t bucket);
  Tensor compute_shard(int64_t bucket);
  std::pair<int64_t, int64_t> owned_range(int64_t bucket) const;
  int64_t shard_offset(int64_t bucket) const { return shard_offsets_[bucket]; }
  // One Param's part of one shard: elements [param_begin, param_begin + numel) of the Param sit
  // at [at, at + numel) of the shards' concatenation (the compact sharded buffers; the
  // distributed optimizer's moments are laid out the same way).
  struct OwnedSegment {
    Param* param = nullptr;
    int64_t param_begin = 0, numel = 0, at = 0;
  };
  // Every Param's parts of this rank's shards, in buffer order (sharded sets only).
  const std::vector<OwnedSegment>& owned_segments() const { return segments_; }
  // Points bucket i's Params at `full` ([bucket length], compute dtype or u8 codes for an FP8
  // bucket): their compute weights
  // (and, in fp32 runs where they are the same buffer, their main weights). detach_weights
  // leaves them undefined again.
  void attach_weights(int64_t bucket, const Tensor& full);
  void detach_weights(int64_t bucket);
  // Points bucket i's Params' fp32 main weights (and, in fp32 runs, their compute weights) at
  // `full` ([bucket length] fp32): a whole-model reader's view of sharded weights; detach_main
  // undoes it. Frozen Params keep their private copies.
  void attach_main(int64_t bucket, const Tensor& full);
  void detach_main(int64_t bucket);
  // The same for their gradients (`full`: [bucket length] fp32, accumulated into by backward).
  void attach_grads(int64_t bucket, const Tensor& full);
  void detach_grads(int64_t bucket);

 private:
  void allocate(int64_t total);
  void index_buckets();
  // Where element `at` of the compute storage is: compute_ or codes_, full or compact.
  Tensor compute_view(int64_t at, const Shape& shape, bool fp8);
  void plan_shards();

  std::vector<Param*> params_;
  std::vector<int64_t> offsets_;
  bool bucketed_ = false;
  BucketLayout layout_;
  std::vector<std::pair<int64_t, int64_t>> buckets_;
  std::vector<std::vector<Param*>> bucket_params_;
  std::vector<std::vector<int64_t>> bucket_param_offsets_;  // each Param's offset in its bucket
  std::unordered_map<const Param*, int64_t> param_bucket_;
  Sharding sharding_;
  std::vector<std::pair<int64_t, int64_t>> owned_;  // per bucket (sharded sets)
  std::vector<int64_t> shard_offsets_;
  std::vector<OwnedSegment> segments_;
  DType compute_dtype_;
  Device device_ = Device::kCPU;
  Tensor main_, grads_, compute_, codes_;
  int64_t first_fp8_bucket_ = 0;  // buckets_.size() when there are none
  int64_t fp8_begin_ = 0;         // where the FP8 buckets start: flat offset, compact offset
  int64_t fp8_shard_begin_ = 0;
  int64_t trainable_ = 0;  // end of the part laid out for training (see trainable_numel)
};

// Stable 64-bit hash of a string (FNV-1a), for per-parameter RNG streams.
uint64_t stable_hash(const std::string& s);

}  // namespace megatron
