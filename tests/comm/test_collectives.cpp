// Collectives, ParallelState and MpiRuntime under a real MPI job (CTest runs this binary under
// mpiexec with 2, 4 and 8 processes).
//
// Every collective is checked against its closed form on every group of a hybrid layout
// (tp 2 x pp 2 x dp world/4, or tp 2 / pp 2 on two ranks): each rank contributes values that are a
// known function of its world rank, so the expected result on every rank is computable locally.
// The values are small integers times powers of two, so every f32/f64 sum is exact in any order
// and results are compared bit for bit. bf16 sums are checked to be the f32 sum rounded once.
//
// Every rank runs the same tests in the same order, so collectives pair up; checks use EXPECT
// (not ASSERT) wherever an early return would leave peers waiting. A failure on any rank makes
// every rank exit non-zero (see main), and a job that did not start with the expected number of
// processes fails instead of passing as a set of singletons.
#include <gtest/gtest.h>

#include <mpi.h>
#include "testing/mpi_testing.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "comm/mpi_process_group.h"
#include "comm/mpi_runtime.h"
#include "comm/parallel_state.h"
#include "comm/rank_generator.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/threads.h"

namespace megatron {
namespace {

MpiRuntime* g_runtime = nullptr;
int g_expected_world = 0;

ProcessGroup& world() {
  return *g_runtime->world();
}

// ---- values each rank contributes ---------------------------------------------------------------

// A small integer times a power of two: at most 8 significant bits, so exact in bf16, and any sum
// of up to 2^15 of them is exact in f32.
int64_t pattern(int g, int64_t i) {
  return ((g * 37 + i * 11) % 255 + 1) << ((g + i) % 5);
}

template <typename T>
T value(int g, int64_t i);
template <>
float value<float>(int g, int64_t i) {
  return static_cast<float>(pattern(g, i));
}
template <>
double value<double>(int g, int64_t i) {
  return static_cast<double>(pattern(g, i)) + g * 0x1p-30;  // uses bits f32 would not hold
}
template <>
int32_t value<int32_t>(int g, int64_t i) {
  return static_cast<int32_t>(pattern(g, i) * 1000 + g);
}
template <>
int64_t value<int64_t>(int g, int64_t i) {
  return (pattern(g, i) << 44) + g;  // 56 bits, beyond f64's 53: must travel as int64
}
template <>
bf16 value<bf16>(int g, int64_t i) {
  return f32_to_bf16(static_cast<float>(pattern(g, i)));
}

template <typename T>
T reduce_of(const std::vector<int>& members, int64_t i, ReduceOp op) {
  if constexpr (std::is_same_v<T, bf16>) {
    // f32 accumulation, one rounding at the end; exact in f32 by construction of pattern().
    float acc = op == ReduceOp::kSum ? 0.0f : -1e30f;
    for (int g : members) {
      float v = bf16_to_f32(value<bf16>(g, i));
      acc = op == ReduceOp::kSum ? acc + v : std::max(acc, v);
    }
    return f32_to_bf16(acc);
  } else {
    T acc = op == ReduceOp::kSum ? T(0) : value<T>(members[0], i);
    for (int g : members)
      acc = op == ReduceOp::kSum ? acc + value<T>(g, i) : std::max(acc, value<T>(g, i));
    return acc;
  }
}

template <typename T>
Tensor filled(int64_t n, const std::function<T(int64_t)>& f) {
  Tensor t = Tensor::empty(Shape{n}, detail::dtype_of<T>());
  T* p = t.data<T>();
  for (int64_t i = 0; i < n; ++i) p[i] = f(i);
  return t;
}

template <typename T>
bool same(T a, T b) {
  if constexpr (std::is_same_v<T, bf16>) {
    return a.bits == b.bits;
  } else {
    return a == b;
  }
}

template <typename T>
double printable(T v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return bf16_to_f32(v);
  } else {
    return static_cast<double>(v);
  }
}

// Compares every element with want(i), bit for bit; reports the count and the first mismatch.
template <typename T>
void expect_values(const Tensor& t, const std::function<T(int64_t)>& want,
                   const std::string& what) {
  const T* p = t.data<T>();
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!same(p[i], want(i))) {
      if (bad++ == 0) first = i;
    }
  }
  EXPECT_EQ(bad, 0) << what << " (world rank " << g_runtime->rank() << "): " << bad << " of "
                    << t.numel() << " elements differ; first at " << first << ": got "
                    << (first >= 0 ? printable(p[first]) : 0) << ", want "
                    << (first >= 0 ? printable(want(first)) : 0);
}

// ---- the groups of a layout
// ----------------------------------------------------------------------

struct NamedGroup {
  std::string name;
  ProcessGroup* group;
};

