// The distributed optimizer (ZeRO-1) under a real MPI job (CTest runs this binary under mpiexec
// with 2 and 4 processes): ParamSet's padded bucket layout, GradBuckets' reduce-scatter mode, and
// DistributedOptimizer against the plain path (GradBuckets all-reduce + AdamW on every rank).
//
// Data-parallel groups: the world, a size-1 group (make_self_process_group), and for the 4-rank
// run also the two halves of the world (split), so dp 1, 2 and 4 are all exercised.
//
// Exactness. Rank r's gradient element j of parameter k at step t is (r + 1) f(k, j, t), f a
// multiple of 1/4 with |f| <= 1.5. For a power-of-two dp (every group here) scaling by 1/dp is
// exact and every partial sum of the reduction is a multiple of 1/(4 dp) of magnitude at most
// 0.75 (dp + 1), well inside f32's 24 bits: the sums are exact in any order, so the
// reduce-scatter and the all-reduce give the same mean bit for bit whichever algorithm MPI picks
// for each (with arbitrary values they could differ in the last bit, as Open MPI's reduce-scatter
// and all-reduce may add the ranks' terms in different orders, and only a tolerance would do).
// The squares of the means are multiples of 1/64 below 16, so the sums of squares are exact in
// double too, in any grouping (the distributed one is a sum over shards, then over DP): the norms
// are equal bit for bit, hence the clipping factors, hence the clipped gradients. AdamW is
// elementwise, the same code on the same inputs: main weights, moments and compute copies are
// compared exactly, no tolerance. (An element may fall in the vectorised body of one call and in
// the scalar tail of the other, as the slices start at different places; the exact comparison
// also checks that both round alike.)
//
// Every rank runs the same tests in the same order with the same collectives; an expected
// exception is thrown on every rank before anything is launched; checks use EXPECT, ASSERT only
// on facts that are the same on every rank of a group. A failure on any rank fails every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "comm/mpi_runtime.h"
#include "comm/process_group.h"
#include "core/error.h"
#include "optim/adamw.h"
#include "optim/distributed_optimizer.h"
#include "parallel/grad_buckets.h"
#include "parallel/param.h"
#include "tensor/tensor.h"
#include "testing/mpi_testing.h"

namespace megatron {
namespace {

MpiRuntime* g_runtime = nullptr;

ProcessGroup& world() {
  return *g_runtime->world();
}

// One parameter of the test model.
struct Spec {
  int64_t numel;
  bool no_weight_decay = false;
  bool embedding = false;  // is_embedding_or_output: a bucket of its own in the padded layout
  bool duplicate = false;  // a TP replica on TP rank 1: left out of the norm
};

// Registration order; odd sizes, so the 16-element alignment pads most of them, and the padded
// buckets' shards start and end inside parameters. 400 elements laid out, 303 of them parameters.
const std::vector<Spec> kSpecs = {
    {37, false, true},         // "word embeddings": registered first, laid out last
    {5, true},                 // a bias
    {17},                      //
    {3, true},                 // a norm weight
    {130},                     // spans several shards
    {40, false, false, true},  // a duplicate
    {1, true},                 //
    {70},                      //
};

struct Model {
  Model(const std::vector<Spec>& specs, DType dtype) : params(make(specs)), set(ptrs(), dtype) {}
  Model(const std::vector<Spec>& specs, DType dtype, const BucketLayout& layout)
      : params(make(specs)), set(ptrs(), dtype, layout) {}
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  static std::vector<Param> make(const std::vector<Spec>& specs) {
    std::vector<Param> out(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      Param& p = out[i];
      p.name = "p" + std::to_string(i);
      p.shape = Shape{specs[i].numel};
      p.no_weight_decay = specs[i].no_weight_decay;
      p.is_embedding_or_output = specs[i].embedding;
      if (specs[i].duplicate) p.tp_rank = 1, p.tp_size = 2;
    }
    return out;
  }
  std::vector<Param*> ptrs() {
    std::vector<Param*> out;
    for (Param& p : params) out.push_back(&p);
    return out;
  }

