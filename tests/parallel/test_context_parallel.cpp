// Context-parallel attention (parallel/context_parallel.h) under a real MPI job, the world as the
// context-parallel group (2 and 4 ranks), against the whole sequence's attention on the
// reference device: for each comm type (p2p, allgather, a2a; a2a+p2p as 2 x 2 at 4 ranks),
// causal and not, with document
// masks and with attention dropout, chunks of odd length, each rank's output, lse and packed
// dQKV must be the rows of the whole-sequence results that its chunks hold (r and 2 cp - 1 - r).
//
// Tolerance: both sides compute in f64; the merge over key blocks (exp(lse_i - lse) weights) and
// the blockwise sums of dK, dV reorder the arithmetic, which moves results by a few ulp of the
// row's magnitude: 1e-12 relative plus 1e-12 absolute. A wrong block (a missing or doubled key
// chunk, a wrong offset, a mask or dropout counter off by a chunk) is an O(1e-2) error or more.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/mpi_runtime.h"
#include "core/threads.h"
#include "parallel/context_parallel.h"
#include "testing/mpi_testing.h"
#include "testing/testing.h"

namespace megatron {
namespace {

MpiRuntime* g_runtime = nullptr;
int g_expected_world = 0;
constexpr int64_t kB = 2, kGroups = 4, kPerGroup = 2, kHn = 4;  // 8 query heads, 4 KV heads
constexpr int64_t kHeads = kGroups * kPerGroup;

// Rows of chunks r and 2n - 1 - r of a [S, ...] tensor, as this rank's local [2c, ...].
Tensor local_rows(const Tensor& full, int rank, int n) {
  const int64_t c = full.dim(0) / (2 * n);
  Shape shape = full.shape();
  shape[0] = 2 * c;
  Tensor out = Tensor::empty(shape, full.dtype());
  out.slice0(0, c).copy_from(full.slice0(rank * c, (rank + 1) * c));
  out.slice0(c, 2 * c).copy_from(full.slice0((2 * n - 1 - rank) * c, (2 * n - rank) * c));
  return out;
}

struct Whole {
  Tensor out, lse, dqkv;
};

// The whole sequence's attention and its backward on the reference device.
Whole reference(const Tensor& qkv, const Tensor& dout, const ops::AttentionSpec& spec) {
  using ops::packed_qkv_view, ops::QkvPart;
  const int64_t S = qkv.dim(0);
  const Tensor q = qkv.to(Device::kReference);
  ops::AttentionSpec s = spec;
  if (s.doc_start.defined()) s.doc_start = s.doc_start.to(Device::kReference);
  Whole w{Tensor::empty({S, kB, kHeads, kHn}, DType::kF64, Device::kReference),
          Tensor::empty({kB, kHeads, S}, DType::kF64, Device::kReference),
          Tensor::empty(qkv.shape(), DType::kF64, Device::kReference)};
  ops::attention_forward(w.out, w.lse, packed_qkv_view(q, QkvPart::kQuery),
                         packed_qkv_view(q, QkvPart::kKey), packed_qkv_view(q, QkvPart::kValue), s);
  ops::attention_backward(
      packed_qkv_view(w.dqkv, QkvPart::kQuery), packed_qkv_view(w.dqkv, QkvPart::kKey),
      packed_qkv_view(w.dqkv, QkvPart::kValue), Tensor(), dout.to(Device::kReference),
      packed_qkv_view(q, QkvPart::kQuery), packed_qkv_view(q, QkvPart::kKey),
      packed_qkv_view(q, QkvPart::kValue), w.out, w.lse, s);
  return {w.out.to(Device::kCPU), w.lse.to(Device::kCPU), w.dqkv.to(Device::kCPU)};
}

struct Setting {
  const char* name;
  bool causal, documents;
  float dropout;
};

// a2a+p2p at 4 ranks: inner groups {0, 1}, {2, 3}; outer rings {0, 2}, {1, 3}.
struct Hierarchy {
  std::shared_ptr<ProcessGroup> inner, outer;
};
Hierarchy& hierarchy() {
  static Hierarchy h = [] {
    Hierarchy x;
    x.inner = g_runtime->world()->split({{0, 1}, {2, 3}});
    x.outer = g_runtime->world()->split({{0, 2}, {1, 3}});
    return x;
  }();
  return h;
}

void check(CpCommType comm, const Setting& st, int64_t chunk, Tensor* forward_out = nullptr) {
  const int n = g_runtime->world_size(), r = g_runtime->rank();
  const int64_t S = 2 * n * chunk;
  const Tensor qkv =
      testing::random_tensor({S, kB, kGroups, kPerGroup + 2, kHn}, 41, 1.0, DType::kF64);
  const Tensor dout = testing::random_tensor({S, kB, kHeads, kHn}, 42, 1.0, DType::kF64);
  ops::AttentionSpec spec;
  spec.scale = 0.5f;
  spec.causal = st.causal;
  spec.dropout = st.dropout;
  spec.seed = 9;
  spec.stream = 4;
  spec.total_heads = kHeads;
  Tensor doc_full;
  if (st.documents) {
    // Documents [0, 5), [5, S) in sequence 0; [0, S - 3), [S - 3, S) in sequence 1.
    doc_full = Tensor::empty({kB, S}, DType::kI32);
    for (int64_t t = 0; t < S; ++t) {
      doc_full.data<int32_t>()[t] = t < 5 ? 0 : 5;
      doc_full.data<int32_t>()[S + t] = static_cast<int32_t>(t < S - 3 ? 0 : S - 3);
    }
    spec.doc_start = doc_full;
  }
  const Whole want = reference(qkv, dout, spec);

  ContextParallelContext cp{g_runtime->world().get(), comm};
  if (comm == CpCommType::kA2AP2P) {
    cp.inner = hierarchy().inner.get();
    cp.outer = hierarchy().outer.get();
  }
  ops::AttentionSpec local = spec;
  if (st.documents) local.doc_start = cp_local_columns(doc_full, cp);
  const Tensor lq = local_rows(qkv, r, n);
  Tensor out = Tensor::empty({2 * chunk, kB, kHeads, kHn}, DType::kF64);
  Tensor lse = Tensor::empty({kB, kHeads, 2 * chunk}, DType::kF64);
  cp_attention_forward(out, lse, lq, local, cp);
  EXPECT_TRUE(testing::allclose(out, local_rows(want.out, r, n), 1e-12, 1e-12)) << "output";
  // lse [b, np, S]: this rank's columns.
  const Tensor want_lse = cp_local_columns(want.lse.view({kB * kHeads, S}), cp);
  EXPECT_TRUE(testing::allclose(lse.view({kB * kHeads, 2 * chunk}), want_lse, 1e-12, 1e-12))
      << "lse";
  Tensor dqkv = Tensor::empty(lq.shape(), DType::kF64);
  cp_attention_backward(dqkv, local_rows(dout, r, n), lq, out, lse, local, cp);
  EXPECT_TRUE(testing::allclose(dqkv, local_rows(want.dqkv, r, n), 1e-12, 1e-12)) << "dqkv";
  if (forward_out) *forward_out = out;
}

const Setting kSettings[] = {{"causal", true, false, 0.0f},
                             {"not causal", false, false, 0.0f},
                             {"causal with documents", true, true, 0.0f},
                             // p = 0.5: the keep-scale 1/(1-p) = 2 is exact in f32 (the CPU
                             // kernel's) and f64 (the reference's), so only the masks matter.
                             {"causal with dropout", true, false, 0.5f}};

TEST(ContextParallelAttention, EveryCommTypeGivesTheWholeSequenceRows) {
  std::vector<CpCommType> comms = {CpCommType::kP2P, CpCommType::kAllGather, CpCommType::kA2A};
  if (g_runtime->world_size() == 4) {
    comms.push_back(CpCommType::kA2AP2P);
    (void)hierarchy();  // collective: every rank splits, in the same order
  }
  for (CpCommType comm : comms) {
    for (const Setting& st : kSettings) {
      for (int64_t chunk : {3, 5}) {
        SCOPED_TRACE(std::string(cp_comm_type_name(comm)) + ", " + st.name + ", chunk " +
                     std::to_string(chunk));
        check(comm, st, chunk);
      }
    }
  }
}

TEST(ContextParallelAttention, RingAndAllGatherForwardsAreBitIdentical) {
  for (const Setting& st : kSettings) {
    SCOPED_TRACE(st.name);
    Tensor ring, gathered;
    check(CpCommType::kP2P, st, 5, &ring);
    check(CpCommType::kAllGather, st, 5, &gathered);
    EXPECT_TRUE(testing::allclose(ring, gathered, 0, 0));
  }
}

TEST(ContextParallelAttention, SequenceLengthsThatDoNotSplitAreRefused) {
  const ContextParallelContext cp{g_runtime->world().get(), CpCommType::kP2P};
  const int64_t bad = 2 * g_runtime->world_size() * 3 + 2;
  try {
    cp_local_columns(Tensor::zeros({kB, bad}, DType::kI64), cp);
    ADD_FAILURE() << "a length of " << bad << " was split";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("divisible by 2 x --context-parallel-size"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_cp_comm_type("ring"), InvalidArgument);
}

}  // namespace
}  // namespace megatron

int main(int argc, char** argv) {
  megatron::MpiRuntime runtime(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  megatron::set_num_threads(runtime.default_threads_per_rank());
  megatron::g_expected_world = megatron::testing::expected_world_size(argc, argv);
  megatron::g_runtime = &runtime;
  return megatron::testing::run_all_tests_on_every_rank(runtime, megatron::g_expected_world);
}