// Every group this rank belongs to, in the same order on every rank (the embedding group is
// skipped on middle stages, which are in none; its members still pair up among themselves).
std::vector<NamedGroup> groups_of(const ParallelState& ps) {
  std::vector<NamedGroup> out = {{"world", &ps.world_group()},
                                 {"tp", &ps.tp_group()},
                                 {"pp", &ps.pp_group()},
                                 {"dp", &ps.dp_group()},
                                 {"cp", &ps.cp_group()},
                                 {"dp-cp", &ps.dp_cp_group()},
                                 {"model-parallel", &ps.model_parallel_group()}};
  if (ps.in_embedding_group()) out.push_back({"embedding", &ps.embedding_group()});
  return out;
}

// The layouts whose every group the collectives are checked on.
std::vector<ParallelConfig> collective_layouts(int world_size) {
  if (world_size % 4 == 0) {
    return {{.tensor_model_parallel_size = 2, .pipeline_model_parallel_size = 2}};
  }
  if (world_size == 2) {
    return {{.tensor_model_parallel_size = 2}, {.pipeline_model_parallel_size = 2}};
  }
  return {{}};
}

std::string label(const ParallelState& ps, const NamedGroup& g) {
  return g.name + " group of " + ps.str();
}

// Runs `check` on every group of every collective layout.
void for_each_group(const std::function<void(ProcessGroup&, const std::string&)>& check) {
  for (const ParallelConfig& c : collective_layouts(world().size())) {
    ParallelState ps(g_runtime->world(), c);
    for (const NamedGroup& g : groups_of(ps)) check(*g.group, label(ps, g));
  }
}

int me() {
  return g_runtime->rank();
}

// ---- collectives -----------------------------------------------------------------------------

template <typename T>
void check_all_reduce(ProcessGroup& pg, const std::string& where, bool async) {
  const int64_t n = 37;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
    Tensor t = filled<T>(n, [](int64_t i) { return value<T>(me(), i); });
    if (async) {
      Work w = pg.all_reduce_async(t, op);
      w.wait();
    } else {
      pg.all_reduce(t, op);
    }
    expect_values<T>(
        t, [&](int64_t i) { return reduce_of<T>(pg.global_ranks(), i, op); },
        std::string("all_reduce ") + reduce_op_name(op) + " " + dtype_name(t.dtype()) +
            (async ? " async" : "") + " on " + where);
  }
}

template <typename T>
void check_reduce_scatter(ProcessGroup& pg, const std::string& where, bool async) {
  const int64_t n = 5;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
    Tensor in = filled<T>(n * pg.size(), [](int64_t i) { return value<T>(me(), i); });
    Tensor out = Tensor::empty(Shape{n}, in.dtype());
    if (async) {
      Work w = pg.reduce_scatter_async(out, in, op);
      w.wait();
    } else {
      pg.reduce_scatter(out, in, op);
    }
    expect_values<T>(
        out, [&](int64_t i) { return reduce_of<T>(pg.global_ranks(), pg.rank() * n + i, op); },
        std::string("reduce_scatter ") + reduce_op_name(op) + " " + dtype_name(in.dtype()) +
            (async ? " async" : "") + " on " + where);
  }
}

template <typename T>
void check_all_gather(ProcessGroup& pg, const std::string& where, bool async) {
  const int64_t n = 7;
  Tensor in = filled<T>(n, [](int64_t i) { return value<T>(me(), i); });
  Tensor out = Tensor::empty(Shape{n * pg.size()}, in.dtype());
  if (async) {
    Work w = pg.all_gather_async(out, in);
    w.wait();
  } else {
    pg.all_gather(out, in);
  }
  expect_values<T>(
      out, [&](int64_t j) { return value<T>(pg.global_ranks()[j / n], j % n); },
      std::string("all_gather ") + dtype_name(in.dtype()) + (async ? " async" : "") + " on " +
          where);
}

template <typename T>
void check_broadcast(ProcessGroup& pg, const std::string& where, bool async) {
  const int64_t n = 11;
  for (int root = 0; root < pg.size(); ++root) {
    Tensor t = filled<T>(n, [](int64_t i) { return value<T>(me(), i); });
    if (async) {
      Work w = pg.broadcast_async(t, root);
      w.wait();
    } else {
      pg.broadcast(t, root);
    }
    int src = pg.global_ranks()[root];
    expect_values<T>(
        t, [&](int64_t i) { return value<T>(src, i); },
        std::string("broadcast ") + dtype_name(t.dtype()) + " from group rank " +
            std::to_string(root) + (async ? " async" : "") + " on " + where);
  }
}

template <typename T>
void check_all_to_all(ProcessGroup& pg, const std::string& where, bool async) {
  const int64_t n = 3;
  // Chunk j of the input is for group rank j: value(me, 100 * j + i).
  Tensor in =
      filled<T>(n * pg.size(), [](int64_t k) { return value<T>(me(), 100 * (k / n) + k % n); });
  Tensor out = Tensor::empty(Shape{n * pg.size()}, in.dtype());
  if (async) {
    Work w = pg.all_to_all_async(out, in);
    w.wait();
  } else {
    pg.all_to_all(out, in);
  }
  // Chunk k of the output came from group rank k and was meant for this rank.
  expect_values<T>(
      out, [&](int64_t k) { return value<T>(pg.global_ranks()[k / n], 100 * pg.rank() + k % n); },
      std::string("all_to_all ") + dtype_name(in.dtype()) + (async ? " async" : "") + " on " +
          where);
}

