// Flat-buffer layout of the parameters and their name-keyed Philox initialisation.
#include "parallel/param.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/philox.h"

namespace megatron {

uint64_t stable_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

Shape Param::full_shape() const {
  if (!is_tensor_parallel()) return shape;
  Shape full = shape;
  full[tp_partition_dim] *= tp_size;
  return full;
}

int64_t Param::full_index(int64_t i) const {
  if (!is_tensor_parallel()) return i;
  MEGATRON_ASSERT(tp_partition_dim < shape.ndim(), name, ": partition dim ", tp_partition_dim,
                  " of a ", shape.ndim(), "-d tensor");
  // Split the row-major index into (outer, j, inner) around the partition dim.
  int64_t inner = 1;
  for (int d = tp_partition_dim + 1; d < shape.ndim(); ++d) inner *= shape[d];
  const int64_t local = shape[tp_partition_dim];
  const int64_t j = i / inner % local, outer = i / inner / local, in = i % inner;
  return (outer * local * tp_size + full_partition_position(j)) * inner + in;
}

namespace {
// Calls f(start, n) for the local [start, start + n) of each block of p's shard along its
// partition dim (stride blocks or sections), in order, until f returns true. No allocation: init
// calls it once per element.
template <typename F>
void for_each_block(const Param& p, F&& f) {
  const int64_t local = p.shape[p.tp_partition_dim];
  int64_t start = 0;
  if (p.tp_partition_sections.empty()) {
    MEGATRON_ASSERT(local % p.tp_partition_stride == 0, p.name, ": stride ", p.tp_partition_stride,
                    " does not divide the shard's ", local);
    const int64_t n = local / p.tp_partition_stride;
    for (int k = 0; k < p.tp_partition_stride; ++k, start += n)
      if (f(start, n)) return;
    return;
  }
  for (int64_t full : p.tp_partition_sections) {
    MEGATRON_ASSERT(full % p.tp_size == 0, p.name, ": section of ", full, " does not split over ",
                    p.tp_size, " ranks");
    const int64_t n = full / p.tp_size;
    if (f(start, n)) return;
    start += n;
  }
  MEGATRON_ASSERT(start == local, p.name, ": sections cover ", start, " of the shard's ", local);
}
}  // namespace

int64_t Param::full_partition_position(int64_t j) const {
  // Local position j lies in block [start, start + n) at offset j - start; the block's full copy
  // starts at start * tp_size (every earlier block is tp_size times its local size) and this
  // rank's slice of it at tp_rank * n.
  int64_t out = -1;
  for_each_block(*this, [&](int64_t start, int64_t n) {
    if (j >= start + n) return false;
    out = start * tp_size + tp_rank * n + (j - start);
    return true;
  });
  MEGATRON_ASSERT(out >= 0, name, ": position ", j, " outside the shard");
  return out;
}

int64_t Param::local_block_end(int64_t j) const {
  int64_t end = shape[tp_partition_dim];
  for_each_block(*this, [&](int64_t start, int64_t n) {
    if (j >= start + n) return false;
    end = start + n;
    return true;
  });
  return end;
}

ParamSet::ParamSet(std::vector<Param*> params, DType compute_dtype, Device device)
    : params_(std::move(params)), compute_dtype_(compute_dtype), device_(device) {
  MEGATRON_CHECK(
      compute_dtype == DType::kF32 || is_half(compute_dtype) || compute_dtype == DType::kF64,
      "compute dtype must be f32, bf16, f16 or f64, got ", dtype_name(compute_dtype));
  int64_t total = 0;
  offsets_.resize(params_.size());
  for (const bool trained : {true, false}) {  // the parameters without gradients last
    if (!trained) trainable_ = total;
    for (size_t i = params_.size(); i-- > 0;) {
      if (params_[i]->requires_grad != trained) continue;
      offsets_[i] = total;
      // Each param starts on a 64-byte boundary (16 floats) for aligned vector loads.
      total += (params_[i]->shape.numel() + 15) / 16 * 16;
      MEGATRON_CHECK(params_[i]->fp8 == nullptr, params_[i]->name,
                     ": FP8 primary weights (--fp8-param-gather) need the distributed optimizer's "
                     "bucketed layout");
    }
  }
  fp8_begin_ = total;
  allocate(total);
}

ParamSet::ParamSet(std::vector<Param*> params, DType compute_dtype, const BucketLayout& layout,
                   Device device, const Sharding& sharding)
    : params_(std::move(params)),
      bucketed_(true),
      layout_(layout),
      sharding_(sharding),
      compute_dtype_(compute_dtype),
      device_(device) {
  MEGATRON_CHECK(
      compute_dtype == DType::kF32 || is_half(compute_dtype) || compute_dtype == DType::kF64,
      "compute dtype must be f32, bf16, f16 or f64, got ", dtype_name(compute_dtype));
  MEGATRON_CHECK(layout.pad_multiple > 0 && layout.pad_multiple % 16 == 0,
                 "bucket padding must be a positive multiple of 16 elements (the parameters' "
                 "alignment), got ",
                 layout.pad_multiple);
  int64_t total = 0, begin = 0;
  auto close = [&] {
    total = (total + layout.pad_multiple - 1) / layout.pad_multiple * layout.pad_multiple;
    buckets_.emplace_back(begin, total);
    begin = total;
  };
  offsets_.resize(params_.size());
  // Two parts: every other parameter, then the FP8 primary weights in buckets of their own.
  for (const bool fp8_part : {false, true}) {
    if (fp8_part) {
      if (total > begin) close();
      first_fp8_bucket_ = static_cast<int64_t>(buckets_.size());
      fp8_begin_ = total;
    }
    const Param* prev = nullptr;  // the one laid out before, in this part
    for (size_t i = params_.size(); i-- > 0;) {
      const Param& p = *params_[i];
      if ((p.fp8 != nullptr) != fp8_part || !p.requires_grad) continue;
      const bool own = p.is_embedding_or_output;
      const bool other_domain = prev && p.expert_parallel != prev->expert_parallel;
      const bool other_unit = layout.per_unit && prev && fsdp_unit(p.name) != fsdp_unit(prev->name);
      if ((own || other_domain || other_unit) && total > begin) close();
      offsets_[i] = total;
      total += (p.shape.numel() + 15) / 16 * 16;
      const bool full =
          !layout.per_unit && layout.bucket_size > 0 && total - begin >= layout.bucket_size;
      if (own || full) close();
      prev = &p;
    }
  }
  if (total > begin) close();
  // The parameters without gradients after every bucket: in none of them.
  trainable_ = total;
  for (size_t i = params_.size(); i-- > 0;) {
    if (params_[i]->requires_grad) continue;
    MEGATRON_CHECK(params_[i]->fp8 == nullptr, params_[i]->name,
                   ": a frozen weight cannot be an FP8 primary weight");
    offsets_[i] = total;
    total += (params_[i]->shape.numel() + 15) / 16 * 16;
  }
  index_buckets();
  plan_shards();
  allocate(total);
}

std::string fsdp_unit(const std::string& name) {
  // "...layers.<n>." ends a transformer layer's prefix.
  for (size_t at = name.find("layers."); at != std::string::npos;
       at = name.find("layers.", at + 1)) {
    size_t k = at + 7;
    while (k < name.size() && std::isdigit(static_cast<unsigned char>(name[k]))) ++k;
    if (k > at + 7 && k < name.size() && name[k] == '.') return name.substr(0, k);
  }
  if (name.rfind("embedding.", 0) == 0) return "embedding";
  // Otherwise the holding module: the name without its last component (weight, bias).
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

void ParamSet::index_buckets() {
  bucket_params_.assign(buckets_.size(), {});
  bucket_param_offsets_.assign(buckets_.size(), {});
  param_bucket_.clear();
  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return offsets_[a] < offsets_[b]; });
  size_t bucket = 0;
  for (size_t i : order) {
    if (!params_[i]->requires_grad) continue;  // after every bucket
    while (bucket < buckets_.size() && offsets_[i] >= buckets_[bucket].second) ++bucket;
    MEGATRON_ASSERT(bucket < buckets_.size(), params_[i]->name, " lies outside every bucket");
    param_bucket_[params_[i]] = static_cast<int64_t>(bucket);
    bucket_params_[bucket].push_back(params_[i]);
    bucket_param_offsets_[bucket].push_back(offsets_[i] - buckets_[bucket].first);
  }
}

