// GradBuckets under a real MPI job (CTest runs this binary under mpiexec with 2 and 4 processes):
// the bucket layout over a ParamSet's flat gradient buffer, and the data-parallel mean it
// computes, with the world as the data-parallel group and, for the no-op case, a size-1 group.
//
// The layout is checked on parameters of odd sizes (5, 17, 3, 40, 1; padded to 16, 32, 16, 48,
// 16 by ParamSet's 16-element alignment): buckets tile [0, numel) with no gap or overlap, cut
// only at parameter offsets, at the first offset where a bucket holds bucket_size elements, and
// bucket 0 starts at 0 with the last registered parameter (ParamSet's reverse layout).
//
// The mean is checked bit for bit, padding included (the buckets cover it): rank r's gradient
// element i is (r + 1) * f(i), f(i) = k / 4 with |k| <= 10. For a power-of-two dp (the 2 and 4
// CTest runs) scaling by 1/dp is exact, and every term and partial sum is a multiple of 1/(4 dp)
// below 3 dp in magnitude: fewer than 12 dp^2 steps of 1/(4 dp), far inside f32's 24 bits, so
// every sum is exact in any order and the all-reduce gives the closed-form mean
// f(i) * (dp + 1) / 2 exactly. For other dp see mean_tolerance.
//
// Not here: the trainer's use of the buckets (tests/train) and the collectives themselves
// (tests/comm). Every rank runs the same tests in the same order and makes the same mark_ready
// calls, so collectives pair up and an expected exception is thrown on every rank at the same
// point, before that call launches anything; checks use EXPECT (ASSERT only on layout facts,
// the same on every rank, so all ranks stop at the same point). A failure on any rank fails
// every rank (see main).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "comm/mpi_runtime.h"
#include "comm/process_group.h"
#include "core/error.h"
#include "parallel/grad_buckets.h"
#include "parallel/param.h"
#include "tensor/tensor.h"
#include "testing/mpi_testing.h"

namespace megatron {
namespace {

MpiRuntime* g_runtime = nullptr;

// Registration order. Padded: 16, 32, 16, 48, 16, laid out reversed: p4 [0, 16), p3 [16, 64),
// p2 [64, 80), p1 [80, 112), p0 [112, 128).
const std::vector<int64_t> kSizes = {5, 17, 3, 40, 1};

// Parameters and the ParamSet over them; the set points into `params`, so this never moves.
struct Model {
  explicit Model(const std::vector<int64_t>& sizes)
      : params(make_params(sizes)), set(pointers(params), DType::kF32) {}
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  static std::vector<Param> make_params(const std::vector<int64_t>& sizes) {
    std::vector<Param> out(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      out[i].name = "p" + std::to_string(i);
      out[i].shape = Shape{sizes[i]};
    }
    return out;
  }
  static std::vector<Param*> pointers(std::vector<Param>& ps) {
    std::vector<Param*> out;
    for (Param& p : ps) out.push_back(&p);
    return out;
  }