template <typename T>
void check_send_recv_ring(ProcessGroup& pg, const std::string& where, bool async) {
  if (pg.size() == 1) return;  // no peer to talk to
  const int64_t n = 13;
  const int next = (pg.rank() + 1) % pg.size(), prev = (pg.rank() + pg.size() - 1) % pg.size();
  Tensor out = filled<T>(n, [](int64_t i) { return value<T>(me(), i); });
  Tensor in = Tensor::zeros(Shape{n}, out.dtype());
  const int tag = 7;
  if (async) {
    Work r = pg.recv_async(in, prev, tag);
    Work s = pg.send_async(out, next, tag);
    s.wait();
    r.wait();
  } else if (pg.rank() % 2 == 0) {
    // Blocking sends may wait for the matching receive: alternate the order around the ring.
    pg.send(out, next, tag);
    pg.recv(in, prev, tag);
  } else {
    pg.recv(in, prev, tag);
    pg.send(out, next, tag);
  }
  int src = pg.global_ranks()[prev];
  expect_values<T>(
      in, [&](int64_t i) { return value<T>(src, i); },
      std::string("send/recv ring ") + dtype_name(in.dtype()) + (async ? " async" : "") + " on " +
          where);
}

template <typename T>
void check_everything(ProcessGroup& pg, const std::string& where) {
  for (bool async : {false, true}) {
    check_all_reduce<T>(pg, where, async);
    check_reduce_scatter<T>(pg, where, async);
    check_all_gather<T>(pg, where, async);
    check_broadcast<T>(pg, where, async);
    check_all_to_all<T>(pg, where, async);
    check_send_recv_ring<T>(pg, where, async);
  }
}

TEST(Collectives, F32OnEveryGroup) {
  for_each_group(check_everything<float>);
}
TEST(Collectives, F64OnEveryGroup) {
  for_each_group(check_everything<double>);
}
TEST(Collectives, I32OnEveryGroup) {
  for_each_group(check_everything<int32_t>);
}
TEST(Collectives, I64OnEveryGroup) {
  for_each_group(check_everything<int64_t>);
}
TEST(Collectives, Bf16OnEveryGroup) {
  for_each_group(check_everything<bf16>);
}

// 256 on the first rank and 1 on the others: the sum 256 + (n - 1) needs 9 bits. Accumulating in
// bf16 would round 256 + 1 back to 256 at every step (ties to even) and return 256; the f32
// accumulator gives the sum rounded once (n = 4: 259 -> 260; n = 8: 263 -> 264).
TEST(Collectives, Bf16SumIsTheF32SumRoundedOnce) {
  for_each_group([](ProcessGroup& pg, const std::string& where) {
    for (bool async : {false, true}) {
      Tensor t = Tensor::full(Shape{3}, pg.rank() == 0 ? 256.0 : 1.0, DType::kBF16);
      if (async) {
        pg.all_reduce_async(t).wait();
      } else {
        pg.all_reduce(t);
      }
      bf16 want = f32_to_bf16(256.0f + static_cast<float>(pg.size() - 1));
      expect_values<bf16>(
          t, [&](int64_t) { return want; }, "bf16 all_reduce on " + where);
      // reduce-scatter goes through the same accumulator.
      Tensor in = Tensor::full(Shape{2 * pg.size()}, pg.rank() == 0 ? 256.0 : 1.0, DType::kBF16);
      Tensor out = Tensor::empty(Shape{2}, DType::kBF16);
      pg.reduce_scatter(out, in);
      expect_values<bf16>(
          out, [&](int64_t) { return want; }, "bf16 reduce_scatter on " + where);
    }
  });
  if (world().size() >= 4) {
    // The check above would pass with bf16 accumulation too if the two roundings agreed.
    EXPECT_NE(f32_to_bf16(256.0f + world().size() - 1).bits, f32_to_bf16(256.0f).bits);
  }
}

