// RankGenerator and layout validation, without MPI: Megatron's documented 16-rank example, the
// group lists of Megatron's pre-RankGenerator code (its own regression oracle) for many sizes,
// and brute-force properties of every token over many grids and orders.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "comm/mpi_runtime.h"
#include "comm/parallel_state.h"
#include "comm/rank_generator.h"
#include "core/error.h"

namespace megatron {
namespace {

// Megatron's parallel_state.py docstring: 16 ranks, tp 2, pp 4 (so dp 2).
TEST(RankGenerator, MegatronSixteenRankExample) {
  RankGenerator gen({.tp = 2, .dp = 2, .pp = 4});
  EXPECT_EQ(gen.world_size(), 16);
  EXPECT_EQ(gen.get_ranks("tp"),
            (RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(gen.get_ranks("dp"),
            (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(gen.get_ranks("pp"),
            (RankGroups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  // Model parallel (tp x pp): one group per data-parallel replica.
  EXPECT_EQ(gen.get_ranks("tp-pp"),
            (RankGroups{{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}}));
  EXPECT_EQ(embedding_rank_groups(gen.get_ranks("pp")),
            (RankGroups{{0, 12}, {1, 13}, {2, 14}, {3, 15}}));
}

// The docstring example of generate_masked_orthogonal_rank_groups: sizes [tp 2, dp 3, pp 4],
// dp groups.
TEST(RankGenerator, MaskedOrthogonalDocstringExample) {
  RankGroups dp = masked_orthogonal_rank_groups(24, {2, 3, 4}, {false, true, false});
  ASSERT_EQ(dp.size(), 8u);
  EXPECT_EQ(dp[0], (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(dp[1], (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(dp[7], (std::vector<int>{19, 21, 23}));
  // Its other example: order tp-pp-dp, sizes 2-2-2, dp groups.
  EXPECT_EQ(masked_orthogonal_rank_groups(8, {2, 2, 2}, {false, false, true}),
            (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(RankGenerator, EmbeddingRanks) {
  EXPECT_EQ(embedding_ranks({5}), (std::vector<int>{5}));
  EXPECT_EQ(embedding_ranks({1, 3}), (std::vector<int>{1, 3}));
  EXPECT_EQ(embedding_ranks({0, 4, 8, 12}), (std::vector<int>{0, 12}));
}

// Megatron's groups before RankGenerator existed, written as explicit loops (its test suite
// keeps them as the golden result, test_rank_generator_for_tp_dp_pp); order tp-cp-dp-pp.
struct LegacyGroups {
  RankGroups dp, dp_cp, cp, mp, tp, pp, tp_dp, tp_dp_cp;
};

LegacyGroups legacy_groups(int world, int tp, int pp, int cp) {
  LegacyGroups g;
  const int dp = world / (tp * pp * cp);
  const int num_pp_groups = world / pp;
  RankGroups all_dp_cp;
  for (int i = 0; i < pp; ++i) {
    int start = i * num_pp_groups, end = (i + 1) * num_pp_groups;
    for (int j = 0; j < cp * tp; ++j) {
      std::vector<int> r;
      for (int k = start + j; k < end; k += cp * tp) r.push_back(k);
      g.dp.push_back(r);
    }
    for (int j = 0; j < tp; ++j) {
      std::vector<int> r;
      for (int k = start + j; k < end; k += tp) r.push_back(k);
      all_dp_cp.push_back(r);
      g.dp_cp.push_back(r);
    }
  }
  for (int i = 0; i < pp; ++i) {
    for (int j = 0; j < dp; ++j) {
      int start = i * num_pp_groups + j * tp * cp, end = i * num_pp_groups + (j + 1) * tp * cp;
      for (int k = 0; k < tp; ++k) {
        std::vector<int> r;
        for (int x = start + k; x < end; x += tp) r.push_back(x);
        g.cp.push_back(r);
      }
    }
  }
  for (int i = 0; i < dp * cp; ++i) {
    std::vector<int> r;
    for (const auto& grp : all_dp_cp) r.push_back(grp[i]);
    g.mp.push_back(r);
  }
  for (int i = 0; i < world / tp; ++i) {
    std::vector<int> r;
    for (int k = i * tp; k < (i + 1) * tp; ++k) r.push_back(k);
    g.tp.push_back(r);
  }
  for (int i = 0; i < num_pp_groups; ++i) {
    std::vector<int> r;
    for (int k = i; k < world; k += num_pp_groups) r.push_back(k);
    g.pp.push_back(r);
  }
  const int tdc = tp * dp * cp;
  for (int i = 0; i < world / tdc; ++i) {
    std::vector<int> all;
    for (int k = i * tdc; k < (i + 1) * tdc; ++k) all.push_back(k);
    g.tp_dp_cp.push_back(all);
    for (int j = 0; j < cp; ++j) {
      std::vector<int> r;
      for (int k = 0; k < dp; ++k) {
        int start = i * tdc + j * tp + k * tp * cp;
        for (int x = start; x < start + tp; ++x) r.push_back(x);
      }
      g.tp_dp.push_back(r);
    }
  }
  return g;
}

TEST(RankGenerator, MatchesMegatronLegacyGroups) {
  // (world, tp, pp, cp) from Megatron's parametrisation (nodes x 8 GPUs) plus small odd sizes.
  const std::vector<std::vector<int>> cases = {
      {8, 1, 1, 1},  {8, 2, 2, 1},  {8, 2, 2, 2},  {16, 8, 2, 1},  {16, 2, 4, 2}, {32, 2, 4, 1},
      {32, 8, 4, 1}, {64, 4, 8, 2}, {64, 8, 2, 4}, {128, 4, 2, 8}, {96, 8, 4, 1}, {12, 3, 2, 1},
      {18, 1, 3, 3}, {30, 5, 3, 2}, {6, 1, 6, 1},  {6, 6, 1, 1}};
  for (const auto& c : cases) {
    const int world = c[0], tp = c[1], pp = c[2], cp = c[3];
    SCOPED_TRACE(::testing::Message()
                 << "world " << world << " tp " << tp << " pp " << pp << " cp " << cp);
    const int dp = world / (tp * pp * cp);
    RankGenerator gen({.tp = tp, .cp = cp, .dp = dp, .pp = pp}, "tp-cp-dp-pp");
    RankGenerator gen_default({.tp = tp, .cp = cp, .dp = dp, .pp = pp});
    LegacyGroups want = legacy_groups(world, tp, pp, cp);
    for (const RankGenerator* g : {&gen, &gen_default}) {
      EXPECT_EQ(g->get_ranks("dp"), want.dp);
      EXPECT_EQ(g->get_ranks("dp-cp"), want.dp_cp);
      EXPECT_EQ(g->get_ranks("cp"), want.cp);
      EXPECT_EQ(g->get_ranks("tp-pp"), want.mp);
      EXPECT_EQ(g->get_ranks("tp"), want.tp);
      EXPECT_EQ(g->get_ranks("pp"), want.pp);
      EXPECT_EQ(g->get_ranks("tp-dp"), want.tp_dp);
      EXPECT_EQ(g->get_ranks("tp-dp-cp"), want.tp_dp_cp);
    }
  }
}

// Every rank's coordinate on each axis, by mixed radix over `axes` (first fastest).
std::map<std::string, int> coordinates(int rank, const std::vector<std::string>& axes,
                                       const std::map<std::string, int>& size) {
  std::map<std::string, int> c;
  for (const auto& a : axes) {
    c[a] = rank % size.at(a);
    rank /= size.at(a);
  }
  return c;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t e; (e = s.find('-', b)) != std::string::npos; b = e + 1)
    out.push_back(s.substr(b, e - b));
  out.push_back(s.substr(b));
  return out;
}

// For every grid with sizes in 1..3 (ep and cp not both > 1), several orders, and every token
// (non-empty subset of axes): the groups partition the world; each has the product of the named
// sizes; two ranks share a group iff they agree on every unnamed coordinate; inside a group
// ranks are ordered by the named coordinates (first axis of the order fastest); groups are
// ordered by the unnamed coordinates the same way.
TEST(RankGenerator, BruteForceProperties) {
  const std::vector<std::string> names = {"tp", "cp", "ep", "dp", "pp"};
  const std::vector<std::string> orders = {"tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "tp-pp-dp",
                                           "pp-dp-tp-cp-ep"};
  int grids = 0;
  for (int tp = 1; tp <= 3; ++tp)
    for (int cp = 1; cp <= 2; ++cp)
      for (int ep = 1; ep <= 2; ++ep)
        for (int dp = 1; dp <= 3; ++dp)
          for (int pp = 1; pp <= 3; ++pp)
            for (const std::string& order : orders) {
              if (ep > 1 && cp > 1) continue;
              const std::map<std::string, int> size = {
                  {"tp", tp}, {"cp", cp}, {"ep", ep}, {"dp", dp}, {"pp", pp}};
              std::vector<std::string> axes = split(order);
              bool omitted_big = false;
              for (const auto& n : names) {
                if (std::find(axes.begin(), axes.end(), n) != axes.end()) continue;
                if (size.at(n) > 1) omitted_big = true;
                axes.push_back(n);
              }
              ParallelGrid grid{.tp = tp, .cp = cp, .ep = ep, .dp = dp, .pp = pp};
              if (omitted_big) {
                EXPECT_THROW(RankGenerator(grid, order), InvalidArgument);
                continue;
              }
              ++grids;
              RankGenerator gen(grid, order);
              const int world = tp * cp * ep * dp * pp;
              ASSERT_EQ(gen.world_size(), world);
              for (int m = 1; m < 32; ++m) {
                std::string token;
                std::vector<std::string> named, unnamed;
                for (int i = 0; i < 5; ++i) {
                  const std::string& axis = axes[i];
                  bool in = (m >> i) & 1;
                  (in ? named : unnamed).push_back(axis);
                  if (in) token += (token.empty() ? "" : "-") + axis;
                }
                SCOPED_TRACE("order " + order + " token " + token + " grid " + std::to_string(tp) +
                             std::to_string(cp) + std::to_string(ep) + std::to_string(dp) +
                             std::to_string(pp));
                RankGroups groups = gen.get_ranks(token);
                int group_size = 1;
                for (const auto& a : named) group_size *= size.at(a);
                ASSERT_EQ(static_cast<int>(groups.size()), world / group_size);
                std::vector<int> seen(world, 0);
                for (size_t g = 0; g < groups.size(); ++g) {
                  ASSERT_EQ(static_cast<int>(groups[g].size()), group_size);
                  for (size_t k = 0; k < groups[g].size(); ++k) {
                    int r = groups[g][k];
                    ASSERT_TRUE(0 <= r && r < world);
                    ++seen[r];
                    auto c = coordinates(r, axes, size);
                    // Position inside the group: the named coordinates, first fastest.
                    int pos = 0, stride = 1, gidx = 0, gstride = 1;
                    for (const auto& a : named) pos += c[a] * stride, stride *= size.at(a);
                    for (const auto& a : unnamed) gidx += c[a] * gstride, gstride *= size.at(a);
                    EXPECT_EQ(pos, static_cast<int>(k));
                    EXPECT_EQ(gidx, static_cast<int>(g));
                    for (const auto& a : names) {
                      EXPECT_EQ(gen.coordinate(r, a), c[a]);
                    }
                  }
                }
                for (int r = 0; r < world; ++r) EXPECT_EQ(seen[r], 1) << "rank " << r;
              }
            }
  EXPECT_GT(grids, 100);
}

TEST(RankGenerator, DefaultOrderTensorFastestPipelineSlowest) {
  for (int tp : {1, 2, 4})
    for (int dp : {1, 2, 3})
      for (int pp : {1, 2, 4}) {
        RankGenerator gen({.tp = tp, .dp = dp, .pp = pp});
        const int world = tp * dp * pp;
        // tp groups are runs of consecutive ranks.
        RankGroups tpg = gen.get_ranks("tp");
        for (size_t g = 0; g < tpg.size(); ++g)
          for (int k = 0; k < tp; ++k) EXPECT_EQ(tpg[g][k], static_cast<int>(g) * tp + k);
        // pp groups step by world / pp; a pipeline stage is a contiguous block of ranks.
        for (const auto& grp : gen.get_ranks("pp"))
          for (int k = 1; k < pp; ++k) EXPECT_EQ(grp[k] - grp[k - 1], world / pp);
        // A tp group and a dp group meet in exactly one rank when both hold it.
        for (const auto& t : tpg)
          for (const auto& d : gen.get_ranks("dp")) {
            int common = 0;
            for (int r : t) common += std::count(d.begin(), d.end(), r);
            bool share_stage = t[0] / (tp * dp) == d[0] / (tp * dp);
            EXPECT_EQ(common, share_stage ? 1 : 0);
          }
      }
}

// --use-tp-pp-dp-mapping's order (Megatron's 'tp-cp-ep-pp-dp'): rank = tp + 2 pp + 4 dp for
// tp 2, pp 2, dp 2, so a replica's stages are adjacent; an expert grid must keep the dense pipeline
// groups (etp x ep = tp x cp), or the layout is refused naming the flags.
TEST(RankGenerator, TpPpDpMapping) {
  RankGenerator gen({.tp = 2, .dp = 2, .pp = 2}, "tp-cp-ep-pp-dp");
  EXPECT_EQ(gen.get_ranks("tp"), (RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(gen.get_ranks("pp"), (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(gen.get_ranks("dp"), (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  ParallelConfig c;
  c.tensor_model_parallel_size = 2;
  c.pipeline_model_parallel_size = 2;
  c.order = "tp-cp-ep-pp-dp";
  const ParallelGrid grid = make_parallel_grid(8, c);
  c.expert_model_parallel_size = 1;  // etp 2 x ep 1 = tp 2: allowed
  EXPECT_EQ(make_expert_grid(grid, c).edp, 2);
  c.expert_model_parallel_size = 2;  // etp 2 x ep 2 != tp 2
  try {
    make_expert_grid(grid, c);
    ADD_FAILURE() << "expected a refusal";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--use-tp-pp-dp-mapping"), std::string::npos) << e.what();
  }
}

TEST(RankGenerator, RejectsBadInput) {
  EXPECT_THROW(RankGenerator({.tp = 0}), InvalidArgument);
  EXPECT_THROW(RankGenerator({.cp = 2, .ep = 2}), InvalidArgument);
  EXPECT_THROW(RankGenerator({.tp = 2}, "tp-xx-pp"), InvalidArgument);
  EXPECT_THROW(RankGenerator({.tp = 2}, "tp-tp"), InvalidArgument);
  EXPECT_THROW(RankGenerator({.tp = 2, .dp = 2}, "tp-pp"), InvalidArgument);  // dp unnamed
  RankGenerator gen({.tp = 2, .dp = 2}, "tp-dp");
  EXPECT_EQ(gen.order(), "tp-dp-cp-ep-pp");
  EXPECT_THROW(gen.get_ranks("xp"), InvalidArgument);
  EXPECT_THROW(gen.get_ranks(""), InvalidArgument);
  // Token order does not matter: "pp-tp" is "tp-pp".
  EXPECT_EQ(gen.get_ranks("dp-tp"), gen.get_ranks("tp-dp"));
}

// ---- layout validation (what ParallelState checks before any communication) --------------------

TEST(ParallelGrid, DerivesDataParallelSize) {
  ParallelGrid g =
      make_parallel_grid(16, {.tensor_model_parallel_size = 2, .pipeline_model_parallel_size = 4});
  EXPECT_EQ(g.tp, 2);
  EXPECT_EQ(g.pp, 4);
  EXPECT_EQ(g.dp, 2);
  EXPECT_EQ(g.cp, 1);
  EXPECT_EQ(make_parallel_grid(8, {.context_parallel_size = 2}).dp, 4);
  EXPECT_EQ(make_parallel_grid(1, {}).dp, 1);
}

std::string error_of(int world, const ParallelConfig& c) {
  try {
    make_parallel_grid(world, c);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(ParallelGrid, ErrorsNameTheFlagsAndTheFix) {
  std::string e = error_of(6, {.tensor_model_parallel_size = 2, .pipeline_model_parallel_size = 2});
  EXPECT_NE(e.find("world size (6) is not divisible by total_model_size (4)"), std::string::npos)
      << e;
  EXPECT_NE(e.find("--tensor-model-parallel-size (2)"), std::string::npos) << e;
  EXPECT_NE(e.find("--pipeline-model-parallel-size (2)"), std::string::npos) << e;
  EXPECT_NE(e.find("launch a multiple of 4"), std::string::npos) << e;
  e = error_of(4, {.tensor_model_parallel_size = 0});
  EXPECT_NE(e.find("--tensor-model-parallel-size must be >= 1, got 0"), std::string::npos) << e;
  e = error_of(4, {.pipeline_model_parallel_size = -1});
  EXPECT_NE(e.find("--pipeline-model-parallel-size must be >= 1"), std::string::npos) << e;
  // The expert grid: ETP x EP must divide the ranks of a pipeline stage (EP is carved out of
  // them); a valid EP leaves the dense grid as it is.
  EXPECT_EQ(error_of(4, {.expert_model_parallel_size = 2}), "");
  try {
    make_expert_grid(make_parallel_grid(4, {}), {.expert_model_parallel_size = 3});
    e = "";
  } catch (const InvalidArgument& ex) {
    e = ex.what();
  }
  EXPECT_NE(e.find("--expert-model-parallel-size (3)"), std::string::npos) << e;
  EXPECT_NE(e.find("must divide the ranks of a pipeline stage"), std::string::npos) << e;
  const ExpertGrid g = make_expert_grid(make_parallel_grid(8, {.tensor_model_parallel_size = 2}),
                                        {.tensor_model_parallel_size = 2,
                                         .expert_model_parallel_size = 4,
                                         .expert_tensor_parallel_size = 1});
  EXPECT_EQ(g.etp, 1);
  EXPECT_EQ(g.ep, 4);
  EXPECT_EQ(g.edp, 2);  // 8 = TP 2 x DP 4 = ETP 1 x EP 4 x EDP 2
  e = error_of(2, {.tensor_model_parallel_size = 4});
  EXPECT_NE(e.find("world size (2) is not divisible by total_model_size (4)"), std::string::npos)
      << e;
}

// ---- threads per rank ---------------------------------------------------------------------------

TEST(ThreadsPerRank, SharesTheNodeAndRespectsBinding) {
  EXPECT_EQ(threads_per_rank(2, 2, 1), 2);    // one rank owns the node
  EXPECT_EQ(threads_per_rank(2, 2, 2), 1);    // dp2 on 2 cores: one thread each
  EXPECT_EQ(threads_per_rank(2, 2, 8), 1);    // oversubscribed: still one
  EXPECT_EQ(threads_per_rank(64, 64, 8), 8);  // unbound ranks share evenly
  EXPECT_EQ(threads_per_rank(64, 4, 8), 4);   // bound to 4 cores by the launcher
  EXPECT_EQ(threads_per_rank(64, 1, 2), 1);   // bound to one core
  EXPECT_EQ(threads_per_rank(10, 10, 3), 3);  // rounds down
  EXPECT_THROW(threads_per_rank(0, 1, 1), InvalidArgument);
  EXPECT_THROW(threads_per_rank(4, 4, 0), InvalidArgument);
}

}  // namespace
}  // namespace megatron
