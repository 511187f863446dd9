// GPTModel under tensor, sequence and pipeline parallelism against the single-process model, in
// f32 with dropout on, for a tiny GPT-2-style and a tiny Llama-style config (CTest runs this
// binary under mpiexec with 2 and 4 processes; the tensor-parallel tests run for every TP size
// dividing the world, the TP groups laid out by ParallelState).
//
// Every rank builds the whole model on its own (self group) and runs it as the reference, then:
//   1. a tensor-parallel model (with and without --sequence-parallel) is initialised from the
//      same seed: each shard must hold exactly its slice of the whole model's weights;
//   2. both run forward and backward on the same batch with the same dropout coordinates: the
//      per-token loss and every shard's gradient must match the whole model's (exactly for TP 1,
//      within the tolerances below otherwise);
//   3. the model is cut into two pipeline stages inside one process (no pipeline communication),
//      the first stage's output fed to the second and the second's input gradient back to the
//      first: loss and gradients must be the whole model's bit for bit, in one process and, the
//      stages and the whole model alike tensor parallel, in every TP layout (the tied
//      embedding's two copies: see check_two_stages).
// Dropout masks are a pure function of (seed, stream, element of the full tensor), so they are
// the same in every layout; a wrong mask anywhere moves the loss far beyond the tolerances (the
// LossAndGrads tests check that a different stream does).
//
// Not here: pipeline stages talking over MPI (the pipeline executor's tests) and the trainer's
// gradient finishing beyond the sequence-parallel all-reduce done by hand below.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/mpi_runtime.h"
#include "comm/parallel_state.h"
#include "core/threads.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/mtp.h"
#include "tensor/ops.h"
#include "testing/mpi_testing.h"
#include "testing/testing.h"

