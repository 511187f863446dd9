// Trainer-side checkpointing: which boxes this rank saves, how a checkpoint of any layout loads
// into this one, the run state, and the (optionally asynchronous) save.
//
// Tensors, all f32 and named by the parameter's full (global) name:
//   model.<param>                  the fp32 main weights (bf16/fp16 compute copies are rounded
//                                  from them, so a resume is bit-exact), and the models' extra
//                                  state (FP8 scales and amax histories)
//   optimizer.exp_avg.<param>      Adam's first moment   } unless --no-save-optim
//   optimizer.exp_avg_sq.<param>   Adam's second moment  }
//   optimizer.momentum_buffer.<param>  instead, SGD's (--optimizer sgd; none with momentum 0), and
//                                  Muon's for its matrices (--optimizer muon; Adam's for the rest)
// Every element is written once: the weights and the plain optimizer's moments by data-parallel
// rank 0 (under Muon's layer-wise distribution a parameter's state by its owner), the distributed
// optimizer's moments (and sharded main weights) by the rank that owns them in
// distributed-optimizer instance 0 (--num-distributed-optimizer-instances), and never by a copy
// another rank also holds (Param::is_duplicate: TP replicas, the last stage's tied embeddings).
// Every rank reads the boxes of everything it holds, duplicates included.
//
// The run state (metadata.json, next to the tensors): iteration, consumed train/valid/test
// samples, the samples the LR schedule has advanced by, the optimizer's step count, the fp16
// loss scaler, the RNG state (dropout masks are counter-based, so the seed is the whole state),
// the model-shape arguments, the tokenizer and the layout that saved it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/sharded_checkpoint.h"
#include "comm/parallel_state.h"
#include "core/timer.h"
#include "optim/adamw.h"
#include "optim/distributed_optimizer.h"
#include "optim/loss_scaler.h"
#include "parallel/param.h"
#include "train/arguments.h"
#include "train/fault_injection.h"
#include "train/progress_log.h"
#include "transformer/config.h"

