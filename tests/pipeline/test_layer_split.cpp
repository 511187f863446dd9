// The pipeline layer split against Megatron's own arithmetic: get_num_layers_to_build
// (megatron/core/transformer/transformer_block.py), get_transformer_layer_offset
// (transformer_layer.py) and the split rules of TransformerConfig.__post_init__, restated below
// line for line in their original form (per-rank arithmetic, None for a flag not given), so that
// our formulation (one list of per-virtual-stage counts, offsets as prefix sums) is checked
// against an independent one over every small configuration.
#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <string>

#include "core/error.h"
#include "pipeline/layer_split.h"

namespace megatron {
namespace {

struct MegatronConfig {
  int64_t num_layers = 0, pp = 1;
  std::optional<int64_t> first, last;  // num_layers_in_first/last_pipeline_stage
  bool embedding = false, loss = false;
  std::optional<int64_t> vp;  // virtual_pipeline_model_parallel_size (None below 2)
};

// Python's floor division and modulo (the restated code divides negative numbers too).
int64_t py_div(int64_t a, int64_t b) {
  return a / b - ((a % b != 0) && ((a < 0) != (b < 0)));
}
int64_t py_mod(int64_t a, int64_t b) {
  return a - b * py_div(a, b);
}

bool vp_first(int64_t vp_stage, const MegatronConfig& c) {
  return !c.vp || vp_stage == 0;
}
bool vp_last(int64_t vp_stage, const MegatronConfig& c) {
  return !c.vp || vp_stage == *c.vp - 1;
}

// TransformerConfig.__post_init__'s uneven-PP and account-for checks, plus arguments.py's
// divisibility for the even split and TransformerBlock's asserts. Two additions, cases Megatron
// lets through to build a wrong number of layers: middle layers below zero (the first and last
// stages asking for more than the model has), and both first and last given for one stage.
bool megatron_accepts(const MegatronConfig& c) {
  if ((c.first || c.last) && (c.embedding || c.loss)) return false;
  if (c.first || c.last) {
    int64_t layers = c.num_layers, ranks = c.pp;
    for (const auto& n : {c.first, c.last}) {
      if (!n) continue;
      if (*n <= 0) return false;
      if (c.vp && *n % *c.vp != 0) return false;
      layers -= *n;
      ranks -= 1;
    }
    if (layers < 0 || ranks < 0) return false;  // the additions above
    if ((layers != 0) != (ranks != 0)) return false;
    if (ranks != 0 && py_mod(layers, ranks) != 0) return false;
    if (ranks != 0 && c.vp && py_mod(py_div(layers, ranks), *c.vp) != 0) return false;
    return true;
  }
  const int64_t units = c.num_layers + c.embedding + c.loss;
  if (units % c.pp != 0) return false;
  if (c.vp && (units / c.pp) % *c.vp != 0) return false;
  return true;
}

int64_t megatron_num_layers_to_build(const MegatronConfig& c, int64_t vp_stage, int64_t pp_rank) {
  const bool is_first_pp_stage = pp_rank == 0, is_last_pp_stage = pp_rank == c.pp - 1;
  int64_t num_layers_per_pipeline_rank = 0;
  if (c.first || c.last) {
    int64_t layers_to_distribute = c.num_layers, pipeline_stages_left = c.pp;
    if (c.first) {
      layers_to_distribute -= *c.first;
      pipeline_stages_left -= 1;
    }
    if (c.last) {
      layers_to_distribute -= *c.last;
      pipeline_stages_left -= 1;
    }
    num_layers_per_pipeline_rank =
        pipeline_stages_left > 0 ? py_div(layers_to_distribute, pipeline_stages_left) : 0;
    if (is_first_pp_stage && c.first) num_layers_per_pipeline_rank = *c.first;
    if (is_last_pp_stage && c.last) num_layers_per_pipeline_rank = *c.last;
  } else {
    const int64_t num_layers = c.num_layers + c.embedding + c.loss;
    num_layers_per_pipeline_rank = num_layers / c.pp;
  }
  int64_t num_layers_to_build = num_layers_per_pipeline_rank;
  if (c.vp && c.pp > 1) num_layers_to_build = num_layers_per_pipeline_rank / *c.vp;
  if (c.embedding && vp_first(vp_stage, c) && is_first_pp_stage) num_layers_to_build -= 1;
  if (c.loss && vp_last(vp_stage, c) && is_last_pp_stage) num_layers_to_build -= 1;
  return num_layers_to_build;
}

int64_t megatron_layer_offset(const MegatronConfig& c, int64_t vp_stage, int64_t pp_rank) {
  if (c.pp <= 1) return 0;
  if (c.first || c.last) {
    const int64_t middle_pipeline_stages = c.pp - (c.first ? 1 : 0) - (c.last ? 1 : 0);
    const int64_t first = c.first.value_or(0), last = c.last.value_or(0);
    const int64_t middle_num_layers = c.num_layers - first - last;
    const int64_t middle_pipeline_rank = c.first ? pp_rank - 1 : pp_rank;
    if (c.vp) {
      const int64_t in_first = py_div(first, *c.vp), in_last = py_div(last, *c.vp);
      const int64_t in_middle = py_div(middle_num_layers, *c.vp);
      const int64_t total_virtual_chunks = in_first + in_middle + in_last;
      if (pp_rank == 0) return vp_stage * total_virtual_chunks;
      // Megatron divides by the middle stages even when there are none (pp 2 with both ends
      // given: ZeroDivisionError); the other factor, middle_pipeline_rank, is 0 then.
      if (middle_pipeline_stages == 0) return vp_stage * total_virtual_chunks + in_first;
      return vp_stage * total_virtual_chunks + in_first +
             middle_pipeline_rank * py_div(in_middle, middle_pipeline_stages);
    }
    const int64_t per_rank =
        middle_pipeline_stages > 0 ? py_div(middle_num_layers, middle_pipeline_stages) : 0;
    if (pp_rank == 0) return 0;
    return middle_pipeline_rank * per_rank + first;
  }
  const int64_t num_layers = c.num_layers + c.embedding + c.loss;
  const int64_t num_layers_per_pipeline_rank = num_layers / c.pp;
  int64_t offset = 0;
  if (c.vp) {
    const int64_t num_layers_per_virtual_rank = num_layers_per_pipeline_rank / *c.vp;
    const int64_t total_virtual_chunks = num_layers / *c.vp;
    offset = vp_stage * total_virtual_chunks + pp_rank * num_layers_per_virtual_rank;
  } else {
    offset = pp_rank * num_layers_per_pipeline_rank;
  }
  if (c.embedding && !(vp_first(vp_stage, c) && pp_rank == 0)) offset -= 1;
  return offset;
}

PipelineSplit make_split(int64_t first, int64_t last, bool embedding, bool loss) {
  PipelineSplit s;
  s.first_stage_layers = first;
  s.last_stage_layers = last;
  s.embedding_in_split = embedding;
  s.loss_in_split = loss;
  return s;
}

TEST(LayerSplit, EveryLayoutAgreesWithMegatronsArithmetic) {
  int checked = 0, refused = 0;
  for (int64_t n = 1; n <= 13; ++n) {
    for (int64_t pp = 1; pp <= 5; ++pp) {
      for (int64_t vpp = 1; vpp <= 3; ++vpp) {
        if (vpp > 1 && pp == 1) continue;  // interleaving needs pp > 1 (checked by train_args)
        for (int64_t f = 0; f <= n; ++f) {
          for (int64_t l = 0; l <= n; ++l) {
            for (int extra = 0; extra < 4; ++extra) {
              const PipelineSplit s = make_split(f, l, (extra & 1) != 0, (extra & 2) != 0);
              MegatronConfig c{n,
                               pp,
                               std::nullopt,
                               std::nullopt,
                               s.embedding_in_split,
                               s.loss_in_split,
                               std::nullopt};
              if (f > 0) c.first = f;
              if (l > 0) c.last = l;
              if (vpp > 1) c.vp = vpp;
              const std::string what = "layers " + std::to_string(n) + " pp " + std::to_string(pp) +
                                       " vpp " + std::to_string(vpp) + " first " +
                                       std::to_string(f) + " last " + std::to_string(l) +
                                       " extra " + std::to_string(extra);
              bool ours = true;
              try {
                validate_pipeline_split(n, pp, vpp, s);
              } catch (const InvalidArgument&) {
                ours = false;
              }
              ASSERT_EQ(ours, megatron_accepts(c)) << what;
              if (!ours) {
                ++refused;
                continue;
              }
              int64_t total = 0;
              for (int64_t v = 0; v < vpp; ++v) {
                for (int64_t r = 0; r < pp; ++r) {
                  const LayerRange got = chunk_layer_range(n, pp, vpp, s, r, v);
                  ASSERT_EQ(got.count, megatron_num_layers_to_build(c, v, r))
                      << what << " rank " << r << " chunk " << v;
                  ASSERT_GE(got.count, 0) << what;
                  if (got.count > 0) {
                    ASSERT_EQ(got.first, megatron_layer_offset(c, v, r))
                        << what << " rank " << r << " chunk " << v;
                  }
                  total += got.count;
                }
              }
              ASSERT_EQ(total, n) << what;
              ++checked;
            }
          }
        }
      }
    }
  }
  // The grid holds both kinds in numbers (1176 accepted and compared, 51552 refused when this
  // was written): a change that empties either fails here.
  std::printf("%d layouts checked, %d refused\n", checked, refused);
  EXPECT_GT(checked, 1000);
  EXPECT_GT(refused, 10000);
}

// The blocks tile the layers in order of virtual stage g = chunk * pp + rank.
TEST(LayerSplit, BlocksAreContiguousInVirtualStageOrder) {
  const PipelineSplit s = make_split(0, 0, true, true);
  const std::vector<int64_t> counts = virtual_stage_layer_counts(6, 2, 3, s);
  EXPECT_EQ(counts, (std::vector<int64_t>{0, 1, 1, 1, 1, 0}));  // 8 units, 1 per chunk
  EXPECT_EQ(virtual_stage_layer_counts(8, 4, 1, make_split(1, 1, false, false)),
            (std::vector<int64_t>{1, 3, 3, 1}));
  EXPECT_EQ(virtual_stage_layer_counts(12, 2, 2, make_split(4, 0, false, false)),
            (std::vector<int64_t>{2, 4, 2, 4}));
}

// Megatron's layout strings: its unrolling (parentheses first, then single characters), stages at
// '|', transformer layers counted per stage (the E and L ends hold none).
TEST(LayerSplit, LayoutStringsParseAsMegatronsDo) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(parse_pipeline_layout("Et*3|(tt|)*2,L"), (V{3, 2, 2, 0}));
  EXPECT_EQ(parse_pipeline_layout("E(t|tt)*2,tL"), (V{1, 3, 3}));  // Et|ttt|tttL
  EXPECT_EQ(parse_pipeline_layout("E(|t)*2L"), (V{0, 1, 1}));      // E|t|tL
  EXPECT_EQ(parse_pipeline_layout("Et*12L"), (V{12}));
  EXPECT_EQ(parse_pipeline_layout("E,t,t|t,t,L"), (V{2, 2}));
  // Megatron's docstring example, 'm' (MTP) replaced by a transformer layer.
  const V big = parse_pipeline_layout("Ettt|(tt|)*29,t|L");
  ASSERT_EQ(big.size(), 32u);
  EXPECT_EQ(big.front(), 3);
  EXPECT_EQ(big[30], 1);
  EXPECT_EQ(big.back(), 0);
  // A layout's counts are the split, whatever pp x V reads them.
  PipelineSplit s;
  s.layout = parse_pipeline_layout("E|tt|t|tL");
  EXPECT_NO_THROW(validate_pipeline_split(4, 2, 2, s));
  EXPECT_EQ(chunk_layer_range(4, 2, 2, s, 0, 1).first, 2);  // rank 0's second chunk: layer 2
  EXPECT_EQ(chunk_layer_range(4, 2, 2, s, 0, 1).count, 1);
  EXPECT_EQ(chunk_layer_range(4, 2, 2, s, 0, 0).count, 0);  // the embedding alone
}

void expect_invalid(int64_t n, int64_t pp, int64_t vpp, const PipelineSplit& s,
                    const std::vector<std::string>& needles) {
  try {
    validate_pipeline_split(n, pp, vpp, s);
    ADD_FAILURE() << "no InvalidArgument thrown";
  } catch (const InvalidArgument& e) {
    for (const std::string& needle : needles) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "'" << needle << "' not in: " << e.what();
    }
  }
}