namespace megatron {
namespace {

MpiRuntime* g_runtime = nullptr;
int g_expected_world = 0;

// TP sizes to test: every divisor of the world size.
std::vector<int> tp_sizes() {
  std::vector<int> out;
  for (int t = 1; t <= g_runtime->world_size(); ++t)
    if (g_runtime->world_size() % t == 0) out.push_back(t);
  return out;
}

constexpr int64_t kB = 2;
constexpr uint64_t kInitSeed = 1234;
const ForwardMode kTraining{true, 99, 3};  // dropout on, micro-batch stream 3

// Tolerances where ranks sum partial results. A cross-rank sum (row-parallel outputs, the column
// layers' input gradients, the vocab-parallel softmax sums, the output layer's input gradient,
// the sequence-parallel gradient all-reduce) adds p partial sums after each rank summed its own
// terms, where one process sums all K terms in its GEMM's order. For the K <= 128 terms of these
// widths the two orders differ by at most about 2 K u sum|terms| (u = 2^-24), in practice by a few
// u (rounding errors are not all of one sign); that perturbation passes through at most three
// layers and the softmax. Measured worst: 2e-7 relative on the loss, 1.3e-6 of the largest
// |gradient| of a tensor. A wrong slice or a missing reduction is an O(1) error of the values it
// touches; the masks of another micro-batch move the loss by over 0.5 relative (the LossAndGrads
// tests check that it is above 1e-2, 1000 kLossTol).
//   kLossTol: relative, per token; the loss is O(log V) = O(4), never near zero. 50x the worst.
//   kGradTol: of the tensor's largest |element| (individual elements may be cancellations near
//   zero, where a relative error means nothing). About 8x the worst.
constexpr double kLossTol = 1e-5;
constexpr double kGradTol = 1e-5;

// Divisible by 4 everywhere TP splits (heads, query groups, ffn, padded vocabulary, sequence).
TransformerConfig gpt2_config() {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.seq_length = 8;
  c.max_position_embeddings = 10;  // rows 8, 9 never used: zero gradient in every layout
  c.vocab_size = 61;
  c.padded_vocab_size = 64;  // rank 3 of TP 4 holds 13 real rows and 3 padding rows
  c.hidden_dropout = 0.1;
  c.attention_dropout = 0.1;
  c.init_method_std = 0.2;  // large enough that every branch moves the loss
  c.compute_dtype = DType::kF32;
  c.finalize();
  return c;
}

TransformerConfig llama_config() {
  TransformerConfig c = gpt2_config();
  c.num_layers = 3;
  c.hidden_size = 32;
  c.num_attention_heads = 8;
  c.num_query_groups = 4;  // GQA: 2 query heads per key/value head
  c.kv_channels = 0;
  c.ffn_hidden_size = 48;  // fc1 is [gate | up], 96 rows, stride-2 shards
  c.normalization = Normalization::kRMSNorm;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.position_embedding = PositionEmbedding::kRope;
  c.untie_embeddings_and_output_weights = true;
  c.finalize();
  return c;
}

// A model (whole, a TP shard or a pipeline stage) and its parameters, initialised from kInitSeed.
struct Model {
  GPTModel model;
  ParamSet params;
  Model(const TransformerConfig& cfg, GPTStage stage)
      : model(cfg, std::move(stage)), params(model.parameters(), DType::kF32) {
    params.initialize(kInitSeed);
  }
};

// The elements of `full` (a tensor shaped like p's full tensor) that shard p holds, shaped like p.
Tensor slice_of_full(const Param& p, const Tensor& full) {
  EXPECT_EQ(full.shape(), p.full_shape()) << p.name;
  Tensor out = Tensor::empty(p.shape, DType::kF64);
  double* o = out.data<double>();
  for (int64_t i = 0; i < out.numel(); ++i) o[i] = full.item(p.full_index(i));
  return out.to(full.dtype());  // f32 -> f64 -> f32: exact
}

// Norm weights start at 1 and biases at 0, where a bias added once per rank instead of once, or
// a norm weight applied to the wrong slice, would go unseen: move them by a noise that is a
// function of (name, element of the full tensor), so that every layout gets the same values.
void perturb_constant_inits(ParamSet& ps) {
  for (Param* p : ps.params()) {
    if (p->init == Init::kNormal) continue;
    Tensor noise = testing::random_tensor(p->full_shape(), stable_hash(p->name), 0.2);
    Tensor mine = slice_of_full(*p, noise);
    ops::add_inplace(p->main, mine);
  }
  ps.sync_compute_from_main();
}

struct Batch {
  Tensor tokens, labels;  // [b, s] i64 < vocab_size
  Tensor dloss;           // [b, s] f32, a different weight per token ([b, s] vs [s, b] matters)
};

Batch make_batch(const TransformerConfig& cfg) {
  const Shape bs{kB, cfg.seq_length};
  return {testing::random_ids(bs, 5, cfg.vocab_size), testing::random_ids(bs, 6, cfg.vocab_size),
          testing::random_tensor(bs, 7)};
}

// Forward and backward of a whole (or tensor-parallel) model on `batch`; returns the loss [b, s].
Tensor forward_backward(Model& m, const Batch& batch, const ForwardMode& mode) {
  GPTModel::Ctx ctx;
  Tensor loss = m.model.forward(batch.tokens, batch.labels, Tensor(), ctx, mode);
  m.model.backward(batch.dloss, ctx);
  return loss;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.item(i)));
  return m;
}

std::string layout_name(int tp, bool sp) {
  return "tp " + std::to_string(tp) + (sp ? " sp" : "") + " rank " +
         std::to_string(g_runtime->rank());
}

// ---- 1. initialisation ------------------------------------------------------------------------

void check_init_is_the_slice(const TransformerConfig& cfg) {
  Model whole(cfg, {});
  for (int tp : tp_sizes()) {
    for (bool sp : {false, true}) {
      ParallelState ps(g_runtime->world(), {.tensor_model_parallel_size = tp});
      Model shard(cfg, GPTStage{.tp = ps.tp_group_ptr(), .sequence_parallel = sp});
      const std::string at = layout_name(tp, sp);
      ASSERT_EQ(shard.params.params().size(), whole.params.params().size()) << at;
      for (Param* p : shard.params.params()) {
        const Param& full = whole.params.find(p->name);
        EXPECT_EQ(p->tp_size, tp) << at << " " << p->name;
        // A copy of the values, no arithmetic: exact.
        EXPECT_TRUE(testing::allclose(p->main, slice_of_full(*p, full.main), 0, 0))
            << at << " " << p->name;
      }
    }
  }
}