namespace megatron {

struct RunState {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0, consumed_valid_samples = 0, consumed_test_samples = 0;
  int64_t scheduler_samples = 0;  // samples the LR schedule has advanced by (successful steps)
  int64_t optimizer_steps = 0;
  // Megatron's skipped_train_samples (--decrease-batch-size-if-needed) and
  // num_floating_point_operations_so_far (--log-progress throughput); 0 in older checkpoints.
  int64_t skipped_train_samples = 0;
  double floating_point_operations = 0;
  // The run's --global-batch-size (what --override-ckpt-iteration checks); absent in older
  // checkpoints.
  std::optional<int64_t> global_batch_size;
  std::optional<LossScalerState> loss_scaler;  // --fp16 runs
  std::optional<uint64_t> rng_seed;            // absent with --no-save-rng
  // Megatron's OptimizerParamScheduler.state_dict() (optim/scheduler_state.h); null in
  // checkpoints written before it was saved.
  nlohmann::json opt_param_scheduler;
};

// The model-shape arguments, under Megatron's names, that a checkpoint records
// (--use-checkpoint-args restores them) and that must match for its tensors to load.
nlohmann::json model_args_json(const Arguments& a, const TransformerConfig& cfg);
// "name: checkpoint X, this run Y" for every field of `saved` that differs in `mine`.
// A checkpoint's resolved model record ("args": what `megatron convert` writes, and every
// checkpoint from before the full argument record) as the flags' dests that --use-checkpoint-args
// restores: disable_bias_linear from add_bias_linear, and use_rope_scaling from a positive
// rope_scaling_factor where an older record lacks the switch (the factor is 0 when scaling is
// off).
nlohmann::json model_record_as_flags(nlohmann::json args);

std::vector<std::string> model_arg_differences(const nlohmann::json& saved,
                                               const nlohmann::json& mine);

// What this rank holds.
struct CheckpointTarget {
  ParamSet* params = nullptr;
  AdamW* optimizer = nullptr;  // the plain optimizer, or
  DistributedOptimizer* dist_optimizer = nullptr;
  int64_t dp_rank = 0;
  // The expert-data-parallel rank: expert-parallel Params are written by its rank 0 (= dp_rank
  // when the experts are split like the dense layers).
  int64_t expert_dp_rank = 0;
  // State saved as "model.<name>" beside the weights but outside the ParamSet (ModelChunk::
  // extra_state: FP8 scaling), replicated over DP and TP: written by the ranks that write the
  // dense weights, read by every rank. A checkpoint without it leaves it as it is.
  std::vector<Param*> extra_state;
  // --num-distributed-optimizer-instances: this rank's instance (for expert-parallel Params, its
  // instance of the expert-data-parallel ranks). Every instance holds the same sharded state
  // (main weight shards, moments); instance 0 writes it, all read it.
  int64_t instance = 0, expert_instance = 0;
};

// This rank's boxes (see the file comment); optim adds the moments. copy: host copies that stay
// valid while training goes on (an async save), else views into the live buffers.
std::vector<checkpoint::ShardEntry> shard_entries(const CheckpointTarget& t, bool optim, bool copy);

// Reads every box this rank holds from `reader` into its buffers (main weights, then the compute
// copy; with optim the moments). No communication (with main weights sharded alone the caller
// then all-gathers the compute copy: DistributedOptimizer::refresh_compute). Errors name the
// tensor and the file.
// extra_missing (optional): set when the checkpoint lacks some of t.extra_state (kept as it is).
void load_shards(checkpoint::CheckpointReader& reader, const CheckpointTarget& t, bool optim,
                 bool* extra_missing = nullptr);
// The weights of `t` that the checkpoint has (no optimizer state), as Megatron's finetuning loads
// a pretrained checkpoint with strict=False; returns the names of the parameters it lacks, which
// keep their values. Tensors of the checkpoint the model lacks are not read.
std::vector<std::string> load_weights_present(checkpoint::CheckpointReader& reader,
                                              const CheckpointTarget& t);

nlohmann::json run_state_json(const RunState& s);
RunState run_state_from_json(const nlohmann::json& meta, const std::string& where);

// The directory of the global non-persistent checkpoints of a run whose --save (or --load) is
// `root`: --non-persistent-global-ckpt-dir, else <root>/non_persistent (Megatron's default).
std::string non_persistent_dir(const Arguments& args, const std::string& root);

// The checkpoint --load resumes from (Megatron's _load_base_checkpoint): --ckpt-step or the
// tracker under --load; with --non-persistent-ckpt-type global, the non-persistent checkpoint
// instead when its iteration is at least that one (so also over --ckpt-step). nullopt: none.
// Messages for the log (a missing or older non-persistent checkpoint) go to `notes`.
struct CheckpointChoice {
  std::string root;  // --load, or its non-persistent directory
  int64_t iteration = 0;
  bool non_persistent = false;
};
std::optional<CheckpointChoice> checkpoint_to_load(const Arguments& args,
                                                   std::vector<std::string>* notes);

// Megatron restores the optimizer's parameter groups with its state (torch's load_state_dict):
// Adam's betas and eps and SGD's momentum are the checkpoint's, whatever this run's flags say
// (the learning rate and weight decay are set by the scheduler at every step). When `args` will
// load optimizer state (a checkpoint under --load with it, no --no-load-optim or --finetune),
// sets those flags to the values the checkpoint records and returns a log line per change.
// Anything unreadable is left to the load, which names it.
std::vector<std::string> restore_optimizer_groups(Arguments& args);

// Saves checkpoints under --save, blocking or (--async-save) on a background thread: at most one
// save in flight; the next save, poll() once every rank has finished writing, or finish() commits
// it (metadata.json, then the tracker). A failed write is agreed on by every rank (AgreedFailure,
// exit 1) and leaves the previous checkpoint and tracker as they were.
class Checkpointer {
 public:
  // kPersistent: under --save, --save-retain-interval applied. kNonPersistent: under
  // non_persistent_dir(args, --save); before each save the checkpoints there but the newest are
  // deleted (Megatron's cleanup_old_non_persistent_checkpoint), so at most two exist.
  enum class Kind { kPersistent, kNonPersistent };
  // fault: the --inject-fault hook; kill-in-save and fail-in-save act on the writes of their
  // rank and iteration (SIGKILL mid-write, or a write failing with ENOSPC).
  Checkpointer(std::shared_ptr<ParallelState> parallel, const Arguments& args,
               CheckpointTarget target, FaultInjection fault = {}, Kind kind = Kind::kPersistent);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Collective. Saves `state` (state.iteration) with this rank's boxes; an earlier async save is
  // committed first.
  void save(const RunState& state, const nlohmann::json& extra);
  // Collective (one all-reduce while an async save is in flight, nothing otherwise): commits it
  // once every rank has written its file.
  void poll();
  // Collective: waits for the in-flight save and commits it.
  void finish();
  // The iteration of the last save this run committed or started; -1 when none.
  int64_t last_saved_iteration() const { return last_saved_; }
  // --log-progress: commits of async saves and deletions are appended to it (rank 0).
  void set_progress_log(ProgressLog* log) { progress_ = log; }

 private:
  struct InFlight {
    int64_t iteration = 0;
    Timer since_start;            // from the start of the save
    double blocking_seconds = 0;  // what the training loop waited for (async: the host copy)
    std::string staging;
    nlohmann::json meta;
    std::vector<checkpoint::ShardEntry> entries;  // host copies
    nlohmann::json record;
    std::string error;
    std::atomic<bool> done{false};
    std::thread writer;
  };
  void commit(InFlight& f);
  std::function<bool()> fault_hook(int64_t iteration) const;
  // Non-persistent: rank 0 deletes every committed checkpoint under root_ but the newest.
  void delete_older_non_persistent() const;

  std::shared_ptr<ParallelState> parallel_;
  std::string root_;
  Kind kind_;
  bool async_, save_optim_;
  int64_t retain_interval_;          // --save-retain-interval; 0: keep every checkpoint
  ProgressLog* progress_ = nullptr;  // --log-progress
  CheckpointTarget target_;
  FaultInjection fault_;
  std::unique_ptr<InFlight> in_flight_;
  int64_t last_saved_ = -1;
};

}  // namespace megatron
