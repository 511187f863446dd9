// Tests for the pipeline schedules, without MPI.
//
// Per stage: every (micro-batch, chunk) has exactly one forward and one backward, backward after
// forward, the warm-up count is Megatron's formula (written out here again, not taken from the
// library), and the activations held never exceed warm-up + 1. Across stages: a discrete-event
// simulation runs all stages' lists together (sends never block, a receive waits for its send)
// and must finish without deadlock, every receive matching the oldest unmatched send on its
// channel with the same (micro-batch, chunk). Hand-written orders pin Megatron's examples.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "pipeline/schedule.h"

namespace megatron {
namespace {

using MbChunk = std::pair<int, int>;

std::string join(const std::vector<Action>& actions, bool compute_only = false) {
  std::string out;
  for (const Action& a : actions) {
    if (compute_only && a.kind != ActionKind::kForward && a.kind != ActionKind::kBackward) continue;
    if (!out.empty()) out += ' ';
    out += to_string(a);
  }
  return out;
}

// Megatron's warm-up counts, restated independently of the library (schedules.py,
// get_pp_rank_microbatches).
// group: --microbatch-group-size-per-virtual-pipeline-stage (0: pp).
int expected_warmup(int pp, int rank, int m, int v, int group = 0) {
  if (v == 1) return std::min(pp - rank - 1, m);
  return std::min((pp - rank - 1) * 2 + (v - 1) * (group == 0 ? pp : group), m * v);
}

std::vector<Action> schedule_for(int pp, int rank, int m, int v, int group = 0) {
  return v == 1 ? one_f_one_b_schedule(pp, rank, m) : interleaved_schedule(pp, rank, m, v, group);
}

// Single-stage invariants of one rank's list.
void check_stage(const std::vector<Action>& actions, int pp, int rank, int m, int v,
                 int group = 0) {
  SCOPED_TRACE(::testing::Message() << "pp " << pp << " rank " << rank << " M " << m << " V " << v
                                    << " group " << group << ": " << join(actions));
  std::map<MbChunk, int> forward_at, backward_at;
  int in_flight = 0, max_in_flight = 0, forwards_before_first_backward = -1, step = 0;
  for (const Action& a : actions) {
    ASSERT_GE(a.microbatch, 0);
    ASSERT_LT(a.microbatch, m);
    ASSERT_GE(a.chunk, 0);
    ASSERT_LT(a.chunk, v);
    const MbChunk key{a.microbatch, a.chunk};
    if (a.kind == ActionKind::kForward) {
      ASSERT_EQ(forward_at.count(key), 0u) << "second forward of " << a;
      forward_at[key] = step;
      max_in_flight = std::max(max_in_flight, ++in_flight);
    } else if (a.kind == ActionKind::kBackward) {
      ASSERT_EQ(backward_at.count(key), 0u) << "second backward of " << a;
      ASSERT_EQ(forward_at.count(key), 1u) << "backward before forward: " << a;
      if (forwards_before_first_backward < 0) {
        forwards_before_first_backward = static_cast<int>(forward_at.size());
      }
      backward_at[key] = step;
      --in_flight;
    } else {
      ASSERT_GE(a.peer_stage, 0);
      ASSERT_LT(a.peer_stage, pp);
    }
    ++step;
  }
  EXPECT_EQ(forward_at.size(), static_cast<size_t>(m * v));
  EXPECT_EQ(backward_at.size(), static_cast<size_t>(m * v));
  const int warmup = expected_warmup(pp, rank, m, v, group);
  // The first backward comes after the warm-up forwards and the first steady forward, if any.
  EXPECT_EQ(forwards_before_first_backward, std::min(warmup + 1, m * v));
  // 1F1B's memory bound: activations of at most warm-up + 1 forwards are alive at once.
  EXPECT_LE(max_in_flight, warmup + 1);
  EXPECT_EQ(in_flight, 0);
}

// Runs all stages together. Sends are queued on a FIFO channel (src, dst, forward?) and never
// block; a receive blocks until its channel is non-empty and must then match the head. Returns
// once no stage can move; every stage must have finished.
void simulate(int pp, int m, int v, int group = 0) {
  SCOPED_TRACE(::testing::Message()
               << "simulating pp " << pp << " M " << m << " V " << v << " group " << group);
  const int last = pp * v - 1;
  std::vector<std::vector<Action>> lists;
  for (int r = 0; r < pp; ++r) lists.push_back(schedule_for(pp, r, m, v, group));
  std::map<std::tuple<int, int, bool>, std::deque<MbChunk>> channels;
  std::vector<size_t> pc(pp, 0);
  std::vector<std::set<MbChunk>> activations(pp), gradients(pp), forwarded(pp), backwarded(pp);
  int sends = 0, recvs = 0;

  // Executes lists[r][pc[r]] if it can; false when it must wait on a receive.
  auto step = [&](int r) -> bool {
    const Action& a = lists[r][pc[r]];
    const MbChunk key{a.microbatch, a.chunk};
    const int g = a.chunk * pp + r;
    const int peer_g = a.peer_chunk * pp + a.peer_stage;
    switch (a.kind) {
      case ActionKind::kForward:
        if (g > 0) {
          EXPECT_EQ(activations[r].erase(key), 1u) << "rank " << r << " " << a << " has no input";
        }
        forwarded[r].insert(key);
        break;
      case ActionKind::kBackward:
        EXPECT_TRUE(forwarded[r].count(key)) << "rank " << r << " " << a;
        if (g < last) {
          EXPECT_EQ(gradients[r].erase(key), 1u) << "rank " << r << " " << a << " has no grad";
        }
        backwarded[r].insert(key);
        break;
      case ActionKind::kSendForward:
        EXPECT_EQ(peer_g, g + 1) << "rank " << r << " " << a;
        EXPECT_TRUE(forwarded[r].count(key)) << "rank " << r << " sends before forward: " << a;
        channels[{r, a.peer_stage, true}].push_back({a.microbatch, a.peer_chunk});
        ++sends;
        break;
      case ActionKind::kSendBackward:
        EXPECT_EQ(peer_g, g - 1) << "rank " << r << " " << a;
        EXPECT_TRUE(backwarded[r].count(key)) << "rank " << r << " sends before backward: " << a;
        channels[{r, a.peer_stage, false}].push_back({a.microbatch, a.peer_chunk});
        ++sends;
        break;
      case ActionKind::kRecvForward:
      case ActionKind::kRecvBackward: {
        const bool fwd = a.kind == ActionKind::kRecvForward;
        // The first virtual stage reads data, the last computes the loss: neither receives.
        EXPECT_EQ(peer_g, fwd ? g - 1 : g + 1) << "rank " << r << " " << a;
        auto& queue = channels[{a.peer_stage, r, fwd}];
        if (queue.empty()) return false;
        EXPECT_EQ(queue.front(), key) << "rank " << r << " " << a << " got micro-batch "
                                      << queue.front().first << " chunk " << queue.front().second;
        queue.pop_front();
        (fwd ? activations : gradients)[r].insert(key);
        ++recvs;
        break;
      }
    }
    ++pc[r];
    return true;
  };

  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < pp; ++r) {
      while (pc[r] < lists[r].size() && step(r)) moved = true;
    }
  }
  for (int r = 0; r < pp; ++r) {
    EXPECT_EQ(pc[r], lists[r].size())
        << "deadlock: rank " << r << " waits at " << lists[r][pc[r]] << " in " << join(lists[r]);
    EXPECT_EQ(forwarded[r].size(), static_cast<size_t>(m * v));
    EXPECT_EQ(backwarded[r].size(), static_cast<size_t>(m * v));
    EXPECT_TRUE(activations[r].empty() && gradients[r].empty());
  }
  for (const auto& [channel, queue] : channels) EXPECT_TRUE(queue.empty()) << "unreceived send";
  EXPECT_EQ(sends, recvs);
  // Every boundary between consecutive virtual stages carries M activations and M gradients.
  EXPECT_EQ(sends, 2 * m * last);
}