  std::vector<Param> params;  // registration order
  ParamSet set;
};

// f(k, j, t): a multiple of 1/4 in [-1.5, 1.5].
float pattern(size_t k, int64_t j, int step) {
  return static_cast<float>((j * 7 + static_cast<int64_t>(k) * 5 + step * 3) % 13 - 6) * 0.25f;
}

// Every parameter element of this rank's gradient (padding stays zero, as backward leaves it).
void fill(Model& m, int rank, int step) {
  for (size_t k = 0; k < m.params.size(); ++k) {
    Tensor& g = m.params[k].main_grad;
    float* d = g.data<float>();
    for (int64_t j = 0; j < g.numel(); ++j)
      d[j] = static_cast<float>(rank + 1) * pattern(k, j, step);
  }
}

// Backward order: the last registered parameter is final first.
void mark_all_backward(GradBuckets& gb, Model& m) {
  for (size_t i = m.params.size(); i-- > 0;) {
    gb.mark_ready(m.params[i]);
    gb.poll();
  }
}

std::string where(const ProcessGroup& dp) {
  return " (world rank " + std::to_string(g_runtime->rank()) + ", dp rank " +
         std::to_string(dp.rank()) + " of " + std::to_string(dp.size()) + ")";
}

// got[i] == want[i] for every i, bit for bit (both as doubles: exact for f32 and bf16).
void expect_equal(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (got.item(i) != want.item(i)) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.numel() << " elements differ, first at "
                    << first << ": got " << (first >= 0 ? got.item(first) : 0.0) << ", want "
                    << (first >= 0 ? want.item(first) : 0.0);
}

// The data-parallel groups to run on: size 1, every power-of-two part of the world, the world.
struct Groups {
  Groups() {
    self = make_self_process_group();
    list.push_back(self.get());
    const int n = world().size();
    for (int s = 2; s < n; s *= 2) {
      if (n % s != 0) continue;
      RankGroups parts;
      for (int g = 0; g < n / s; ++g) {
        parts.emplace_back();
        for (int i = 0; i < s; ++i) parts.back().push_back(g * s + i);
      }
      owned.push_back(world().split(parts));
      list.push_back(owned.back().get());
    }
    if (n > 1) list.push_back(&world());
  }
  std::shared_ptr<ProcessGroup> self;
  std::vector<std::shared_ptr<ProcessGroup>> owned;
  std::vector<ProcessGroup*> list;
};

// Built in main (collective: the split) and released there before MPI is finalised.
std::unique_ptr<Groups> g_groups;
Groups& groups() {
  return *g_groups;
}

// ---- the padded layout ------------------------------------------------------------------------

TEST(DistributedLayout, BucketsArePaddedAndCutAtParameterBoundaries) {
  for (int dp : {1, 2, 4, 3, 16}) {
    for (int64_t bucket_size : {int64_t{0}, int64_t{1}, int64_t{50}, int64_t{150}}) {
      const BucketLayout layout = distributed_bucket_layout(bucket_size, dp);
      const std::string at =
          "dp " + std::to_string(dp) + ", bucket_size " + std::to_string(bucket_size);
      // lcm(16 dp, 128): Megatron's lcm(dp, 128) for these dp except 16 (256 instead of 128).
      EXPECT_EQ(layout.pad_multiple, std::lcm(int64_t{16} * dp, int64_t{128})) << at;
      EXPECT_EQ(layout.pad_multiple % dp, 0) << at;
      EXPECT_EQ(layout.pad_multiple / dp % 16, 0) << at << ": shards are not 16-aligned";
      Model m(kSpecs, DType::kF32, layout);
      ASSERT_TRUE(m.set.bucketed()) << at;
      const auto& buckets = m.set.bucket_ranges();
      ASSERT_FALSE(buckets.empty()) << at;
      std::set<int64_t> offsets;
      for (const Param& p : m.params) offsets.insert(m.set.offset_of(p));
      int64_t next = 0;
      for (size_t b = 0; b < buckets.size(); ++b) {
        const auto [begin, end] = buckets[b];
        EXPECT_EQ(begin, next) << at << ", bucket " << b << ": gap or overlap";
        EXPECT_TRUE(offsets.count(begin)) << at << ", bucket " << b << " starts inside a param";
        EXPECT_EQ((end - begin) % layout.pad_multiple, 0) << at << ", bucket " << b;
        next = end;
      }
      EXPECT_EQ(next, m.set.numel()) << at;
      for (size_t k = 0; k < m.params.size(); ++k) {
        const Param& p = m.params[k];
        const int64_t off = m.set.offset_of(p);
        EXPECT_EQ(off % 16, 0) << at << ": " << p.name << " is not aligned";
        for (const auto& [begin, end] : buckets) {
          if (off < begin || off >= end) continue;
          EXPECT_LE(off + p.shape.numel(), end) << at << ": " << p.name << " crosses a bucket end";
          // The embedding is alone in its bucket, at its start, so two pipeline stages' copies
          // have the same shards.
          if (kSpecs[k].embedding) {
            EXPECT_EQ(off, begin) << at;
            EXPECT_EQ(end - begin, (p.shape.numel() + layout.pad_multiple - 1) /
                                       layout.pad_multiple * layout.pad_multiple)
                << at << ": the embedding shares its bucket";
          }
        }
      }
      // Without the embedding's own bucket, the cuts are GradBuckets' own rule's.
      std::vector<Spec> plain(kSpecs.begin() + 1, kSpecs.end());
      Model q(plain, DType::kF32, layout);
      const GradBuckets gb(q.set, *groups().self, bucket_size, /*overlap=*/false);
      ASSERT_EQ(gb.num_buckets(), static_cast<int64_t>(q.set.bucket_ranges().size())) << at;
      for (int64_t b = 0; b < gb.num_buckets(); ++b) {
        EXPECT_EQ(gb.bucket_range(b), q.set.bucket_ranges()[b]) << at << ", bucket " << b;
      }
    }
  }
}

TEST(DistributedLayout, OnlyTheGapsChange) {
  // Same parameters, default and padded layouts: same order, same sizes, each param at or after
  // its default offset; the default layout is the dense 16-aligned reverse one.
  Model dense(kSpecs, DType::kF32);
  Model padded(kSpecs, DType::kF32, distributed_bucket_layout(50, 4));
  EXPECT_FALSE(dense.set.bucketed());
  EXPECT_TRUE(dense.set.bucket_ranges().empty());
  EXPECT_EQ(dense.set.numel(), 400);
  int64_t expect = 0;
  for (size_t k = kSpecs.size(); k-- > 0;) {
    EXPECT_EQ(dense.set.offset_of(dense.params[k]), expect) << dense.params[k].name;
    EXPECT_GE(padded.set.offset_of(padded.params[k]), expect) << padded.params[k].name;
    expect += (kSpecs[k].numel + 15) / 16 * 16;
  }
  EXPECT_THROW(Model(kSpecs, DType::kF32, BucketLayout{0, 24}), InvalidArgument);
  EXPECT_THROW(Model(kSpecs, DType::kF32, BucketLayout{0, 0}), InvalidArgument);
}

// ---- reduce-scatter buckets -------------------------------------------------------------------

// Elements of the owned shards equal the closed-form mean over dp ranks, (dp + 1) / 2 f.
void expect_owned_mean(Model& m, const GradBuckets& gb, int step, const std::string& what) {
  const int dp = gb.dp_group().size();
  for (size_t k = 0; k < m.params.size(); ++k) {
    const int64_t off = m.set.offset_of(m.params[k]);
    for (int64_t b = 0; b < gb.num_buckets(); ++b) {
      const auto [s0, s1] = gb.shard_range(b);
      int64_t bad = 0;
      for (int64_t e = std::max(off, s0); e < std::min(off + m.params[k].shape.numel(), s1); ++e) {
        const double want = static_cast<double>(pattern(k, e - off, step)) * (dp + 1) / 2.0;
        if (m.set.grads().item(e) != want) ++bad;
      }
      EXPECT_EQ(bad, 0) << what << where(gb.dp_group()) << ": " << m.params[k].name << " in bucket "
                        << b << "'s shard";
    }
  }
}

TEST(ReduceScatterBuckets, ShardsTileEachBucketAndHoldTheMean) {
  for (ProcessGroup* dp : groups().list) {
    for (int64_t bucket_size : {int64_t{0}, int64_t{1}, int64_t{50}, int64_t{150}}) {
      for (bool overlap : {false, true}) {
        const std::string at =
            "bucket_size " + std::to_string(bucket_size) + (overlap ? ", overlap" : ", no overlap");
        Model m(kSpecs, DType::kF32, distributed_bucket_layout(bucket_size, dp->size()));
        GradBuckets gb(m.set, *dp, bucket_size, overlap, GradReduce::kReduceScatter);
        ASSERT_EQ(gb.num_buckets(), static_cast<int64_t>(m.set.bucket_ranges().size())) << at;
        for (int64_t b = 0; b < gb.num_buckets(); ++b) {
          const auto [begin, end] = gb.bucket_range(b);
          EXPECT_EQ(std::make_pair(begin, end), m.set.bucket_ranges()[b]) << at;
          const int64_t n = (end - begin) / dp->size();
          EXPECT_EQ(n * dp->size(), end - begin) << at;
          EXPECT_EQ(gb.shard_range(b),
                    std::make_pair(begin + dp->rank() * n, begin + (dp->rank() + 1) * n))
              << at << where(*dp);
        }
        for (int step = 0; step < 2; ++step) {
          gb.reset();
          m.set.zero_grads();
          fill(m, dp->rank(), step);
          if (overlap) mark_all_backward(gb, m);
          gb.finish();
          expect_owned_mean(m, gb, step, at + ", step " + std::to_string(step));
        }
      }
    }
  }
}

TEST(ReduceScatterBuckets, OverlapWithOnlyTheFirstBucketMarked) {
  for (ProcessGroup* dp : groups().list) {
    Model m(kSpecs, DType::kF32, distributed_bucket_layout(50, dp->size()));
    GradBuckets gb(m.set, *dp, 50, /*overlap=*/true, GradReduce::kReduceScatter);
    gb.reset();
    fill(m, dp->rank(), 0);
    const int64_t end0 = gb.bucket_range(0).second;
    for (size_t i = m.params.size(); i-- > 0;) {
      if (m.set.offset_of(m.params[i]) < end0) gb.mark_ready(m.params[i]);
    }
    gb.poll();
    gb.finish();
    expect_owned_mean(m, gb, 0, "bucket 0 marked");
  }
}

// --ddp-reduce-scatter-with-fp32-accumulation: each owned shard element is the f32 sum, in rank
// order, of every rank's element scaled by 1 / dp (and rounded to bf16 first with
// --grad-reduce-in-bf16, the sum rounded to bf16 once), written to the fp32 buffer. The gradients
// here are arbitrary (not exact in bf16, sums that round), so a reduction in another order or
// precision misses the expected bits somewhere; the reference is the same rounding steps taken
// by Tensor's own conversions and f32 additions, so the comparison is exact. The bytes sent: half
// the plain reduce-scatter's with bf16 (which sends f32), the same with f32.
TEST(ReduceScatterBuckets, Fp32AccumulationSumsTheRanksCopiesInRankOrder) {
  auto value = [](int rank, int64_t e) {
    return static_cast<float>(std::sin(0.37 * static_cast<double>(e) + 1.3 * rank) *
                              (1.0 + 0.01 * rank));
  };
  for (ProcessGroup* dp : groups().list) {
    if (dp->size() == 1) continue;  // nothing to reduce: the gradients stay as they are
    for (bool bf16 : {false, true}) {
      for (bool overlap : {false, true}) {
        const std::string at = std::string(bf16 ? "bf16" : "f32") + (overlap ? ", overlap" : "");
        Model m(kSpecs, DType::kF32, distributed_bucket_layout(50, dp->size()));
        GradBuckets gb(m.set, *dp, 50, overlap, GradReduce::kReduceScatter);
        gb.set_reduce_in_bf16(bf16);
        gb.set_fp32_accumulation(true);
        gb.reset();
        const int64_t n = m.set.numel();
        // Every rank's gradients as this rank would reduce them: scaled by 1 / dp (exact for
        // the power-of-two groups here), rounded to bf16 where the reduction runs in bf16.
        std::vector<Tensor> sent;
        for (int r = 0; r < dp->size(); ++r) {
          Tensor t = Tensor::empty({n}, DType::kF32);
          for (int64_t e = 0; e < n; ++e)
            t.data<float>()[e] = value(r, e) / static_cast<float>(dp->size());
          sent.push_back(bf16 ? t.to(DType::kBF16).to(DType::kF32) : t);
        }
        Tensor want = sent[0].clone();
        for (int r = 1; r < dp->size(); ++r) {
          for (int64_t e = 0; e < n; ++e) want.data<float>()[e] += sent[r].data<float>()[e];
        }
        if (bf16) want = want.to(DType::kBF16).to(DType::kF32);
        for (int64_t e = 0; e < n; ++e) m.set.grads().data<float>()[e] = value(dp->rank(), e);
        const int64_t bytes0 = dp->bytes_sent();
        if (overlap) mark_all_backward(gb, m);
        gb.finish();
        const int64_t bytes = dp->bytes_sent() - bytes0;
        int64_t bad = 0, owned = 0;
        for (int64_t b = 0; b < gb.num_buckets(); ++b) {
          const auto [s0, s1] = gb.shard_range(b);
          for (int64_t e = s0; e < s1; ++e, ++owned) {
            if (m.set.grads().data<float>()[e] != want.data<float>()[e]) ++bad;
          }
        }
        EXPECT_GT(owned, 0) << at;
        EXPECT_EQ(bad, 0) << at << where(*dp) << ": " << bad << " of " << owned
                          << " owned elements";
        // The plain reduce-scatter of the same buckets sends f32 (bf16 through its f32
        // accumulator): the all-to-all sends the reduction dtype, half of it in bf16.
        Model plain(kSpecs, DType::kF32, distributed_bucket_layout(50, dp->size()));
        GradBuckets pb(plain.set, *dp, 50, false, GradReduce::kReduceScatter);
        pb.set_reduce_in_bf16(bf16);
        pb.reset();
        const int64_t plain0 = dp->bytes_sent();
        pb.finish();
        EXPECT_EQ(bytes * (bf16 ? 2 : 1), dp->bytes_sent() - plain0) << at << where(*dp);
      }
    }
  }
}

TEST(ReduceScatterBuckets, MisuseIsRefused) {
  ProcessGroup& dp = world();
  Model dense(kSpecs, DType::kF32);
  EXPECT_THROW(GradBuckets(dense.set, dp, 50, false, GradReduce::kReduceScatter), InvalidArgument);
  Model padded(kSpecs, DType::kF32, distributed_bucket_layout(50, dp.size()));
  EXPECT_THROW(GradBuckets(padded.set, dp, 60, false, GradReduce::kReduceScatter), InvalidArgument);
  GradBuckets all_reduce(padded.set, dp, 50, false);
  EXPECT_THROW(DistributedOptimizer(all_reduce, AdamWConfig{}), InvalidArgument);
  all_reduce.finish();  // every rank reduces, so the collectives still pair up
}

// ---- the optimizer against the plain path -----------------------------------------------------

struct Case {
  int64_t bucket_size;
  bool overlap;
  bool megatron_padding;  // distributed_bucket_layout's; else the smallest, 16 dp (more splits)
  DType dtype;
  // The precision-aware optimizer's moment storage (fp16 and fp8 only with dp 1, see below).
  MomentDType exp_avg = MomentDType::kF32, exp_avg_sq = MomentDType::kF32;
};

// The reference's moments as the distributed optimizer stores them: after each AdamW step of the
// reference, every owned segment of `opt` (dp 1: all of them) goes through a MomentStorage of the
// same kind (MomentStorage's own rules are checked in test_moment_storage.cpp; this checks that
// the optimizer scales per segment, reads the moments back before the next update and uses the
// unrounded ones for this one). bf16 rounds elementwise, so any dp works for it.
void store_like(Tensor& ref_moment, MomentDType t, const DistributedOptimizer& opt,
                const Model& dist, const Model& ref) {
  if (t == MomentDType::kF32) return;
  if (t == MomentDType::kBF16) {  // elementwise: other ranks' segments too
    ref_moment.copy_from(ref_moment.to(DType::kBF16));
    return;
  }
  std::vector<std::pair<int64_t, int64_t>> groups;
  for (const auto& seg : opt.owned_segments()) {
    size_t k = 0;
    while (&dist.params[k] != seg.param) ++k;
    const int64_t at = ref.set.offset_of(ref.params[k]) + seg.param_begin;
    groups.emplace_back(at, at + seg.numel);
  }
  MomentStorage storage(ref_moment.numel(), t, DType::kF32, Device::kCPU, groups);
  for (int64_t g = 0; g < storage.num_groups(); ++g) {
    const auto [b, e] = groups[static_cast<size_t>(g)];
    Tensor slice = ref_moment.flat_view(b, {e - b});
    Tensor v = slice.clone();
    storage.store(g, v);
    slice.copy_from(storage.unscaled(g));
  }
}

void run_equivalence(ProcessGroup& dp, const Case& c) {
  const std::string at = "bucket_size " + std::to_string(c.bucket_size) +
                         (c.overlap ? ", overlap" : ", no overlap") +
                         (c.megatron_padding ? ", lcm padding" : ", 16 dp padding") + ", " +
                         dtype_name(c.dtype) + ", moments " + moment_dtype_name(c.exp_avg) + "/" +
                         moment_dtype_name(c.exp_avg_sq) + where(dp);
  const AdamWConfig cfg{0.9, 0.95, 1e-8, 0.1};
  const double max_norm = 1.0;  // below every step's norm: clipping is active
  constexpr int kSteps = 5;
  constexpr uint64_t kSeed = 1234;

  // Reference: dense layout, all-reduce (one bucket: the sums are exact, so bucketing cannot
  // change them), AdamW over the whole buffer on every rank.
  Model ref(kSpecs, c.dtype);
  ref.set.initialize(kSeed);
  GradBuckets ref_buckets(ref.set, dp, /*bucket_size=*/0, /*overlap=*/false);
  AdamW ref_opt(ref.set, cfg);

  BucketLayout layout = distributed_bucket_layout(c.bucket_size, dp.size());
  if (!c.megatron_padding) layout.pad_multiple = 16 * dp.size();
  Model dist(kSpecs, c.dtype, layout);
  dist.set.initialize(kSeed);
  GradBuckets buckets(dist.set, dp, c.bucket_size, c.overlap, GradReduce::kReduceScatter);
  AdamWConfig stored = cfg;
  stored.exp_avg_dtype = c.exp_avg;
  stored.exp_avg_sq_dtype = c.exp_avg_sq;
  DistributedOptimizer opt(buckets, stored);

  // Memory: the two moments of the owned elements only, 1/dp of the padded buffer.
  EXPECT_EQ(opt.owned_numel() * dp.size(), dist.set.numel()) << at;
  EXPECT_EQ(
      opt.state_bytes(),
      (moment_element_bytes(c.exp_avg) + moment_element_bytes(c.exp_avg_sq)) * opt.owned_numel())
      << at;

  for (int step = 0; step < kSteps; ++step) {
    const std::string at_step = at + ", step " + std::to_string(step + 1);
    const double lr = 1e-2 * (step + 1);

    ref.set.zero_grads();
    ref_buckets.reset();
    fill(ref, dp.rank(), step);
    ref_buckets.finish();
    const double ref_norm = std::sqrt(grad_sum_squares_unique(ref.set));
    clip_grads(ref.set, max_norm, ref_norm);
    ref_opt.step(lr);
    store_like(ref_opt.exp_avg(), c.exp_avg, opt, dist, ref);
    store_like(ref_opt.exp_avg_sq(), c.exp_avg_sq, opt, dist, ref);

    dist.set.zero_grads();
    buckets.reset();
    fill(dist, dp.rank(), step);
    if (c.overlap) mark_all_backward(buckets, dist);
    buckets.finish();
    Tensor sq = Tensor::full({1}, opt.grad_sum_squares_unique(), DType::kF64);
    dp.all_reduce(sq);  // (the trainer: then over the model-parallel group too)
    const double norm = std::sqrt(sq.item());
    EXPECT_EQ(norm, ref_norm) << at_step << ": grad norm";
    EXPECT_GT(norm, max_norm) << at_step << ": clipping is not exercised";
    EXPECT_TRUE(opt.grads_finite()) << at_step;
    // Clipping fused into the update equals clipping the gradients in place first (the
    // reference), bit for bit.
    opt.step(lr, clip_coefficient(max_norm, norm));
    EXPECT_EQ(opt.steps(), step + 1) << at_step;

    // The full main weights and compute copy, on every rank.
    for (size_t k = 0; k < kSpecs.size(); ++k) {
      expect_equal(dist.params[k].main, ref.params[k].main,
                   at_step + ", main weights of " + ref.params[k].name);
      expect_equal(dist.params[k].value, ref.params[k].value,
                   at_step + ", compute weights of " + ref.params[k].name);
    }
    // The moments of the owned elements: the matching slices of the reference's; padding zero.
    const auto [exp_avg, exp_avg_sq] = opt.moments_f32();
    std::vector<bool> is_param(static_cast<size_t>(dist.set.numel()), false);
    for (size_t k = 0; k < kSpecs.size(); ++k) {
      const int64_t off = dist.set.offset_of(dist.params[k]),
                    ref_off = ref.set.offset_of(ref.params[k]);
      for (int64_t j = 0; j < kSpecs[k].numel; ++j) is_param[off + j] = true;
      for (int64_t b = 0; b < buckets.num_buckets(); ++b) {
        const auto [s0, s1] = buckets.shard_range(b);
        const int64_t e0 = std::max(off, s0), e1 = std::min(off + kSpecs[k].numel, s1);
        if (e0 >= e1) continue;
        const Shape n{e1 - e0};
        const int64_t state = opt.state_offset(b) + e0 - s0;
        expect_equal(
            exp_avg.flat_view(state, n), ref_opt.exp_avg().flat_view(ref_off + e0 - off, n),
            at_step + ", exp_avg of " + ref.params[k].name + " in bucket " + std::to_string(b));
        expect_equal(
            exp_avg_sq.flat_view(state, n), ref_opt.exp_avg_sq().flat_view(ref_off + e0 - off, n),
            at_step + ", exp_avg_sq of " + ref.params[k].name + " in bucket " + std::to_string(b));
      }
    }
    int64_t nonzero_padding = 0;
    for (int64_t b = 0; b < buckets.num_buckets(); ++b) {
      const auto [s0, s1] = buckets.shard_range(b);
      for (int64_t e = s0; e < s1; ++e) {
        if (!is_param[e] &&
            (exp_avg.item(opt.state_offset(b) + e - s0) != 0 ||
             exp_avg_sq.item(opt.state_offset(b) + e - s0) != 0 || dist.set.main().item(e) != 0)) {
          ++nonzero_padding;
        }
      }
    }
    EXPECT_EQ(nonzero_padding, 0) << at_step << ": padding elements changed";
  }
}

TEST(DistributedOptimizer, EqualsAllReduceAndAdamW) {
  // Bucket sizes: one bucket (and the embedding's own), one parameter per bucket, and two mixed
  // ones; both paddings; overlap on and off; one bf16 run (compute copy refreshed). A chosen set,
  // not the full product: oversubscribed ranks pay tens of milliseconds per collective.
  const std::vector<Case> cases = {
      {0, false, true, DType::kF32},   {0, true, false, DType::kF32},
      {1, true, false, DType::kF32},   {1, false, true, DType::kF32},
      {50, true, true, DType::kF32},   {50, false, false, DType::kF32},
      {150, true, false, DType::kF32}, {50, true, false, DType::kBF16},
  };
  for (ProcessGroup* dp : groups().list) {
    for (const Case& c : cases) run_equivalence(*dp, c);
  }
}

TEST(DistributedOptimizer, PrecisionAwareMomentStorage) {
  // --use-precision-aware-optimizer: bf16 moments on every group (elementwise rounding: the same
  // bits whatever the layout), fp16 and fp8 ones, scaled per segment, with dp 1 (the reference
  // then knows every segment) over bucket layouts that cut parameters differently.
  using M = MomentDType;
  for (ProcessGroup* dp : groups().list) {
    run_equivalence(*dp, Case{50, true, false, DType::kF32, M::kBF16, M::kBF16});
    run_equivalence(*dp, Case{0, false, true, DType::kBF16, M::kBF16, M::kF32});
  }
  ProcessGroup& self = *groups().self;
  run_equivalence(self, Case{0, false, true, DType::kF32, M::kF16, M::kF16});
  run_equivalence(self, Case{50, false, false, DType::kBF16, M::kFP8, M::kBF16});
  run_equivalence(self, Case{1, false, true, DType::kF32, M::kFP8, M::kFP8});
  run_equivalence(self, Case{150, true, false, DType::kF32, M::kF32, M::kF16});
}

TEST(DistributedOptimizer, SizeOneGroupIsThePlainOptimizer) {
  // dp 1: one shard per bucket, the whole bucket; nothing communicated.
  ProcessGroup& self = *groups().self;
  Model m(kSpecs, DType::kF32, distributed_bucket_layout(50, 1));
  GradBuckets gb(m.set, self, 50, false, GradReduce::kReduceScatter);
  for (int64_t b = 0; b < gb.num_buckets(); ++b) EXPECT_EQ(gb.shard_range(b), gb.bucket_range(b));
  DistributedOptimizer opt(gb, AdamWConfig{});
  EXPECT_EQ(opt.owned_numel(), m.set.numel());
  run_equivalence(self, Case{50, false, true, DType::kF32});
}

// ---- memory -----------------------------------------------------------------------------------

TEST(DistributedOptimizer, StateFallsAsOneOverDp) {
  // A 1,000,000-parameter model (two odd sizes among powers of two).
  const std::vector<Spec> big = {{524288}, {262144},    {131072},  {65536},
                                 {16384},  {500, true}, {76, true}};
  int64_t params = 0;
  for (const Spec& s : big) params += s.numel;
  ASSERT_EQ(params, 1000000);
  for (int64_t bucket_size : {default_ddp_bucket_size(1), int64_t{100000}}) {
    int64_t bytes_dp1 = 0;
    for (ProcessGroup* dp : groups().list) {
      Model m(big, DType::kF32, distributed_bucket_layout(bucket_size, dp->size()));
      GradBuckets gb(m.set, *dp, bucket_size, false, GradReduce::kReduceScatter);
      DistributedOptimizer opt(gb, AdamWConfig{});
      const std::string at = "bucket_size " + std::to_string(bucket_size) + where(*dp);
      EXPECT_EQ(opt.state_bytes(), 2 * 4 * opt.owned_numel()) << at;
      EXPECT_EQ(opt.owned_numel() * dp->size(), m.set.numel()) << at;
      if (dp->size() == 1) bytes_dp1 = opt.state_bytes();
      // 1/dp of the dp-1 state, up to the extra bucket padding of the larger multiple.
      const int64_t slack = 2 * 4 * gb.num_buckets() *
                            distributed_bucket_layout(bucket_size, dp->size()).pad_multiple;
      EXPECT_GE(opt.state_bytes() * dp->size(), bytes_dp1) << at;
      EXPECT_LE(opt.state_bytes() * dp->size(), bytes_dp1 + slack) << at;
      // The plain optimizer holds the moments of the whole dense buffer.
      Model dense(big, DType::kF32);
      AdamW plain(dense.set, AdamWConfig{});
      const auto plain_bytes =
          static_cast<int64_t>(plain.exp_avg().nbytes() + plain.exp_avg_sq().nbytes());
      if (g_runtime->rank() == 0) {
        std::printf(
            "[ memory ] %ld params, bucket_size %ld, dp %d: %ld buckets, optimizer state "
            "%ld bytes per rank (AdamW: %ld)\n",
            static_cast<long>(params), static_cast<long>(bucket_size), dp->size(),
            static_cast<long>(gb.num_buckets()), static_cast<long>(opt.state_bytes()),
            static_cast<long>(plain_bytes));
      }
    }
  }
}

}  // namespace
}  // namespace megatron

int main(int argc, char** argv) {
  megatron::MpiRuntime runtime(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  megatron::g_runtime = &runtime;
  megatron::g_groups = std::make_unique<megatron::Groups>();
  const int rc = megatron::testing::run_all_tests_on_every_rank(
      runtime, megatron::testing::expected_world_size(argc, argv));
  megatron::g_groups.reset();
  return rc;
}