// Several operations in flight on the same and on different groups, waited for in reverse order.
TEST(Collectives, ManyAsyncOperationsInFlight) {
  for (const ParallelConfig& c : collective_layouts(world().size())) {
    ParallelState ps(g_runtime->world(), c);
    ProcessGroup& tp = ps.tp_group();
    ProcessGroup& dp = ps.dp_group();
    const int64_t n = 1000;
    Tensor a = filled<float>(n, [](int64_t i) { return value<float>(me(), i); });
    Tensor b = filled<bf16>(n, [](int64_t i) { return value<bf16>(me(), i); });
    Tensor g_in = filled<int64_t>(n, [](int64_t i) { return value<int64_t>(me(), i); });
    Tensor g_out = Tensor::empty(Shape{n * dp.size()}, DType::kI64);
    Tensor rs_in = filled<float>(n * tp.size(), [](int64_t i) { return value<float>(me(), i); });
    Tensor rs_out = Tensor::empty(Shape{n}, DType::kF32);
    Tensor bc = filled<double>(n, [](int64_t i) { return value<double>(me(), i); });
    std::vector<Work> works;
    works.push_back(tp.all_reduce_async(a));
    works.push_back(dp.all_reduce_async(b, ReduceOp::kSum));
    works.push_back(dp.all_gather_async(g_out, g_in));
    works.push_back(tp.reduce_scatter_async(rs_out, rs_in));
    works.push_back(ps.world_group().broadcast_async(bc, ps.world_size() - 1));
    works.push_back(ps.world_group().barrier_async());
    while (!works.empty()) {
      works.back().wait();
      works.pop_back();
    }
    const std::string where = ps.str();
    expect_values<float>(
        a, [&](int64_t i) { return reduce_of<float>(tp.global_ranks(), i, ReduceOp::kSum); },
        "async all_reduce f32 (tp) " + where);
    expect_values<bf16>(
        b, [&](int64_t i) { return reduce_of<bf16>(dp.global_ranks(), i, ReduceOp::kSum); },
        "async all_reduce bf16 (dp) " + where);
    expect_values<int64_t>(
        g_out, [&](int64_t j) { return value<int64_t>(dp.global_ranks()[j / n], j % n); },
        "async all_gather i64 (dp) " + where);
    expect_values<float>(
        rs_out,
        [&](int64_t i) {
          return reduce_of<float>(tp.global_ranks(), tp.rank() * n + i, ReduceOp::kSum);
        },
        "async reduce_scatter f32 (tp) " + where);
    expect_values<double>(
        bc, [&](int64_t i) { return value<double>(ps.world_size() - 1, i); },
        "async broadcast f64 (world) " + where);
  }
}

TEST(Collectives, WorkCompletesByPollingAndOnDestruction) {
  Tensor t = filled<float>(64, [](int64_t i) { return value<float>(me(), i); });
  Work w = world().all_reduce_async(t);
  while (!w.is_completed()) {
  }
  EXPECT_TRUE(w.is_completed());
  w.wait();  // a second wait is a no-op
  std::vector<int> all(world().size());
  for (int r = 0; r < world().size(); ++r) all[r] = r;
  expect_values<float>(
      t, [&](int64_t i) { return reduce_of<float>(all, i, ReduceOp::kSum); }, "polled all_reduce");
  Tensor u = filled<float>(64, [](int64_t i) { return value<float>(me(), i); });
  { Work dropped = world().all_reduce_async(u); }
  expect_values<float>(
      u, [&](int64_t i) { return reduce_of<float>(all, i, ReduceOp::kSum); },
      "all_reduce whose Work was dropped");
  Work done;  // default: complete
  EXPECT_TRUE(done.is_completed());
}

// The distributed optimizer's layout: this rank's shard lives inside the full buffer.
TEST(Collectives, ShardInsideTheFullBuffer) {
  for_each_group([](ProcessGroup& pg, const std::string& where) {
    const int64_t n = 6;
    for (bool async : {false, true}) {
      // all_gather whose input is this rank's slice of the output.
      Tensor full = Tensor::zeros(Shape{n * pg.size()}, DType::kF32);
      Tensor shard = full.slice0(pg.rank() * n, (pg.rank() + 1) * n);
      for (int64_t i = 0; i < n; ++i) shard.data<float>()[i] = value<float>(me(), i);
      if (async) {
        pg.all_gather_async(full, shard).wait();
      } else {
        pg.all_gather(full, shard);
      }
      expect_values<float>(
          full, [&](int64_t j) { return value<float>(pg.global_ranks()[j / n], j % n); },
          "in-place all_gather on " + where);
      // reduce_scatter whose output is this rank's slice of the input.
      Tensor buf = filled<float>(n * pg.size(), [](int64_t i) { return value<float>(me(), i); });
      Tensor mine = buf.slice0(pg.rank() * n, (pg.rank() + 1) * n);
      if (async) {
        pg.reduce_scatter_async(mine, buf).wait();
      } else {
        pg.reduce_scatter(mine, buf);
      }
      expect_values<float>(
          mine,
          [&](int64_t i) {
            return reduce_of<float>(pg.global_ranks(), pg.rank() * n + i, ReduceOp::kSum);
          },
          "in-place reduce_scatter on " + where);
      // all_to_all in place.
      Tensor a2a = filled<float>(
          n * pg.size(), [](int64_t k) { return value<float>(me(), 100 * (k / n) + k % n); });
      pg.all_to_all(a2a, a2a);
      expect_values<float>(
          a2a,
          [&](int64_t k) {
            return value<float>(pg.global_ranks()[k / n], 100 * pg.rank() + k % n);
          },
          "in-place all_to_all on " + where);
    }
  });
}