TEST(LayerSplit, RefusalsNameTheFlags) {
  expect_invalid(5, 2, 1, {},
                 {"--num-layers (5)", "--pipeline-model-parallel-size (2)",
                  "--decoder-first-pipeline-num-layers"});
  expect_invalid(6, 4, 1, make_split(0, 0, true, false),
                 {"--account-for-embedding-in-pipeline-split", "= 7"});
  expect_invalid(8, 4, 1, make_split(2, 0, true, false),
                 {"--decoder-first-pipeline-num-layers", "--account-for-embedding"});
  expect_invalid(8, 4, 2, make_split(3, 0, false, false),
                 {"--decoder-first-pipeline-num-layers (3)", "virtual pipeline parallel degree 2"});
  expect_invalid(8, 4, 1, make_split(1, 2, false, false),
                 {"middle stage: 5", "middle pipeline model parallel size 2"});
  expect_invalid(4, 2, 1, make_split(1, 2, false, false),
                 {"Mismatch: 1 middle layers remaining but 0 middle PP stages"});
  expect_invalid(4, 3, 1, make_split(3, 3, false, false), {"more than the model's"});
  EXPECT_NO_THROW(validate_pipeline_split(4, 2, 1, make_split(2, 2, false, false)));
  // Layouts: the stages against pp x V and the layers, and no other split beside them.
  PipelineSplit layout;
  layout.layout = {1, 2, 1};
  expect_invalid(4, 2, 1, layout, {"divisible by pipeline_model_parallel_size", "3 stages"});
  layout.layout = {1, 2, 1, 1};
  expect_invalid(4, 2, 2, layout, {"Number of decoder layers 5", "--num-layers 4"});
  expect_invalid(5, 2, 1, layout, {"2 virtual stages per pipeline rank, not 1"});
  layout.first_stage_layers = 1;
  expect_invalid(5, 2, 2, layout, {"cannot be set with other pipeline layout arguments"});
  auto bad_layout = [](const std::string& text, const std::string& needle) {
    try {
      parse_pipeline_layout(text);
      ADD_FAILURE() << text << ": no InvalidArgument thrown";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("--pipeline-model-parallel-layout"), std::string::npos);
    }
  };
  bad_layout("tE|tL", "the embedding (E) must be the first layer");
  bad_layout("Et|Lt", "the loss (L) must be the last layer");
  bad_layout("Et|tt", "each exactly once");
  bad_layout("Et|mL", "multi-token prediction");
  bad_layout("Et|xL", "invalid layer character 'x'");
}

}  // namespace
}  // namespace megatron
