// The models/common parts whose tensor- and sequence-parallel paths GPT does not exercise, under
// a real MPI job (2 and 4 processes; every TP size dividing the world, with and without
// --sequence-parallel): LanguageEmbedding with token types, learned positions and dropout, and
// Pooler. (The word embeddings and the LM head in every layout: tests/models/
// test_gpt_model_parallel.cpp.)
//
// Every rank runs the single-process layer (self group) as the reference and the parallel one
// initialised from the same seed; each must give the reference's output (its s/tp positions
// under sequence parallelism), input gradient and parameter gradients (the shard's slice). All
// bit for bit: the only cross-rank sums add one rank's value to zeros (the vocab-parallel lookup)
// and the gathers and splits copy, so nothing is rounded differently.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/mpi_runtime.h"
#include "comm/parallel_state.h"
#include "core/threads.h"
#include "models/common/language_embedding.h"
#include "models/common/pooler.h"
#include "testing/mpi_testing.h"
#include "testing/testing.h"

namespace megatron {
namespace {

MpiRuntime* g_runtime = nullptr;
int g_expected_world = 0;
constexpr int64_t kS = 8, kB = 2, kH = 8;  // s divisible by 4: the sequence-parallel split
constexpr uint64_t kSeed = 77;

TransformerConfig config() {
  TransformerConfig c;
  c.num_layers = 1;
  c.hidden_size = kH;
  c.num_attention_heads = 4;
  c.seq_length = kS;
  c.vocab_size = 30;
  c.padded_vocab_size = 32;
  c.hidden_dropout = 0.25;
  c.finalize();
  return c;
}

const ForwardMode kTraining{true, 5, 2};

std::string layout(int tp, bool sp) {
  return "tp " + std::to_string(tp) + (sp ? " sp" : "") + " rank " +
         std::to_string(g_runtime->rank());
}

// Rows [r s/tp, (r + 1) s/tp) of an [s, b, h] tensor: rank r's sequence-parallel part.
Tensor my_positions(const Tensor& x, const TensorParallelContext& tp) {
  if (!tp.sp()) return x;
  const int64_t part = kS / tp.size();
  return x.slice0(tp.rank() * part, (tp.rank() + 1) * part).clone();
}

// The elements of `full` that shard p holds.
Tensor slice_of_full(const Param& p, const Tensor& full) {
  Tensor out = Tensor::empty(p.shape, full.dtype());
  for (int64_t i = 0; i < out.numel(); ++i)
    out.data<float>()[i] = full.data<float>()[p.full_index(i)];
  return out;
}

template <typename Layer>
std::vector<Param*> params_of(Layer& l) {
  std::vector<Param*> ps;
  l.collect(ps);
  return ps;
}

TEST(CommonParallel, LanguageEmbeddingWithTokenTypesAndDropout) {
  const TransformerConfig cfg = config();
  const Tensor tokens = testing::random_ids({kB, kS}, 1, cfg.vocab_size);
  const Tensor types = testing::random_ids({kB, kS}, 2, 2);
  const Tensor dy = testing::random_tensor({kS, kB, kH}, 3);
  auto self = make_self_process_group();
  LanguageEmbedding whole(cfg, {self.get(), false, {}}, 2);
  ParamSet whole_params(params_of(whole), DType::kF32);
  whole_params.initialize(kSeed);
  LanguageEmbedding::Ctx wctx;
  const Tensor want = whole.forward(tokens, Tensor(), types, wctx, kTraining);
  whole_params.zero_grads();
  whole.backward(dy, wctx);

  for (int t = 1; t <= g_runtime->world_size(); ++t) {
    if (g_runtime->world_size() % t != 0) continue;
    for (bool sp : {false, true}) {
      SCOPED_TRACE(layout(t, sp));
      ParallelState ps(g_runtime->world(), {.tensor_model_parallel_size = t});
      const TensorParallelContext tp{ps.tp_group_ptr().get(), sp, {}};
      LanguageEmbedding part(cfg, tp, 2);
      ParamSet part_params(params_of(part), DType::kF32);
      part_params.initialize(kSeed);
      LanguageEmbedding::Ctx ctx;
      const Tensor got = part.forward(tokens, Tensor(), types, ctx, kTraining);
      EXPECT_TRUE(testing::allclose(got, my_positions(want, tp), 0, 0)) << "output";
      part_params.zero_grads();
      part.backward(my_positions(dy, tp), ctx);
      for (Param* p : part_params.params()) {
        const Tensor full = whole_params.find(p->name).main_grad;
        EXPECT_TRUE(testing::allclose(p->main_grad, slice_of_full(*p, full), 0, 0)) << p->name;
      }
    }
  }
}

TEST(CommonParallel, PoolerGathersTheSequenceAndSplitsItsGradient) {
  const Tensor hidden = testing::random_tensor({kS, kB, kH}, 4);
  const Tensor dy = testing::random_tensor({kB, kH}, 5);
  auto self = make_self_process_group();
  Pooler whole("pooler", kH, 0.3, {self.get(), false, {}});
  ParamSet whole_params(params_of(whole), DType::kF32);
  whole_params.initialize(kSeed);
  Pooler::Ctx wctx;
  const Tensor want = whole.forward(hidden, wctx);
  whole_params.zero_grads();
  const Tensor want_dx = whole.backward(dy, wctx);

  for (int t = 1; t <= g_runtime->world_size(); ++t) {
    if (g_runtime->world_size() % t != 0) continue;
    for (bool sp : {false, true}) {
      SCOPED_TRACE(layout(t, sp));
      ParallelState ps(g_runtime->world(), {.tensor_model_parallel_size = t});
      const TensorParallelContext tp{ps.tp_group_ptr().get(), sp, {}};
      Pooler part("pooler", kH, 0.3, tp);
      ParamSet part_params(params_of(part), DType::kF32);
      part_params.initialize(kSeed);
      Pooler::Ctx ctx;
      EXPECT_TRUE(testing::allclose(part.forward(my_positions(hidden, tp), ctx), want, 0, 0));
      part_params.zero_grads();
      const Tensor dx = part.backward(dy, ctx);
      EXPECT_TRUE(testing::allclose(dx, my_positions(want_dx, tp), 0, 0)) << "input gradient";
      for (Param* p : part_params.params()) {
        EXPECT_FALSE(p->is_tensor_parallel()) << p->name;
        EXPECT_TRUE(testing::allclose(p->main_grad, whole_params.find(p->name).main_grad, 0, 0))
            << p->name;
      }
    }
  }
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