int64_t ParamSet::bucket_of(const Param& p) const {
  MEGATRON_ASSERT(bucketed_, "bucket_of(", p.name, ") on a ParamSet without buckets");
  const auto it = param_bucket_.find(&p);
  MEGATRON_ASSERT(it != param_bucket_.end(), "parameter ", p.name, " is not in this set");
  return it->second;
}

std::pair<int64_t, int64_t> ParamSet::owned_range(int64_t bucket) const {
  if (!owned_.empty()) return owned_[static_cast<size_t>(bucket)];
  if (bucketed_) return buckets_[static_cast<size_t>(bucket)];
  return {0, trainable_};
}

namespace {
// The shard of bucket `i` in `buf`: compact when that kind is sharded, else at its full place.
Tensor shard_view(Tensor& buf, bool sharded, int64_t compact_offset,
                  std::pair<int64_t, int64_t> range) {
  const int64_t n = range.second - range.first;
  return buf.flat_view(sharded ? compact_offset : range.first, {n});
}
}  // namespace

Tensor ParamSet::main_shard(int64_t bucket) {
  const int64_t at = main_sharded() ? shard_offsets_[bucket] : 0;
  return shard_view(main_, main_sharded(), at, owned_range(bucket));
}

Tensor ParamSet::grad_shard(int64_t bucket) {
  const int64_t at = sharding_.grads ? shard_offsets_[bucket] : 0;
  return shard_view(grads_, sharding_.grads, at, owned_range(bucket));
}

