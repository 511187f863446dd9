// Trainer: Megatron's pretraining loop, on one rank of any tensor x pipeline x data parallel
// layout (or alone).
//
// Each iteration: zero gradients; run this stage's schedule over the global_batch / (micro_batch
// x dp) micro-batches (gradient accumulation without pipelining, 1F1B or interleaved 1F1B with
// pipelining; see MicroBatchRunner for the loss); then finish the gradients (average over data
// parallel replicas, sum the sequence-parallel replicated ones over TP and the tied embeddings
// over the embedding group), the gradient norm over the model-parallel group counting each
// element once, clipping, an AdamW step at the scheduled learning rate, and the log line (from
// the last rank, which holds the loss). Every
// --eval-interval iterations, and at the end, the validation (and at the end the test) loss and
// perplexity in Megatron's format. Everything that varies between iterations (data, dropout
// masks) is a pure function of (seed, iteration), so two identical runs print identical losses.
#pragma once

#include <array>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "comm/parallel_state.h"
#include "core/timer.h"
#include "data/tokenizer.h"
#include "models/model_chunk.h"
#include "models/model_spec.h"
#include "optim/adamw.h"
#include "optim/distributed_optimizer.h"
#include "optim/loss_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/muon.h"
#include "optim/onebit_adam.h"
#include "optim/scheduler_state.h"
#include "parallel/fsdp.h"
#include "parallel/grad_buckets.h"
#include "pipeline/executor.h"
#include "plan/cost_model.h"
#include "tensor/op_profile.h"
#include "train/arguments.h"
#include "train/batch_prefetcher.h"
#include "train/batch_schedule.h"
#include "train/checkpointing.h"
#include "train/datasets.h"
#include "train/exit_signal.h"
#include "train/fault_injection.h"
#include "train/progress_log.h"
#include "train/qk_clip.h"
#include "train/rerun_state_machine.h"
#include "train/step_timers.h"
#include "train/tensorboard_writer.h"
#include "train/training_log.h"
#include "train/watchdog.h"

namespace megatron {

class Trainer {
 public:
  // Builds tokenizer, model, optimizer, schedule and data from args (validated by the CLI) and
  // prints the start-up lines.
  // parallel: the layout when launched under MPI; null for a single process.
  explicit Trainer(const Arguments& args, std::shared_ptr<ParallelState> parallel = nullptr);
  ~Trainer();

  // Runs iterations up to args.train_iters (from the loaded checkpoint's, if any), with
  // evaluation and checkpoints. Returns the exit code (train/exit_codes.h): 0 when training
  // finished or --exit-interval was reached, kExitSavedRequeue after --exit-signal or
  // --exit-duration-in-mins (having saved when --save is given).
  int train();

  // Training loss of each iteration run so far, and every evaluation loss, validation and test,
  // in the order printed (for tests).
  const std::vector<double>& losses() const { return losses_; }
  const std::vector<double>& eval_losses() const { return eval_losses_; }
  ParamSet& params() { return *params_; }

