// Pipeline schedules as data: the ordered list of actions one pipeline stage performs in one
// training step (forward and backward of every micro-batch, and the point-to-point transfers
// between neighbouring stages), as Megatron-LM's schedules.py orders them.
//
// Three schedules: no pipelining (gradient accumulation, pp = 1), 1F1B (warm-up forwards, steady
// one-forward-one-backward, cool-down backwards) and interleaved 1F1B (V model chunks per stage,
// micro-batches in groups of pp or of --microbatch-group-size-per-virtual-pipeline-stage). Each is
// a pure function of (pp size, pp rank, micro-batches, virtual stages, group size); an executor
// walks the list and runs each action, nothing more. This file is not the executor, does no
// communication and knows nothing of tensors or models.
//
// Stages and chunks. With V chunks per rank, the model is cut into pp x V virtual stages; virtual
// stage g = chunk * pp + rank (Megatron's layout: chunk v of rank r holds layer block v * pp + r).
// Activations flow from virtual stage g to g + 1, gradients from g + 1 to g; so chunk c of the last
// rank sends to chunk c + 1 of rank 0.
//
// Communication contract. A Recv is placed right before the compute that consumes it, a Send right
// after the compute that produced it, which is exactly where Megatron's 1F1B exchanges tensors.
// Sends must not block (post them asynchronously, e.g. MPI_Isend, and complete them later);
// receives block. Between two stages, messages of one kind (activation or gradient) are received
// in the order they were sent, so an executor may match them in FIFO order.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace megatron {

enum class ActionKind {
  kForward,       // forward of (microbatch, chunk)
  kBackward,      // backward of (microbatch, chunk)
  kSendForward,   // send the output activation of (microbatch, chunk) to the next virtual stage
  kRecvForward,   // receive the input activation of (microbatch, chunk) from the previous one
  kSendBackward,  // send the input gradient of (microbatch, chunk) to the previous virtual stage
  kRecvBackward,  // receive the output gradient of (microbatch, chunk) from the next one
};

struct Action {
  ActionKind kind;
  int microbatch;       // 0 .. num_microbatches - 1
  int chunk;            // model chunk on this rank, 0 .. virtual_stages - 1
  int peer_stage = -1;  // pipeline rank of the peer for send/recv; -1 for compute
  int peer_chunk = -1;  // the peer's model chunk holding the other end; -1 for compute

  bool operator==(const Action&) const = default;
};

// Short form for logs and test messages: "F3.1" is the forward of micro-batch 3 on chunk 1,
// "SF3.1->2" sends its activation to rank 2, "RB3.1<-2" receives its gradient from rank 2.
std::string to_string(const Action& action);
std::ostream& operator<<(std::ostream& os, const Action& action);

// Megatron's number of warm-up forwards (schedules.py, get_pp_rank_microbatches) before the first
// backward of a step. 1F1B: min(pp - rank - 1, M); the last stage starts 1F1B at once and earlier
// stages run ahead by as many micro-batches as there are stages behind them.
int one_f_one_b_warmup(int pp_size, int pp_rank, int num_microbatches);
// Interleaved: min((pp - rank - 1) * 2 + (V - 1) * N, M * V), counted in (micro-batch, chunk)
// forwards, N the micro-batch group size (group_size; 0: pp, Megatron's default): (V - 1) * N on
// every rank, so that one group has gone through every chunk but the last, plus 2 per rank behind
// this one (earlier ranks run further ahead, the last rank least).
int interleaved_warmup(int pp_size, int pp_rank, int num_microbatches, int virtual_stages,
                       int group_size = 0);

// Gradient accumulation without pipelining: F0 B0 F1 B1 ... on chunk 0, no communication.
std::vector<Action> no_pipelining_schedule(int num_microbatches);

// Non-interleaved 1F1B for stage pp_rank of pp_size: W = one_f_one_b_warmup forwards, then
// M - W rounds of one forward and one backward, then W backwards. At most W + 1 micro-batches
// hold activations at any time, instead of all M.
std::vector<Action> one_f_one_b_schedule(int pp_size, int pp_rank, int num_microbatches);

// Interleaved 1F1B with V = virtual_stages chunks per rank. The k-th forward runs micro-batch
// and chunk from Megatron's schedule table: micro-batches in groups of N (group_size,
// --microbatch-group-size-per-virtual-pipeline-stage; 0: pp), each group through chunk 0, then
// chunk 1, ... (pp 2, V 2, M 4: (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1)); the last group
// takes the remainder. The k-th backward takes the same entry with the chunk reversed (V - 1 -
// chunk). W = interleaved_warmup forwards, then 1F1B rounds, then the remaining backwards.
// Requires pp > 1, V > 1 and Megatron's group rules: with N = pp, M a multiple of pp; else
// pp <= N <= M and a remainder M mod N of 0 or at least pp.
std::vector<Action> interleaved_schedule(int pp_size, int pp_rank, int num_microbatches,
                                         int virtual_stages, int group_size = 0);

// Checks a pipeline layout with Megatron's constraints, naming the flags to change; throws
// InvalidArgument. virtual_stages is 1 without interleaving, else the number of layers per stage
// divided by --num-layers-per-virtual-pipeline-stage. The layers split evenly (uneven splits:
// validate_pipeline_split, layer_split.h).
void validate_pipeline(int pp_size, int num_microbatches, int virtual_stages, int num_layers,
                       int group_size = 0);
// The interleaving part of validate_pipeline alone: pp > 1 with V > 1, and the micro-batch
// group rules of interleaved_schedule; throws InvalidArgument naming the flags.
void validate_interleaving(int pp_size, int num_microbatches, int virtual_stages,
                           int group_size = 0);

}  // namespace megatron