Tensor ParamSet::compute_view(int64_t at, const Shape& shape, bool fp8) {
  if (!fp8) return compute_.flat_view(at, shape);
  return codes_.flat_view(at - (sharding_.weights ? fp8_shard_begin_ : fp8_begin_), shape);
}

Tensor ParamSet::compute_shard(int64_t bucket) {
  const auto [s0, s1] = owned_range(bucket);
  const int64_t at = sharding_.weights ? shard_offsets_[bucket] : s0;
  return compute_view(at, {s1 - s0}, fp8_bucket(bucket));
}

Tensor ParamSet::compute_bucket(int64_t bucket) {
  MEGATRON_ASSERT(!sharding_.weights, "compute_bucket(", bucket, ") of sharded weights");
  const auto [b, e] = buckets_[static_cast<size_t>(bucket)];
  return compute_view(b, {e - b}, fp8_bucket(bucket));
}

void ParamSet::attach_weights(int64_t bucket, const Tensor& full) {
  const auto [b, e] = buckets_[static_cast<size_t>(bucket)];
  const DType want = fp8_bucket(bucket) ? DType::kU8 : compute_.dtype();
  MEGATRON_ASSERT(full.numel() == e - b && full.dtype() == want, "attach_weights: bucket ", bucket,
                  " needs ", e - b, " ", dtype_name(want), " elements, got ", full.str());
  const bool same = compute_.raw() == main_.raw();
  const auto& ps = bucket_params_[static_cast<size_t>(bucket)];
  for (size_t k = 0; k < ps.size(); ++k) {
    if (ps[k]->frozen) continue;  // its private copy
    ps[k]->value =
        full.flat_view(bucket_param_offsets_[static_cast<size_t>(bucket)][k], ps[k]->shape);
    if (same) ps[k]->main = ps[k]->value;
  }
}