// Expects fn to throw InvalidArgument whose message contains every one of needles.
template <typename Fn>
void expect_invalid(Fn fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "no InvalidArgument thrown";
  } catch (const InvalidArgument& e) {
    for (const auto& needle : needles) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "'" << needle << "' not in: " << e.what();
    }
  }
}

TEST(ScheduleTest, NoPipeliningAlternatesForwardAndBackward) {
  EXPECT_EQ(join(no_pipelining_schedule(3)), "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0");
}

TEST(ScheduleTest, WarmupCountsAreMegatrons) {
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(one_f_one_b_warmup(4, rank, 8), 3 - rank);
  EXPECT_EQ(one_f_one_b_warmup(4, 0, 2), 2);  // capped at M
  // (pp - rank - 1) * 2 + (V - 1) * pp: pp 4, V 2 gives 10, 8, 6, 4.
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(interleaved_warmup(4, rank, 8, 2), 10 - 2 * rank);
  EXPECT_EQ(interleaved_warmup(2, 0, 4, 2), 4);
  EXPECT_EQ(interleaved_warmup(2, 1, 4, 2), 2);
  EXPECT_EQ(interleaved_warmup(4, 0, 4, 3), 12);  // 6 + 8 = 14, capped at M * V = 12
}

TEST(ScheduleTest, OneFOneBHandExample) {
  // pp 2, M 3: rank 0 warms up with one forward, rank 1 starts 1F1B at once.
  EXPECT_EQ(join(one_f_one_b_schedule(2, 0, 3)),
            "F0.0 SF0.0->1.0 "
            "F1.0 SF1.0->1.0 RB0.0<-1.0 B0.0 "
            "F2.0 SF2.0->1.0 RB1.0<-1.0 B1.0 "
            "RB2.0<-1.0 B2.0");
  EXPECT_EQ(join(one_f_one_b_schedule(2, 1, 3)),
            "RF0.0<-0.0 F0.0 B0.0 SB0.0->0.0 "
            "RF1.0<-0.0 F1.0 B1.0 SB1.0->0.0 "
            "RF2.0<-0.0 F2.0 B2.0 SB2.0->0.0");
}