// Megabyte messages take MPI's large-message (rendezvous) path, unlike the small ones above.
TEST(Collectives, LargeMessages) {
  ProcessGroup& pg = world();
  const int64_t n = int64_t{1} << 20;  // 4 MiB of f32 per rank
  std::vector<int> all(pg.size());
  for (int r = 0; r < pg.size(); ++r) all[r] = r;
  Tensor t = filled<float>(n, [](int64_t i) { return value<float>(me(), i); });
  pg.all_reduce(t);
  expect_values<float>(
      t, [&](int64_t i) { return reduce_of<float>(all, i, ReduceOp::kSum); }, "large all_reduce");
  Tensor in = filled<float>(n / pg.size(), [](int64_t i) { return value<float>(me(), i); });
  Tensor out = Tensor::empty(Shape{n / pg.size() * pg.size()}, DType::kF32);
  pg.all_gather_async(out, in).wait();
  const int64_t m = in.numel();
  expect_values<float>(
      out, [&](int64_t j) { return value<float>(static_cast<int>(j / m), j % m); },
      "large all_gather");
  Tensor big_in = filled<float>(n, [](int64_t i) { return value<float>(me(), i); });
  Tensor big_out = Tensor::empty(Shape{n}, DType::kF32);
  const int next = (pg.rank() + 1) % pg.size(), prev = (pg.rank() + pg.size() - 1) % pg.size();
  if (pg.size() > 1) {
    Work r = pg.recv_async(big_out, prev, 1);
    pg.send(big_in, next, 1);
    r.wait();
    expect_values<float>(
        big_out, [&](int64_t i) { return value<float>(prev, i); }, "large send/recv");
  }
}

// MPI counts are int: larger tensors go in several calls. A lowered limit exercises that path.
TEST(Collectives, LargeTensorsSplitIntoSeveralMpiCalls) {
  MpiProcessGroup pg(MPI_COMM_WORLD);
  pg.set_max_count_per_call(4);
  const int64_t n = 37;  // 10 pieces, the last one short
  std::vector<int> all(pg.size());
  for (int r = 0; r < pg.size(); ++r) all[r] = r;
  for (bool async : {false, true}) {
    Tensor t = filled<float>(n, [](int64_t i) { return value<float>(me(), i); });
    if (async) {
      pg.all_reduce_async(t).wait();
    } else {
      pg.all_reduce(t);
    }
    expect_values<float>(
        t, [&](int64_t i) { return reduce_of<float>(all, i, ReduceOp::kSum); },
        "chunked all_reduce");
    Tensor b = filled<int64_t>(n, [](int64_t i) { return value<int64_t>(me(), i); });
    if (async) {
      pg.broadcast_async(b, pg.size() - 1).wait();
    } else {
      pg.broadcast(b, pg.size() - 1);
    }
    expect_values<int64_t>(
        b, [&](int64_t i) { return value<int64_t>(pg.size() - 1, i); }, "chunked broadcast");
    check_send_recv_ring<bf16>(pg, "a world group with 4-element MPI calls", async);
  }
  // Gather-type collectives need each rank's part in one call: a clear error, on every rank.
  Tensor in = Tensor::zeros(Shape{5}, DType::kF32);
  Tensor out = Tensor::zeros(Shape{5 * pg.size()}, DType::kF32);
  EXPECT_THROW(pg.all_gather(out, in), InvalidArgument);
}

TEST(Collectives, BadArgumentsThrowBeforeCommunicating) {
  ProcessGroup& pg = world();
  Tensor t = Tensor::zeros(Shape{4}, DType::kF32);
  Tensor wrong = Tensor::zeros(Shape{4 * pg.size() + 1}, DType::kF32);
  EXPECT_THROW(pg.all_gather(wrong, t), InvalidArgument);
  EXPECT_THROW(pg.reduce_scatter(t, wrong), InvalidArgument);
  Tensor other_dtype = Tensor::zeros(Shape{4 * pg.size()}, DType::kBF16);
  EXPECT_THROW(pg.all_gather(other_dtype, t), InvalidArgument);
  EXPECT_THROW(pg.broadcast(t, pg.size()), InvalidArgument);
  EXPECT_THROW(pg.send(t, pg.rank()), InvalidArgument);
  EXPECT_THROW(pg.recv(t, -1), InvalidArgument);
  EXPECT_THROW(pg.split({{0, 0}}), InvalidArgument);
  EXPECT_THROW(pg.split({{pg.size()}}), InvalidArgument);
  Tensor undefined;
  EXPECT_THROW(pg.all_reduce(undefined), InvalidArgument);
  pg.barrier();
}

// A receive larger than the message would otherwise succeed with stale trailing elements.
TEST(Collectives, RecvOfTheWrongSizeIsAnError) {
  ProcessGroup& pg = world();
  if (pg.size() < 2) return;
  if (pg.rank() == 0) {
    pg.send(Tensor::zeros(Shape{5}, DType::kF32), 1, 3);
  } else if (pg.rank() == 1) {
    Tensor t = Tensor::zeros(Shape{6}, DType::kF32);
    EXPECT_THROW(pg.recv(t, 0, 3), InvalidArgument);
  }
  pg.barrier();
}

