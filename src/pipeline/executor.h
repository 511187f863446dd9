// The pipeline executor: walks a schedule's actions (schedule.h) on this stage, running the
// compute through a StageRunner and moving activations and gradients between neighbouring stages
// with point-to-point transfers on the pipeline group.
//
// Sends are asynchronous (each tensor is kept alive until its transfer completes), receives
// block, as the schedules' communication contract asks. Each transfer is matched by (source,
// tag) with tag = 2 x receiving chunk + kind (activation 0, gradient 1): MPI keeps messages with
// the same source and tag in order, and the schedules send them in the order they are received.
// Every received activation has the runner's activation shape ([s', b, h], f32); gradients
// have the same shape.
//
// This is not the model and not the loss: what a forward or backward computes, and what the
// last stage does with the loss, is the runner's business.
#pragma once

#include <vector>

#include "comm/process_group.h"
#include "pipeline/schedule.h"
#include "tensor/tensor.h"

namespace megatron {

class StageRunner {
 public:
  virtual ~StageRunner() = default;
  // Forward of `microbatch` on this rank's model chunk `chunk`. input: the previous virtual
  // stage's output (undefined on the first virtual stage). Returns the output for the next
  // virtual stage (ignored on the last one).
  virtual Tensor forward(int microbatch, int chunk, const Tensor& input) = 0;
  // Backward of the same. doutput: the gradient of that output (undefined on the last virtual
  // stage, whose runner knows its loss gradient). Returns the gradient of the input (ignored on
  // the first virtual stage).
  virtual Tensor backward(int microbatch, int chunk, const Tensor& doutput) = 0;
};

class PipelineExecutor {
 public:
  // pp: this rank's pipeline group; activation: shape of every tensor passed between stages.
  PipelineExecutor(ProcessGroup& pp, Shape activation, int virtual_stages);

  // One training step: every action of `actions` (this rank's schedule), then waits for the
  // sends still in flight.
  void run(const std::vector<Action>& actions, StageRunner& runner);
  // Evaluation: forwards only, micro-batch by micro-batch, each through every chunk in order.
  void run_forward_only(int num_microbatches, StageRunner& runner);

 private:
  struct Slot {  // the tensors of one (micro-batch, chunk) while they are needed
    Tensor input, output, doutput, dinput;
  };
  Slot& slot(int microbatch, int chunk);
  void send(const Tensor& t, int peer_stage, int peer_chunk, int kind);
  Tensor recv(int peer_stage, int chunk, int kind);
  void reap_sends(bool wait_all);
  bool first_virtual(int chunk) const { return pp_.rank() == 0 && chunk == 0; }
  bool last_virtual(int chunk) const {
    return pp_.rank() == pp_.size() - 1 && chunk == virtual_stages_ - 1;
  }

  ProcessGroup& pp_;
  Shape activation_;
  int virtual_stages_;
  std::vector<std::vector<Slot>> slots_;  // [chunk][microbatch]
  struct Pending {
    Work work;
    Tensor tensor;  // kept alive until the send completes
  };
  std::vector<Pending> sends_;
};

}  // namespace megatron
