// The pipeline executor: walks a schedule's actions (schedule.h) on this stage, running the
// compute through a StageRunner and moving activations and gradients between neighbouring stages
// with point-to-point transfers on the pipeline group.
//
// What moves is a TensorMap: the tensors a chunk sends (its runner's send_specs, forward) or the
// gradients of those it received (its recv_specs, backward), one message each, in the specs'
// order. Sends are asynchronous (each tensor is kept alive until its transfer completes),
// receives block, as the schedules' communication contract asks. Each transfer is matched by
// (source, tag) with tag = 2 x receiving chunk + kind (activation 0, gradient 1): MPI keeps
// messages with the same source and tag in order, and the schedules send them in the order they
// are received.
//
// This is not the model and not the loss: what a forward or backward computes, and what the
// last stage does with the loss, is the runner's business.
#pragma once

#include <vector>

#include "comm/process_group.h"
#include "pipeline/schedule.h"
#include "tensor/tensor.h"
#include "tensor/tensor_map.h"

namespace megatron {

class StageRunner {
 public:
  virtual ~StageRunner() = default;
  // What this rank's model chunk `chunk` receives from the previous virtual stage (empty on the
  // first virtual stage) and sends to the next (empty on the last).
  virtual std::vector<TensorSpec> recv_specs(int chunk) const = 0;
  virtual std::vector<TensorSpec> send_specs(int chunk) const = 0;
  // Forward of `microbatch` on chunk `chunk`. input: the previous virtual stage's outputs (empty
  // on the first virtual stage). Returns the outputs for the next virtual stage (ignored on the
  // last one).
  virtual TensorMap forward(int microbatch, int chunk, const TensorMap& input) = 0;
  // Backward of the same. doutput: the gradients of those outputs (empty on the last virtual
  // stage, whose runner knows its loss gradient). Returns the gradients of the inputs (ignored on
  // the first virtual stage).
  virtual TensorMap backward(int microbatch, int chunk, const TensorMap& doutput) = 0;
};

class PipelineExecutor {
 public:
  // pp: this rank's pipeline group.
  // Received activations are placed on `device` (where the model chunks compute).
  PipelineExecutor(ProcessGroup& pp, int virtual_stages, Device device = Device::kCPU);

  // One training step: every action of `actions` (this rank's schedule), then waits for the
  // sends still in flight.
  void run(const std::vector<Action>& actions, StageRunner& runner);
  // Evaluation: forwards only, micro-batch by micro-batch, each through every chunk in order.
  void run_forward_only(int num_microbatches, StageRunner& runner);

 private:
  struct Slot {  // the tensors of one (micro-batch, chunk) while they are needed
    TensorMap input, output, doutput, dinput;
  };
  Slot& slot(int microbatch, int chunk);
  void send(const TensorMap& m, const std::vector<TensorSpec>& specs, int peer_stage,
            int peer_chunk, int kind);
  TensorMap recv(const std::vector<TensorSpec>& specs, int peer_stage, int chunk, int kind);
  void reap_sends(bool wait_all);
  bool first_virtual(int chunk) const { return pp_.rank() == 0 && chunk == 0; }
  bool last_virtual(int chunk) const {
    return pp_.rank() == pp_.size() - 1 && chunk == virtual_stages_ - 1;
  }

  ProcessGroup& pp_;
  int virtual_stages_;
  Device device_;
  std::vector<std::vector<Slot>> slots_;  // [chunk][microbatch]
  struct Pending {
    Work work;
    Tensor tensor;  // kept alive until the send completes
  };
  std::vector<Pending> sends_;
};

}  // namespace megatron