 private:
  struct StepResult {
    LossTerms terms;  // reduced over data-parallel ranks (on the last stage)
    double loss = 0;  // the objective: the first term's value
    double grad_norm = 0;
    bool skipped = false;    // fp16 overflow: no update, the LR schedule does not advance
    int64_t num_zeros = -1;  // --log-num-zeros-in-grad (-1: not counted)
    // --qk-clip / --log-max-attention-logit: the step's largest attention score (NaN: not kept)
    double max_logit = std::numeric_limits<double>::quiet_NaN();
    // The rerun state machine's decision; with `exit` set nothing was updated.
    RerunStateMachine::Decision rerun;
  };
  // The constructor's parts, in order.
  void build_model();
  void build_optimizer();
  void build_schedule();
  void build_checkpointing();
  void build_data();
  void report_gemm_peak();
  void predict_step();
  // --ddp-num-buckets' size, else --ddp-bucket-size or Megatron's default for the dp x cp size.
  int64_t bucket_size() const;
  int64_t bucket_elems_ = 0;  // --ddp-num-buckets' bucket size, parameters / N (0: not given)
  // This rank's context-parallel group and comm types (none at --context-parallel-size 1),
  // built once (a2a+p2p splits the CP group into its inner and outer groups: collective).
  ContextParallelContext context_parallel() const;
  // The MoE layers' expert groups (EP, ETP and their product, from the expert grid).
  ExpertParallelContext expert_parallel() const;
  void build_context_parallel();
  // The step's exposed context-parallel communication into the timing report (cp > 1).
  void add_cp_time(double cp_busy_at_start);
  // The step's wait for the distributed optimizer's weight all-gather into the timing report.
  void add_gather_time(double wait_at_start);
  // Seconds spent in context-parallel communication so far (the CP group and a2a+p2p's groups).
  double cp_busy_seconds() const;
  // Seconds in the expert groups' communication so far (0 unless experts_apart), and the step's
  // share of it into the timing report.
  double expert_busy_seconds() const;
  void add_expert_time(double expert_at_start);
  // One iteration over `batch` (its micro-batch count is num_microbatches_).
  StepResult train_step(int64_t iteration, const BatchSchedule::Batch& batch,
                        const StepRates& rates);
  // The schedules' rates after `samples` samples: LR, decoupled LR, weight decay.
  StepRates rates_at(int64_t samples) const;
  // --check-weight-hash-across-dp-replicas-interval (train/replica_check.h): throws when the
  // data-parallel replicas' weights differ; collective.
  void check_weight_hashes(int64_t iteration);
  // --test-mode (Megatron's run_realtime_tests): the query/key norms' weights equal over the
  // data-parallel replicas and the tensor-parallel ranks; a difference ends the run (exit 1).
  void check_qk_norm_replicas(int64_t iteration);
  // --inject-fault flip-weight: one bit of this rank's first weight flipped.
  void flip_one_weight_bit();
  // A loaded checkpoint's schedule parameters (--override-opt_param-scheduler,
  // --use-checkpoint-opt_param-scheduler or the default check; optim/scheduler_state.h).
  void restore_schedule(const nlohmann::json& saved);
  // The iteration line closing the log interval at `step` (with the timers' report), the
  // memory report after the first interval; collective over the world.
  void log_iteration(TrainingLog& log, const TrainingLog::Step& step);
  // After the last iteration: the final save, the validation and test evaluations, --save-hf.
  int finish_training();
  // The validation and test evaluations at the end of training (or of --skip-train).
  void final_evaluations(int64_t iteration);
  // --timing-log-level 2: seconds inside each op category so far, and the step's share of them
  // added to the timers.
  // The step's time by op is added to step_op_seconds_ too, for the table at the end of training.
  std::array<double, kOpCategories> op_times();
  void add_op_times(const std::array<double, kOpCategories>& before);
  // --timing-log-level 2, after the last iteration: this rank's mean time per training step in
  // each op, largest first (what the kernel categories are made of), then the GEMMs' by shape.
  void report_op_times() const;
  // This stage's share of the micro-batches of a step: read by TP rank 0 of every stage that
  // needs the data (first and last stages; every stage with --reset-attention-mask) and
  // broadcast over the TP group. `read(k)` builds the k-th micro-batch of the step; `evaluation`:
  // an evaluation's, of --eval-micro-batch-size.
  std::vector<TensorMap> step_batches(int64_t microbatches,
                                      const std::function<TensorMap(int64_t)>& read,
                                      bool evaluation = false);
  // After backward: data-parallel average, sequence-parallel and shared-embedding sums.
  void finish_gradients();
  // Its sequence-parallel and tied-embedding sums on sharded gradients (Megatron-FSDP).
  void finish_sharded_gradients();
  // --log-params-norm: the L2 norm of the fp32 main weights, each element of the model once
  // (every rank holds whole main weights after a step). Collective over the model-parallel group.
  double params_norm() const;
  // A per-rank sum (squares, zeros) over every element of the model once: part(kAll) over the
  // model-parallel group, or, when experts are apart, part(kDense) there and part(kExpert) over
  // the expert model-parallel group; with the distributed optimizer and sharded (gradients),
  // first over the (expert) data-parallel group that shares the shards. Collective over the world.
  double sum_over_model(const std::function<double(ParamDomain)>& part, bool sharded = true) const;
  // What this rank holds and writes of a checkpoint.
  CheckpointTarget checkpoint_target() const;
  // --overlap-param-gather: completes the weights' gathers in flight (before anything but the
  // next forward reads them).
  void complete_param_gather() const;
  // --calculate-per-token-loss: the summed gradients divided by the global batch's token count
  // (`terms`: the step's reduced loss terms, on the last stage). Collective over the pipeline.
  void divide_by_global_tokens(const LossTerms& terms);
  // Sums (loss, tokens) over the data-parallel replicas of the last stage.
  void reduce_loss_stats(LossTerms* terms);
  // The step's MoE load-balancing and z-losses as Megatron logs them (per name, the mean over
  // MoE layers of each layer's loss / coeff), appended to the last stage's terms; per layer in
  // moe_per_layer_. Collective over the world.
  void add_moe_terms(LossTerms* terms);
  // After each step of an MoE model: --moe-router-enable-expert-bias's bias update, and with
  // --log-expert-load the "expert load max/mean" term; clears the routers' counts. Collective.
  void moe_step_end(LossTerms* terms);
  std::vector<Action> schedule() const;
  // Token-weighted mean loss over eval_iters global batches of `data`, from sample `*consumed`;
  // consumed null (--full-validation): over every sample of `data` once (train/full_validation.h).
  LossTerms evaluate(const SampleSource& data, int64_t* consumed);
  // set: "" or, with --multiple-validation-sets, "-<index>" (Megatron's log and TensorBoard
  // suffix of the set).
  void evaluate_and_print(const std::string& prefix, const std::string& set,
                          const SampleSource& data, int64_t* consumed, int64_t iteration);
  // The validation sets' evaluations at `prefix` ("iteration N" ...); none without validation
  // data or evaluation iterations.
  void validate(const std::string& prefix, int64_t iteration);

