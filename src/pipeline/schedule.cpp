// Pipeline schedules: the compute order of each schedule, then the transfers placed around it.
//
// Every schedule is built in two steps. First the order of forwards and backwards on this rank
// (what Megatron's warm-up / steady / cool-down loops decide); then with_communication() puts a
// receive right before each compute that needs a neighbour's tensor and a send right after each
// compute whose tensor a neighbour needs. Keeping the second step shared means the three schedules
// cannot disagree on who talks to whom.
#include "pipeline/schedule.h"

#include <algorithm>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "pipeline/layer_split.h"

namespace megatron {
namespace {

// A compute step before communication is added: forward or backward of (microbatch, chunk).
struct Compute {
  bool forward;
  int microbatch;
  int chunk;
};

// Adds the point-to-point transfers of stage pp_rank around its compute order. Virtual stage
// g = chunk * pp + rank; activations go g -> g + 1, gradients g + 1 -> g.
std::vector<Action> with_communication(const std::vector<Compute>& order, int pp_size, int pp_rank,
                                       int virtual_stages) {
  const int last_stage = pp_size * virtual_stages - 1;
  std::vector<Action> actions;
  actions.reserve(order.size() * 3);
  for (const Compute& c : order) {
    const int g = c.chunk * pp_size + pp_rank;
    const int prev_rank = (g - 1 + pp_size) % pp_size, prev_chunk = (g - 1) / pp_size;
    const int next_rank = (g + 1) % pp_size, next_chunk = (g + 1) / pp_size;
    if (c.forward) {
      if (g > 0) {
        actions.push_back({ActionKind::kRecvForward, c.microbatch, c.chunk, prev_rank, prev_chunk});
      }
      actions.push_back({ActionKind::kForward, c.microbatch, c.chunk});
      if (g < last_stage) {
        actions.push_back({ActionKind::kSendForward, c.microbatch, c.chunk, next_rank, next_chunk});
      }
    } else {
      // The last virtual stage starts backward from its own loss: nothing to receive.
      if (g < last_stage) {
        actions.push_back(
            {ActionKind::kRecvBackward, c.microbatch, c.chunk, next_rank, next_chunk});
      }
      actions.push_back({ActionKind::kBackward, c.microbatch, c.chunk});
      if (g > 0) {
        actions.push_back(
            {ActionKind::kSendBackward, c.microbatch, c.chunk, prev_rank, prev_chunk});
      }
    }
  }
  return actions;
}

void check_stage(int pp_size, int pp_rank, int num_microbatches) {
  MEGATRON_CHECK(pp_size >= 1, "--pipeline-model-parallel-size must be at least 1, got ", pp_size,
                 ".");
  MEGATRON_CHECK(pp_rank >= 0 && pp_rank < pp_size, "pipeline rank must be in [0, ", pp_size,
                 "), got ", pp_rank, ".");
  MEGATRON_CHECK(num_microbatches >= 1,
                 "the number of micro-batches (--global-batch-size / (--micro-batch-size x "
                 "data-parallel size)) must be at least 1, got ",
                 num_microbatches, ".");
}

// Megatron's interleaving constraints on the schedule itself (schedules.py, with the default
// micro-batch group size = pp): the group size must lie in [pp, M] and M % group must be 0 or at
// least pp; with group = pp both reduce to "M is a multiple of pp".
void check_interleaving(int pp_size, int num_microbatches, int virtual_stages, int group_size) {
  MEGATRON_CHECK(virtual_stages >= 1, "virtual stages per pipeline rank must be at least 1, got ",
                 virtual_stages, "; check --num-layers-per-virtual-pipeline-stage.");
  if (virtual_stages == 1) return;
  MEGATRON_CHECK(
      pp_size > 1,
      "When interleaved schedule is used, pipeline-model-parallel size should be greater "
      "than 1: --num-layers-per-virtual-pipeline-stage needs "
      "--pipeline-model-parallel-size > 1, got ",
      pp_size, ". Drop --num-layers-per-virtual-pipeline-stage or raise pp.");
  if (group_size == 0) {
    MEGATRON_CHECK(num_microbatches % pp_size == 0,
                   "the interleaved schedule needs the number of micro-batches to be a multiple "
                   "of --pipeline-model-parallel-size (",
                   pp_size, "), got ", num_microbatches,
                   " micro-batches (--global-batch-size / (--micro-batch-size x data-parallel "
                   "size)). Change --global-batch-size or --micro-batch-size, or drop "
                   "--num-layers-per-virtual-pipeline-stage.");
    return;
  }
  // Megatron's checks in forward_backward_pipelining_with_interleaving.
  MEGATRON_CHECK(group_size >= pp_size && group_size <= num_microbatches,
                 "--microbatch-group-size-per-virtual-pipeline-stage (", group_size,
                 ") must be between --pipeline-model-parallel-size (", pp_size,
                 ") and the number of micro-batches (", num_microbatches,
                 ": --global-batch-size / (--micro-batch-size x data-parallel size))");
  const int rest = num_microbatches % group_size;
  MEGATRON_CHECK(rest == 0 || rest >= pp_size, "the last group of ", rest,
                 " micro-batches is smaller than --pipeline-model-parallel-size (", pp_size,
                 "): choose --microbatch-group-size-per-virtual-pipeline-stage (", group_size,
                 ") or the batch sizes so that ", num_microbatches,
                 " micro-batches leave no remainder or one of at least ", pp_size);
}

}  // namespace

std::string to_string(const Action& action) {
  static constexpr const char* kNames[] = {"F", "B", "SF", "RF", "SB", "RB"};
  std::ostringstream os;
  os << kNames[static_cast<int>(action.kind)] << action.microbatch << '.' << action.chunk;
  switch (action.kind) {
    case ActionKind::kSendForward:
    case ActionKind::kSendBackward:
      os << "->" << action.peer_stage << '.' << action.peer_chunk;
      break;
    case ActionKind::kRecvForward:
    case ActionKind::kRecvBackward:
      os << "<-" << action.peer_stage << '.' << action.peer_chunk;
      break;
    default:
      break;
  }
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Action& action) {
  return os << to_string(action);
}

int one_f_one_b_warmup(int pp_size, int pp_rank, int num_microbatches) {
  check_stage(pp_size, pp_rank, num_microbatches);
  return std::min(pp_size - pp_rank - 1, num_microbatches);
}

int interleaved_warmup(int pp_size, int pp_rank, int num_microbatches, int virtual_stages,
                       int group_size) {
  check_stage(pp_size, pp_rank, num_microbatches);
  check_interleaving(pp_size, num_microbatches, virtual_stages, group_size);
  const int total = num_microbatches * virtual_stages;
  const int group = group_size == 0 ? pp_size : group_size;
  return std::min((pp_size - pp_rank - 1) * 2 + (virtual_stages - 1) * group, total);
}

std::vector<Action> no_pipelining_schedule(int num_microbatches) {
  check_stage(1, 0, num_microbatches);
  std::vector<Compute> order;
  for (int m = 0; m < num_microbatches; ++m) {
    order.push_back({true, m, 0});
    order.push_back({false, m, 0});
  }
  return with_communication(order, 1, 0, 1);
}

std::vector<Action> one_f_one_b_schedule(int pp_size, int pp_rank, int num_microbatches) {
  const int warmup = one_f_one_b_warmup(pp_size, pp_rank, num_microbatches);
  const int steady = num_microbatches - warmup;
  std::vector<Compute> order;
  for (int m = 0; m < warmup; ++m) order.push_back({true, m, 0});
  // Backwards retire micro-batches in the order their forwards ran (oldest first).
  for (int i = 0; i < steady; ++i) {
    order.push_back({true, warmup + i, 0});
    order.push_back({false, i, 0});
  }
  for (int m = steady; m < num_microbatches; ++m) order.push_back({false, m, 0});
  return with_communication(order, pp_size, pp_rank, 1);
}

std::vector<Action> interleaved_schedule(int pp_size, int pp_rank, int num_microbatches,
                                         int virtual_stages, int group_size) {
  const int warmup =
      interleaved_warmup(pp_size, pp_rank, num_microbatches, virtual_stages, group_size);
  MEGATRON_CHECK(virtual_stages > 1,
                 "the interleaved schedule needs at least 2 virtual stages per pipeline rank, got ",
                 virtual_stages, "; without --num-layers-per-virtual-pipeline-stage use 1F1B.");
  const int total = num_microbatches * virtual_stages;
  const int group = group_size == 0 ? pp_size : group_size;

  // Megatron's schedule table (get_schedule_table): entry k is (micro-batch, chunk) of the k-th
  // forward; the last group holds what is left (at least pp micro-batches, or none).
  std::vector<std::pair<int, int>> table;
  table.reserve(total);
  for (int first = 0; first < num_microbatches; first += group) {
    const int end = std::min(first + group, num_microbatches);
    for (int chunk = 0; chunk < virtual_stages; ++chunk) {
      for (int m = first; m < end; ++m) table.push_back({m, chunk});
    }
  }
  // The k-th backward walks the same table with the chunk reversed: gradients enter at the last
  // chunk; within a chunk micro-batches retire oldest first, as their forwards ran.
  auto forward = [&](int k) { return Compute{true, table[k].first, table[k].second}; };
  auto backward = [&](int k) {
    return Compute{false, table[k].first, virtual_stages - 1 - table[k].second};
  };

  std::vector<Compute> order;
  for (int k = 0; k < warmup; ++k) order.push_back(forward(k));
  for (int k = 0; k < total - warmup; ++k) {
    order.push_back(forward(warmup + k));
    order.push_back(backward(k));
  }
  for (int k = total - warmup; k < total; ++k) order.push_back(backward(k));
  return with_communication(order, pp_size, pp_rank, virtual_stages);
}

void validate_pipeline(int pp_size, int num_microbatches, int virtual_stages, int num_layers,
                       int group_size) {
  check_stage(pp_size, 0, num_microbatches);
  check_interleaving(pp_size, num_microbatches, virtual_stages, group_size);
  validate_pipeline_split(num_layers, pp_size, virtual_stages, PipelineSplit{});
}

void validate_interleaving(int pp_size, int num_microbatches, int virtual_stages, int group_size) {
  check_interleaving(pp_size, num_microbatches, virtual_stages, group_size);
}

}  // namespace megatron