TEST(Collectives, SplitKeepsTheListedOrder) {
  ProcessGroup& pg = world();
  // One group of every rank, listed in reverse: group rank k is world rank size-1-k.
  RankGroups reversed(1);
  for (int r = pg.size() - 1; r >= 0; --r) reversed[0].push_back(r);
  auto rev = pg.split(reversed);
  ASSERT_NE(rev, nullptr);
  EXPECT_EQ(rev->rank(), pg.size() - 1 - pg.rank());
  EXPECT_EQ(rev->global_ranks(), reversed[0]);
  Tensor in = filled<int32_t>(2, [](int64_t i) { return value<int32_t>(me(), i); });
  Tensor out = Tensor::empty(Shape{2 * pg.size()}, DType::kI32);
  rev->all_gather(out, in);
  expect_values<int32_t>(
      out, [&](int64_t j) { return value<int32_t>(pg.size() - 1 - j / 2, j % 2); },
      "all_gather in a reversed group");
  // Only rank 0 listed: everyone else gets no group.
  auto solo = pg.split({{0}});
  EXPECT_EQ(solo != nullptr, pg.rank() == 0);
  if (solo) {
    EXPECT_EQ(solo->size(), 1);
  }
}

// ---- ParallelState ---------------------------------------------------------------------------

// Every (tp, pp, cp) layout of this world whose product divides it.
std::vector<ParallelConfig> all_layouts(int world_size) {
  std::vector<ParallelConfig> out;
  for (int tp = 1; tp <= world_size; ++tp)
    for (int pp = 1; pp <= world_size; ++pp)
      for (int cp = 1; cp <= 2; ++cp)
        if (world_size % (tp * pp * cp) == 0)
          out.push_back({.tensor_model_parallel_size = tp,
                         .pipeline_model_parallel_size = pp,
                         .context_parallel_size = cp});
  return out;
}

std::vector<int> group_holding(const RankGroups& groups, int rank) {
  for (const auto& g : groups)
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  return {};
}

TEST(ParallelState, GroupsMatchRankGenerator) {
  for (const ParallelConfig& c : all_layouts(world().size())) {
    ParallelState ps(g_runtime->world(), c);
    SCOPED_TRACE(ps.str());
    RankGenerator gen(ps.grid());
    const int r = me();
    EXPECT_EQ(ps.rank(), r);
    EXPECT_EQ(ps.world_size(), world().size());
    EXPECT_EQ(ps.dp_size(), world().size() / (ps.tp_size() * ps.pp_size() * ps.cp_size()));
    EXPECT_EQ(ps.tp_group().global_ranks(), group_holding(gen.get_ranks("tp"), r));
    EXPECT_EQ(ps.pp_group().global_ranks(), group_holding(gen.get_ranks("pp"), r));
    EXPECT_EQ(ps.dp_group().global_ranks(), group_holding(gen.get_ranks("dp"), r));
    EXPECT_EQ(ps.cp_group().global_ranks(), group_holding(gen.get_ranks("cp"), r));
    EXPECT_EQ(ps.dp_cp_group().global_ranks(), group_holding(gen.get_ranks("dp-cp"), r));
    EXPECT_EQ(ps.model_parallel_group().global_ranks(), group_holding(gen.get_ranks("tp-pp"), r));
    EXPECT_EQ(ps.tp_rank(), gen.coordinate(r, "tp"));
    EXPECT_EQ(ps.pp_rank(), gen.coordinate(r, "pp"));
    EXPECT_EQ(ps.dp_rank(), gen.coordinate(r, "dp"));
    EXPECT_EQ(ps.cp_rank(), gen.coordinate(r, "cp"));
    EXPECT_EQ(ps.is_first_stage(), gen.coordinate(r, "pp") == 0);
    EXPECT_EQ(ps.is_last_stage(), gen.coordinate(r, "pp") == ps.pp_size() - 1);
    std::vector<int> emb = group_holding(embedding_rank_groups(gen.get_ranks("pp")), r);
    EXPECT_EQ(ps.in_embedding_group(), !emb.empty());
    EXPECT_EQ(ps.in_embedding_group(), ps.is_first_stage() || ps.is_last_stage());
    if (ps.in_embedding_group()) {
      EXPECT_EQ(ps.embedding_group().global_ranks(), emb);
    } else {
      EXPECT_THROW(ps.embedding_group(), InvalidArgument);
    }
    // The communicators hold who they say: the sum of world ranks over each group.
    for (const NamedGroup& g : groups_of(ps)) {
      Tensor t = Tensor::full(Shape{1}, r, DType::kI64);
      g.group->all_reduce(t);
      int64_t want = 0;
      for (int m : g.group->global_ranks()) want += m;
      EXPECT_EQ(t.data<int64_t>()[0], want) << g.name << " group";
    }
  }
}