TEST(TensorParallelGPT, Gpt2InitIsTheSliceOfTheWholeModel) {
  check_init_is_the_slice(gpt2_config());
}

TEST(TensorParallelGPT, LlamaInitIsTheSliceOfTheWholeModel) {
  check_init_is_the_slice(llama_config());
}

// ---- 2. loss and gradients --------------------------------------------------------------------

void check_loss_and_grads(const TransformerConfig& cfg) {
  const Batch batch = make_batch(cfg);
  Model whole(cfg, {});
  perturb_constant_inits(whole.params);
  const Tensor loss = forward_backward(whole, batch, kTraining);

  for (int tp : tp_sizes()) {
    for (bool sp : {false, true}) {
      ParallelState ps(g_runtime->world(), {.tensor_model_parallel_size = tp});
      Model shard(cfg, GPTStage{.tp = ps.tp_group_ptr(), .sequence_parallel = sp});
      perturb_constant_inits(shard.params);
      const std::string at = layout_name(tp, sp);
      EXPECT_EQ(shard.model.activation_shape(kB),
                (Shape{cfg.seq_length / (sp ? tp : 1), kB, cfg.hidden_size}))
          << at;
      const Tensor shard_loss = forward_backward(shard, batch, kTraining);
      // The trainer's finishing step for sequence parallelism: replicated params that saw only
      // this rank's s/tp tokens hold partial gradients, summed over TP.
      for (Param* p : shard.params.params()) {
        EXPECT_EQ(p->sequence_parallel, sp && tp > 1 && p->tp_partition_dim < 0 &&
                                            p->name.find("embedding") == std::string::npos)
            << at << " " << p->name;
        if (p->sequence_parallel) ps.tp_group().all_reduce(p->main_grad);
      }
      if (tp == 1) {
        // A size-1 group runs the single-process code (sequence parallelism is ignored): the
        // same ops in the same order, bit for bit.
        EXPECT_TRUE(testing::allclose(shard_loss, loss, 0, 0)) << at << " loss";
        for (Param* p : shard.params.params()) {
          EXPECT_TRUE(testing::allclose(p->main_grad, whole.params.find(p->name).main_grad, 0, 0))
              << at << " " << p->name;
        }
        continue;
      }
      // Every gradient lies downstream of a cross-rank sum (the loss itself is one), so nothing
      // is bit for bit here: kLossTol and kGradTol.
      EXPECT_TRUE(testing::allclose(shard_loss, loss, 0, kLossTol)) << at << " loss";
      for (Param* p : shard.params.params()) {
        Tensor want = slice_of_full(*p, whole.params.find(p->name).main_grad);
        EXPECT_TRUE(testing::allclose(p->main_grad, want, kGradTol * max_abs(want), 0))
            << at << " " << p->name;
      }
    }
  }

  // The tolerances are far below what a wrong dropout mask costs: the masks of another
  // micro-batch move the loss by orders of magnitude more.
  Model other(cfg, {});
  perturb_constant_inits(other.params);
  const ForwardMode other_masks{true, kTraining.seed, kTraining.stream + 1};
  const testing::CloseReport r =
      testing::compare(forward_backward(other, batch, other_masks), loss, 0, 0);
  EXPECT_GT(r.max_rel, 1000 * kLossTol) << "dropout barely moves the loss: " << r.max_rel;
}

TEST(TensorParallelGPT, Gpt2LossAndGradsMatchTheWholeModel) {
  check_loss_and_grads(gpt2_config());
}

TEST(TensorParallelGPT, LlamaLossAndGradsMatchTheWholeModel) {
  check_loss_and_grads(llama_config());
}

// ---- 3. two pipeline stages in one process ----------------------------------------------------