void ParamSet::attach_main(int64_t bucket, const Tensor& full) {
  const auto [b, e] = buckets_[static_cast<size_t>(bucket)];
  MEGATRON_ASSERT(full.numel() == e - b && full.dtype() == main_.dtype(), "attach_main: bucket ",
                  bucket, " needs ", e - b, " elements, got ", full.str());
  const bool same = compute_.raw() == main_.raw();
  const auto& ps = bucket_params_[static_cast<size_t>(bucket)];
  for (size_t k = 0; k < ps.size(); ++k) {
    if (ps[k]->frozen) continue;  // its private copy
    ps[k]->main =
        full.flat_view(bucket_param_offsets_[static_cast<size_t>(bucket)][k], ps[k]->shape);
    if (same) ps[k]->value = ps[k]->main;
  }
}

void ParamSet::detach_main(int64_t bucket) {
  const bool same = compute_.raw() == main_.raw();
  for (Param* p : bucket_params_[static_cast<size_t>(bucket)]) {
    if (p->frozen) continue;
    p->main = Tensor();
    if (same) p->value = Tensor();
  }
}

void ParamSet::detach_weights(int64_t bucket) {
  for (Param* p : bucket_params_[static_cast<size_t>(bucket)]) {
    if (!p->frozen) p->value = p->main = Tensor();
  }
}

void ParamSet::attach_grads(int64_t bucket, const Tensor& full) {
  const auto [b, e] = buckets_[static_cast<size_t>(bucket)];
  MEGATRON_ASSERT(full.numel() == e - b && full.dtype() == grads_.dtype(), "attach_grads: bucket ",
                  bucket, " needs ", e - b, " elements, got ", full.str());
  const auto& ps = bucket_params_[static_cast<size_t>(bucket)];
  for (size_t k = 0; k < ps.size(); ++k)
    ps[k]->main_grad =
        full.flat_view(bucket_param_offsets_[static_cast<size_t>(bucket)][k], ps[k]->shape);
}

void ParamSet::detach_grads(int64_t bucket) {
  for (Param* p : bucket_params_[static_cast<size_t>(bucket)]) p->main_grad = Tensor();
}

void ParamSet::allocate(int64_t total) {
  // f64 models (gradient checks in tests) keep everything in double.
  DType master = compute_dtype_ == DType::kF64 ? DType::kF64 : DType::kF32;
  // Sharded kinds: only this rank's shards, one after the other.
  const int64_t shards = shard_offsets_.empty()
                             ? 0
                             : shard_offsets_.back() + owned_.back().second - owned_.back().first;
  MEGATRON_CHECK(!sharding_.main || compute_dtype_ != master,
                 "sharding the main weights alone needs a 16-bit compute copy (in fp32 runs the "
                 "compute weights are the main weights: shard the weights)");
  const bool fp8 = first_fp8_bucket_ < static_cast<int64_t>(buckets_.size());
  MEGATRON_CHECK(!fp8 || (compute_dtype_ == DType::kBF16 && main_sharded()),
                 "FP8 primary weights (--fp8-param-gather) need bf16 compute weights and fp32 "
                 "main weights sharded by the distributed optimizer");
  // The compute copy of the buckets before the FP8 ones; the FP8 ones' codes after.
  // (Without FP8 weights, all of it: the parameters without gradients after the buckets too.)
  const int64_t weights = sharding_.weights ? fp8_shard_begin_ : fp8 ? fp8_begin_ : total;
  main_ = Tensor::zeros({main_sharded() ? shards : total}, master, device_);
  grads_ = Tensor::zeros({sharding_.grads ? shards : trainable_}, master, device_);
  compute_ = compute_dtype_ == master ? main_ : Tensor::zeros({weights}, compute_dtype_, device_);
  if (fp8) {
    codes_ =
        Tensor::zeros({sharding_.weights ? shards - fp8_shard_begin_ : trainable_ - fp8_begin_},
                      DType::kU8, device_);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = *params_[i];
    if (main_sharded() && p.frozen) {
      // Read and updated outside the optimizer (the routers' expert bias): whole and private.
      p.main = Tensor::zeros(p.shape, master, device_);
      p.value = compute_dtype_ == master ? p.main : Tensor::zeros(p.shape, compute_dtype_, device_);
    } else {
      if (!main_sharded()) p.main = main_.flat_view(offsets_[i], p.shape);
      if (!sharding_.weights) p.value = compute_view(offsets_[i], p.shape, p.fp8 != nullptr);
    }
    if (!sharding_.grads && p.requires_grad) p.main_grad = grads_.flat_view(offsets_[i], p.shape);
  }
}