TEST(ScheduleTest, InterleavedOrderMatchesMegatronsTable) {
  // pp 2, V 2, M 4. Megatron's table: micro-batches in groups of pp, each group through chunk 0
  // then chunk 1: (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1). Backward k takes entry k with
  // the chunk reversed. Rank 0 warms up with (2 - 0 - 1) * 2 + (2 - 1) * 2 = 4 forwards.
  EXPECT_EQ(join(interleaved_schedule(2, 0, 4, 2), true),
            "F0.0 F1.0 F0.1 F1.1 "
            "F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 "
            "B2.1 B3.1 B2.0 B3.0");
  // Rank 1 warms up with 2.
  EXPECT_EQ(join(interleaved_schedule(2, 1, 4, 2), true),
            "F0.0 F1.0 "
            "F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 "
            "B2.0 B3.0");
  // Chunk 0 of the last rank feeds chunk 1 of rank 0; chunk 1 of rank 0 returns gradients there.
  const std::vector<Action> rank0 = interleaved_schedule(2, 0, 4, 2);
  EXPECT_NE(std::find(rank0.begin(), rank0.end(), Action{ActionKind::kRecvForward, 0, 1, 1, 0}),
            rank0.end());
  EXPECT_NE(std::find(rank0.begin(), rank0.end(), Action{ActionKind::kSendBackward, 0, 1, 1, 0}),
            rank0.end());
}

TEST(ScheduleTest, OneFOneBInvariantsAndSimulation) {
  for (int pp = 1; pp <= 6; ++pp) {
    for (int m = 1; m <= 12; ++m) {
      for (int rank = 0; rank < pp; ++rank) {
        check_stage(one_f_one_b_schedule(pp, rank, m), pp, rank, m, 1);
      }
      simulate(pp, m, 1);
    }
  }
}

TEST(ScheduleTest, InterleavedInvariantsAndSimulation) {
  for (int pp = 2; pp <= 6; ++pp) {
    for (int v = 2; v <= 4; ++v) {
      for (int m = pp; m <= 4 * pp; m += pp) {
        for (int rank = 0; rank < pp; ++rank) {
          check_stage(interleaved_schedule(pp, rank, m, v), pp, rank, m, v);
        }
        simulate(pp, m, v);
      }
    }
  }
}

TEST(ScheduleTest, MicrobatchGroupsFollowMegatronsTable) {
  // schedules.py's get_schedule_table example: pp 2, V 2, group 3, M 5 gives micro-batches
  // 0 1 2 0 1 2 3 4 3 4 on chunks 0 0 0 1 1 1 0 0 1 1. Rank 1 warms up with (2 - 1 - 1) * 2 +
  // (2 - 1) * 3 = 3 forwards; backward k takes entry k with the chunk reversed.
  EXPECT_EQ(join(interleaved_schedule(2, 1, 5, 2, 3), true),
            "F0.0 F1.0 F2.0 "
            "F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.0 B0.0 F4.0 B1.0 F3.1 B2.0 F4.1 B3.1 "
            "B4.1 B3.0 B4.0");
  // The group of the pipeline size is the default.
  EXPECT_EQ(interleaved_schedule(2, 0, 4, 2, 2), interleaved_schedule(2, 0, 4, 2));
  // Breadth-first (group = M): every micro-batch through chunk 0 before chunk 1.
  EXPECT_EQ(join(interleaved_schedule(2, 1, 4, 2, 4), true).substr(0, 23),
            "F0.0 F1.0 F2.0 F3.0 F0.");
}