// One layout: the whole model (tensor parallel over ps's TP group when tp > 1) against its two
// stages in the same layout.
void check_two_stages(const TransformerConfig& cfg, const Batch& batch, const ParallelState& ps,
                      bool sp) {
  const std::string at = layout_name(ps.tp_size(), sp);
  const GPTStage base{.tp = ps.tp_group_ptr(), .sequence_parallel = sp};
  GPTStage first_stage = base, last_stage = base;
  first_stage.num_layers = 1;
  first_stage.post_process = false;
  last_stage.first_layer = 1;
  last_stage.pre_process = false;
  Model whole(cfg, base), first(cfg, first_stage), last(cfg, last_stage);
  for (Model* m : {&whole, &first, &last}) perturb_constant_inits(m->params);
  const Tensor loss = forward_backward(whole, batch, kTraining);

  const GPTInputs in{batch.tokens, batch.labels, Tensor(), Tensor(), Tensor()};
  GPTModel::Ctx ctx_first, ctx_last;
  const Tensor hidden = first.model.forward_stage(Tensor(), in, ctx_first, kTraining);
  EXPECT_EQ(hidden.shape(), first.model.activation_shape(kB)) << at;
  EXPECT_EQ(hidden.shape(), last.model.activation_shape(kB)) << at;
  const Tensor stage_loss = last.model.forward_stage(hidden, in, ctx_last, kTraining);
  // The same kernels and collectives on the same values in the same order: bit for bit.
  EXPECT_TRUE(testing::allclose(stage_loss, loss, 0, 0)) << at << " loss";
  const Tensor dhidden = last.model.backward_stage(batch.dloss, ctx_last);
  EXPECT_EQ(dhidden.shape(), hidden.shape()) << at;
  EXPECT_FALSE(first.model.backward_stage(dhidden, ctx_first).defined()) << at;

  // Every parameter of the whole model lives on exactly one stage, except the tied embedding,
  // whose second copy is the last stage's output weight.
  const bool tied = !cfg.untie_embeddings_and_output_weights;
  std::map<int64_t, int> count;  // occurrences of each token id in the batch
  for (int64_t i = 0; i < batch.tokens.numel(); ++i)
    ++count[static_cast<int64_t>(batch.tokens.item(i))];
  for (Param* p : whole.params.params()) {
    std::vector<Param*> copies;
    for (Model* m : {&first, &last})
      for (Param* q : m->params.params())
        if (q->name == p->name) copies.push_back(q);
    const bool shared = tied && p->name == "embedding.word_embeddings.weight";
    ASSERT_EQ(copies.size(), shared ? 2u : 1u) << at << " " << p->name;
    for (Param* q : copies) {
      EXPECT_TRUE(testing::allclose(q->main, p->main, 0, 0)) << at << " " << p->name << " init";
      EXPECT_EQ(q->shared_embedding, q == copies.back() && shared) << at << " " << p->name;
    }
    if (!shared) {
      EXPECT_TRUE(testing::allclose(copies[0]->main_grad, p->main_grad, 0, 0))
          << at << " " << p->name;
      continue;
    }
    // The whole model adds the output GEMM's dW and then, token by token, each embedding row's
    // gradient into one buffer: G + d_1 + d_2 + ...; the stages hold d_1 + d_2 + ... (from 0)
    // and G apart, summed here. A row whose token occurs at most once in the batch is G, or
    // d_1 + G = G + d_1 (addition is commutative): exact. A repeated token's row is regrouped,
    // (d_1 + d_2) + G against (G + d_1) + d_2: for k <= 3 repeats (this batch) a few u apart
    // (u = 2^-24) relative to the terms, which are gradients of the same size as the tensor's
    // largest |element|; 1e-6 of that is 16 u. Measured: at most 1 u.
    Tensor sum = copies[0]->main_grad.clone();
    ops::add_inplace(sum, copies[1]->main_grad);
    const double tol = 1e-6 * max_abs(p->main_grad);
    const int64_t h = cfg.hidden_size;
    int repeated = 0;
    for (int64_t row = 0; row < p->shape[0]; ++row) {
      const int64_t v = p->full_index(row * h) / h;  // this shard's row in the full vocabulary
      const int k = count.contains(v) ? count[v] : 0;
      repeated += k > 1;
      EXPECT_TRUE(testing::allclose(sum.slice0(row, row + 1), p->main_grad.slice0(row, row + 1),
                                    k > 1 ? tol : 0, 0))
          << at << " " << p->name << " row " << v << ", token seen " << k << " times";
    }
    // Counted over the TP group: one shard's block of the vocabulary may hold no repeated token.
    Tensor n = Tensor::full({1}, repeated, DType::kI32);
    ps.tp_group().all_reduce(n);
    EXPECT_GT(n.item(), 0) << at << ": no repeated token, the regrouped case went untested";
  }
}