  std::vector<Param> params;  // registration order
  ParamSet set;
};

ProcessGroup& world() {
  return *g_runtime->world();
}

// Gradient patterns: f(i) a multiple of 1/4 in [-1.5, 1.5], or of 1/2 in [-2.5, 2.5].
using Pattern = float (*)(int64_t);
float f1(int64_t i) {
  return static_cast<float>((i * 7) % 13 - 6) * 0.25f;
}
float f2(int64_t i) {
  return static_cast<float>((i * 5) % 11 - 5) * 0.5f;
}

// Every element of the buffer, alignment padding included: rank's gradient (rank + 1) * f(i).
void fill(Model& m, int rank, Pattern f) {
  float* g = m.set.grads().data<float>();
  for (int64_t i = 0; i < m.set.numel(); ++i) g[i] = static_cast<float>(rank + 1) * f(i);
}

// Zero (exact, see the file comment) for a power-of-two dp. Otherwise 1/dp rounds: the factor
// and each scaled term carry a relative error of at most u = 2^-24 each, and a sum of dp terms in
// any order adds at most (dp - 1) u of the sum of |terms|, so |error| <= (dp + 1) u sum|terms|;
// twice that for margin. sum|terms| = |f| (1 + ... + dp) / dp = |f| (dp + 1) / 2.
double mean_tolerance(int dp, double f) {
  if (std::has_single_bit(static_cast<unsigned>(dp))) return 0.0;
  return 2.0 * (dp + 1) * std::ldexp(1.0, -24) * std::fabs(f) * (dp + 1) / 2.0;
}

// Elements [begin, end) equal the closed-form mean over the dp ranks, (dp + 1) / 2 * f(i).
void expect_mean(Model& m, int dp, Pattern f, const std::string& what, int64_t begin = 0,
                 int64_t end = -1) {
  if (end < 0) end = m.set.numel();
  const Tensor& g = m.set.grads();
  int64_t bad = 0, first = -1;
  double got_first = 0, want_first = 0;
  for (int64_t i = begin; i < end; ++i) {
    const double want = static_cast<double>(f(i)) * (dp + 1) / 2.0;
    if (std::fabs(g.item(i) - want) > mean_tolerance(dp, f(i))) {
      if (first < 0) first = i, got_first = g.item(i), want_first = want;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << " (world rank " << g_runtime->rank() << ", dp " << dp << "): " << bad
                    << " of " << end - begin << " elements are not the mean, first at " << first
                    << ": got " << got_first << ", want " << want_first;
}

// Elements [begin, end) still hold this rank's own gradient: nothing reduced or scaled them.
void expect_untouched(Model& m, int rank, Pattern f, int64_t begin, int64_t end,
                      const std::string& what) {
  const Tensor& g = m.set.grads();
  int64_t bad = 0, first = -1;
  for (int64_t i = begin; i < end; ++i) {
    if (g.item(i) != static_cast<double>(rank + 1) * f(i)) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << " (world rank " << g_runtime->rank() << "): " << bad << " of "
                    << end - begin << " elements changed before their bucket was reduced, first at "
                    << first;
}

// Backward order: the last registered parameter's gradient is final first.
void mark_all_backward(GradBuckets& gb, Model& m, const std::string& what) {
  for (size_t i = m.params.size(); i-- > 0;) {
    EXPECT_NO_THROW(gb.mark_ready(m.params[i])) << what << ": " << m.params[i].name;
    gb.poll();
  }
}

// ---- layout -----------------------------------------------------------------------------------

// The invariants of any layout, for one bucket size.
void check_layout(Model& m, int64_t bucket_size) {
  const GradBuckets gb(m.set, world(), bucket_size, /*overlap=*/false);
  const std::string at = "bucket_size " + std::to_string(bucket_size);
  std::set<int64_t> offsets;
  for (const Param& p : m.params) offsets.insert(m.set.offset_of(p));
  const int64_t n = gb.num_buckets();
  ASSERT_GE(n, 1) << at;
  int64_t next = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto [begin, end] = gb.bucket_range(i);
    EXPECT_EQ(begin, next) << at << ", bucket " << i << ": gap or overlap with the one before";
    EXPECT_LT(begin, end) << at << ", bucket " << i << " is empty";
    EXPECT_TRUE(offsets.count(begin))
        << at << ", bucket " << i << " starts at " << begin << ", inside a parameter";
    if (i + 1 < n) {
      EXPECT_TRUE(offsets.count(end))
          << at << ", bucket " << i << " ends at " << end << ", inside a parameter";
      EXPECT_GE(end - begin, bucket_size) << at << ", bucket " << i << " is short";
      // Megatron's rule: a bucket closes at the first parameter boundary where it holds
      // bucket_size elements, so at the boundary before its end it held fewer.
      const int64_t before = *std::prev(offsets.lower_bound(end));
      if (before > begin) {
        EXPECT_LT(before - begin, bucket_size)
            << at << ", bucket " << i << " could have closed at " << before;
      }
    }
    next = end;
  }
  EXPECT_EQ(next, m.set.numel()) << at << ": the buckets do not reach the end of the buffer";
  // Every parameter's elements lie inside one bucket.
  for (const Param& p : m.params) {
    const int64_t off = m.set.offset_of(p);
    for (int64_t i = 0; i < n; ++i) {
      const auto [begin, end] = gb.bucket_range(i);
      if (off >= begin && off < end) {
        EXPECT_LE(off + p.shape.numel(), end) << at << ": " << p.name << " crosses a boundary";
      }
    }
  }
  // Reverse layout: the last registered parameter is at offset 0, in bucket 0.
  const Param& last = m.params.back();
  EXPECT_EQ(m.set.offset_of(last), 0) << at;
  EXPECT_EQ(gb.bucket_range(0).first, 0) << at;
  EXPECT_LE(last.shape.numel(), gb.bucket_range(0).second) << at;
}

TEST(GradBuckets, LayoutTilesTheBufferAtParameterBoundaries) {
  Model m(kSizes);
  ASSERT_EQ(m.set.numel(), 128);  // the padded sizes of kSizes' comment
  // bucket_size -> boundaries, from the layout in kSizes' comment.
  const std::vector<std::pair<int64_t, std::vector<int64_t>>> cases = {
      {1, {0, 16, 64, 80, 112, 128}},
      {16, {0, 16, 64, 80, 112, 128}},
      {17, {0, 64, 112, 128}},
      {50, {0, 64, 128}},
      {64, {0, 64, 128}},
      {65, {0, 80, 128}},
      {112, {0, 112, 128}},
      {113, {0, 128}},
      {128, {0, 128}},
  };
  for (const auto& [bucket_size, bounds] : cases) {
    check_layout(m, bucket_size);
    const GradBuckets gb(m.set, world(), bucket_size, /*overlap=*/false);
    std::vector<int64_t> got = {0};
    for (int64_t i = 0; i < gb.num_buckets(); ++i) got.push_back(gb.bucket_range(i).second);
    EXPECT_EQ(got, bounds) << "bucket_size " << bucket_size;
  }
  // Other shapes: one parameter; sizes that need no padding next to ones that do.
  for (const std::vector<int64_t>& sizes :
       {std::vector<int64_t>{7}, std::vector<int64_t>{16, 1, 33, 32}}) {
    Model other(sizes);
    for (int64_t bucket_size : {1, 16, 17, 40, 1000}) check_layout(other, bucket_size);
  }
}

TEST(GradBuckets, NonPositiveOrHugeBucketSizeGivesOneBucket) {
  Model m(kSizes);
  for (int64_t bucket_size : {int64_t{0}, int64_t{-1}, int64_t{129}, int64_t{1} << 40,
                              default_ddp_bucket_size(world().size())}) {
    const GradBuckets gb(m.set, world(), bucket_size, /*overlap=*/false);
    ASSERT_EQ(gb.num_buckets(), 1) << "bucket_size " << bucket_size;
    EXPECT_EQ(gb.bucket_range(0), std::make_pair(int64_t{0}, m.set.numel()))
        << "bucket_size " << bucket_size;
  }
}

TEST(GradBuckets, DefaultBucketSizeIsMegatrons) {
  // max(40,000,000, 1,000,000 x dp).
  EXPECT_EQ(default_ddp_bucket_size(1), 40000000);
  EXPECT_EQ(default_ddp_bucket_size(40), 40000000);
  EXPECT_EQ(default_ddp_bucket_size(41), 41000000);
  EXPECT_EQ(default_ddp_bucket_size(64), 64000000);
}

// ---- averaging over the world ----------------------------------------------------------------

// One bucket; one per parameter; two uneven ones; one again.
const std::vector<int64_t> kBucketSizes = {0, 16, 50, int64_t{1} << 40};

TEST(GradBuckets, FinishAveragesWithoutOverlap) {
  const int rank = world().rank(), dp = world().size();
  for (int64_t bucket_size : kBucketSizes) {
    const std::string at = "no overlap, bucket_size " + std::to_string(bucket_size);
    Model m(kSizes);
    fill(m, rank, f1);
    GradBuckets gb(m.set, world(), bucket_size, /*overlap=*/false);
    gb.reset();
    // Without overlap, mark_ready is a no-op: nothing is launched, a second mark is no error.
    for (const Param& p : m.params) {
      EXPECT_NO_THROW(gb.mark_ready(p)) << at;
      EXPECT_NO_THROW(gb.mark_ready(p)) << at;
    }
    gb.poll();
    expect_untouched(m, rank, f1, 0, m.set.numel(), at + ", before finish");
    gb.finish();
    expect_mean(m, dp, f1, at);
  }
}

TEST(GradBuckets, OverlapAveragesWhenEveryParameterIsMarked) {
  const int rank = world().rank(), dp = world().size();
  for (int64_t bucket_size : kBucketSizes) {
    const std::string at = "overlap, bucket_size " + std::to_string(bucket_size);
    Model m(kSizes);
    fill(m, rank, f1);
    GradBuckets gb(m.set, world(), bucket_size, /*overlap=*/true);
    gb.reset();
    mark_all_backward(gb, m, at);
    gb.finish();
    expect_mean(m, dp, f1, at);
  }
}

TEST(GradBuckets, OverlapAveragesWhenOnlyTheFirstBucketIsMarked) {
  const int rank = world().rank(), dp = world().size();
  for (int64_t bucket_size : kBucketSizes) {
    const std::string at = "overlap, bucket 0 marked, bucket_size " + std::to_string(bucket_size);
    Model m(kSizes);
    fill(m, rank, f1);
    GradBuckets gb(m.set, world(), bucket_size, /*overlap=*/true);
    gb.reset();
    const int64_t end0 = gb.bucket_range(0).second;
    // Backward order; bucket 0 holds exactly the parameters that start before its end.
    for (size_t i = m.params.size(); i-- > 0;) {
      if (m.set.offset_of(m.params[i]) < end0) {
        EXPECT_NO_THROW(gb.mark_ready(m.params[i])) << at << ": " << m.params[i].name;
      }
    }
    gb.poll();
    // Bucket 0 is in flight (not to be read); the other buckets must not have been launched.
    expect_untouched(m, rank, f1, end0, m.set.numel(), at + ", buckets 1..");
    gb.finish();
    expect_mean(m, dp, f1, at);
  }
}

TEST(GradBuckets, OverlapWithNothingMarkedReducesInFinish) {
  const int rank = world().rank(), dp = world().size();
  for (int64_t bucket_size : kBucketSizes) {
    const std::string at = "overlap, nothing marked, bucket_size " + std::to_string(bucket_size);
    Model m(kSizes);
    fill(m, rank, f1);
    GradBuckets gb(m.set, world(), bucket_size, /*overlap=*/true);
    gb.reset();
    gb.poll();
    expect_untouched(m, rank, f1, 0, m.set.numel(), at + ", before finish");
    gb.finish();
    expect_mean(m, dp, f1, at);
  }
}

// ---- misuse -----------------------------------------------------------------------------------

TEST(GradBuckets, MarkingAParameterTwiceThrows) {
  const int rank = world().rank(), dp = world().size();
  // Bucket size 1: one parameter per bucket, so the first mark of p4 launches bucket 0 and the
  // second finds the bucket complete. Every rank throws at the same call, which launches nothing.
  Model m(kSizes);
  fill(m, rank, f1);
  GradBuckets gb(m.set, world(), /*bucket_size=*/1, /*overlap=*/true);
  gb.reset();
  const Param& last = m.params.back();
  gb.mark_ready(last);
  try {
    gb.mark_ready(last);
    ADD_FAILURE() << "marking " << last.name << " twice did not throw";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find(last.name), std::string::npos) << e.what();
  }
  for (size_t i = m.params.size() - 1; i-- > 0;) {
    EXPECT_NO_THROW(gb.mark_ready(m.params[i])) << m.params[i].name;
  }
  gb.finish();
  // The rejected mark launched nothing again: bucket 0 is averaged once, not scaled twice.
  expect_mean(m, dp, f1, "after a rejected second mark");
}

TEST(GradBuckets, MarkingAParameterTwiceInASharedBucketThrows) {
  const int rank = world().rank(), dp = world().size();
  // Bucket size 50: bucket 0 = {p4, p3}. Marking p4 twice must be refused, not counted as p3:
  // counted, it would launch bucket 0 while p3's gradient may still change.
  Model m(kSizes);
  fill(m, rank, f1);
  GradBuckets gb(m.set, world(), /*bucket_size=*/50, /*overlap=*/true);
  gb.reset();
  ASSERT_EQ(gb.bucket_range(0), std::make_pair(int64_t{0}, int64_t{64}));
  const Param& p4 = m.params[4];
  const Param& p3 = m.params[3];
  gb.mark_ready(p4);
  EXPECT_THROW(gb.mark_ready(p4), InternalError) << "p4 marked twice in a two-parameter bucket";
  // p3 has not been marked yet: its first mark completes the bucket and is no error.
  EXPECT_NO_THROW(gb.mark_ready(p3)) << "first mark of p3";
  gb.finish();
  expect_mean(m, dp, f1, "after a second mark of p4");
}

TEST(GradBuckets, MarkingAParameterOutsideTheSetThrows) {
  Model m(kSizes);
  GradBuckets gb(m.set, world(), /*bucket_size=*/16, /*overlap=*/true);
  Param stray;
  stray.name = "stray";
  stray.shape = Shape{4};
  EXPECT_THROW(gb.mark_ready(stray), InternalError);
  gb.finish();  // every rank reduces the (zero) buffer, so the collectives still pair up
}

// ---- steps ------------------------------------------------------------------------------------

TEST(GradBuckets, ResetStartsAFreshStep) {
  const int rank = world().rank(), dp = world().size();
  for (bool overlap : {false, true}) {
    for (int64_t bucket_size : kBucketSizes) {
      const std::string at = std::string(overlap ? "overlap" : "no overlap") + ", bucket_size " +
                             std::to_string(bucket_size);
      Model m(kSizes);
      GradBuckets gb(m.set, world(), bucket_size, overlap);
      // Step 1, then step 2 with other values. Without reset, finish would launch nothing in
      // step 2 (every bucket already launched) and, with overlap, its marks would be refused.
      for (int step = 0; step < 2; ++step) {
        const Pattern f = step == 0 ? f1 : f2;
        const std::string at_step = at + ", step " + std::to_string(step + 1);
        gb.reset();
        fill(m, rank, f);
        mark_all_backward(gb, m, at_step);
        gb.finish();
        expect_mean(m, dp, f, at_step);
      }
    }
  }
}

// ---- a size-1 group ---------------------------------------------------------------------------

TEST(GradBuckets, SizeOneGroupLeavesGradientsUnchanged) {
  const int rank = world().rank();
  std::shared_ptr<ProcessGroup> self = make_self_process_group();
  ASSERT_EQ(self->size(), 1);
  for (bool overlap : {false, true}) {
    for (int64_t bucket_size : kBucketSizes) {
      const std::string at = std::string(overlap ? "overlap" : "no overlap") + ", bucket_size " +
                             std::to_string(bucket_size) + ", size-1 group";
      Model m(kSizes);
      fill(m, rank, f1);
      GradBuckets gb(m.set, *self, bucket_size, overlap);
      gb.reset();
      mark_all_backward(gb, m, at);
      gb.finish();
      // The mean over one rank is its own gradient, bit for bit (nothing is even scaled).
      expect_untouched(m, rank, f1, 0, m.set.numel(), at);
    }
  }
}

}  // namespace
}  // namespace megatron

int main(int argc, char** argv) {
  megatron::MpiRuntime runtime(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  megatron::g_runtime = &runtime;
  return megatron::testing::run_all_tests_on_every_rank(
      runtime, megatron::testing::expected_world_size(argc, argv));
}