  // --load: the checkpoint's weights (and optimizer, RNG and run state, unless told otherwise)
  // into this layout. Every rank reads its own boxes; a failure on any rank stops all of them
  // with its message (AgreedFailure).
  void load_checkpoint();
  // --pretrained-checkpoint naming one of our checkpoints: its latest weights that this model
  // has (a classifier from a pretrained BERT), nothing else of its state.
  void load_pretrained_checkpoint();
  RunState run_state(int64_t iteration) const;
  // metadata.json's fields besides tensors and run state: model arguments, layout, tokenizer.
  nlohmann::json checkpoint_extra() const;
  nlohmann::json layout_record() const;  // the parallel layout a checkpoint records
  void save_checkpoint(int64_t iteration, bool non_persistent = false);
  // After iteration `it`: the exit code when the run must stop now (--exit-signal-handler,
  // --exit-duration-in-mins, --exit-interval; agreed by every rank), else -1.
  int exit_decision(int64_t it);

  // Every line of the run comes from rank 0. Megatron prints the iteration and evaluation lines
  // from the last rank (which owns the loss); two ranks writing at once interleave mid-line
  // under a launcher that forwards their streams in chunks (mpirun does), so the last stage's
  // loss travels to rank 0 instead (relay_to_first_rank) and per-rank reports are gathered.
  void log_first(const std::string& line) const;
  // The last pipeline stage's named values (the loss terms of an interval or an evaluation) on
  // rank 0: the two ends of rank 0's pipeline exchange names and values, so rank 0 needs to know
  // neither in advance. Every other rank returns `values` as they are. Called by every rank at
  // the same point.
  std::vector<std::pair<std::string, double>> relay_to_first_rank(
      const std::vector<std::pair<std::string, double>>& values) const;
  // Megatron's "[Rank r] (after N iterations) memory (MB) | ..." of every data-parallel rank 0,
  // gathered and printed by rank 0 as one block. Collective over the world group.
  void report_memory(int64_t iteration) const;
  // Every rank's line (empty: none), printed by rank 0 as one block in rank order. Collective
  // over the world group.
  void log_gathered(const std::string& mine) const;