void check_two_stages(const TransformerConfig& cfg) {
  const Batch batch = make_batch(cfg);
  for (int tp : tp_sizes()) {
    for (bool sp : {false, true}) {
      ParallelState ps(g_runtime->world(), {.tensor_model_parallel_size = tp});
      if (tp == 1 && sp) continue;  // sequence parallelism is ignored without TP
      check_two_stages(cfg, batch, ps, sp);
    }
  }
}

TEST(PipelineStagesGPT, Gpt2TwoStagesMatchTheWholeModel) {
  check_two_stages(gpt2_config());
}

TEST(PipelineStagesGPT, LlamaTwoStagesMatchTheWholeModel) {
  check_two_stages(llama_config());
}

// Multi-token prediction's roll under context parallelism, the world as the CP group: each
// rank's local part rolled (one all-gather of the chunks' first elements, the document starts
// gathered for the ends) is its columns of the single-process roll of the whole row, with and
// without packed documents. Documents end inside chunks and at chunk boundaries (the last column
// of a chunk whose successor on another rank starts a document); sequence 1 ends with a
// one-token document. Exact: only copies.
TEST(ContextParallelMtp, RollIsTheWholeRowsColumns) {
  const int n = g_runtime->world_size();
  const int64_t c = 3, S = 2 * n * c;
  ContextParallelContext cp{g_runtime->world().get()};
  const ContextParallelContext none;
  Tensor x = Tensor::empty({kB, S}, DType::kF32), starts = Tensor::empty({kB, S}, DType::kI32);
  const std::vector<std::vector<int64_t>> bounds = {{0, 5, S - 4}, {0, c, 2 * c, S - 1}};
  for (int64_t i = 0; i < kB; ++i) {
    int32_t start = 0;
    for (int64_t t = 0; t < S; ++t) {
      for (int64_t b : bounds[static_cast<size_t>(i)])
        if (t == b) start = static_cast<int32_t>(t);
      starts.data<int32_t>()[i * S + t] = start;
      x.data<float>()[i * S + t] = static_cast<float>(100 * i + t + 1);
    }
  }
  const Tensor local = cp_local_columns(x, cp), local_starts = cp_local_columns(starts, cp);
  for (bool packed : {false, true}) {
    SCOPED_TRACE(packed ? "packed documents" : "whole rows");
    const Tensor ends = packed ? document_ends(local_starts, cp) : Tensor();
    const Tensor whole_ends = packed ? document_ends(starts, none) : Tensor();
    const Tensor once = roll_left(x, none, whole_ends);
    Tensor got = roll_left(local, cp, ends);
    EXPECT_EQ(std::memcmp(got.raw(), cp_local_columns(once, cp).raw(), got.nbytes()), 0);
    got = roll_left(got, cp, ends);  // depth 2
    const Tensor twice = roll_left(once, none, whole_ends);
    EXPECT_EQ(std::memcmp(got.raw(), cp_local_columns(twice, cp).raw(), got.nbytes()), 0);
    // The packed roll differs from the whole row's (documents end inside the row).
    if (packed) {
      EXPECT_NE(std::memcmp(once.raw(), roll_left(x).raw(), once.nbytes()), 0);
    }
  }
}

}  // namespace
}  // namespace megatron

int main(int argc, char** argv) {
  megatron::MpiRuntime runtime(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  // The node's cores shared among its ranks, as the trainer does: on an oversubscribed node one
  // thread per rank, so no OpenMP barrier waits on a descheduled thread.
  megatron::set_num_threads(runtime.default_threads_per_rank());
  megatron::g_expected_world = megatron::testing::expected_world_size(argc, argv);
  megatron::g_runtime = &runtime;
  return megatron::testing::run_all_tests_on_every_rank(runtime, megatron::g_expected_world);
}