void ParamSet::plan_shards() {
  if (!sharding_.grads && !sharding_.weights && !sharding_.main) return;
  MEGATRON_CHECK(sharding_.dense_size >= 1 && sharding_.expert_size >= 0,
                 "sharding group sizes must be positive");
  int64_t total = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const auto [b, e] = buckets_[i];
    const auto& ps = bucket_params_[i];
    bool expert = sharding_.expert_size > 0 && !ps.empty();
    for (const Param* p : ps) expert = expert && p->expert_parallel;
    const int64_t r = expert ? sharding_.expert_rank : sharding_.dense_rank;
    const int64_t n = expert ? sharding_.expert_size : sharding_.dense_size;
    MEGATRON_CHECK((e - b) % n == 0, "bucket [", b, ", ", e, ") does not split into ", n,
                   " shards; lay it out with distributed_bucket_layout");
    const int64_t s0 = b + r * (e - b) / n, s1 = s0 + (e - b) / n;
    owned_.emplace_back(s0, s1);
    shard_offsets_.push_back(total);
    for (size_t k = 0; k < ps.size(); ++k) {
      const int64_t off = b + bucket_param_offsets_[i][k];
      const int64_t lo = std::max(off, s0), hi = std::min(off + ps[k]->shape.numel(), s1);
      if (lo < hi) segments_.push_back({ps[k], lo - off, hi - lo, total + lo - s0});
    }
    total += s1 - s0;
  }
  fp8_shard_begin_ = first_fp8_bucket_ < static_cast<int64_t>(buckets_.size())
                         ? shard_offsets_[static_cast<size_t>(first_fp8_bucket_)]
                         : total;
}

namespace {
// Element `full` of a tensor initialised by `init` (scale: the normal's std or the uniform's
// bound).
double init_value(Init init, double scale, uint64_t seed, uint64_t stream, uint64_t full) {
  if (init == Init::kNormal) return scale * Philox::normal(seed, stream, full);
  const double u = Philox::uniform(seed, stream, full);
  if (init == Init::kMambaALog) return std::log(1.0 + 15.0 * u);
  if (init == Init::kMambaDtBias) {
    const double lo = std::log(0.001), hi = std::log(0.1);
    const double dt = std::max(std::exp(lo + u * (hi - lo)), 1e-4);
    return dt + std::log(-std::expm1(-dt));  // softplus^-1(dt)
  }
  return scale * (2.0 * u - 1.0);
}

// Elements [begin, begin + out.numel()) of p's (local) initial values into `out`.
void init_elements(const Param& p, int64_t begin, uint64_t seed, Tensor out) {
  switch (p.init) {
    case Init::kZeros:
      out.zero();
      return;
    case Init::kOnes:
      out.fill(1.0);
      return;
    case Init::kNormal:
    case Init::kXavierUniform:
    case Init::kUniform:
    case Init::kMambaALog:
    case Init::kMambaDtBias:
      break;
  }
  double scale = p.init_std;
  if (p.init == Init::kXavierUniform) {
    const Shape full_shape = p.full_shape();
    MEGATRON_ASSERT(full_shape.ndim() == 2, "Xavier init of ", p.name, " needs a matrix");
    scale = std::sqrt(6.0 / static_cast<double>(full_shape[0] + full_shape[1]));
  }
  Tensor tmp = Tensor::empty({out.numel()}, DType::kF64);
  double* d = tmp.data<double>();
  const uint64_t stream = stable_hash(p.name);
  const bool shard = p.is_tensor_parallel();
  // Every element is its own Philox draw, so threads give the same values (a 124M-parameter
  // model's Box-Muller draws took 5.5 s on one core). full_index's layout checks depend on the
  // shape alone: run once here, where a failure can throw.
  if (shard) (void)p.full_index(begin);
#pragma omp parallel for schedule(static) if (tmp.numel() > 65536)
  for (int64_t k = 0; k < tmp.numel(); ++k) {
    const int64_t i = begin + k;
    const auto full = static_cast<uint64_t>(shard ? p.full_index(i) : i);
    d[k] = init_value(p.init, scale, seed, stream, full);
  }
  out.copy_from(tmp.view(out.shape()));
}
}  // namespace