TEST(ScheduleTest, MicrobatchGroupsInvariantsAndSimulation) {
  for (int pp = 2; pp <= 4; ++pp) {
    for (int v = 2; v <= 3; ++v) {
      for (int m = pp; m <= 3 * pp + 1; ++m) {
        for (int group = pp; group <= m; ++group) {
          const int rest = m % group;
          if (rest != 0 && rest < pp) continue;  // refused (SchedulesRejectBadArguments)
          for (int rank = 0; rank < pp; ++rank) {
            check_stage(interleaved_schedule(pp, rank, m, v, group), pp, rank, m, v, group);
          }
          simulate(pp, m, v, group);
        }
      }
    }
  }
}

TEST(ScheduleTest, PipelineOfOneIsGradientAccumulation) {
  EXPECT_EQ(one_f_one_b_schedule(1, 0, 4), no_pipelining_schedule(4));
}

TEST(ScheduleTest, ValidationNamesTheFlags) {
  EXPECT_NO_THROW(validate_pipeline(1, 1, 1, 3));
  EXPECT_NO_THROW(validate_pipeline(4, 8, 2, 16));
  EXPECT_NO_THROW(validate_pipeline(2, 4, 2, 4));
  expect_invalid([] { validate_pipeline(4, 8, 1, 6); },
                 {"--num-layers (6)", "--pipeline-model-parallel-size (4)"});
  // 16 layers / pp 4 = 4 per stage: 3 virtual stages do not divide it.
  expect_invalid([] { validate_pipeline(4, 8, 3, 16); },
                 {"--num-layers-per-virtual-pipeline-stage", "--pipeline-model-parallel-size"});
  expect_invalid([] { validate_pipeline(1, 4, 2, 8); },
                 {"--num-layers-per-virtual-pipeline-stage", "--pipeline-model-parallel-size"});
  // 6 micro-batches cannot be grouped by pp 4 for interleaving; 1F1B takes any number.
  expect_invalid([] { validate_pipeline(4, 6, 2, 16); },
                 {"--global-batch-size", "--micro-batch-size", "--pipeline-model-parallel-size"});
  EXPECT_NO_THROW(validate_pipeline(4, 6, 1, 16));
  expect_invalid([] { validate_pipeline(0, 4, 1, 8); }, {"--pipeline-model-parallel-size"});
  expect_invalid([] { validate_pipeline(2, 0, 1, 8); }, {"--global-batch-size"});
}

TEST(ScheduleTest, SchedulesRejectBadArguments) {
  expect_invalid([] { interleaved_schedule(4, 0, 6, 2); }, {"--pipeline-model-parallel-size"});
  expect_invalid([] { interleaved_schedule(1, 0, 4, 2); }, {"--pipeline-model-parallel-size"});
  expect_invalid([] { interleaved_schedule(2, 0, 4, 1); },
                 {"--num-layers-per-virtual-pipeline-stage"});
  expect_invalid([] { one_f_one_b_schedule(2, 2, 4); }, {"pipeline rank"});
  expect_invalid([] { no_pipelining_schedule(0); }, {"--micro-batch-size"});
  // Megatron's group rules: pp <= group <= M, and a last group of 0 or at least pp.
  const std::string group = "--microbatch-group-size-per-virtual-pipeline-stage";
  expect_invalid([] { interleaved_schedule(4, 0, 8, 2, 3); }, {group, "(4)"});
  expect_invalid([] { interleaved_schedule(2, 0, 4, 2, 5); }, {group, "(4"});
  expect_invalid([] { interleaved_schedule(4, 0, 9, 2, 4); }, {group, "last group of 1"});
  expect_invalid([] { validate_interleaving(4, 9, 2, 4); }, {group});
  EXPECT_NO_THROW(validate_interleaving(4, 9, 2, 5));  // groups of 5 and 4
}

}  // namespace
}  // namespace megatron
