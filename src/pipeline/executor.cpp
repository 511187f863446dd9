// Executes pipeline schedules over the pipeline group's point-to-point transfers.
#include "pipeline/executor.h"

#include "core/error.h"

namespace megatron {

namespace {
constexpr int kActivation = 0, kGradient = 1;
int tag_of(int receiving_chunk, int kind) {
  return 2 * receiving_chunk + kind;
}
}  // namespace

PipelineExecutor::PipelineExecutor(ProcessGroup& pp, int virtual_stages, Device device)
    : pp_(pp), virtual_stages_(virtual_stages), device_(device) {
  MEGATRON_ASSERT(virtual_stages >= 1, "virtual stages ", virtual_stages);
}

PipelineExecutor::Slot& PipelineExecutor::slot(int microbatch, int chunk) {
  MEGATRON_ASSERT(chunk >= 0 && chunk < virtual_stages_ && microbatch >= 0, "slot (", microbatch,
                  ", ", chunk, ")");
  if (slots_.empty()) slots_.resize(virtual_stages_);
  auto& row = slots_[chunk];
  if (static_cast<int>(row.size()) <= microbatch) row.resize(microbatch + 1);
  return row[microbatch];
}

void PipelineExecutor::send(const TensorMap& m, const std::vector<TensorSpec>& specs,
                            int peer_stage, int peer_chunk, int kind) {
  MEGATRON_ASSERT(m.size() == specs.size(), "pipeline send of ", m.names(), ", expected ",
                  specs.size(), " tensors");
  for (const TensorSpec& spec : specs) {
    const Tensor* t = m.find(spec.name);
    MEGATRON_ASSERT(t && t->defined() && t->shape() == spec.shape && t->dtype() == spec.dtype,
                    "pipeline send of '", spec.name,
                    "': ", t && t->defined() ? t->str() : "nothing", ", expected ",
                    spec.shape.str());
    sends_.push_back(Pending{pp_.send_async(*t, peer_stage, tag_of(peer_chunk, kind)), *t});
  }
  reap_sends(false);
}

TensorMap PipelineExecutor::recv(const std::vector<TensorSpec>& specs, int peer_stage, int chunk,
                                 int kind) {
  TensorMap m;
  for (const TensorSpec& spec : specs) {
    Tensor t = Tensor::empty(spec.shape, spec.dtype, device_);
    pp_.recv(t, peer_stage, tag_of(chunk, kind));
    m.set(spec.name, t);
  }
  return m;
}

void PipelineExecutor::reap_sends(bool wait_all) {
  std::vector<Pending> still;
  for (Pending& p : sends_) {
    if (wait_all) {
      p.work.wait();
    } else if (!p.work.is_completed()) {
      still.push_back(std::move(p));
    }
  }
  sends_ = std::move(still);
}

void PipelineExecutor::run(const std::vector<Action>& actions, StageRunner& runner) {
  slots_.clear();
  for (const Action& a : actions) {
    Slot& s = slot(a.microbatch, a.chunk);
    switch (a.kind) {
      case ActionKind::kRecvForward:
        s.input = recv(runner.recv_specs(a.chunk), a.peer_stage, a.chunk, kActivation);
        break;
      case ActionKind::kForward:
        MEGATRON_ASSERT(first_virtual(a.chunk) || !s.input.empty(), "forward ", to_string(a),
                        " before its input arrived");
        s.output = runner.forward(a.microbatch, a.chunk, s.input);
        // Backward never reads it; whatever it needs the model's state keeps (and frees what it
        // need not keep, e.g. --distribute-saved-activations' split of a recomputed input).
        s.input = TensorMap();
        if (last_virtual(a.chunk)) s.output = TensorMap();
        break;
      case ActionKind::kSendForward:
        send(s.output, runner.send_specs(a.chunk), a.peer_stage, a.peer_chunk, kActivation);
        s.output = TensorMap();
        break;
      case ActionKind::kRecvBackward:
        s.doutput = recv(runner.send_specs(a.chunk), a.peer_stage, a.chunk, kGradient);
        break;
      case ActionKind::kBackward:
        MEGATRON_ASSERT(last_virtual(a.chunk) || !s.doutput.empty(), "backward ", to_string(a),
                        " before its output gradient arrived");
        s.dinput = runner.backward(a.microbatch, a.chunk, s.doutput);
        s.input = s.doutput = TensorMap();
        if (first_virtual(a.chunk)) s.dinput = TensorMap();
        break;
      case ActionKind::kSendBackward:
        send(s.dinput, runner.recv_specs(a.chunk), a.peer_stage, a.peer_chunk, kGradient);
        s.dinput = TensorMap();
        break;
    }
  }
  reap_sends(true);
  slots_.clear();
}

void PipelineExecutor::run_forward_only(int num_microbatches, StageRunner& runner) {
  const int pp = pp_.size(), rank = pp_.rank();
  for (int mb = 0; mb < num_microbatches; ++mb) {
    for (int c = 0; c < virtual_stages_; ++c) {
      // Virtual stage g = c * pp + rank receives from g - 1 and sends to g + 1.
      TensorMap in;
      if (!first_virtual(c)) {
        in = recv(runner.recv_specs(c), rank == 0 ? pp - 1 : rank - 1, c, kActivation);
      }
      TensorMap out = runner.forward(mb, c, in);
      if (!last_virtual(c)) {
        const int next = rank == pp - 1 ? 0 : rank + 1, next_chunk = rank == pp - 1 ? c + 1 : c;
        send(out, runner.send_specs(c), next, next_chunk, kActivation);
      }
    }
  }
  reap_sends(true);
}

}  // namespace megatron