void ParamSet::initialize(uint64_t seed) {
  if (!main_sharded()) {
    for (Param* p : params_) init_elements(*p, 0, seed, p->main);
    sync_compute_from_main();
    return;
  }
  for (const OwnedSegment& s : segments_) {
    if (!s.param->frozen)
      init_elements(*s.param, s.param_begin, seed, main_.flat_view(s.at, {s.numel}));
  }
  for (Param* p : params_) {
    if (p->frozen) init_elements(*p, 0, seed, p->main);
  }
  sync_compute_from_main();
  if (!sharding_.weights) {
    // The whole compute copy too (every rank holds it): the same values, rounded.
    for (Param* p : params_) {
      if (p->frozen || p->fp8) continue;  // FP8 codes: the distributed optimizer quantises them
      Tensor full = Tensor::empty(p->shape, main_.dtype(), device_);
      init_elements(*p, 0, seed, full);
      p->value.copy_from(full);
    }
  }
}

void ParamSet::set_main(const Param& p, const Tensor& t) {
  MEGATRON_CHECK(t.numel() == p.shape.numel(), "set_main(", p.name, "): ", t.numel(),
                 " elements for a parameter of shape ", p.shape.str());
  if (!main_sharded() || p.frozen) {
    const_cast<Param&>(p).main.copy_from(t.view(p.shape));
    return;
  }
  const Tensor flat = t.dtype() == main_.dtype() ? t : t.to(main_.dtype());
  for (const OwnedSegment& s : segments_) {
    if (s.param == &p)
      main_.flat_view(s.at, {s.numel}).copy_from(flat.flat_view(s.param_begin, {s.numel}));
  }
  // The whole compute copy (main weights sharded alone): its own value, rounded.
  if (!sharding_.weights && !p.fp8) const_cast<Param&>(p).value.copy_from(flat.view(p.shape));
}

void ParamSet::zero_grads() {
  grads_.zero();
  for (Param* p : params_) p->main_grad_zero = true;
}

void ParamSet::sync_frozen_compute() {
  if (!main_sharded()) return;
  for (Param* p : params_) {
    if (p->frozen && p->value.raw() != p->main.raw()) p->value.copy_from(p->main);
  }
}

void ParamSet::sync_compute_from_main() {
  sync_frozen_compute();
  if (compute_.raw() == main_.raw()) return;
  if (main_sharded()) {
    // Only this rank's shards (the distributed optimizer all-gathers the rest of a whole compute
    // copy; the FSDP runtime gathers sharded weights around their use). The FP8 buckets' codes
    // are the distributed optimizer's: quantising them takes the FP8 scaling state.
    for (int64_t b = 0; b < first_fp8_bucket_; ++b) compute_shard(b).copy_from(main_shard(b));
    return;
  }
  compute_.copy_from(main_);
}

void ParamSet::sync_compute_from_main(int64_t begin, int64_t end) {
  if (compute_.raw() == main_.raw() || end <= begin) return;
  compute_.flat_view(begin, {end - begin}).copy_from(main_.flat_view(begin, {end - begin}));
}

Param& ParamSet::find(const std::string& name) const {
  for (Param* p : params_)
    if (p->name == name) return *p;
  MEGATRON_CHECK(false, "no parameter named '", name, "' in the model");
  __builtin_unreachable();
}

int64_t ParamSet::offset_of(const Param& p) const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i] == &p) return offsets_[i];
  MEGATRON_ASSERT(false, "parameter ", p.name, " is not in this set");
  return -1;
}

}  // namespace megatron