// The expert grid (MoE): ETP x EP x EDP over each stage's ranks, Megatron's second RankGenerator
// (tp = ETP, ep = EP, dp = EDP, cp 1), for every ETP, EP dividing the stage, with tp and pp.
TEST(ParallelState, ExpertGroupsMatchTheExpertRankGenerator) {
  const int n = world().size();
  int checked = 0;
  for (int tp : {1, 2})
    for (int pp : {1, 2})
      for (int etp : {1, 2})
        for (int ep : {1, 2, 4}) {
          if (n % (tp * pp) != 0 || (n / pp) % (etp * ep) != 0) continue;
          ParallelState ps(g_runtime->world(), {.tensor_model_parallel_size = tp,
                                                .pipeline_model_parallel_size = pp,
                                                .expert_model_parallel_size = ep,
                                                .expert_tensor_parallel_size = etp});
          SCOPED_TRACE(ps.str());
          ParallelGrid eg;
          eg.tp = etp;
          eg.ep = ep;
          eg.dp = n / (pp * etp * ep);
          eg.pp = pp;
          RankGenerator gen(eg);
          const int r = me();
          EXPECT_EQ(ps.edp_size(), eg.dp);
          EXPECT_EQ(ps.experts_apart(), ep > 1 || etp != tp);
          EXPECT_EQ(ps.ep_group().global_ranks(), group_holding(gen.get_ranks("ep"), r));
          EXPECT_EQ(ps.etp_group().global_ranks(), group_holding(gen.get_ranks("tp"), r));
          EXPECT_EQ(ps.tp_ep_group().global_ranks(), group_holding(gen.get_ranks("tp-ep"), r));
          EXPECT_EQ(ps.edp_group().global_ranks(), group_holding(gen.get_ranks("dp"), r));
          EXPECT_EQ(ps.expert_model_parallel_group().global_ranks(),
                    group_holding(gen.get_ranks("tp-ep-pp"), r));
          EXPECT_EQ(ps.ep_rank(), gen.coordinate(r, "ep"));
          EXPECT_EQ(ps.edp_rank(), gen.coordinate(r, "dp"));
          // EP is carved out of the stage: the expert pipeline groups are the dense ones.
          EXPECT_EQ(gen.get_ranks("pp"), RankGenerator(ps.grid()).get_ranks("pp"));
          ++checked;
        }
  EXPECT_GE(checked, 4);
}

// --num-distributed-optimizer-instances K (Megatron's partial distributed optimizer): each
// data x context parallel group cut into K consecutive blocks (the intra-instance groups) and the
// ranks at the same place in each block (the inter-instance groups), for every K dividing it.
TEST(ParallelState, DistributedOptimizerInstanceGroups) {
  const int n = world().size();
  int checked = 0;
  for (int tp : {1, 2})
    for (int cp : {1, 2})
      for (int k : {1, 2, 4}) {
        if (n % (tp * cp) != 0 || (n / tp) % k != 0) continue;
        ParallelState ps(g_runtime->world(), {.tensor_model_parallel_size = tp,
                                              .context_parallel_size = cp,
                                              .num_distributed_optimizer_instances = k});
        SCOPED_TRACE(ps.str() + ", instances " + std::to_string(k));
        const std::vector<int> dpcp = ps.dp_cp_group().global_ranks();
        const size_t per = dpcp.size() / static_cast<size_t>(k);
        const size_t at = static_cast<size_t>(ps.dp_cp_group().rank());
        const size_t instance = at / per, place = at % per;
        const std::vector<int> intra(
            dpcp.begin() + static_cast<std::ptrdiff_t>(instance * per),
            dpcp.begin() + static_cast<std::ptrdiff_t>((instance + 1) * per));
        EXPECT_EQ(ps.intra_instance_group().global_ranks(), intra);
        EXPECT_EQ(ps.num_distributed_optimizer_instances(), k);
        if (k == 1) {
          EXPECT_EQ(ps.inter_instance_group(), nullptr);
        } else {
          std::vector<int> inter;
          for (size_t i = 0; i < static_cast<size_t>(k); ++i)
            inter.push_back(dpcp[i * per + place]);
          ASSERT_NE(ps.inter_instance_group(), nullptr);
          EXPECT_EQ(ps.inter_instance_group()->global_ranks(), inter);
          EXPECT_EQ(ps.inter_instance_group()->rank(), static_cast<int>(instance));
        }
        ++checked;
      }
  EXPECT_GE(checked, 3);
  // Experts split apart (EP 2): the expert-data-parallel group cut the same way.
  if (n % 4 == 0) {
    ParallelState ps(g_runtime->world(),
                     {.expert_model_parallel_size = 2, .num_distributed_optimizer_instances = 2});
    const std::vector<int> edp = ps.edp_group().global_ranks();
    const size_t per = edp.size() / 2, at = static_cast<size_t>(ps.edp_rank());
    const std::vector<int> intra(edp.begin() + static_cast<std::ptrdiff_t>(at / per * per),
                                 edp.begin() + static_cast<std::ptrdiff_t>((at / per + 1) * per));
    EXPECT_EQ(ps.intra_instance_expert_group().global_ranks(), intra);
    ASSERT_NE(ps.inter_instance_expert_group(), nullptr);
    EXPECT_EQ(ps.inter_instance_expert_group()->global_ranks(),
              (std::vector<int>{edp[at % per], edp[per + at % per]}));
  }
  // K must divide dp x cp: the same refusal on every rank.
  EXPECT_THROW(ParallelState(g_runtime->world(), {.num_distributed_optimizer_instances = 3}),
               InvalidArgument);
}