  Arguments args_;
  std::shared_ptr<ParallelState> parallel_;
  int64_t dp_size_ = 1, dp_rank_ = 0;
  // The group gradients reduce over: data parallel x context parallel (one rank's samples are
  // split over its CP group, so its replicas are the dp x cp ranks holding the same weights).
  int64_t grad_size_ = 1, grad_rank_ = 0;
  // The distributed optimizer's shard group: this rank's instance (--num-distributed-optimizer-
  // instances; the data x context parallel group with one instance).
  int64_t opt_size_ = 1, opt_rank_ = 0;
  ContextParallelContext cp_;
  std::shared_ptr<ProcessGroup> cp_inner_, cp_outer_;  // a2a+p2p only
  int virtual_stages_ = 1;
  bool first_rank_ = true, last_rank_ = true;
  bool memory_reported_ = false;  // Megatron reports memory once, after the first interval
  // The planner's prediction of this run's step and memory (GPT on CPUs), put beside the
  // measured ones once, after the second logging interval (the first warms up).
  std::optional<plan::Prediction> prediction_;
  int64_t intervals_logged_ = 0;
  // --timing-log-level 2: seconds by op at the start of the current step, and summed over steps.
  std::map<std::string, double> step_op_start_, step_op_seconds_;
  // The same for the GEMMs by shape.
  std::map<std::string, ShapeTime> step_gemm_start_, step_gemm_times_;
  int64_t profiled_steps_ = 0;
  bool first_step_profiled_ = false;
  bool needs_data_ = true;  // this stage reads micro-batches (first, last, or doc masks)
  bool has_loss_ = true;    // the last pipeline stage
  TransformerConfig cfg_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::unique_ptr<ModelChunk>> chunks_;  // one per virtual pipeline stage
  // FP8 delayed scaling: every chunk's regions update every enrolled GEMM at their ends, as
  // Transformer Engine's global amax buffer (parallel/fp8_scaling.h).
  Fp8Registry fp8_registry_;
  const ModelSpec* spec_ = nullptr;  // --model
  std::unique_ptr<LossFn> loss_;
  BatchFn make_batch_;                   // the spec's batch maker under this run's BatchOptions
  std::vector<TensorSpec> batch_specs_;  // the micro-batch fields this rank's chunks read
  std::vector<TensorSpec> eval_batch_specs_;  // the same at --eval-micro-batch-size
  std::unique_ptr<PipelineExecutor> executor_;
  std::unique_ptr<GradBuckets> grad_buckets_;
  std::vector<Param*> sp_params_;      // gradients summed over TP after backward (SP replicas)
  Param* shared_embedding_ = nullptr;  // tied embeddings summed over the embedding group
  FaultInjection fault_;
  std::unique_ptr<LossScaler> scaler_;  // --fp16 only
  int64_t scheduler_samples_ = 0;  // samples the LR schedule has advanced by (successful steps)
  StepTimers timers_;
  // Seconds spent in communication so far, over every group of this rank.
  double comm_seconds() const;
  std::unique_ptr<ParamSet> params_;
  // --qk-clip / --log-max-attention-logit: the decoder attention's largest scores (qk_clip.h).
  std::unique_ptr<QkClipper> qk_clipper_;
  std::unique_ptr<MoeAuxTracker> moe_tracker_;  // MoE models: each layer's losses of a step
  // The last step's MoE losses per name: (layer, value) of every MoE layer.
  std::vector<std::pair<std::string, std::vector<std::pair<int64_t, double>>>> moe_per_layer_;
  std::unique_ptr<AdamW> optimizer_;  // plain optimizer (or 1-bit Adam), or
  OneBitAdam* onebit_ = nullptr;      // --optimizer onebit_adam: optimizer_
  // 1-bit Adam: the data-parallel bytes of the last full step, and whether the comparison with
  // the first compressed step has been printed.
  int64_t onebit_last_full_bytes_ = 0;
  bool onebit_reported_ = false;
  void report_onebit_traffic(int64_t iteration, bool compressed, int64_t dp_bytes0);
  std::unique_ptr<DistributedOptimizer> dist_optimizer_;  // --use-distributed-optimizer
  // --use-megatron-fsdp with optim_grads or optim_grads_params: lends sharded units around use.
  std::unique_ptr<FsdpRuntime> fsdp_;
  // The gate every forward asks before reading weights (FSDP's, the distributed optimizer's with
  // --overlap-param-gather, or none).
  const ParamGate* forward_gate() const;
  // --use-megatron-fsdp's start-up line: what each rank keeps, in bytes.
  void report_fsdp() const;
  // Bytes this rank's buffers of weights, gradients and optimizer state hold.
  struct BufferBytes {
    int64_t main = 0, compute = 0, grads = 0, state = 0;
  };
  BufferBytes buffer_bytes() const;
  // Seconds waited so far for weight all-gathers (the distributed optimizer's and FSDP's).
  double param_gather_wait_seconds() const;
  LrSchedule schedule_;
  std::optional<LrSchedule> decoupled_schedule_;  // --decoupled-lr: embeddings and output layer
  // --use-mup: the schedule of the parameters of Param::MupClass other than kNone (hidden
  // matrices at lr / m; SGD's vectors at lr m), and Adam's eps scale of the hidden ones.
  std::optional<LrSchedule> mup_schedule_;
  bool mup_vectors_ = false;  // SGD: mup_schedule_ is the vectors' (and the embeddings')
  double mup_scale_ = 1;
  int64_t eval_iteration_ = 0;  // the training iteration an evaluation runs at (the watchdog's) //
                                // its bounds over the base schedule's (1 / m, or m for SGD)
  double mup_eps_scale_ = 1;
  void classify_mup_params();
  WeightDecaySchedule wd_schedule_;
  Datasets data_;
  // --phase-transition-iterations: the consumed samples before this phase's first (the training
  // data is read from consumed_train_ - phase_data_offset_).
  int64_t phase_data_offset_ = 0;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::unique_ptr<BatchPrefetcher> prefetcher_;
  std::optional<BatchSchedule> batch_schedule_;  // the global batch of each iteration
  int64_t num_microbatches_ = 1;                 // of the iteration being run
  int64_t eval_microbatches_ = 1;  // evaluation takes whole --global-batch-size batches
  int64_t consumed_valid_ = 0, consumed_test_ = 0;
  int64_t consumed_train_ = 0;
  int64_t skipped_train_samples_ = 0;     // --decrease-batch-size-if-needed, --iterations-to-skip
  std::set<int64_t> iterations_to_skip_;  // Megatron's 0-based counts
  // Megatron's result validation (--rerun-mode); nan_checks_: the NaN/Inf validations are on
  // (--no-check-for-nan-in-loss-and-grad off, and not dynamic fp16 loss scaling, whose scale
  // they drive).
  std::unique_ptr<RerunStateMachine> rerun_;
  bool nan_checks_ = false;
  nlohmann::json loaded_rerun_state_;  // the checkpoint's record, restored after loading
  void build_rerun_state_machine();
  // The validations of a micro-batch's local loss sum and of a bucket's local gradients.
  void validate_loss(double local_sum);
  void validate_grads(int64_t bucket, const Tensor& grads);
  void restore_rerun_state();
  double flops_so_far_ = 0;        // the model's FLOPs of every iteration trained
  double flops_at_start_ = 0;      // ... when this job started (for --log-progress)
  int64_t start_iteration_ = 0;    // the loaded checkpoint's iteration (0 without --load)
  int64_t loaded_iteration_ = -1;  // -1: nothing loaded
  uint64_t dropout_seed_ = 0;      // --seed, or the loaded RNG state
  std::unique_ptr<Checkpointer> checkpointer_;  // --save
  // --non-persistent-save-interval with --non-persistent-ckpt-type global (and --save).
  std::unique_ptr<Checkpointer> np_checkpointer_;
  std::unique_ptr<ProgressLog> progress_;  // --log-progress with --save, on rank 0
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<ExitSignalHandler> exit_signal_;  // --exit-signal-handler
  Timer train_timer_;                               // for --exit-duration-in-mins
  double peak_gflops_ = 0;
  Device device_ = Device::kCPU;  // where the weights live and the model computes (--device)
  std::vector<double> losses_, eval_losses_;
};

// The tokenizer arguments of a run.
TokenizerArgs tokenizer_args(const Arguments& args);

}  // namespace megatron