// all_to_all_v and all_gather_v with uneven (and empty) chunks: rank r sends (r + j) % 3
// elements r * 100 + j + k / 10 to rank j; every rank contributes r + 1 elements to the gather.
TEST(Collectives, AllToAllVAndAllGatherVWithUnevenAndEmptyChunks) {
  ProcessGroup& g = world();
  const int n = g.size(), r = me();
  std::vector<int64_t> send(n), recv(n);
  for (int j = 0; j < n; ++j) {
    send[j] = (r + j) % 3;
    recv[j] = (j + r) % 3;
  }
  int64_t ns = 0, nr = 0;
  for (int j = 0; j < n; ++j) {
    ns += send[j];
    nr += recv[j];
  }
  Tensor in = Tensor::empty({ns}, DType::kF64), out = Tensor::empty({nr}, DType::kF64);
  int64_t at = 0;
  for (int j = 0; j < n; ++j)
    for (int64_t k = 0; k < send[j]; ++k) in.data<double>()[at++] = r * 100 + j + k / 10.0;
  g.all_to_all_v(out, in, send, recv);
  at = 0;
  for (int i = 0; i < n; ++i)
    for (int64_t k = 0; k < recv[i]; ++k)
      EXPECT_EQ(out.data<double>()[at++], i * 100 + r + k / 10.0) << "from rank " << i;

  std::vector<int64_t> counts(n);
  for (int i = 0; i < n; ++i) counts[i] = i + 1;
  Tensor mine = Tensor::full({r + 1}, r, DType::kI64);
  Tensor all = Tensor::empty({n * (n + 1) / 2}, DType::kI64);
  g.all_gather_v(all, mine, counts);
  at = 0;
  for (int i = 0; i < n; ++i)
    for (int k = 0; k <= i; ++k) EXPECT_EQ(all.data<int64_t>()[at++], i);
}

TEST(ParallelState, BadLayoutFailsOnEveryRankWithoutHanging) {
  const int n = world().size();
  EXPECT_THROW(ParallelState(g_runtime->world(), {.tensor_model_parallel_size = n + 1}),
               InvalidArgument);
  EXPECT_THROW(ParallelState(g_runtime->world(),
                             {.tensor_model_parallel_size = 2, .pipeline_model_parallel_size = n}),
               InvalidArgument);
  // EP x ETP must divide the ranks of a pipeline stage.
  EXPECT_THROW(ParallelState(g_runtime->world(), {.expert_model_parallel_size = n + 1}),
               InvalidArgument);
  EXPECT_THROW(ParallelState(g_runtime->world(),
                             {.expert_model_parallel_size = 2, .expert_tensor_parallel_size = n}),
               InvalidArgument);
  world().barrier();  // every rank got here: nobody entered a split the others skipped
}

// ---- MpiRuntime ------------------------------------------------------------------------------

TEST(MpiRuntime, RanksFromTheLauncher) {
  EXPECT_EQ(g_runtime->world_size(), g_expected_world);
  EXPECT_EQ(world().size(), g_runtime->world_size());
  EXPECT_EQ(world().rank(), g_runtime->rank());
  // CTest starts every process on this machine.
  EXPECT_EQ(g_runtime->local_size(), g_runtime->world_size());
  EXPECT_EQ(g_runtime->local_rank(), g_runtime->rank());
  EXPECT_GE(g_runtime->node_cores(), 1);
  EXPECT_EQ(g_runtime->default_threads_per_rank(),
            threads_per_rank(g_runtime->node_cores(), available_cores(), g_runtime->local_size()));
  EXPECT_GE(g_runtime->default_threads_per_rank(), 1);
}

}  // namespace
}  // namespace megatron

int main(int argc, char** argv) {
  megatron::MpiRuntime runtime(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  megatron::g_expected_world = megatron::testing::expected_world_size(argc, argv);
  megatron::g_runtime = &runtime;
  // --abort-from-rank=R: rank R aborts while the others wait in a barrier; the job must end (with
  // a non-zero status) instead of hanging. This is what a failing rank does in the trainer.
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--abort-from-rank=", 18) == 0) {
      if (runtime.rank() == std::atoi(argv[i] + 18)) {
        std::fprintf(stderr, "rank %d: aborting the job on purpose\n", runtime.rank());
        megatron::MpiRuntime::abort(3);
      }
      runtime.world()->barrier();
      std::fprintf(stderr, "rank %d: left a barrier that a dead rank never entered\n",
                   runtime.rank());
      return 0;
    }
  }
  return megatron::testing::run_all_tests_on_every_rank(runtime, megatron::g_expected_world);
}
