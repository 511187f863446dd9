// The training loop: start-up lines, the step (micro-batches, clipping, AdamW), the iteration line,
// TensorBoard scalars and Megatron's evaluation blocks.
#include "train/trainer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <stdexcept>

#include "comm/agreement.h"
#include "comm/mpi_runtime.h"
#include "core/logging.h"
#include "core/threads.h"
#include "core/timer.h"
#include "data/random_sampler.h"
#include "optim/mup.h"
#include "tensor/allocator.h"
#include "tensor/memory_stats.h"
#include "tensor/op_profile.h"
#include "tensor/ops.h"
#include "train/cpu_calibration.h"
#include "train/device_choice.h"
#include "train/exit_codes.h"
#include "train/full_validation.h"
#include "train/gemm_peak.h"
#include "train/memory_report.h"
#include "train/micro_batch_runner.h"
#include "train/model_config.h"
#include "train/plan_prediction.h"
#include "train/replica_check.h"

namespace megatron {

namespace {
// What a checkpoint load checks (--verify-integrity, --no-verify-integrity; per-tensor checksums
// by default).
checkpoint::Integrity load_integrity(const Arguments& a) {
  if (a.no_verify_integrity) return checkpoint::Integrity::kSizesOnly;
  return a.verify_integrity ? checkpoint::Integrity::kTensorsAndFiles
                            : checkpoint::Integrity::kTensors;
}
}  // namespace

void Trainer::log_first(const std::string& line) const {
  if (first_rank_) log_line(line);
}

std::vector<std::pair<std::string, double>> Trainer::relay_to_first_rank(
    const std::vector<std::pair<std::string, double>>& values) const {
  const ParallelState& ps = *parallel_;
  if (ps.pp_size() == 1 || ps.tp_rank() != 0 || grad_rank_ != 0) return values;
  if (!ps.is_first_stage() && !ps.is_last_stage()) return values;
  // A tag no pipeline transfer uses (those are 2 x chunk + kind): none is in flight here anyway,
  // since every step and evaluation has finished its transfers before anything is logged.
  constexpr int kRelayTag = 1 << 20;
  // The names as one string ('\n' between them) padded into i32 words, then the values.
  Tensor header = Tensor::empty({2}, DType::kI64);
  std::string names;
  if (ps.is_last_stage()) {
    for (const auto& v : values) names += (names.empty() ? "" : "\n") + v.first;
    header.data<int64_t>()[0] = static_cast<int64_t>(values.size());
    header.data<int64_t>()[1] = static_cast<int64_t>(names.size());
    ps.pp_group().send(header, 0, kRelayTag);
  } else {
    ps.pp_group().recv(header, ps.pp_size() - 1, kRelayTag);
  }
  const int64_t count = header.data<int64_t>()[0], bytes = header.data<int64_t>()[1];
  if (count == 0) return {};
  Tensor text = Tensor::zeros({(bytes + 3) / 4}, DType::kI32);
  Tensor numbers = Tensor::empty({count}, DType::kF64);
  if (ps.is_last_stage()) {
    std::memcpy(text.data<int32_t>(), names.data(), names.size());
    for (int64_t i = 0; i < count; ++i) numbers.data<double>()[i] = values[i].second;
    ps.pp_group().send(text, 0, kRelayTag);
    ps.pp_group().send(numbers, 0, kRelayTag);
    return values;
  }
  ps.pp_group().recv(text, ps.pp_size() - 1, kRelayTag);
  ps.pp_group().recv(numbers, ps.pp_size() - 1, kRelayTag);
  names.assign(reinterpret_cast<const char*>(text.data<int32_t>()), static_cast<size_t>(bytes));
  std::vector<std::pair<std::string, double>> out;
  size_t start = 0;
  for (int64_t i = 0; i < count; ++i) {
    const size_t end = i + 1 < count ? names.find('\n', start) : names.size();
    out.emplace_back(names.substr(start, end - start), numbers.data<double>()[i]);
    start = end + 1;
  }
  return out;
}

void Trainer::log_gathered(const std::string& mine) const {
  std::string block;
  for (const std::string& line : all_gather_strings(parallel_->world_group(), mine)) {
    if (!line.empty()) block += (block.empty() ? "" : "\n") + line;
  }
  log_first(block);
}

void Trainer::report_memory(int64_t iteration) const {
  // Megatron's report_memory prints from every data-parallel rank 0; here rank 0 prints them
  // all, in rank order, so that the block is whole under any launcher.
  log_gathered(dp_rank_ != 0 ? std::string()
                             : strprintf("[Rank %d] (after %ld iterations) memory (MB) | resident: "
                                         "%.1f | max resident: %.1f",
                                         parallel_->rank(), static_cast<long>(iteration),
                                         resident_mb(), max_resident_mb()));
  if (!args_.use_megatron_fsdp) return;
  // Megatron-FSDP: every rank's own shards differ, so every rank reports. What the buffers hold
  // (held), what the runtime lent on top at most (gathered weights and gradient buffers), and
  // the most bytes all tensors took at once, activations included.
  const double mb = 1048576.0;
  const BufferBytes b = buffer_bytes();
  const double held = static_cast<double>(b.main + b.compute + b.grads + b.state);
  log_gathered(
      strprintf("[Rank %d] (after %ld iterations) FSDP memory (MB) | weights, gradients "
                "and optimizer state: %.3f | lent at most: %.3f | peak of all tensors: "
                "%.3f",
                parallel_->rank(), static_cast<long>(iteration), held / mb,
                static_cast<double>(fsdp_ ? fsdp_->peak_lent_bytes() : 0) / mb,
                static_cast<double>(peak_tensor_bytes()) / mb));
}

TokenizerArgs tokenizer_args(const Arguments& a) {
  TokenizerArgs t;
  t.type = a.tokenizer_type;
  t.vocab_file = a.vocab_file;
  t.merge_file = a.merge_file;
  t.tokenizer_model = a.tokenizer_model;
  t.vocab_size = a.vocab_size;
  t.vocab_extra_ids = a.vocab_extra_ids;
  t.tiktoken_pattern = a.tiktoken_pattern;
  t.tiktoken_num_special_tokens = a.tiktoken_num_special_tokens;
  t.tiktoken_special_tokens = a.tiktoken_special_tokens;
  t.null_tokenizer_eod_id = a.null_tokenizer_eod_id;
  t.null_tokenizer_pad_id = a.null_tokenizer_pad_id;
  t.hf_include_special_tokens = !a.tokenizer_hf_no_include_special_tokens;
  return t;
}

Trainer::Trainer(const Arguments& args, std::shared_ptr<ParallelState> parallel)
    : args_(args), parallel_(std::move(parallel)) {
  // The evaluation's batch sizes, when the caller has not resolved them (the CLI does).
  if (args_.eval_micro_batch_size == 0) args_.eval_micro_batch_size = args_.micro_batch_size;
  if (args_.eval_global_batch_size == 0) args_.eval_global_batch_size = args_.global_batch_size;
  // A single process is a world of one: every group is the process itself.
  if (!parallel_)
    parallel_ = std::make_shared<ParallelState>(make_self_process_group(), ParallelConfig{});
  const ParallelState& ps = *parallel_;
  dp_size_ = ps.dp_size();
  dp_rank_ = ps.dp_rank();
  grad_size_ = ps.dp_cp_group().size();
  grad_rank_ = ps.dp_cp_group().rank();
  opt_size_ = ps.intra_instance_group().size();
  opt_rank_ = ps.intra_instance_group().rank();
  first_rank_ = ps.rank() == 0;
  last_rank_ = ps.rank() == ps.world_size() - 1;
  has_loss_ = ps.is_last_stage();
  virtual_stages_ = static_cast<int>(virtual_pipeline_stages(args_));
  fault_ = FaultInjection::parse(args_.inject_fault);
  dropout_seed_ = static_cast<uint64_t>(args_.seed);
  for (const std::string& change : restore_optimizer_groups(args_)) log_first(change);
  if (args_.timing_log_level >= 2) set_op_profiling(true);
  if (args_.fp16) {
    scaler_ = std::make_unique<LossScaler>(
        LossScalerConfig{args_.loss_scale, args_.initial_loss_scale, args_.min_loss_scale,
                         args_.loss_scale_window, args_.hysteresis});
  }
  tokenizer_ = build_tokenizer(tokenizer_args(args_));
  cfg_ = transformer_config_from_args(args_);
  spec_ = &model_spec(args_.model);
  device_ = resolve_device(args_.device);
  const bool whole_model = ps.tp_size() == 1 && ps.pp_size() == 1;
  // One of our checkpoints as --pretrained-checkpoint loads into any layout (each rank reads its
  // boxes); a Hugging Face directory only into the whole model.
  const bool native_pretrained =
      !args_.pretrained_checkpoint.empty() &&
      std::filesystem::exists(std::filesystem::path(args_.pretrained_checkpoint) /
                              checkpoint::kTrackerFile);
  MEGATRON_CHECK(whole_model || ((args_.pretrained_checkpoint.empty() || native_pretrained) &&
                                 args_.save_hf.empty()),
                 "--pretrained-checkpoint and --save-hf read and write whole Hugging Face models "
                 "in one process (tensor- and pipeline-parallel size 1); in a parallel layout, "
                 "convert first (`megatron convert --load-hf IN --save CKPT`, then --load CKPT) "
                 "and after training (--save CKPT, then `megatron convert --load CKPT --save-hf "
                 "OUT`)");
  // Under expert parallelism each rank holds whole experts of its own: a Hugging Face model loads
  // rank by rank, but only ETP 1 holds whole expert tensors, and only EP 1 can write them all.
  MEGATRON_CHECK(args_.pretrained_checkpoint.empty() || native_pretrained || ps.etp_size() == 1,
                 "--pretrained-checkpoint loads whole expert tensors: use "
                 "--expert-tensor-parallel-size 1, or convert first (`megatron convert --load-hf "
                 "IN --save CKPT`, then --load CKPT)");
  MEGATRON_CHECK(args_.save_hf.empty() || (ps.ep_size() == 1 && ps.etp_size() == 1),
                 "--save-hf writes every expert from one process: use "
                 "--expert-model-parallel-size 1 and --expert-tensor-parallel-size 1, or save a "
                 "checkpoint (--save CKPT) and `megatron convert --load CKPT --save-hf OUT`");
  if (!args_.save_hf.empty()) {
    // Refuse an unexportable model or an unwritable directory now, not after training.
    spec_->hf.check_exportable(cfg_);
    std::error_code ec;
    std::filesystem::create_directories(args_.save_hf, ec);
    MEGATRON_CHECK(!ec && std::filesystem::is_directory(args_.save_hf),
                   "--save-hf: cannot create '", args_.save_hf, "' (", ec.message(), ")");
  }
  log_first(strprintf(" > padded vocab (size: %ld) with %ld dummy tokens (new size: %ld)",
                      static_cast<long>(cfg_.vocab_size),
                      static_cast<long>(cfg_.padded_vocab_size - cfg_.vocab_size),
                      static_cast<long>(cfg_.padded_vocab_size)));
  batch_schedule_.emplace(args_.global_batch_size, args_.micro_batch_size, dp_size_,
                          args_.decrease_batch_size_if_needed,
                          args_.rampup_batch_size.empty()
                              ? std::nullopt
                              : std::optional(parse_rampup_batch_size(args_.rampup_batch_size)));
  log_first(batch_schedule_->describe());
  if (args_.train_samples > 0) {
    log_first(
        strprintf("setting training iterations to %ld", static_cast<long>(args_.train_iters)));
  } else if (batch_schedule_->ramps_up()) {
    log_first(
        " > --rampup-batch-size with --train-iters (Megatron r0.14 asserts against the pair, "
        "though its GPT-3 example passes both): --train-iters iterations, each of the ramp-up's "
        "batch; the LR schedule's lengths are iterations x --global-batch-size, as Megatron's "
        "iteration-based schedule counts them");
  }
  for (const std::string& v : args_.iterations_to_skip) iterations_to_skip_.insert(std::stoll(v));
  build_rerun_state_machine();
  // The final (largest) batch: what the memory estimate must hold.
  num_microbatches_ = batch_schedule_->all_batches().back().microbatches;
  eval_microbatches_ = args_.eval_global_batch_size / (args_.eval_micro_batch_size * dp_size_);

  build_context_parallel();
  build_model();
  build_optimizer();
  build_schedule();
  classify_mup_params();
  build_checkpointing();
  build_data();
  report_gemm_peak();
  predict_step();
  // The peak the memory report prints is the run's, not the start-up's (initialisation's and
  // loading's temporaries, the GEMM peak probe).
  reset_peak_tensor_bytes();
}

// This rank's model chunks, the model's loss, the parameters (initialised or imported), and the
// start-up parameter-count and memory lines.
void Trainer::build_model() {
  const ParallelState& ps = *parallel_;
  // This rank's model chunks, one per virtual pipeline stage, and the model's loss.
  const int pp = ps.pp_size();
  chunks_ = spec_->build_chunks(
      ModelOptions{cfg_, args_.reset_attention_mask || args_.dataloader_inter_document_masking,
                   args_.dataloader_inter_document_masking},
      ChunkPlacement{.tp = ps.tp_group_ptr(),
                     .sequence_parallel = args_.sequence_parallel,
                     .pp_size = pp,
                     .pp_rank = ps.pp_rank(),
                     .virtual_stages = virtual_stages_,
                     .cp = context_parallel(),
                     .expert = expert_parallel(),
                     .amax = &ps.amax_reduction_group(),
                     .split = pipeline_split(args_)});
  std::vector<Param*> all;
  for (const auto& chunk : chunks_) {
    for (Param* p : chunk->parameters()) all.push_back(p);
    for (Fp8Region* r : chunk->fp8_regions()) r->join(&fp8_registry_);
  }
  if (args_.apply_wd_to_qk_layernorm) {
    // Megatron's Qwen3-Next rule: 1-D parameters and biases keep no decay, except those of the
    // q_layernorm and k_layernorm modules.
    for (Param* p : all) {
      if (p->name.find("q_layernorm.") != std::string::npos ||
          p->name.find("k_layernorm.") != std::string::npos)
        p->no_weight_decay = false;
    }
  }
  loss_ = spec_->make_loss(cfg_);
  // Multi-token prediction's layers are numbered after the decoder's (Megatron's tracker holds
  // num_layers + mtp_num_layers entries too; a hybrid MTP depth has its pattern's layers).
  if (cfg_.moe.enabled()) moe_tracker_ = std::make_unique<MoeAuxTracker>(cfg_.layer_slots());
  if (cfg_.track_max_logits) {
    std::vector<SelfAttention*> attentions;
    for (const auto& chunk : chunks_)
      for (SelfAttention* a : chunk->decoder_self_attentions()) attentions.push_back(a);
    qk_clipper_ = std::make_unique<QkClipper>(std::move(attentions),
                                              QkClip{.alpha = args_.qk_clip_alpha,
                                                     .threshold = args_.qk_clip_threshold,
                                                     .dtype = cfg_.compute_dtype},
                                              args_.qk_clip);
  }
  // The fields this rank's chunks read, each once, in first-read order.
  {
    for (const auto& chunk : chunks_) {
      for (const std::string& f : chunk->batch_fields()) {
        bool known = false;
        for (const TensorSpec& t : batch_specs_) known = known || t.name == f;
        if (!known) {
          batch_specs_.push_back(spec_->batch_field(f, args_.micro_batch_size, cfg_));
          eval_batch_specs_.push_back(spec_->batch_field(f, args_.eval_micro_batch_size, cfg_));
        }
      }
    }
    needs_data_ = !batch_specs_.empty();
  }
  // The buffers' bucket layout must be known before they are allocated: the distributed
  // optimizer pads each bucket to split evenly into data-parallel shards. --ddp-num-buckets:
  // Megatron's bucket size, this rank's parameter count (its chunks') / N.
  if (args_.ddp_num_buckets > 0) {
    int64_t count = 0;
    for (const Param* p : all) count += p->shape.numel();
    bucket_elems_ = std::max<int64_t>(1, count / args_.ddp_num_buckets);
  }
  const int64_t bucket = bucket_size();
  const bool distributed = args_.use_distributed_optimizer;
  const int expert_dp = ps.experts_apart() ? ps.intra_instance_expert_group().size() : 1;
  BucketLayout layout = distributed_bucket_layout(bucket, static_cast<int>(opt_size_), expert_dp);
  // Megatron-FSDP's buffers: one per unit (transformer layer, embeddings, ...); with optim_grads
  // the gradients, with optim_grads_params the weights too, exist only as this rank's shards
  // (over the groups the buckets reduce over: dp x cp, and expert data parallelism for experts
  // split apart), from the start: the whole model is never allocated.
  layout.per_unit = args_.use_megatron_fsdp;
  const std::string& strategy = args_.data_parallel_sharding_strategy;
  Sharding sharding;
  if (args_.use_megatron_fsdp) {
    sharding.grads = strategy == "optim_grads" || strategy == "optim_grads_params";
    sharding.weights = strategy == "optim_grads_params";
  }
  // Mixed precision with the distributed optimizer (every FSDP strategy but no_shard): the fp32
  // main weights shard with the optimizer state, the 16-bit compute copy staying whole
  // (Megatron's layout, 6 + 12/dp bytes per parameter).
  sharding.main = distributed && is_half(cfg_.compute_dtype);
  sharding.dense_rank = static_cast<int>(opt_rank_);
  sharding.dense_size = static_cast<int>(opt_size_);
  if (ps.experts_apart()) {
    sharding.expert_rank = ps.intra_instance_expert_group().rank();
    sharding.expert_size = ps.intra_instance_expert_group().size();
  }
  params_ = distributed
                ? std::make_unique<ParamSet>(all, cfg_.compute_dtype, layout, device_, sharding)
                : std::make_unique<ParamSet>(all, cfg_.compute_dtype, device_);
  // Initialised first in every case: what a pretrained model lacks (a classifier's head) keeps
  // its initialisation.
  params_->initialize(static_cast<uint64_t>(args_.seed));
  if (!args_.pretrained_checkpoint.empty()) {
    if (std::filesystem::exists(std::filesystem::path(args_.pretrained_checkpoint) /
                                checkpoint::kTrackerFile)) {
      load_pretrained_checkpoint();
    } else {
      spec_->hf.load(args_.pretrained_checkpoint, *chunks_.front(), *params_);
    }
    log_first(" > loaded pretrained weights from " + args_.pretrained_checkpoint);
  }
  if (!args_.pretrained_vision_checkpoint.empty()) {
    // Megatron's combine step: the vision encoder from its own checkpoint (the first stage's).
    MEGATRON_CHECK(spec_->hf.load_vision != nullptr,
                   "--pretrained-vision-checkpoint applies to "
                   "vision-language models (--model llava)");
    MEGATRON_CHECK(parallel_->tp_size() == 1 && parallel_->pp_size() == 1,
                   "--pretrained-vision-checkpoint reads a whole Hugging Face "
                   "vision tower in one process (tensor- and pipeline-parallel size 1); convert "
                   "the combined model first (`megatron convert`), then --load it");
    spec_->hf.load_vision(args_.pretrained_vision_checkpoint, *chunks_.front(), *params_);
    log_first(" > loaded the vision encoder from " + args_.pretrained_vision_checkpoint);
  }
  for (Param* p : params_->params()) {
    if (!p->requires_grad) continue;  // frozen without gradients: nothing to reduce
    if (p->sequence_parallel) sp_params_.push_back(p);
    // With pipelining and tied embeddings (or multi-token prediction, which embeds on the last
    // stage), the first and the last stage each hold a copy.
    if (pp > 1 && (!cfg_.untie_embeddings_and_output_weights || cfg_.mtp_num_layers > 0) &&
        p->name == "embedding.word_embeddings.weight") {
      shared_embedding_ = p;
    }
  }
  if (cfg_.mamba.enabled()) {
    // Megatron's allocate_layers report (its log lines), with the counts of each type.
    const std::string& l = cfg_.mamba.layers;
    const auto count = [&](char c) { return std::count(l.begin(), l.end(), c); };
    log_first(
        strprintf("Hybrid allocation (M is mamba, * is attention, - is mlp):\n%s\n%ld "
                  "attention layers in %ld total layers.\n%ld mlp layers in %ld total "
                  "layers.",
                  l.c_str(), static_cast<long>(count('*')), static_cast<long>(l.size()),
                  static_cast<long>(count('-')), static_cast<long>(l.size())));
  }
  int64_t nparams = 0;
  for (Param* p : params_->params())
    // Megatron counts parameters (frozen ones too), not buffers (the routers' expert bias).
    if (!p->frozen || !p->requires_grad) nparams += p->shape.numel();
  // Megatron prints one line per model-parallel rank (from data-parallel rank 0); rank 0 prints
  // them all as one block, in rank order (see log_first).
  log_gathered(grad_rank_ != 0 ? std::string()
                               : strprintf(" > number of parameters on (tensor, pipeline) model "
                                           "parallel rank (%d, %d): %ld",
                                           ps.tp_rank(), ps.pp_rank(), static_cast<long>(nparams)));
  {
    ShardedState sharded{distributed, params_->main_sharded(), params_->grads_sharded(),
                         params_->weights_sharded()};
    sharded.moment_bytes = moment_bytes_from_args(args_);  // SGD buffer / Adam moment storage
    if (args_.optimizer == "muon" || args_.optimizer == "lion") {
      // Megatron's emerging optimizers keep one fp32 state tensor per matrix (Muon's buffer,
      // Lion's moment) and Adam's two (or Lion's one) for the rest: their mean over the trained
      // parameters. The layer-wise distributed optimizer spreads it over the replicas.
      AdamWConfig c;
      c.rule = args_.optimizer == "muon" ? UpdateRule::kMuon : UpdateRule::kLion;
      c.muon_scalar_lion = args_.muon_scalar_optimizer == "lion";
      double state = 0, trained = 0;
      for (const Param* p : params_->params()) {
        if (p->frozen || !p->requires_grad) continue;
        state += 4.0 * states_of(c, *p) * static_cast<double>(p->shape.numel());
        trained += static_cast<double>(p->shape.numel());
      }
      sharded.moment_bytes = trained > 0 ? state / trained : 0.0;
      sharded.moments = args_.use_layer_wise_distributed_optimizer;
    }
    int64_t fp8_weights = 0, frozen = 0;
    for (const Param* p : params_->params()) {
      if (p->fp8) fp8_weights += p->shape.numel();
      if (!p->requires_grad) frozen += p->shape.numel();
    }
    int64_t activation = 0;
    if (spec_->name == "gpt") {
      // The planner's memory model of this layout (the one the start-up prediction and `megatron
      // plan` use): the in-flight micro-batches' activations and what a stage holds once.
      plan::Prediction p;
      plan::predict_memory(
          workload_from_args(args_, cfg_, *spec_, plan::ActivationRuntime::kThisProject),
          layout_from_args(args_, ps.world_size()), plan::Device{}, &p);
      activation = static_cast<int64_t>(p.activation_bytes);
    } else {
      // What one micro-batch keeps per chunk (the model's own estimate), times the (micro-batch,
      // chunk) forwards this rank holds at once under its schedule.
      int64_t per_chunk = 0;
      for (const auto& chunk : chunks_) {
        per_chunk =
            std::max(per_chunk, spec_->activation_bytes(*chunk, cfg_, args_.micro_batch_size));
      }
      activation = per_chunk * plan::in_flight_microbatches(
                                   pp, virtual_stages_, ps.pp_rank(), num_microbatches_,
                                   args_.microbatch_group_size_per_vp_stage);
    }
    log_first(theoretical_memory_line(nparams, cfg_.compute_dtype, opt_size_, sharded, activation,
                                      fp8_weights, frozen));
  }
}

ContextParallelContext Trainer::context_parallel() const {
  return cp_;
}

void Trainer::build_context_parallel() {
  const ParallelState& ps = *parallel_;
  if (ps.cp_size() == 1) return;
  cp_.group = &ps.cp_group();
  cp_.comm = parse_cp_comm_type(args_.cp_comm_type.front());
  if (args_.cp_comm_type.size() > 1) {
    for (const std::string& t : args_.cp_comm_type) cp_.layer_comm.push_back(parse_cp_comm_type(t));
  }
  bool hierarchical = cp_.comm == CpCommType::kA2AP2P;
  for (CpCommType t : cp_.layer_comm) hierarchical = hierarchical || t == CpCommType::kA2AP2P;
  if (!hierarchical) return;
  // Inner groups of A adjacent CP ranks; outer rings of the ranks with equal inner index.
  const int a = std::stoi(args_.hierarchical_context_parallel_sizes.front());
  const int n = ps.cp_size();
  RankGroups inner, outer(static_cast<size_t>(a));
  for (int g = 0; g < n / a; ++g) {
    inner.emplace_back();
    for (int j = 0; j < a; ++j) {
      inner.back().push_back(g * a + j);
      outer[static_cast<size_t>(j)].push_back(g * a + j);
    }
  }
  cp_inner_ = ps.cp_group().split(inner);
  cp_outer_ = ps.cp_group().split(outer);
  cp_.inner = cp_inner_.get();
  cp_.outer = cp_outer_.get();
}

int64_t Trainer::bucket_size() const {
  if (bucket_elems_ > 0) return bucket_elems_;
  return args_.ddp_bucket_size > 0 ? args_.ddp_bucket_size
                                   : default_ddp_bucket_size(static_cast<int>(grad_size_));
}

// Data-parallel gradient buckets, the pipeline executor and the optimizer (plain or distributed).
void Trainer::build_optimizer() {
  const ParallelState& ps = *parallel_;
  const bool distributed = args_.use_distributed_optimizer;
  // Experts split over EP (or ETP != TP) reduce over the expert-data-parallel group, scaled by
  // 1 / (dp x cp) (GradBuckets' ExpertReduction); otherwise they are dense parameters here.
  ExpertReduction expert;
  if (ps.experts_apart()) {
    expert = {&ps.intra_instance_expert_group(), 1.0 / static_cast<double>(grad_size_),
              ps.inter_instance_expert_group()};
  }
  // Several distributed-optimizer instances: the reduce-scatter over this rank's instance, then
  // the shards summed over the instances (GradBuckets).
  grad_buckets_ = std::make_unique<GradBuckets>(
      *params_, ps.intra_instance_group(), bucket_size(), args_.overlap_grad_reduce,
      distributed ? GradReduce::kReduceScatter : GradReduce::kAllReduce, expert,
      ps.inter_instance_group());
  grad_buckets_->set_reduce_in_bf16(args_.grad_reduce_in_bf16);
  // Megatron-FSDP reduces through its own buffers, which never read the DDP flag.
  grad_buckets_->set_fp32_accumulation(args_.ddp_reduce_scatter_with_fp32_accumulation &&
                                       !args_.use_megatron_fsdp);
  grad_buckets_->set_average(!args_.calculate_per_token_loss);
  grad_buckets_->set_before_reduce(
      [this](int64_t bucket, const Tensor& grads) { validate_grads(bucket, grads); });
  // As Megatron's gradient buffer, per pipeline stage (the first rank of each stage's line).
  log_gathered(grad_rank_ != 0 || ps.tp_rank() != 0
                   ? std::string()
                   : strprintf("Number of buckets for gradient all-reduce / reduce-scatter: %ld",
                               static_cast<long>(grad_buckets_->num_buckets())));
  executor_ = std::make_unique<PipelineExecutor>(ps.pp_group(), virtual_stages_, device_);

  // The weight decay of each step comes from the schedule (StepRates); this is the constant one.
  AdamWConfig adam{args_.adam_beta1, args_.adam_beta2, args_.adam_eps, args_.weight_decay};
  if (args_.optimizer == "sgd") {
    adam.rule = UpdateRule::kSgd;
    adam.sgd_momentum = args_.sgd_momentum;
    log_first(strprintf(
        " > SGD (Megatron's --optimizer sgd, FusedSGD's rule): momentum %g%s, weight decay added "
        "to the gradient (L2), no bias correction",
        args_.sgd_momentum, args_.sgd_momentum != 0 ? " (one buffer per weight)" : ", no buffer"));
  }
  adam.lion_beta1 = args_.lion_beta1;
  adam.lion_beta2 = args_.lion_beta2;
  if (distributed) {
    AdamWConfig moments = adam;
    // --use-precision-aware-optimizer's storage (validated: fp32 without the flag).
    MEGATRON_CHECK(parse_moment_dtype(args_.exp_avg_dtype, &moments.exp_avg_dtype) &&
                       parse_moment_dtype(args_.exp_avg_sq_dtype, &moments.exp_avg_sq_dtype),
                   "--exp-avg-dtype / --exp-avg-sq-dtype: fp32, fp16, bf16 or fp8");
    dist_optimizer_ = std::make_unique<DistributedOptimizer>(*grad_buckets_, moments);
    dist_optimizer_->set_overlap_param_gather(args_.overlap_param_gather &&
                                              !params_->weights_sharded());
    if (params_->grads_sharded()) {
      fsdp_ = std::make_unique<FsdpRuntime>(
          *grad_buckets_, args_.overlap_param_gather && !params_->weights_sharded()
                              ? dist_optimizer_.get()
                              : nullptr);
    }
    log_first(strprintf(
        " > distributed optimizer: each of the %ld data-parallel%s ranks keeps the %s "
        "%sof 1/%ld of every gradient bucket (%.2f MB on this rank)%s%s",
        static_cast<long>(opt_size_), ps.cp_size() > 1 ? " x context-parallel" : "",
        !adam.sgd()         ? "Adam moments"
        : adam.states() > 0 ? "SGD momentum buffers"
                            : "SGD state, nothing without momentum,",
        params_->main_sharded() ? "and the fp32 main weights " : "", static_cast<long>(opt_size_),
        static_cast<double>(dist_optimizer_->state_bytes()) / 1048576.0,
        ps.num_distributed_optimizer_instances() > 1
            ? strprintf(" in each of %d instances (the gradient shards summed over them)",
                        ps.num_distributed_optimizer_instances())
                  .c_str()
            : "",
        grad_size_ == 1 ? "; with data-parallel size 1 there is nothing to shard: it behaves as "
                          "the plain optimizer"
                        : ""));
    if (args_.use_precision_aware_optimizer) {
      log_first(strprintf(
          " > precision-aware optimizer: Adam's moments stored as exp_avg %s, exp_avg_sq %s "
          "(updated in fp32; fp16 and fp8 scaled per parameter shard, Transformer Engine's "
          "FusedAdam); checkpoints hold them in fp32",
          moment_dtype_name(moments.exp_avg_dtype), moment_dtype_name(moments.exp_avg_sq_dtype)));
    }
  } else if (args_.optimizer == "onebit_adam") {
    auto onebit =
        std::make_unique<OneBitAdam>(*params_, adam, args_.onebit_freeze_step, ps.dp_cp_group());
    onebit_ = onebit.get();
    optimizer_ = std::move(onebit);
    log_first(strprintf(
        " > 1-bit Adam (DeepSpeed's OneBitAdam): Adam without bias correction, the first step "
        "only initialising, the gradients all-reduced over the %ld data-parallel ranks for %ld "
        "steps (--onebit-freeze-step); then the variance is frozen and the momentum is averaged "
        "compressed to 1 bit per element with error feedback instead",
        static_cast<long>(grad_size_), static_cast<long>(args_.onebit_freeze_step)));
  } else if (args_.optimizer == "muon" || args_.optimizer == "lion") {
    adam.rule = args_.optimizer == "lion" ? UpdateRule::kLion : UpdateRule::kMuon;
    adam.muon_scalar_lion = args_.muon_scalar_optimizer == "lion";
    MuonConfig muon;
    muon.momentum = args_.muon_momentum;
    muon.nesterov = args_.muon_nesterov;
    muon.split_qkv = args_.muon_split_qkv;
    parse_muon_scale_mode(args_.muon_scale_mode, &muon.scale_mode);  // validated
    parse_muon_tp_mode(args_.muon_tp_mode, &muon.tp_mode);
    muon.bf16_iteration = args_.muon_fp32_matmul_prec == "medium";
    muon.coefficient_type = args_.muon_coefficient_type;
    muon.num_ns_steps = args_.muon_num_ns_steps;
    muon.extra_scale_factor = args_.muon_extra_scale_factor;
    LayerWiseGroups layer_wise;
    if (args_.use_layer_wise_distributed_optimizer) {
      layer_wise.dense = &ps.intra_instance_group();
      layer_wise.expert =
          ps.experts_apart() ? &ps.intra_instance_expert_group() : &ps.intra_instance_group();
    }
    auto owned =
        std::make_unique<Muon>(*params_, adam, muon, ps.tp_group(), ps.etp_group(), layer_wise);
    int64_t matrices = 0, elements = 0;
    for (const Param* p : params_->params()) {
      if (is_muon_matrix(*p)) {
        ++matrices;
        elements += p->shape.numel();
      }
    }
    if (layer_wise.dense) {
      log_first(strprintf(
          " > %s's layer-wise distributed optimizer (Megatron's for --use-distributed-optimizer "
          "with %s): gradients all-reduced, each parameter's state and update on one rank of "
          "its data-parallel group (%ld ranks for the dense parameters), then broadcast (%.2f MB "
          "of state on this rank)",
          adam.rule == UpdateRule::kLion ? "Lion" : "Muon",
          adam.rule == UpdateRule::kLion ? "Lion" : "Muon", static_cast<long>(grad_size_),
          static_cast<double>(owned->exp_avg().nbytes() + owned->exp_avg_sq().nbytes()) /
              1048576.0));
    }
    optimizer_ = std::move(owned);
    if (adam.rule == UpdateRule::kLion) {
      log_first(strprintf(
          " > Lion (Megatron's --optimizer lion, emerging_optimizers' rule as Megatron builds it): "
          "%ld matrices (%ld elements on this rank) take the sign of lerp(moment, gradient, 1 - "
          "%g), one moment with decay %g (--adam-beta1/2), decoupled weight decay; embeddings, "
          "output layer and the other parameters take AdamW",
          static_cast<long>(matrices), static_cast<long>(elements), args_.adam_beta1,
          args_.adam_beta2));
    } else {
      log_first(strprintf(
          " > Muon (Megatron's --optimizer muon): %ld matrices (%ld elements on this rank) take "
          "the orthogonalised momentum (momentum %g%s, %ld %s Newton-Schulz steps in %s, scale %s, "
          "tensor-parallel mode %s%s); embeddings, output layer and the other parameters take "
          "%s",
          static_cast<long>(matrices), static_cast<long>(elements), muon.momentum,
          muon.nesterov ? ", Nesterov" : "", static_cast<long>(muon.num_ns_steps),
          muon.coefficient_type.c_str(), muon.bf16_iteration ? "bf16" : "f32",
          args_.muon_scale_mode.c_str(), args_.muon_tp_mode.c_str(),
          muon.split_qkv ? ", QKV split" : "", adam.muon_scalar_lion ? "Lion" : "AdamW"));
    }
  } else {
    optimizer_ = std::make_unique<AdamW>(*params_, adam);
  }
  // Main weights sharded alone: the compute copies of pretrained weights read into each rank's
  // shards meet here (freshly initialised ones are whole already). FP8 primary weights
  // (--fp8-param-gather) get their first codes here in every case: quantising them takes the
  // FP8 scaling state and a reduction of the amaxes, the distributed optimizer's.
  if (params_->main_sharded() &&
      (!args_.pretrained_checkpoint.empty() || params_->has_fp8_weights()))
    dist_optimizer_->refresh_compute();
  if (args_.use_megatron_fsdp) report_fsdp();
}

Trainer::BufferBytes Trainer::buffer_bytes() const {
  // Measured from the tensors, not estimated: the compute copy is the main buffer itself in fp32
  // runs.
  BufferBytes b;
  b.main = static_cast<int64_t>(params_->main().nbytes());
  b.compute = params_->compute().raw() == params_->main().raw()
                  ? 0
                  : static_cast<int64_t>(params_->compute().nbytes());
  // FP8 primary weights' codes (--fp8-param-gather): the compute weights of those GEMMs.
  if (params_->codes().defined()) b.compute += static_cast<int64_t>(params_->codes().nbytes());
  b.grads = static_cast<int64_t>(params_->grads().nbytes());
  b.state = dist_optimizer_ ? dist_optimizer_->state_bytes()
                            : static_cast<int64_t>(optimizer_->exp_avg().nbytes() +
                                                   optimizer_->exp_avg_sq().nbytes());
  return b;
}

void Trainer::report_fsdp() const {
  const double mb = 1048576.0;
  const BufferBytes b = buffer_bytes();
  const double main = static_cast<double>(b.main) / mb;
  const double compute = static_cast<double>(b.compute) / mb;
  const double grads = static_cast<double>(b.grads) / mb;
  const double state = static_cast<double>(b.state) / mb;
  const std::string& strategy = args_.data_parallel_sharding_strategy;
  log_first(strprintf(
      " > Megatron-FSDP, --data-parallel-sharding-strategy %s over %ld data-parallel%s ranks%s: "
      "%s; one buffer per unit (each transformer layer, the embeddings, ...)",
      strategy.c_str(), static_cast<long>(opt_size_),
      parallel_->cp_size() > 1 ? " x context-parallel" : "",
      parallel_->num_distributed_optimizer_instances() > 1
          ? strprintf(" in each of %d instances (hybrid sharding: the gradient shards summed "
                      "across them)",
                      parallel_->num_distributed_optimizer_instances())
                .c_str()
          : "",
      strategy == "no_shard"      ? "nothing sharded (plain data parallelism)"
      : strategy == "optim"       ? "the optimizer state sharded (ZeRO-1)"
      : strategy == "optim_grads" ? "the optimizer state and the gradients sharded (ZeRO-2)"
                                  : "the optimizer state, gradients and weights sharded, each "
                                    "layer's weights gathered around its use (ZeRO-3)"));
  log_gathered(
      strprintf("[Rank %d] FSDP buffers (MB): main weights %.3f | compute weights %.3f "
                "| gradients %.3f | optimizer state %.3f | total %.3f",
                parallel_->rank(), main, compute, grads, state, main + compute + grads + state));
}

const ParamGate* Trainer::forward_gate() const {
  if (fsdp_) return fsdp_.get();
  return args_.overlap_param_gather ? dist_optimizer_.get() : nullptr;
}

void Trainer::build_schedule() {
  // The schedule counts samples, as Megatron's does: iteration-based lengths are iterations x
  // global batch; sample-based ones are given in samples.
  schedule_.max_lr = args_.lr;
  schedule_.min_lr = args_.min_lr;
  schedule_.warmup_init = args_.lr_warmup_init;
  schedule_.style = parse_lr_decay_style(args_.lr_decay_style);
  schedule_.wsd_style = parse_wsd_decay_style(args_.lr_wsd_decay_style);
  double warmup = 0;
  if (args_.train_samples > 0) {
    schedule_.decay_samples =
        args_.lr_decay_samples > 0 ? args_.lr_decay_samples : args_.train_samples;
    warmup = static_cast<double>(args_.lr_warmup_samples);
    schedule_.wsd_decay_samples = args_.lr_wsd_decay_samples;
  } else {
    const int64_t gbs = args_.global_batch_size;
    const int64_t decay_iters = args_.lr_decay_iters > 0 ? args_.lr_decay_iters : args_.train_iters;
    schedule_.decay_samples = decay_iters * gbs;
    warmup = static_cast<double>(args_.lr_warmup_iters * gbs);
    schedule_.wsd_decay_samples = args_.lr_wsd_decay_iters * gbs;
  }
  schedule_.warmup_samples =
      args_.lr_warmup_fraction >= 0
          ? args_.lr_warmup_fraction * static_cast<double>(schedule_.decay_samples)
          : warmup;
  // Megatron's decoupled parameter group: the same schedule between other bounds.
  if (is_set(args_.decoupled_lr)) {
    decoupled_schedule_ = schedule_;
    decoupled_schedule_->max_lr = args_.decoupled_lr;
    decoupled_schedule_->min_lr =
        is_set(args_.decoupled_min_lr) ? args_.decoupled_min_lr : args_.min_lr;
  }
  // --use-mup (Megatron core 0.19's get_mup_config_overrides): a parameter group whose bounds
  // are scaled by 1 / m (hidden matrices; SGD: by m, the vectors and embeddings), warming up
  // from the same --lr-warmup-init.
  if (args_.use_mup && cfg_.mup.width_mult != 1.0) {
    const double m = cfg_.mup.width_mult;
    mup_vectors_ = args_.optimizer == "sgd";
    const double scale = mup_vectors_ ? m : 1.0 / m;
    mup_scale_ = scale;
    mup_schedule_ = schedule_;
    mup_schedule_->max_lr *= scale;
    mup_schedule_->min_lr *= scale;
    if (args_.optimizer == "adam") mup_eps_scale_ = 1.0 / m;
  }
  // The weight decay grows over all training samples; the constant style is --weight-decay
  // (the CLI also sets both ends to it, as Megatron's validate_args does).
  wd_schedule_.style = parse_weight_decay_incr_style(args_.weight_decay_incr_style);
  const bool constant = wd_schedule_.style == WeightDecayIncrStyle::kConstant;
  wd_schedule_.start = constant ? args_.weight_decay : args_.start_weight_decay;
  wd_schedule_.end = constant ? args_.weight_decay : args_.end_weight_decay;
  MEGATRON_CHECK(is_set(wd_schedule_.start) && is_set(wd_schedule_.end),
                 "--weight-decay-incr-style ", args_.weight_decay_incr_style,
                 " needs --start-weight-decay and --end-weight-decay");
  wd_schedule_.incr_samples =
      args_.train_samples > 0 ? args_.train_samples : args_.train_iters * args_.global_batch_size;
}

void Trainer::restore_schedule(const nlohmann::json& saved) {
  if (saved.is_null()) return;  // a checkpoint from before the schedule was saved
  const SchedulerLoad mode = args_.override_opt_param_scheduler ? SchedulerLoad::kOverride
                             : args_.use_checkpoint_opt_param_scheduler
                                 ? SchedulerLoad::kUseCheckpoint
                                 : SchedulerLoad::kCheck;
  for (const std::string& line :
       load_scheduler_state(saved, mode, schedule_, wd_schedule_, "--load " + args_.load)) {
    log_first(line);
  }
  // The μP group: the restored schedule's rates scaled (its bounds are a ratio of the base
  // rate's, which --use-checkpoint-opt_param-scheduler may have taken from the checkpoint).
  if (mup_schedule_) {
    mup_schedule_ = schedule_;
    mup_schedule_->max_lr *= mup_scale_;
    mup_schedule_->min_lr *= mup_scale_;
  }
  // The decoupled group shares the schedule's shape, between its own rates.
  if (decoupled_schedule_) {
    const double max_lr = decoupled_schedule_->max_lr, min_lr = decoupled_schedule_->min_lr;
    decoupled_schedule_ = schedule_;
    decoupled_schedule_->max_lr = max_lr;
    decoupled_schedule_->min_lr = min_lr;
  }
}

StepRates Trainer::rates_at(int64_t samples) const {
  const double lr = schedule_.lr_at(samples);
  StepRates r{lr, decoupled_schedule_ ? decoupled_schedule_->lr_at(samples) : lr,
              wd_schedule_.wd_at(samples)};
  if (mup_schedule_) {
    const double mup_lr = mup_schedule_->lr_at(samples);
    if (mup_vectors_) {
      r.vector_lr = mup_lr;
      // SGD's embeddings and output layer are vectors' class unless --decoupled-lr sets theirs.
      if (!decoupled_schedule_) r.embedding_lr = mup_lr;
    } else {
      r.hidden_lr = mup_lr;
    }
    r.hidden_eps_scale = mup_eps_scale_;
  }
  return r;
}

void Trainer::classify_mup_params() {
  if (mup_schedule_) assign_mup_classes(params_->params(), args_.optimizer);
}

// --load, --save, the watchdog and the exit signal.
void Trainer::build_checkpointing() {
  if (!args_.load.empty()) {
    load_checkpoint();
    // Main weights sharded alone: each rank read its shards; the compute copies meet here.
    if (params_->main_sharded()) dist_optimizer_->refresh_compute();
  }
  if (!args_.save.empty()) {
    checkpointer_ = std::make_unique<Checkpointer>(parallel_, args_, checkpoint_target(), fault_);
    if (args_.log_progress && first_rank_) {
      progress_ = std::make_unique<ProgressLog>(args_.save, parallel_->world_size());
      checkpointer_->set_progress_log(progress_.get());
    }
    if (args_.non_persistent_save_interval > 0 && args_.non_persistent_ckpt_type == "global") {
      np_checkpointer_ = std::make_unique<Checkpointer>(parallel_, args_, checkpoint_target(),
                                                        fault_, Checkpointer::Kind::kNonPersistent);
    }
  }
  if (args_.save.empty() && args_.non_persistent_save_interval > 0) {
    log_first(
        "WARNING: --non-persistent-save-interval without --save: no checkpoints are saved "
        "(as Megatron)");
  }
  if (args_.save.empty() && !args_.phase_transitions.empty()) {
    log_first(
        "WARNING: --phase-transition-iterations without --save: the job exits at the next "
        "transition with nothing to resume the next phase from");
  }
  // The watchdog aborts the whole job (MPI_Abort from its thread: the main thread is stuck).
  watchdog_ =
      std::make_unique<Watchdog>(args_.distributed_timeout_minutes * 60.0, parallel_->rank(),
                                 [] { MpiRuntime::abort(kExitFailure); });
  if (args_.exit_signal_handler) {
    exit_signal_ = std::make_unique<ExitSignalHandler>(parse_exit_signal(args_.exit_signal));
  }
}

// The batch maker, the datasets (checked to hold every sample the run reads) and TensorBoard.
void Trainer::build_data() {
  const DataConfig data = data_config(args_);
  make_batch_ = spec_->batch_maker(data, *tokenizer_);
  SampleCounts need = sample_counts(args_);
  int64_t train_need = batch_schedule_->samples_in(args_.train_iters);
  if (!args_.phase_transitions.empty()) {
    // Megatron's data phases: this job's phase runs from the last transition at or before the
    // start to the next one; its training data is built for the phase's samples alone and read
    // from its first sample (the global batch is constant, checked by the CLI).
    const int64_t gbs = args_.global_batch_size;
    int64_t first = 0, next = args_.train_iters;
    for (const int64_t t : args_.phase_transitions) {
      if (t <= start_iteration_) first = t;
      if (t > start_iteration_) next = std::min(next, t);
    }
    const int64_t phase_samples = std::min(need.train, next * gbs) - first * gbs;
    phase_data_offset_ = consumed_train_ - (start_iteration_ - first) * gbs;
    need.train = phase_samples;
    train_need = (std::min(next, args_.train_iters) - first) * gbs;
    log_first(strprintf(
        " > data phase of iterations %ld to %ld: %ld training samples, read from "
        "the first",
        static_cast<long>(first), static_cast<long>(next), static_cast<long>(phase_samples)));
  }
  // Rank 0 builds (and caches) the sample indices first; the others then load them.
  if (!first_rank_) parallel_->world_group().barrier();
  data_ = spec_->build_datasets(data, *tokenizer_, cfg_.seq_length, need, first_rank_);
  if (first_rank_) parallel_->world_group().barrier();
  // Every sample the run will read must exist now, not hours in, at the last evaluation.
  MEGATRON_CHECK(data_.train->size() >= train_need, "the training data has ", data_.train->size(),
                 " samples; ",
                 args_.phase_transitions.empty()
                     ? std::to_string(args_.train_iters) + " iterations of the batch schedule"
                     : std::string("this data phase's iterations"),
                 " need ", train_need);
  if (args_.eval_iters > 0) {
    // need.valid: every evaluation's samples (sample_counts).
    MEGATRON_CHECK(args_.full_validation || !data_.valid || data_.valid->size() >= need.valid,
                   "the validation data has ", data_.valid ? data_.valid->size() : 0,
                   " samples; evaluation needs ", need.valid,
                   " (the evaluations from --start-eval-at-iter every --eval-interval, and one "
                   "after training, x --eval-iters x --eval-global-batch-size)");
    MEGATRON_CHECK(!data_.test || data_.test->size() >= need.test, "the test data has ",
                   data_.test ? data_.test->size() : 0, " samples; evaluation needs ", need.test);
  }
  // Megatron core 0.19 asserts this at the first evaluation; here before training starts.
  const size_t sets = data_.valid ? 1 + data_.more_valid.size() : 0;
  MEGATRON_CHECK(args_.validation_set_names.empty() || args_.validation_set_names.size() == sets,
                 "--validation-set-names gives ", args_.validation_set_names.size(), " names for ",
                 sets, " validation sets (one per --valid-data-path prefix)");
  // --dataloader-type cyclic: every split read in the random sampler's order, epoch after epoch
  // (Megatron wraps the validation and test loaders too).
  // --full-validation reads its sets in order, whole (Megatron's sequential sampler for them).
  if (args_.dataloader_type == "cyclic") {
    for (std::unique_ptr<SampleSource>* split : {&data_.train, &data_.valid, &data_.test}) {
      if (*split && !(split == &data_.valid && args_.full_validation)) {
        // Megatron's samplers take the evaluation's micro-batch size for validation and test.
        const int64_t mbs =
            split == &data_.train ? args_.micro_batch_size : args_.eval_micro_batch_size;
        *split =
            std::make_unique<SampledSource>(std::move(*split), mbs, dp_size_, args_.data_sharding);
      }
    }
  }

  if (!args_.tensorboard_dir.empty() && last_rank_) {  // Megatron writes from the last rank
    tensorboard_ = std::make_unique<TensorBoardWriter>(args_.tensorboard_dir);
  }
}

// The planner's prediction of this run (GPT on CPUs): this machine measured at the run's shapes
// by every rank at once (as the run will load it), the layout's step time and peak memory
// printed; put beside the measurements after the second logging interval.
void Trainer::predict_step() {
  if (spec_->name != "gpt" || device_ != Device::kCPU) return;
  // What the planner does not model: no prediction rather than a wrong one.
  if (cfg_.heterogeneous.enabled() || cfg_.moe.latent_size > 0) return;
  const ParallelState& ps = *parallel_;
  Timer timer;
  const plan::Workload workload =
      workload_from_args(args_, cfg_, *spec_, plan::ActivationRuntime::kThisProject);
  const plan::Layout layout = layout_from_args(args_, ps.world_size());
  CpuCalibration cal;
  cal.ranks = ps.world_size();
  cal.threads = num_threads();
  cal.group = &ps.world_group();
  cal.budget = 0;
  cal.min_runs = 1;
  cal.ranks_per_core = args_.ranks_per_core;
  // The run's own peak (measured above) for both dtypes: MFU's denominator is the run's dtype's.
  cal.peak_fp32_gflops = cal.peak_16bit_gflops = peak_gflops_;
  // The probe sweeps no more than the optimizer's fp32 weights and moments do every step; the
  // same size on every rank (it sizes the collective probe too): the first stage's.
  cal.probe_bytes = static_cast<int64_t>(
      std::min(32.0 * 1048576.0, 12.0 * plan::rank_params(cfg_, layout, 0).total()));
  const plan::Cluster cluster = calibrate_cpu_cluster(cal);
  prediction_ = plan::predict(workload, layout, cluster);
  // The measurements' blocks are sizes the run will not ask for: give them back.
  allocator_for(Device::kCPU).release_cached();
  log_first(prediction_line(*prediction_) +
            strprintf("; this machine measured in %.2f s", timer.elapsed()));
}

// The GEMM peak model-FLOPs utilisation is reported against: given or measured now.
void Trainer::report_gemm_peak() {
  if (cfg_.fp8.enabled()) {
    const Fp8Config& f = cfg_.fp8;
    const std::string recipe =
        f.recipe == Fp8Recipe::kDelayed
            ? strprintf("delayed scaling (amax history %ld, %s, margin %d)",
                        static_cast<long>(f.amax_history_len),
                        f.amax_compute_max ? "max" : "most_recent", f.margin)
        : f.recipe == Fp8Recipe::kTensorwise ? std::string("tensorwise (current) scaling")
        : f.recipe == Fp8Recipe::kMxfp8
            ? std::string(
                  "MXFP8 block scaling (a power-of-two E8M0 scale per 32 elements along "
                  "each GEMM's reduction dimension)")
            : std::string(
                  "blockwise scaling (power-of-two scales per 1 x 128 block of inputs "
                  "and gradients, 128 x 128 of weights)");
    log_first(strprintf(
        " > FP8 %s (%s), %s: the inputs, weights and output gradients of every transformer "
        "layer's linear-layer GEMMs%s are quantised with %s scales; %s has no FP8 GEMM, "
        "so the FP8 values feed its bf16 GEMM with f32 sums (FP8's numerics, not its speed)",
        f.mode == Fp8Mode::kHybrid ? "hybrid" : "e4m3",
        f.mode == Fp8Mode::kHybrid ? "E4M3 forward, E5M2 gradients" : "E4M3 throughout",
        recipe.c_str(), f.wgrad ? "" : " (weight gradients in high precision: --no-fp8-wgrad)",
        f.block_scaled() ? "per-block" : "per-tensor",
        device_ == Device::kCUDA ? "this GPU backend" : "the CPU"));
    if (args_.no_fp8_wgrad && f.wgrad)
      log_first(
          " > --no-fp8-wgrad applies to delayed scaling only (Megatron passes it to no other "
          "recipe): the weight gradients stay in FP8");
    if (f.param_gather && f.recipe == Fp8Recipe::kMxfp8)
      log_first(
          " > --fp8-param-gather with MXFP8: the weights are all-gathered in bf16 and quantised "
          "on each rank, as Megatron does (Transformer Engine casts no MXFP8 shards)");
    else if (f.param_gather)
      log_first(strprintf(
          " > --fp8-param-gather: those GEMMs' weights are kept as E4M3 codes (one byte each, "
          "no bf16 copy%s), quantised from the fp32 main weights after each step and all-gathered "
          "as codes",
          f.recipe == Fp8Recipe::kBlockwise ? "; a scale per 128 x 128 tile" : ""));
  }
  if (device_ == Device::kCUDA) {
    // A GPU's GEMMs peak at large sizes (a few GFLOP each).
    peak_gflops_ = args_.gemm_peak_gflops > 0
                       ? args_.gemm_peak_gflops
                       : std::max(measure_gemm_gflops(cfg_.compute_dtype, 4096, 0.2, device_),
                                  measure_gemm_gflops(cfg_.compute_dtype, 8192, 0.3, device_));
    log_first(strprintf(
        " > %s GEMM peak of %s: %.1f TFLOP/s (%s; model-FLOPs utilisation is "
        "reported against it)",
        dtype_name(cfg_.compute_dtype), device_description(device_).c_str(), peak_gflops_ / 1e3,
        args_.gemm_peak_gflops > 0 ? "given by --gemm-peak-gflops" : "measured"));
    return;
  }
  if (is_half(cfg_.compute_dtype) && !ops::native_half_gemm(cfg_.compute_dtype)) {
    log_first(
        strprintf(" > warning: this CPU has no native %s GEMM (oneDNN needs AVX-512): GEMMs "
                  "widen their %s inputs to f32 and run at f32 speed (same results)",
                  dtype_name(cfg_.compute_dtype), dtype_name(cfg_.compute_dtype)));
  }
  if (args_.gemm_peak_gflops > 0) {
    peak_gflops_ = args_.gemm_peak_gflops;
    log_first(
        strprintf(" > %s GEMM peak given by --gemm-peak-gflops: %.1f GFLOP/s (model-FLOPs "
                  "utilisation is reported against it)",
                  dtype_name(cfg_.compute_dtype), peak_gflops_));
  } else {
    // The best of two square sizes: which one peaks depends on the caches (512 on a Zen 3 with
    // 512 KB of L2 per core, 1024 on a Zen 4); one size alone understated the peak by 20-50%.
    peak_gflops_ = std::max(measure_gemm_gflops(cfg_.compute_dtype, 512, 0.2),
                            measure_gemm_gflops(cfg_.compute_dtype, 1024, 0.2));
    log_first(
        strprintf(" > measured %s GEMM peak with %d threads: %.1f GFLOP/s (model-FLOPs "
                  "utilisation is reported against it; a busy machine lowers it, fix it "
                  "with --gemm-peak-gflops)",
                  dtype_name(cfg_.compute_dtype), num_threads(), peak_gflops_));
  }
}

Trainer::~Trainer() = default;

std::vector<Action> Trainer::schedule() const {
  const int pp = parallel_->pp_size(), rank = parallel_->pp_rank();
  const int m = static_cast<int>(num_microbatches_);
  if (pp == 1) return no_pipelining_schedule(m);
  if (virtual_stages_ == 1) return one_f_one_b_schedule(pp, rank, m);
  return interleaved_schedule(pp, rank, m, virtual_stages_,
                              static_cast<int>(args_.microbatch_group_size_per_vp_stage));
}

std::vector<TensorMap> Trainer::step_batches(int64_t microbatches,
                                             const std::function<TensorMap(int64_t)>& read,
                                             bool evaluation) {
  // The TP ranks that receive allocate the fields at the step's micro-batch size.
  const std::vector<TensorSpec>& specs = evaluation ? eval_batch_specs_ : batch_specs_;
  std::vector<TensorMap> batches(static_cast<size_t>(microbatches));
  if (!needs_data_) return batches;
  // TP rank 0 reads; the others receive every field this stage reads, in the specs' order.
  ProcessGroup& tp = parallel_->tp_group();
  const ContextParallelContext& cp = cp_;
  for (int64_t mb = 0; mb < microbatches; ++mb) {
    TensorMap& m = batches[mb];
    const TensorMap all = tp.rank() == 0 ? read(mb) : TensorMap();
    for (const TensorSpec& spec : specs) {
      Tensor t = tp.rank() == 0 ? all.at(spec.name) : Tensor::empty(spec.shape, spec.dtype);
      if (tp.size() > 1) tp.broadcast(t, 0);
      // Under context parallelism each rank keeps its chunks of every [b, s] field (Megatron's
      // get_batch_on_this_cp_rank).
      Tensor local = cp.enabled() ? cp_local_columns(t, cp) : t;
      // Batches are read and broadcast on the host, then used where the model computes.
      m.set(spec.name, on_device(local, device_));
    }
  }
  return batches;
}

void Trainer::finish_gradients() {
  const ParallelState& ps = *parallel_;
  // Average the replicas' gradients (each is the gradient of its share of the global-batch
  // objective, scaled for its own micro-batches): the buckets not yet reduced during backward.
  // (Megatron-FSDP's sharded strategies reduced every micro-batch already; this completes them.)
  if (fsdp_) {
    fsdp_->finish();
  } else {
    grad_buckets_->finish();
  }
  if (params_->grads_sharded()) {
    finish_sharded_gradients();
    return;
  }
  // Replicated parameters that saw only this rank's s/tp positions, summed over TP in one
  // all-reduce of their concatenation (Megatron's _allreduce_layernorm_grads coalesces too).
  if (!sp_params_.empty()) {
    int64_t n = 0;
    for (const Param* p : sp_params_) n += p->main_grad.numel();
    Tensor flat = Tensor::empty({n}, DType::kF32);
    int64_t at = 0;
    for (const Param* p : sp_params_) {
      flat.flat_view(at, p->main_grad.shape()).copy_from(p->main_grad);
      at += p->main_grad.numel();
    }
    ps.tp_group().all_reduce(flat);
    at = 0;
    for (Param* p : sp_params_) {
      p->main_grad.copy_from(flat.flat_view(at, p->main_grad.shape()));
      at += p->main_grad.numel();
    }
  }
  // The tied embeddings' two pipeline copies (Megatron's _allreduce_embedding_grads).
  if (shared_embedding_) ps.embedding_group().all_reduce(shared_embedding_->main_grad);
}

void Trainer::finish_sharded_gradients() {
  // The same sums on this rank's shards: every TP rank (and both embedding copies, which sit in
  // equally padded buckets of their own) shards its buckets alike, so a shard's elements are
  // the same elements of the same parameters on each member of those groups.
  const ParallelState& ps = *parallel_;
  if (!sp_params_.empty()) {
    std::vector<Tensor> pieces;
    for (const auto& seg : dist_optimizer_->owned_segments()) {
      if (!seg.param->sequence_parallel) continue;
      pieces.push_back(params_->grads().flat_view(seg.state, {seg.numel}));
    }
    int64_t n = 0;
    for (const Tensor& t : pieces) n += t.numel();
    Tensor flat = Tensor::empty({n}, DType::kF32);
    int64_t at = 0;
    for (const Tensor& t : pieces) {
      flat.flat_view(at, t.shape()).copy_from(t);
      at += t.numel();
    }
    ps.tp_group().all_reduce(flat);
    at = 0;
    for (Tensor& t : pieces) {
      t.copy_from(flat.flat_view(at, t.shape()));
      at += t.numel();
    }
  }
  if (shared_embedding_) {
    Tensor shard = params_->grad_shard(params_->bucket_of(*shared_embedding_));
    ps.embedding_group().all_reduce(shard);
  }
}

void Trainer::divide_by_global_tokens(const LossTerms& terms) {
  // The last stage knows the global batch's tokens (its terms are reduced over dp x cp); every
  // stage of its pipeline takes the count from it (Megatron's finalize_model_grads).
  const ParallelState& ps = *parallel_;
  Tensor tokens = Tensor::empty({1}, DType::kF64);
  tokens.data<double>()[0] = has_loss_ && !terms.empty() ? terms.terms().front().count : 0.0;
  if (ps.pp_size() > 1) ps.pp_group().broadcast(tokens, ps.pp_size() - 1);
  const double n = tokens.data<double>()[0];
  if (n <= 0) return;  // nothing to divide by, as Megatron: the gradients stay sums (zero)
  if (dist_optimizer_) {
    dist_optimizer_->scale_grads(1.0 / n);
  } else {
    ops::scale_inplace(params_->grads(), 1.0 / n);
  }
}

CheckpointTarget Trainer::checkpoint_target() const {
  // Expert-parallel Params are written by expert-data-parallel rank 0 when experts are apart.
  std::vector<Param*> extra;
  for (const auto& chunk : chunks_)
    for (Param* p : chunk->extra_state()) extra.push_back(p);
  const ProcessGroup* inter = parallel_->inter_instance_group();
  const ProcessGroup* inter_e = parallel_->inter_instance_expert_group();
  return CheckpointTarget{
      params_.get(),
      optimizer_.get(),
      dist_optimizer_.get(),
      grad_rank_,
      parallel_->experts_apart() ? parallel_->edp_rank() : grad_rank_,
      std::move(extra),
      inter ? inter->rank() : 0,
      parallel_->experts_apart() && inter_e ? inter_e->rank() : (inter ? inter->rank() : 0)};
}

ExpertParallelContext Trainer::expert_parallel() const {
  const ParallelState& ps = *parallel_;
  return ExpertParallelContext{.tp_ep = &ps.tp_ep_group(),
                               .etp = &ps.etp_group(),
                               .ep = &ps.ep_group(),
                               .ep_rank = ps.ep_rank(),
                               .ep_size = ps.ep_size()};
}

void Trainer::add_moe_terms(LossTerms* terms) {
  if (!moe_tracker_) return;
  // Megatron's track_moe_metrics: each layer's value summed over the step's micro-batches (the
  // tracker), over the pipeline (each stage holds its layers), over TP x CP (each rank's value is
  // its share of the micro-batch), averaged over DP; then per name the mean over the MoE layers
  // and micro-batches. Names in a fixed order on every rank, so the collectives pair up.
  const ParallelState& ps = *parallel_;
  // The mean's divisor is Megatron's counter (_count_moe_layers), so that the logged numbers
  // compare: the decoder's MoE layers (a hybrid model's E layers, its MTP pattern's counted once
  // per depth) plus mtp_num_layers whatever the MTP layers are.
  const int64_t L = cfg_.layer_slots(), D = cfg_.mtp_num_layers;
  int64_t moe_layers = D;
  for (int64_t l = 0; l < cfg_.num_layers; ++l) moe_layers += cfg_.is_moe_layer(l) ? 1 : 0;
  const std::string& mtp = cfg_.mamba.mtp_layers;
  moe_layers += D * static_cast<int64_t>(std::count(mtp.begin(), mtp.end(), 'E'));
  std::vector<std::string> names;
  for (MoeLoadBalancing t : {MoeLoadBalancing::kAuxLoss, MoeLoadBalancing::kSeqAuxLoss})
    if (cfg_.moe.coeff_of(t) > 0)
      names.push_back(t == MoeLoadBalancing::kAuxLoss ? "load_balancing_loss"
                                                      : "seq_load_balancing_loss");
  if (cfg_.moe.z_loss_coeff > 0) names.push_back("z_loss");
  if (names.empty()) return;
  const auto n = static_cast<int64_t>(names.size());
  Tensor v = Tensor::zeros({n * L}, DType::kF64);
  for (int64_t i = 0; i < n; ++i) {
    auto it = moe_tracker_->values().find(names[i]);
    if (it != moe_tracker_->values().end())
      std::copy(it->second.begin(), it->second.end(), v.data<double>() + i * L);
  }
  moe_tracker_->clear();
  if (ps.pp_size() > 1) ps.pp_group().all_reduce(v);
  if (ps.tp_size() > 1) ps.tp_group().all_reduce(v);
  ps.dp_cp_group().all_reduce(v);  // sums over CP, and over DP (divided below)
  moe_per_layer_.clear();
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0;
    std::vector<std::pair<int64_t, double>> layers;
    for (int64_t l = 0; l < L; ++l) {
      const double x = v.data<double>()[i * L + l] / static_cast<double>(dp_size_) /
                       static_cast<double>(num_microbatches_);
      sum += x;
      if (cfg_.is_moe_layer(l)) layers.emplace_back(l, x);
    }
    if (has_loss_) terms->add(names[i], sum / static_cast<double>(moe_layers), 1.0);
    moe_per_layer_.emplace_back(names[i], std::move(layers));
  }
}

void Trainer::moe_step_end(LossTerms* terms) {
  if (!cfg_.moe.enabled()) return;
  const bool bias = cfg_.moe.enable_expert_bias, load = args_.log_expert_load;
  std::vector<TopKRouter*> routers;
  for (auto& c : chunks_)
    for (TopKRouter* r : c->moe_routers()) routers.push_back(r);
  if (bias || load) {
    // Once per global batch: every router's counts summed over TP x DP x CP (the tokens of the
    // whole batch; Megatron's _update_router_expert_bias), and over the pipeline for the log:
    // one [L, E] all-reduce, each stage filling its layers' rows.
    const int64_t E = cfg_.moe.num_experts, L = cfg_.layer_slots();
    Tensor counts = Tensor::zeros({L * E}, DType::kF64);
    for (TopKRouter* r : routers)
      std::copy(r->tokens_per_expert().begin(), r->tokens_per_expert().end(),
                counts.data<double>() + r->layer_number() * E);
    const ParallelState& ps = *parallel_;
    if (ps.tp_size() > 1) ps.tp_group().all_reduce(counts);
    ps.dp_cp_group().all_reduce(counts);
    if (load && ps.pp_size() > 1) ps.pp_group().all_reduce(counts);
    for (TopKRouter* r : routers) {
      const double* c = counts.data<double>() + r->layer_number() * E;
      r->update_expert_bias(std::vector<double>(c, c + E));
    }
    if (load && has_loss_) {
      // --log-expert-load: per MoE layer the busiest expert's tokens over the mean, averaged
      // over the layers (1: perfectly balanced; E / k: every token on the same k experts).
      double sum = 0;
      int64_t layers = 0;
      for (int64_t l = 0; l < L; ++l) {
        if (!cfg_.is_moe_layer(l)) continue;
        const double* c = counts.data<double>() + l * E;
        double mx = 0, mean = 0;
        for (int64_t e = 0; e < E; ++e) {
          mx = std::max(mx, c[e]);
          mean += c[e] / static_cast<double>(E);
        }
        sum += mean > 0 ? mx / mean : 0.0;
        ++layers;
      }
      terms->add("expert load max/mean", sum / static_cast<double>(std::max<int64_t>(layers, 1)),
                 1.0);
    }
  }
  for (TopKRouter* r : routers) r->clear_tokens_per_expert();
}

void Trainer::reduce_loss_stats(LossTerms* terms) {
  if (grad_size_ == 1 || !has_loss_) return;
  // Every data- and context-parallel replica of the last stage has the same terms in the same
  // order (a CP rank's are those of its part of each sequence).
  const std::vector<LossTerms::Term>& t = terms->terms();
  const auto n = static_cast<int64_t>(t.size());
  Tensor stats = Tensor::empty({2 * n}, DType::kF64);
  for (int64_t i = 0; i < n; ++i) {
    stats.data<double>()[2 * i] = t[i].sum;
    stats.data<double>()[2 * i + 1] = t[i].count;
  }
  parallel_->dp_cp_group().all_reduce(stats);
  LossTerms reduced;
  for (int64_t i = 0; i < n; ++i) {
    reduced.add(t[i].name, stats.data<double>()[2 * i], stats.data<double>()[2 * i + 1]);
  }
  *terms = reduced;
}

void Trainer::complete_param_gather() const {
  if (dist_optimizer_) dist_optimizer_->finish_param_gather();
}

double Trainer::params_norm() const {
  complete_param_gather();
  if (params_->main_sharded()) {
    // Each rank holds its shards of the main weights only: summed over DP like the gradients.
    return std::sqrt(sum_over_model(
        [&](ParamDomain d) { return dist_optimizer_->main_sum_squares_unique(d); }, true));
  }
  // Every rank holds whole main weights: no data-parallel sum (sharded = false).
  return std::sqrt(
      sum_over_model([&](ParamDomain d) { return params_sum_squares_unique(*params_, d); }, false));
}

double Trainer::sum_over_model(const std::function<double(ParamDomain)>& part, bool sharded) const {
  const ParallelState& ps = *parallel_;
  sharded = sharded && dist_optimizer_ != nullptr;
  const bool apart = ps.experts_apart();
  Tensor d = Tensor::full({1}, part(apart ? ParamDomain::kDense : ParamDomain::kAll), DType::kF64);
  // Each optimizer instance holds every shard once: the sum over this rank's instance.
  if (sharded) ps.intra_instance_group().all_reduce(d);
  ps.model_parallel_group().all_reduce(d);
  if (!apart) return d.data<double>()[0];
  Tensor e = Tensor::full({1}, part(ParamDomain::kExpert), DType::kF64);
  if (sharded) ps.intra_instance_expert_group().all_reduce(e);
  ps.expert_model_parallel_group().all_reduce(e);
  return d.data<double>()[0] + e.data<double>()[0];
}

double Trainer::comm_seconds() const {
  const ParallelState& ps = *parallel_;
  double s = ps.world_group().busy_seconds() + ps.tp_group().busy_seconds() +
             ps.pp_group().busy_seconds() + ps.dp_group().busy_seconds() +
             ps.dp_cp_group().busy_seconds() + ps.model_parallel_group().busy_seconds();
  if (ps.in_embedding_group()) s += ps.embedding_group().busy_seconds();
  if (const ProcessGroup* inter = ps.inter_instance_group()) {  // its own groups
    s += ps.intra_instance_group().busy_seconds() + inter->busy_seconds();
  }
  return s + cp_busy_seconds() + expert_busy_seconds();
}

double Trainer::expert_busy_seconds() const {
  const ParallelState& ps = *parallel_;
  if (!ps.experts_apart()) return 0.0;  // the expert groups are the dense ones (counted there)
  double s = ps.ep_group().busy_seconds() + ps.etp_group().busy_seconds() +
             ps.tp_ep_group().busy_seconds() + ps.edp_group().busy_seconds() +
             ps.expert_model_parallel_group().busy_seconds();
  if (const ProcessGroup* inter = ps.inter_instance_expert_group())  // their own groups
    s += ps.intra_instance_expert_group().busy_seconds() + inter->busy_seconds();
  return s;
}

double Trainer::cp_busy_seconds() const {
  double s = parallel_->cp_group().busy_seconds();
  if (cp_inner_) s += cp_inner_->busy_seconds();  // a2a+p2p's own groups
  if (cp_outer_) s += cp_outer_->busy_seconds();
  return s;
}

std::array<double, kOpCategories> Trainer::op_times() {
  if (args_.timing_log_level >= 2) {
    step_op_start_.clear();
    for (const auto& [op, seconds] : op_seconds_by_op()) step_op_start_[op] = seconds;
    step_gemm_start_.clear();
    for (const auto& [shape, t] : gemm_times_by_shape()) step_gemm_start_[shape] = t;
  }
  std::array<double, kOpCategories> t{};
  for (int c = 0; c < kOpCategories; ++c) t[c] = op_seconds(static_cast<OpCategory>(c));
  return t;
}

void Trainer::add_op_times(const std::array<double, kOpCategories>& before) {
  if (args_.timing_log_level < 2) return;
  // The whole step's time inside each kind of kernel (forward, backward and optimizer together).
  for (int c = 0; c < kOpCategories; ++c) {
    const auto cat = static_cast<OpCategory>(c);
    // Only hybrid Mamba models have state-space kernels (every rank knows the config).
    if (cat == OpCategory::kStateSpace && !cfg_.mamba.has_mamba()) continue;
    timers_.add(std::string("kernels: ") + op_category_name(cat), op_seconds(cat) - before[c]);
  }
  // The run's first step builds the GEMM primitives and warms the caches: left out.
  if (!first_step_profiled_) {
    first_step_profiled_ = true;
    return;
  }
  for (const auto& [op, seconds] : op_seconds_by_op()) {
    const auto it = step_op_start_.find(op);
    step_op_seconds_[op] += seconds - (it == step_op_start_.end() ? 0.0 : it->second);
  }
  for (const auto& [shape, t] : gemm_times_by_shape()) {
    const auto it = step_gemm_start_.find(shape);
    const ShapeTime start = it == step_gemm_start_.end() ? ShapeTime{} : it->second;
    ShapeTime& sum = step_gemm_times_[shape];
    sum.seconds += t.seconds - start.seconds;
    sum.calls += t.calls - start.calls;
    sum.flops += t.flops - start.flops;
  }
  ++profiled_steps_;
}

void Trainer::report_op_times() const {
  if (args_.timing_log_level < 2 || profiled_steps_ == 0) return;
  std::vector<std::pair<std::string, double>> ops(step_op_seconds_.begin(), step_op_seconds_.end());
  std::sort(ops.begin(), ops.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string text =
      strprintf("time by op on rank 0, ms per training step (mean of the %ld after the first):",
                static_cast<long>(profiled_steps_));
  for (const auto& [op, seconds] : ops) {
    const double ms = 1e3 * seconds / static_cast<double>(profiled_steps_);
    if (ms < 0.005) continue;
    std::string name = "    " + op + " ";
    if (name.size() < 52) name += std::string(52 - name.size(), '.');
    text += strprintf("\n%s: %.2f", name.c_str(), ms);
  }
  // The GEMMs by shape (m x n x k of op(A) op(B), A and B transposed or not, input dtype; "+="
  // accumulates into the output, as weight gradients do): where the GEMM time goes, and each
  // shape's rate in the step, to set beside `megatron bench gemm --shapes`.
  std::vector<std::pair<std::string, ShapeTime>> gemms(step_gemm_times_.begin(),
                                                       step_gemm_times_.end());
  std::sort(gemms.begin(), gemms.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  if (!gemms.empty()) text += "\nGEMMs by shape, ms per training step (calls per step, GFLOP/s):";
  const auto steps = static_cast<double>(profiled_steps_);
  for (const auto& [shape, t] : gemms) {
    if (1e3 * t.seconds / steps < 0.005) continue;
    std::string name = "    " + shape + " ";
    if (name.size() < 52) name += std::string(52 - name.size(), '.');
    text += strprintf("\n%s: %.2f (%g, %.1f)", name.c_str(), 1e3 * t.seconds / steps,
                      static_cast<double>(t.calls) / steps,
                      t.seconds > 0 ? t.flops / t.seconds * 1e-9 : 0.0);
  }
  log_first(text);
}

Trainer::StepResult Trainer::train_step(int64_t iteration, const BatchSchedule::Batch& batch,
                                        const StepRates& rates) {
  StepResult r;
  const double comm0 = comm_seconds();
  const double cp0 = cp_busy_seconds();
  const double expert0 = expert_busy_seconds();
  const std::array<double, kOpCategories> ops0 = op_times();
  Timer phase;
  // 1-bit Adam's compressed stage: each rank keeps its own gradients.
  const bool compressed_step = onebit_ && onebit_->compressing();
  if (onebit_) grad_buckets_->set_reduce(!compressed_step);
  const int64_t dp_bytes0 = parallel_->dp_cp_group().bytes_sent();
  std::vector<TensorMap> batches =
      step_batches(num_microbatches_, [&](int64_t) { return prefetcher_->next(); });
  timers_.add("batch-generator", phase.elapsed());
  phase = Timer();
  // What a pass of forward and backward changes besides the gradients, for a re-run to start
  // from as this one did: the FP8 delayed-scaling state (amax histories and scales). The batches
  // are kept; dropout masks and every other draw are functions of the iteration.
  std::vector<std::pair<Param*, Tensor>> fp8_state;
  if (cfg_.fp8.enabled() && rerun_->mode() != RerunMode::kDisabled) {
    for (auto& c : chunks_)
      for (Param* p : c->extra_state()) fp8_state.emplace_back(p, p->main.clone());
  }
  // The stream is a micro-batch's place in the sample order counted from the end of this
  // iteration's batch (the sampler gives rank r micro-batch mb * dp + r of it): any layout with
  // the same micro-batch size draws the same dropout masks, and batches of a ramp-up never share
  // a stream. With a constant batch it is (iteration x micro-batches + mb) x dp + r.
  const int64_t stream0 = (consumed_train_ + batch.running) / args_.micro_batch_size;
  // --overlap-param-gather: each layer waits for the last step's gather of its weights.
  const ParamGate* gate = forward_gate();
  const double gather_wait0 = param_gather_wait_seconds();
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  auto mode = [&](int mb) {
    ForwardMode m{true, dropout_seed_, static_cast<uint64_t>(stream0 + mb * dp_size_ + dp_rank_),
                  gate};
    m.first_micro_batch = mb == 0;
    // MoE load-balancing losses join the objective as the main loss does (MicroBatchRunner).
    m.aux_loss_scale = args_.calculate_per_token_loss
                           ? loss_scale
                           : loss_scale / static_cast<double>(num_microbatches_);
    m.aux_per_token = args_.calculate_per_token_loss;
    m.moe_tracker = moe_tracker_.get();
    return m;
  };
  // Megatron's rerun loop: one pass, and another when a validation rejected a result.
  bool rerun = false;
  while (rerun_->should_run_forward_backward(iteration)) {
    if (rerun) {
      for (auto& [p, saved] : fp8_state) p->main.copy_from(saved);
      if (moe_tracker_) moe_tracker_->clear();
      for (auto& c : chunks_)
        for (TopKRouter* router : c->moe_routers()) router->clear_tokens_per_expert();
    }
    rerun = true;
    params_->zero_grads();
    grad_buckets_->reset();
    // Before backward, so that it accumulates onto the inf (inf + x = inf) and the bucket
    // holding it is launched with it even when reductions overlap backward.
    if (fault_.inf_grad_at(parallel_->rank(), iteration)) {
      // Sharded gradients: into this rank's shard, which the reductions add to. (The first
      // registered parameter may be frozen, without a gradient: a trained one's.)
      Tensor g = params_->grads();
      if (!params_->grads_sharded()) {
        for (const Param* p : params_->params())
          if (p->requires_grad) {
            g = p->main_grad;
            p->main_grad_zero = false;  // its first GEMM must add to the inf, not overwrite it
            break;
          }
      }
      g.flat_view(0, {1}).fill(std::numeric_limits<float>::infinity());
    }
    MicroBatchRunner runner(chunks_, *loss_, args_.micro_batch_size, batches, mode,
                            /*training=*/true, grad_buckets_.get(), loss_scale);
    runner.set_per_token_loss(args_.calculate_per_token_loss);
    runner.set_report_microbatch_means(args_.sft);
    runner.set_fsdp(fsdp_.get());
    runner.set_loss_check([this](double sum) { validate_loss(sum); });
    executor_->run(schedule(), runner);
    timers_.add("forward-backward", phase.elapsed());

    phase = Timer();
    finish_gradients();
    timers_.add("all-grads-sync", phase.elapsed());
    phase = Timer();
    r.terms = runner.losses();
  }
  r.rerun = rerun_->should_checkpoint_and_exit();
  if (r.rerun.exit) {
    // Nothing is updated: the checkpoint holds the last iteration, FP8 scaling state included.
    for (auto& [p, saved] : fp8_state) p->main.copy_from(saved);
    timers_.add("communication (all groups)", comm_seconds() - comm0);
    return r;
  }
  reduce_loss_stats(&r.terms);
  r.loss = r.terms.empty() ? 0.0 : r.terms.terms().front().value();
  add_moe_terms(&r.terms);
  moe_step_end(&r.terms);
  // qk-clip's factors from this step's forwards; applied to the weights the step leaves.
  std::vector<RowScale> clip_rows;
  if (qk_clipper_) {
    QkClipper::Step q =
        qk_clipper_->finish(parallel_->dp_cp_group(), parallel_->model_parallel_group());
    r.max_logit = q.max_logit;
    clip_rows = std::move(q.scales);
  }
  if (args_.calculate_per_token_loss) divide_by_global_tokens(r.terms);
  if (scaler_) {
    // Megatron's fp16 step: unscale the fp32 main gradients, look for inf/NaN anywhere in the
    // model (one flag, all-reduced over every rank so all of them take the same decision), update
    // the scale, and skip the whole update if anything overflowed.
    // With the distributed optimizer only this rank's shards are reduced: it checks those, and
    // the all-reduce over every rank covers the whole model.
    Tensor found = Tensor::empty({1}, DType::kF64);
    if (dist_optimizer_) {
      dist_optimizer_->scale_grads(1.0 / loss_scale);
      found.data<double>()[0] = dist_optimizer_->grads_finite() ? 0.0 : 1.0;
    } else {
      ops::scale_inplace(params_->grads(), 1.0 / loss_scale);
      found.data<double>()[0] = std::isfinite(ops::sum_squares(params_->grads())) ? 0.0 : 1.0;
    }
    parallel_->world_group().all_reduce(found, ReduceOp::kMax);
    const bool found_inf = found.data<double>()[0] > 0;
    scaler_->update(found_inf);
    if (found_inf) {
      // No update, but Megatron's clip_qk still runs after the optimizer's (skipped) step.
      if (!dist_optimizer_) {
        scale_main_rows(*params_, clip_rows);
      } else if (args_.qk_clip) {
        dist_optimizer_->scale_main_rows(clip_rows);  // collective on every rank
      }
      r.skipped = true;
      r.grad_norm = std::numeric_limits<double>::quiet_NaN();
      timers_.add("optimizer", phase.elapsed());
      timers_.add("communication (all groups)", comm_seconds() - comm0);
      add_cp_time(cp0);
      add_expert_time(expert0);
      add_gather_time(gather_wait0);
      add_op_times(ops0);
      return r;
    }
  }
  if (nan_checks_ && has_loss_ && !scaler_) {
    // A diverged run is a runtime failure (exit 1), not bad input.
    if (!std::isfinite(r.loss)) {
      throw std::runtime_error(strprintf(
          "found NaN or Inf in the loss at iteration %ld (loss = %g); lower --lr, or pass "
          "--no-check-for-nan-in-loss-and-grad",
          static_cast<long>(iteration), r.loss));
    }
  }
  // Each element once over the model-parallel group (replicas of a TP-replicated parameter and
  // the last stage's copy of the tied embeddings are left out); with the distributed optimizer
  // each data-parallel rank holds only its shards, so their sums are added over DP first.
  // Experts split over EP ranks are summed over their own groups (sum_over_model).
  // --mtp-detach-heads: the MTP parameters are a norm group of their own (Megatron's
  // grad_norm_group 'mtp'): left out of the logged norm, clipped by their own below.
  const bool separate = cfg_.mtp_detach_heads && cfg_.mtp_num_layers > 0;
  auto grad_squares_of = [&](NormGroup g) {
    return [&, g](ParamDomain d) {
      return dist_optimizer_ ? dist_optimizer_->grad_sum_squares_unique(d, g)
                             : grad_sum_squares_unique(*params_, d, g);
    };
  };
  r.grad_norm =
      std::sqrt(sum_over_model(grad_squares_of(separate ? NormGroup::kMain : NormGroup::kAll)));
  if (nan_checks_) {
    if (!std::isfinite(r.grad_norm)) {
      throw std::runtime_error(
          strprintf("found NaN or Inf in the gradient norm at iteration %ld; lower --lr, or pass "
                    "--no-check-for-nan-in-loss-and-grad",
                    static_cast<long>(iteration)));
    }
  }
  if (args_.log_num_zeros_in_grad) {
    // Counted as the norm is: each element once over the model-parallel group (the distributed
    // optimizer's shards summed over DP first). Clipping scales, it keeps zeros zero.
    // (Counts below 2^53 add exactly in double.)
    auto zeros = [&](ParamDomain d) {
      return static_cast<double>(dist_optimizer_ ? dist_optimizer_->grad_zeros_unique(d)
                                                 : grad_zeros_unique(*params_, d));
    };
    r.num_zeros = static_cast<int64_t>(sum_over_model(zeros));
  }
  // Clipping rides along with the update (one pass over the gradients instead of two).
  const double clip = clip_coefficient(args_.clip_grad, r.grad_norm);
  StepRates step_rates = rates;
  if (separate && args_.clip_grad > 0) {
    // The separate group's own factor, which the step applies to its parameters instead.
    const double norm = std::sqrt(sum_over_model(grad_squares_of(NormGroup::kSeparate)));
    if (nan_checks_ && !std::isfinite(norm)) {
      throw std::runtime_error(strprintf(
          "found NaN or Inf in the multi-token prediction layers' gradient norm at iteration "
          "%ld; lower --lr, or pass --no-check-for-nan-in-loss-and-grad",
          static_cast<long>(iteration)));
    }
    step_rates.separate_grad_scale = clip_coefficient(args_.clip_grad, norm);
  }
  if (dist_optimizer_) {
    dist_optimizer_->step(step_rates, clip, clip_rows);
  } else {
    optimizer_->step(step_rates, clip);
    scale_main_rows(*params_, clip_rows);
  }
  if (onebit_) report_onebit_traffic(iteration, compressed_step, dp_bytes0);
  timers_.add("optimizer", phase.elapsed());
  timers_.add("communication (all groups)", comm_seconds() - comm0);
  add_cp_time(cp0);
  add_expert_time(expert0);
  add_gather_time(gather_wait0);
  add_op_times(ops0);
  return r;
}

void Trainer::report_onebit_traffic(int64_t iteration, bool compressed, int64_t dp_bytes0) {
  const int64_t bytes = parallel_->dp_cp_group().bytes_sent() - dp_bytes0;
  if (!compressed) {
    onebit_last_full_bytes_ = bytes;
    if (onebit_->compressing()) {
      log_first(
          strprintf(" > 1-bit Adam: the variance froze at iteration %ld; from the next "
                    "step the momentum is exchanged compressed",
                    static_cast<long>(iteration)));
    }
  } else if (!onebit_reported_) {
    onebit_reported_ = true;
    if (onebit_last_full_bytes_ > 0) {
      log_first(strprintf(
          " > 1-bit Adam: data-parallel bytes sent by rank 0 per step: %ld with the gradient "
          "all-reduce, %ld compressed (%.4f of it)",
          static_cast<long>(onebit_last_full_bytes_), static_cast<long>(bytes),
          static_cast<double>(bytes) / static_cast<double>(onebit_last_full_bytes_)));
    } else {
      log_first(
          strprintf(" > 1-bit Adam: resumed in the compressed stage (the loaded step is "
                    "past --onebit-freeze-step; the compression errors restart from 0): "
                    "%ld data-parallel bytes sent by rank 0 per step",
                    static_cast<long>(bytes)));
    }
  }
}

double Trainer::param_gather_wait_seconds() const {
  return (dist_optimizer_ ? dist_optimizer_->param_gather_wait_seconds() : 0.0) +
         (fsdp_ ? fsdp_->gather_wait_seconds() : 0.0);
}

void Trainer::add_gather_time(double wait0) {
  // The distributed optimizer's weight all-gather: within the optimizer phase without
  // --overlap-param-gather (all of it), within forward-backward with it (what was not hidden);
  // Megatron-FSDP's per-unit gathers of sharded weights: what the prefetch did not hide.
  if (dist_optimizer_)
    timers_.add("params-all-gather (exposed)", param_gather_wait_seconds() - wait0);
}

void Trainer::add_cp_time(double cp0) {
  // Time this rank waited on context-parallel transfers (blocking collectives whole; the ring's
  // transfers only where compute did not hide them).
  if (parallel_->cp_size() > 1) {
    timers_.add("context-parallel communication (exposed)", cp_busy_seconds() - cp0);
  }
}

void Trainer::add_expert_time(double expert0) {
  // MoE layers' token exchange (all-to-all over EP, gathers over ETP) and the expert gradients'
  // reduction over expert-data-parallel, when experts are split apart from the dense layers.
  if (parallel_->experts_apart()) {
    timers_.add("expert-parallel communication", expert_busy_seconds() - expert0);
  }
}

LossTerms Trainer::evaluate(const SampleSource& data, int64_t* consumed) {
  complete_param_gather();
  LossTerms terms;
  // Megatron evaluates whole --eval-global-batch-size batches (--global-batch-size by default),
  // ramp-up or not, in micro-batches of --eval-micro-batch-size.
  const int64_t mbs = args_.eval_micro_batch_size, m = eval_microbatches_;
  const bool whole = consumed == nullptr;  // --full-validation
  const WrappedSource wrapped(data);
  const int64_t steps =
      whole ? full_validation_steps(data.size(), m * dp_size_ * mbs) : args_.eval_iters;
  for (int64_t it = 0; it < steps; ++it) {
    // Progress per evaluation iteration, so that a limit meant for one step (as
    // --distributed-timeout-seconds-after-init is) holds for an evaluation of many.
    if (watchdog_) watchdog_->enter("evaluation", eval_iteration_);
    // Megatron's sampler: micro-step it * m + mb of the evaluation, this rank's share of it.
    std::vector<TensorMap> batches = step_batches(
        m,
        [&](int64_t mb) {
          const int64_t first = ((it * m + mb) * dp_size_ + dp_rank_) * mbs;
          if (!whole) return make_batch_(data, *consumed + first, mbs);
          // The last step's positions past the end re-read the start, their loss masked.
          TensorMap batch = make_batch_(wrapped, first, mbs);
          if (first + mbs > data.size())
            mask_rows_from(batch, std::max<int64_t>(data.size() - first, 0));
          return batch;
        },
        /*evaluation=*/true);
    const ParamGate* gate = fsdp_ ? fsdp_.get() : nullptr;  // sharded weights are gathered
    MicroBatchRunner runner(
        chunks_, *loss_, mbs, std::move(batches),
        [gate](int) {
          ForwardMode mode;
          mode.gate = gate;
          return mode;
        },
        /*training=*/false);
    runner.set_report_microbatch_means(args_.sft);
    executor_->run_forward_only(static_cast<int>(m), runner);
    terms.add(runner.losses());
  }
  if (!whole) *consumed += args_.eval_iters * args_.eval_global_batch_size;
  reduce_loss_stats(&terms);
  return terms;
}

void Trainer::validate(const std::string& prefix, int64_t iteration) {
  if (!data_.valid || (args_.eval_iters == 0 && !args_.full_validation)) return;
  eval_iteration_ = iteration;
  watchdog_->enter("evaluation", iteration);
  if (!args_.full_validation) {
    evaluate_and_print(prefix, "", *data_.valid, &consumed_valid_, iteration);
    return;
  }
  std::vector<const SampleSource*> sets = {data_.valid.get()};
  for (const auto& more : data_.more_valid) sets.push_back(more.get());
  for (size_t i = 0; i < sets.size(); ++i) {
    // Megatron core 0.19's --validation-set-names, else the set's index.
    const std::string set = !args_.multiple_validation_sets ? ""
                            : args_.validation_set_names.empty()
                                ? "-" + std::to_string(i)
                                : "-" + args_.validation_set_names[i];
    evaluate_and_print(prefix, set, *sets[i], nullptr, iteration);
  }
}

void Trainer::evaluate_and_print(const std::string& prefix, const std::string& set,
                                 const SampleSource& data, int64_t* consumed, int64_t iteration) {
  const LossTerms terms = evaluate(data, consumed);
  std::vector<std::pair<std::string, double>> values;
  for (const LossTerms::Term& t : terms.terms()) values.emplace_back(t.name, t.value());
  if (!values.empty()) eval_losses_.push_back(values.front().second);
  // As Megatron's evaluate_and_print_results: every term's value and perplexity.
  std::string line = " validation" + set + " loss at " + prefix + " | ";
  for (const auto& [name, value] : relay_to_first_rank(values)) {
    // A loss has a perplexity; a rate (a classifier's accuracy) does not.
    const bool loss = name.size() >= 4 && name.compare(name.size() - 4, 4, "loss") == 0;
    line += loss ? strprintf("%s value: %.6E | %s PPL: %.6E | ", name.c_str(), value, name.c_str(),
                             std::exp(std::min(20.0, value)))
                 : strprintf("%s value: %.6E | ", name.c_str(), value);
  }
  const std::string dashes(line.size() + 1, '-');
  log_first(dashes + "\n" + line + "\n" + dashes);
  // Megatron writes no evaluation of a --skip-train run to TensorBoard; the perplexity only
  // with --log-validation-ppl-to-tensorboard.
  if (tensorboard_ && !args_.skip_train) {
    for (const auto& [name, value] : values) {
      const double ppl = std::exp(std::min(20.0, value));
      const std::string tag = name + " validation" + set;
      TrainingLog::Values by_iter{{tag, value}};
      TrainingLog::Values by_samples{{tag + " vs samples", value}};
      if (args_.log_validation_ppl_to_tensorboard) {
        by_iter.emplace_back(tag + " ppl", ppl);
        by_samples.emplace_back(tag + " ppl vs samples", ppl);
      }
      tensorboard_->add_scalars(by_iter, iteration);
      tensorboard_->add_scalars(by_samples, consumed_train_);
    }
    tensorboard_->flush();
  }
}

void Trainer::load_pretrained_checkpoint() {
  namespace cp = checkpoint;
  const std::string& root = args_.pretrained_checkpoint;
  std::vector<std::string> missing;
  run_agreed(parallel_->world_group(), [&] {
    const std::optional<int64_t> it = cp::read_tracker(root);
    MEGATRON_CHECK(it.has_value(), "--pretrained-checkpoint ", root, ": unreadable ",
                   cp::kTrackerFile);
    cp::CheckpointReader reader =
        cp::CheckpointReader::open(cp::iteration_dir(root, *it), load_integrity(args_));
    missing = load_weights_present(reader, checkpoint_target());
  });
  // Megatron's message for a head the pretrained checkpoint does not have.
  for (const std::string& name : missing)
    log_first("***WARNING*** could not find " + name + " in " + root + ", initializing to random");
}

void Trainer::load_checkpoint() {
  namespace cp = checkpoint;
  const ParallelState& ps = *parallel_;
  std::optional<RunState> loaded;
  std::string dir;
  bool release = false;
  Timer timer;
  int64_t bytes_read = 0;
  std::string root = args_.load;
  run_agreed(ps.world_group(), [&] {
    std::vector<std::string> notes;
    const std::optional<CheckpointChoice> choice = checkpoint_to_load(args_, &notes);
    for (const std::string& note : notes) log_first(note);
    std::optional<int64_t> iteration;
    if (choice) {
      root = choice->root;
      iteration = choice->iteration;
    }
    if (!iteration) {
      const std::string tracker = args_.load + "/" + cp::kTrackerFile;
      MEGATRON_CHECK(!args_.exit_on_missing_checkpoint, "--load ", args_.load,
                     " has no checkpoint (no ", tracker,
                     ") and --exit-on-missing-checkpoint is set: check the path, or drop the "
                     "flag to start from random weights");
      log_first("WARNING: could not find the metadata file " + tracker);
      log_first("    will not load any checkpoints and will start from random");
      return;
    }
    dir = cp::iteration_dir(root, *iteration);
    log_first(strprintf("loading %scheckpoint from %s at iteration %ld",
                        root == args_.load ? "" : "non-persistent ", root.c_str(),
                        static_cast<long>(*iteration)));
    cp::CheckpointReader reader = cp::CheckpointReader::open(dir, load_integrity(args_));
    const std::string meta_path = dir + "/" + cp::kMetadataFile;
    const nlohmann::json& meta = reader.metadata();
    const std::vector<std::string> diffs = model_arg_differences(
        meta.value("args", nlohmann::json::object()), model_args_json(args_, cfg_));
    if (!diffs.empty()) {
      std::string list;
      for (const std::string& d : diffs) list += "\n  " + d;
      MEGATRON_CHECK(false, "checkpoint ", dir,
                     " holds a different model than this run's "
                     "arguments describe:",
                     list,
                     "\npass the checkpoint's values, or --use-checkpoint-args to take them from "
                     "it");
    }
    // A release checkpoint (`megatron convert` from Hugging Face) holds weights only and
    // starts the run at iteration 0, as Megatron's release directories do.
    release = meta.value("release", false);
    const std::string saved_tokenizer =
        meta.value("args", nlohmann::json::object()).value("tokenizer_type", args_.tokenizer_type);
    if (saved_tokenizer != args_.tokenizer_type) {
      log_first(" > warning: checkpoint " + dir + " was trained with --tokenizer-type " +
                saved_tokenizer + ", this run uses " + args_.tokenizer_type);
    }
    const bool optim = args_.load_optim && !args_.finetune && !release;
    if (optim) {
      MEGATRON_CHECK(meta.value("has_optimizer_state", false), "checkpoint ", dir,
                     " has no optimizer state (it was saved with --no-save-optim): pass "
                     "--no-load-optim (moments start at zero) or --finetune");
      // Adam's moments, SGD's momentum buffer and Muon's (buffers for the matrices, Adam's
      // moments for the rest) are different state (torch's load_state_dict would fail on the
      // keys); older checkpoints were Adam's. 1-bit Adam keeps Adam's.
      const std::string saved_optimizer = meta.value("optimizer", std::string("adam"));
      // Muon's other parameters: Adam's two moments or Lion's one.
      const auto family = [&](const std::string& optimizer, const std::string& scalar) {
        const std::string f = optimizer_state_family(optimizer);
        return f == "muon" && scalar == "lion" ? std::string("muon with lion") : f;
      };
      const std::string saved_scalar = meta.value("muon_scalar_optimizer", std::string("adam"));
      MEGATRON_CHECK(
          family(saved_optimizer, saved_scalar) ==
              family(args_.optimizer, args_.muon_scalar_optimizer),
          "checkpoint ", dir, " holds the optimizer state of --optimizer ", saved_optimizer,
          saved_optimizer == "muon" ? " --muon-scalar-optimizer " + saved_scalar : "",
          ", which --optimizer ", args_.optimizer,
          args_.optimizer == "muon" ? " --muon-scalar-optimizer " + args_.muon_scalar_optimizer
                                    : "",
          " cannot continue: pass --no-load-optim (its state starts afresh) or --optimizer ",
          saved_optimizer);
    }
    bool fp8_state_missing = false;
    load_shards(reader, checkpoint_target(), optim, &fp8_state_missing);
    if (fp8_state_missing)
      log_first("checkpoint " + dir +
                " has no FP8 scaling state for some layers (saved without "
                "--fp8-format): their scales start from 1");
    bytes_read = reader.bytes_read();
    RunState state = run_state_from_json(meta, meta_path);
    if (!args_.finetune && !release)
      loaded_rerun_state_ = meta.value("rerun_state_machine", nlohmann::json());
    if (optim) {
      if (optimizer_) optimizer_->set_steps(state.optimizer_steps);
      if (dist_optimizer_) dist_optimizer_->set_steps(state.optimizer_steps);
      if (scaler_ && state.loss_scaler) scaler_->set_state(*state.loss_scaler);
    }
    loaded = state;
  });
  if (!loaded) return;
  Tensor total = Tensor::empty({1}, DType::kI64);
  total.data<int64_t>()[0] = bytes_read;
  parallel_->world_group().all_reduce(total);
  const double seconds = timer.elapsed(), mb = static_cast<double>(total.data<int64_t>()[0]) / 1e6;
  log_first(strprintf(" > read %.1f MB of tensors on %d ranks in %.3f s (%.1f MB/s)", mb,
                      ps.world_size(), seconds, mb / std::max(seconds, 1e-9)));
  loaded_iteration_ = loaded->iteration;  // the checkpoint's own (the final save compares it)
  if (args_.override_ckpt_iteration >= 0 && release) {
    log_first(
        "WARNING: --override-ckpt-iteration ignored: a release checkpoint starts at "
        "iteration 0");
  } else if (args_.override_ckpt_iteration >= 0) {
    // Megatron's override: the data loader replays from the target iteration (consumed samples
    // recomputed from the current batch size, which must be the checkpoint's); the schedule and
    // the optimizer keep the checkpoint's.
    const int64_t gbs = args_.global_batch_size, target = args_.override_ckpt_iteration;
    MEGATRON_CHECK(!loaded->global_batch_size || *loaded->global_batch_size == gbs,
                   "--override-ckpt-iteration recomputes consumed_train_samples from the target "
                   "iteration and current global_batch_size, but checkpoint global_batch_size (",
                   loaded->global_batch_size.value_or(0), ") != current global_batch_size (", gbs,
                   "). This would replay the data loader from the wrong sample offset.");
    loaded->iteration = target;
    loaded->consumed_train_samples = target * gbs;
    loaded->skipped_train_samples = 0;
    log_first(strprintf("Overriding checkpoint iteration to %ld (consumed_train_samples = %ld)",
                        static_cast<long>(target), static_cast<long>(target * gbs)));
  }
  // Megatron compares the batch size with data phases (not when finetuning, where it compares no
  // arguments): a phase's samples are its iterations times it.
  MEGATRON_CHECK(
      args_.phase_transitions.empty() || args_.finetune || !loaded->global_batch_size ||
          *loaded->global_batch_size == args_.global_batch_size,
      "--global-batch-size ", args_.global_batch_size, " differs from the checkpoint's (",
      loaded->global_batch_size.value_or(0),
      "); --phase-transition-iterations needs the same global batch size in every phase");
  if (!args_.finetune && !release) {
    start_iteration_ = loaded->iteration;
    consumed_train_ = loaded->consumed_train_samples;
    consumed_valid_ = loaded->consumed_valid_samples;
    consumed_test_ = loaded->consumed_test_samples;
    // Megatron restores the LR schedule with the optimizer: its position, and its parameters
    // checked against, kept over or taken from the checkpoint's (optim/scheduler_state.h).
    if (args_.load_optim) {
      scheduler_samples_ = loaded->scheduler_samples;
      restore_schedule(loaded->opt_param_scheduler);
    }
    skipped_train_samples_ = loaded->skipped_train_samples;
    flops_so_far_ = flops_at_start_ = loaded->floating_point_operations;
    if (args_.load_rng && loaded->rng_seed) dropout_seed_ = *loaded->rng_seed;
  }
  log_first(
      strprintf("  successfully loaded checkpoint from %s [ t %d/%d, p %d/%d ] at "
                "iteration %ld",
                root.c_str(), ps.tp_rank() + 1, ps.tp_size(), ps.pp_rank() + 1, ps.pp_size(),
                static_cast<long>(start_iteration_)));
  restore_rerun_state();
}

RunState Trainer::run_state(int64_t iteration) const {
  RunState s;
  s.iteration = iteration;
  s.consumed_train_samples = consumed_train_;
  s.consumed_valid_samples = consumed_valid_;
  s.consumed_test_samples = consumed_test_;
  s.scheduler_samples = scheduler_samples_;
  s.opt_param_scheduler = scheduler_state_dict(schedule_, wd_schedule_, scheduler_samples_);
  s.skipped_train_samples = skipped_train_samples_;
  s.floating_point_operations = flops_so_far_;
  s.global_batch_size = args_.global_batch_size;
  s.optimizer_steps = optimizer_ ? optimizer_->steps() : dist_optimizer_->steps();
  if (scaler_) s.loss_scaler = scaler_->state();
  if (args_.save_rng) s.rng_seed = dropout_seed_;
  return s;
}

nlohmann::json Trainer::layout_record() const {
  const ParallelState& ps = *parallel_;
  return {{"world_size", ps.world_size()},
          {"tensor_model_parallel_size", ps.tp_size()},
          {"pipeline_model_parallel_size", ps.pp_size()},
          {"virtual_pipeline_model_parallel_size", virtual_stages_},
          {"data_parallel_size", dp_size_},
          {"context_parallel_size", ps.cp_size()},
          {"expert_model_parallel_size", ps.ep_size()},
          {"expert_tensor_parallel_size", ps.etp_size()},
          {"sequence_parallel", args_.sequence_parallel},
          {"use_distributed_optimizer", args_.use_distributed_optimizer}};
}

nlohmann::json Trainer::checkpoint_extra() const {
  const ParallelState& ps = *parallel_;
  nlohmann::json extra = {
      {"args", model_args_json(args_, cfg_)},
      {"arguments", args_.argument_record},
      {"has_optimizer_state", args_.save_optim},
      {"optimizer", args_.optimizer},
      // The optimizer's parameter groups as torch saves them (restore_optimizer_groups).
      {"sgd_momentum", args_.sgd_momentum},
      {"muon_momentum", args_.muon_momentum},
      {"muon_scalar_optimizer", args_.muon_scalar_optimizer},
      {"lion_beta1", args_.lion_beta1},
      {"lion_beta2", args_.lion_beta2},
      {"adam_beta1", args_.adam_beta1},
      {"adam_beta2", args_.adam_beta2},
      {"adam_eps", args_.adam_eps},
      {"padded_vocab_size", cfg_.padded_vocab_size},
      {"tokenizer", {{"type", args_.tokenizer_type}, {"vocab_size", cfg_.vocab_size}}},
      {"layout", layout_record()},
      {"compute_dtype", dtype_name(cfg_.compute_dtype)}};
  // Only a save that asks for a re-run carries the machine's state (Megatron's state_dict is
  // None otherwise). The state is agreed over the world, so every rank gathers or none does.
  if (rerun_ && rerun_->has_checkpoint_state()) {
    nlohmann::json record = rerun_->common_state();
    record["layout"] = extra["layout"];
    record["ranks"] = nlohmann::json::array();
    for (const std::string& r : all_gather_strings(ps.world_group(), rerun_->rank_state().dump()))
      record["ranks"].push_back(nlohmann::json::parse(r));
    extra["rerun_state_machine"] = std::move(record);
  }
  return extra;
}

void Trainer::build_rerun_state_machine() {
  const ParallelState& ps = *parallel_;
  // As Megatron's argument check: dynamic fp16 loss scaling reads NaN/Inf as overflow.
  nan_checks_ = args_.check_for_nan_in_loss_and_grad && !(args_.fp16 && args_.loss_scale <= 0);
  if (args_.check_for_nan_in_loss_and_grad && !nan_checks_) {
    log_first(
        "WARNING: Setting args.check_for_nan_in_loss_and_grad to False since dynamic loss "
        "scaling is being used");
  }
  if (!args_.result_rejected_tracker_filename.empty()) {
    auto list = [](const std::vector<int64_t>& v) {
      std::string text;
      for (int64_t x : v) text += (text.empty() ? "" : ", ") + std::to_string(x);
      return "[" + text + "]";
    };
    // Read by rank 0 and sent to all: every rank must skip the same iterations (a file being
    // appended to, or not shared, could read differently elsewhere).
    std::string lists;
    if (ps.rank() == 0) {
      std::vector<int64_t> several;
      const std::vector<int64_t> skip =
          skipped_iterations_from_tracker(args_.result_rejected_tracker_filename, &several);
      lists = nlohmann::json{skip, several}.dump();
    }
    broadcast_string(parallel_->world_group(), lists, 0);
    const nlohmann::json parsed = nlohmann::json::parse(lists);
    const auto skip = parsed[0].get<std::vector<int64_t>>();
    const auto several = parsed[1].get<std::vector<int64_t>>();
    // The file names the logged iteration; the skip list counts the iterations before the step
    // (Megatron r0.14 adds the logged number itself, which skips the iteration after it).
    for (int64_t it : skip)
      if (it >= 1) iterations_to_skip_.insert(it - 1);
    log_first("Will skip these iterations from tracker file: " + list(skip));
    if (!several.empty())
      log_first("Will not skip these iterations due to multiple rank errors: " + list(several));
  }
  RerunStateMachine::Options o;
  o.mode = parse_rerun_mode(args_.rerun_mode);
  o.error_injection_rate = args_.error_injection_rate;
  o.error_injection_type = parse_rerun_diagnostic(args_.error_injection_type);
  o.seed = static_cast<uint64_t>(args_.seed);
  o.tracker_file = args_.result_rejected_tracker_filename;
  o.identity = this_rerun_identity(ps.rank(), static_cast<int>(args_.device_index));
  o.validations = nan_checks_ || args_.check_for_spiky_loss || args_.check_for_large_grads;
  ProcessGroup& world = parallel_->world_group();
  o.any_rank = [&world](bool flag) {
    Tensor t = Tensor::full({1}, flag ? 1.0 : 0.0, DType::kF64);
    world.all_reduce(t, ReduceOp::kMax);
    return t.item(0) > 0;
  };
  o.gather = [&world](const std::string& mine) { return all_gather_strings(world, mine); };
  o.log_first = [this](const std::string& line) { log_first(line); };
  o.log_warning = [rank = ps.rank()](const std::string& line) {
    log_line(strprintf("[rank %d] %s", rank, line.c_str()));
  };
  o.log_error = [rank = ps.rank()](const std::string& line) {
    log_error(strprintf("[rank %d] %s", rank, line.c_str()));
  };
  rerun_ = std::make_unique<RerunStateMachine>(std::move(o));
}

void Trainer::validate_loss(double local_sum) {
  RerunStateMachine& m = *rerun_;
  if (!m.wants_results()) return;
  if (nan_checks_) {
    // Tolerance 0: the forward is deterministic (Megatron's setting too).
    m.validate(
        local_sum, [](double v) { return std::isnan(v); },
        "found NaN in local forward loss calculation", 0.0, /*fatal=*/true);
    m.validate(
        local_sum, [](double v) { return std::isinf(v); },
        "found Inf in local forward loss calculation", 0.0, /*fatal=*/true);
  }
  if (args_.check_for_spiky_loss) {
    // Megatron's SPIKY_LOSS_FACTOR: 10 times the largest of the first 100 losses.
    m.validate(
        local_sum, [&m](double v) { return m.is_unexpectedly_large(v, 10, "loss"); }, "Spiky loss",
        0.0, /*fatal=*/false);
  }
}

void Trainer::validate_grads(int64_t bucket, const Tensor& grads) {
  RerunStateMachine& m = *rerun_;
  if (!(nan_checks_ || args_.check_for_large_grads) || !m.wants_results()) return;
  const double norm = std::sqrt(ops::sum_squares(grads));
  const std::string where = strprintf(
      " in local grad norm for bucket #%ld in backward pass before data-parallel communication "
      "collective",
      static_cast<long>(bucket));
  // Megatron's tolerance, 0.1%, allows for a non-deterministic backward (flash attention's);
  // this one is deterministic, so a real difference is far above it.
  if (nan_checks_) {
    m.validate(
        norm, [](double v) { return std::isnan(v); }, "found NaN" + where, 0.001, true);
    m.validate(
        norm, [](double v) { return std::isinf(v); }, "found Inf" + where, 0.001, true);
  }
  if (args_.check_for_large_grads) {
    m.validate(
        norm, [&m](double v) { return m.is_unexpectedly_large(v, 10, "grads"); },
        strprintf("found unexpected large grads in bucket #%ld in backward pass before "
                  "data-parallel communication collective",
                  static_cast<long>(bucket)),
        0.001, /*fatal=*/false);
  }
}

void Trainer::restore_rerun_state() {
  if (loaded_rerun_state_.is_null()) return;
  const nlohmann::json& record = loaded_rerun_state_;
  // As Megatron: only a job of the same layout resumes the re-run.
  if (record.value("layout", nlohmann::json()) != layout_record()) {
    log_first(
        " > the checkpoint asks for a re-run of its next iteration, but was saved with another "
        "parallel layout: its rerun state is ignored");
    return;
  }
  try {
    rerun_->load(record, record.at("ranks").at(static_cast<size_t>(parallel_->rank())));
  } catch (const std::exception& e) {  // as Megatron: an unreadable record is skipped
    log_first(std::string(" > unable to restore the rerun state machine from the checkpoint (") +
              e.what() + "): skipped");
  }
}

void Trainer::save_checkpoint(int64_t iteration, bool non_persistent) {
  watchdog_->enter("save-checkpoint", iteration);
  complete_param_gather();
  if (non_persistent) {  // Megatron's progress log records persistent saves only
    np_checkpointer_->save(run_state(iteration), checkpoint_extra());
    return;
  }
  checkpointer_->save(run_state(iteration), checkpoint_extra());
  if (progress_) {
    progress_->saved_checkpoint(iteration, flops_so_far_, flops_at_start_, train_timer_.elapsed(),
                                static_cast<double>(consumed_train_ * cfg_.seq_length),
                                args_.async_save);
  }
}

int Trainer::exit_decision(int64_t it) {
  // Every exit saves this iteration (unless just saved) and commits any save in flight first.
  auto stop = [&](const std::string& why, int code) {
    if (checkpointer_ && checkpointer_->last_saved_iteration() != it) save_checkpoint(it);
    if (checkpointer_) checkpointer_->finish();
    if (np_checkpointer_) np_checkpointer_->finish();
    log_first("[" + why + "] datetime: " + timestamp());
    return code;
  };
  const bool by_signal = exit_signal_ != nullptr;
  const bool by_time = args_.exit_duration_in_mins > 0;
  if (by_signal || by_time) {
    // Every rank takes the decision of the one that saw the signal or ran out of time first.
    Tensor flags = Tensor::zeros({2}, DType::kI64);
    if (by_signal && exit_signal_->received()) flags.data<int64_t>()[0] = 1;
    if (by_time && train_timer_.elapsed() / 60.0 > args_.exit_duration_in_mins) {
      flags.data<int64_t>()[1] = 1;
    }
    parallel_->world_group().all_reduce(flags, ReduceOp::kMax);
    if (flags.data<int64_t>()[0]) {
      return stop("exiting program after receiving " + args_.exit_signal + ".", kExitSavedRequeue);
    }
    if (flags.data<int64_t>()[1]) {
      return stop(strprintf("exiting program after %f minutes", train_timer_.elapsed() / 60.0),
                  kExitSavedRequeue);
    }
  }
  const auto& phases = args_.phase_transitions;
  if ((args_.exit_interval > 0 && it % args_.exit_interval == 0) ||
      std::find(phases.begin(), phases.end(), it) != phases.end()) {
    return stop(strprintf("exiting program at iteration %ld", static_cast<long>(it)), kExitOk);
  }
  return -1;
}

void Trainer::log_iteration(TrainingLog& log, const TrainingLog::Step& step) {
  // The interval's length before closing it resets the count: the timers report per iteration.
  const int64_t iterations = log.interval_iterations();
  const double interval_seconds = log.interval_seconds_per_iteration();
  std::string line = log.close_interval(step, relay_to_first_rank(log.interval_means()));
  if (args_.timing_log_level > 0) {
    const std::vector<StepTimers::Extremes> times =
        timers_.reduce(parallel_->world_group(), iterations);
    for (const std::string& l : StepTimers::format(times)) line += "\n" + l;
    // Megatron's timers.write: each phase's slowest rank, seconds per iteration.
    if (tensorboard_ && args_.log_timers_to_tensorboard) {
      TrainingLog::Values points;
      for (const StepTimers::Extremes& t : times)
        points.emplace_back(t.name + "-time", t.max_ms / 1e3);
      tensorboard_->add_scalars(points, step.iteration);
    }
  }
  log_first(line);
  if (tensorboard_) log.interval_tensorboard(*tensorboard_, step.iteration);
  timers_.reset();
  // As Megatron: once, after the first logging interval of the run.
  if (!memory_reported_) {
    report_memory(step.iteration);
    memory_reported_ = true;
  } else if (args_.log_memory_interval > 0 && step.iteration % args_.log_memory_interval == 0) {
    report_memory(step.iteration);  // Megatron core 0.19's --log-memory-interval
  }
  // The prediction against the second interval (the first warms up caches and primitives), or
  // the first when the run logs only once.
  ++intervals_logged_;
  if (prediction_ &&
      (intervals_logged_ == 2 ||
       (intervals_logged_ == 1 && step.iteration + args_.log_interval > args_.train_iters))) {
    Tensor peak = Tensor::full({1}, max_resident_mb(), DType::kF64);
    parallel_->world_group().all_reduce(peak, ReduceOp::kMax);
    log_first(prediction_check_line(*prediction_, interval_seconds, peak.item(0)));
  }
  if (tensorboard_) tensorboard_->flush();
}

int Trainer::train() {
  if (progress_) progress_->starting_job();
  if (args_.skip_train) {
    // Megatron's --skip-train: the loaded weights evaluated once, nothing trained or saved.
    log_first("skipping training (--skip-train is on) ...");
    final_evaluations(start_iteration_);
    if (tensorboard_) tensorboard_->close();
    watchdog_->disarm();
    return kExitOk;
  }
  log_first("[before the start of training step] datetime: " + timestamp());
  log_first("training ...");
  // Per rank, as Megatron's "throughput per GPU": the model's FLOPs shared by every rank.
  const int64_t gbs = args_.global_batch_size;
  const double flops_per_sample = spec_->flops_per_iteration(cfg_, gbs) / static_cast<double>(gbs);
  TrainingLog::Options options;
  options.train_iters = args_.train_iters;
  options.seq_length = cfg_.seq_length;
  options.flops_per_sample = flops_per_sample / parallel_->world_size();
  options.peak_gflops = peak_gflops_;
  options.loss_scale_to_tensorboard = args_.log_loss_scale_to_tensorboard;
  options.timers_to_tensorboard = args_.log_timers_to_tensorboard;
  options.memory_to_tensorboard = args_.log_memory_to_tensorboard;
  if (args_.log_world_size_to_tensorboard) options.world_size = parallel_->world_size();
  TrainingLog log(options);
  if (needs_data_ && parallel_->tp_rank() == 0) {
    prefetcher_ = std::make_unique<BatchPrefetcher>(
        *data_.train, make_batch_, args_.micro_batch_size, consumed_train_ - phase_data_offset_,
        args_.num_workers, dp_rank_, dp_size_);
  }
  BatchSchedule::Batch batch = batch_schedule_->at(consumed_train_);
  if (batch_schedule_->ramps_up()) {
    log_first(strprintf("setting initial batch size to %ld", static_cast<long>(batch.global)));
  }
  // As Megatron, the replicas are compared once before training too (after a load).
  if (args_.check_weight_hash_across_dp_replicas_interval > 0)
    check_weight_hashes(start_iteration_);
  train_timer_.start();
  for (int64_t it = start_iteration_ + 1; it <= args_.train_iters; ++it) {
    // Megatron core 0.19's --distributed-timeout-seconds-after-init: once the first iteration is
    // done, the rest of the run (steps, evaluations, saves) hangs at most this long.
    if (it == start_iteration_ + 2 && args_.distributed_timeout_seconds_after_init > 0) {
      watchdog_->set_timeout(args_.distributed_timeout_seconds_after_init,
                             "--distributed-timeout-seconds-after-init");
    }
    watchdog_->enter("train-step", it);
    fault_.at_iteration_start(parallel_->rank(), it);
    // The batch follows the consumed samples (Megatron's update_num_microbatches); as Megatron,
    // a checkpoint is saved before the first iteration of each larger batch.
    const BatchSchedule::Batch previous = batch;
    batch = batch_schedule_->at(consumed_train_);
    if (batch.global != previous.global) {
      log_first(strprintf("ramping up batch size from %ld to %ld",
                          static_cast<long>(previous.global), static_cast<long>(batch.global)));
      if (checkpointer_ && checkpointer_->last_saved_iteration() != it - 1) {
        save_checkpoint(it - 1);
      }
    }
    num_microbatches_ = batch.microbatches;
    if (iterations_to_skip_.count(it - 1)) {
      // Megatron's dummy_train_step: the batch is read and dropped; no step, no schedule
      // advance, no log line, evaluation or save for this iteration.
      rerun_->skip_iteration(it);
      if (prefetcher_) {
        for (int64_t mb = 0; mb < num_microbatches_; ++mb) prefetcher_->next();
      }
      consumed_train_ += batch.running;
      skipped_train_samples_ += batch.running;
      continue;
    }
    Timer timer;
    // The schedule advances only on successful steps (an fp16 step skipped for overflow does
    // not count), as Megatron's optimizer-parameter scheduler does.
    const StepResult r = train_step(it, batch, rates_at(scheduler_samples_));
    if (r.rerun.exit) {
      // Megatron's should_checkpoint_and_exit: the last completed iteration saved when asked,
      // every rank exiting with the machine's code.
      if (r.rerun.checkpoint) {
        if (checkpointer_) {
          save_checkpoint(it - 1);
          // A non-persistent checkpoint of the same iteration (saved or loaded by this job)
          // would be loaded first and lose the record: one is written with the same state.
          if (np_checkpointer_) save_checkpoint(it - 1, /*non_persistent=*/true);
        } else {
          log_first(" > no --save: the checkpoint the rerun state machine asks for is not saved");
        }
      }
      if (checkpointer_) checkpointer_->finish();
      if (np_checkpointer_) np_checkpointer_->finish();
      log_first(
          strprintf("[exiting program at iteration %ld with exit code %d (rerun state "
                    "machine)] datetime: %s",
                    static_cast<long>(it), r.rerun.code, timestamp().c_str()));
      watchdog_->disarm();
      prefetcher_.reset();
      if (tensorboard_) tensorboard_->close();
      return r.rerun.code;
    }
    if (fault_.flip_weight_at(parallel_->rank(), it)) flip_one_weight_bit();
    consumed_train_ += batch.running;
    skipped_train_samples_ += batch.global - batch.running;
    flops_so_far_ += flops_per_sample * static_cast<double>(batch.running);
    if (!r.skipped) scheduler_samples_ += batch.running;
    losses_.push_back(r.loss);
    // Megatron prints the learning rate the scheduler set after this step, for the next one.
    const StepRates next = rates_at(scheduler_samples_);
    TrainingLog::Step step;
    step.iteration = it;
    step.terms = &r.terms;
    step.loss = r.loss;
    step.grad_norm = r.grad_norm;
    step.skipped = r.skipped;
    step.seconds = timer.elapsed();
    step.next_lr = next.lr;
    if (decoupled_schedule_) step.next_decoupled_lr = next.embedding_lr;
    step.loss_scale = scaler_ ? scaler_->scale() : 1.0;
    step.consumed_samples = consumed_train_;
    step.skipped_samples = skipped_train_samples_;
    step.batch_size = batch.running;
    step.num_zeros = r.skipped ? -1 : r.num_zeros;
    if (args_.log_params_norm) step.params_norm = params_norm();
    step.max_attention_logit = r.max_logit;
    log.add(step);
    if (tensorboard_ && it % args_.tensorboard_log_interval == 0) {
      log.tensorboard(*tensorboard_, step);
      if (cfg_.moe.per_layer_logging) {  // Megatron's moe/<name>_layer_<i> (1-based layers)
        std::vector<std::pair<std::string, double>> points;
        for (const auto& [name, layers] : moe_per_layer_)
          for (const auto& [l, x] : layers)
            points.emplace_back("moe/" + name + "_layer_" + std::to_string(l + 1), x);
        tensorboard_->add_scalars(points, it);
      }
    }
    if (it % args_.log_interval == 0 || it == args_.train_iters) log_iteration(log, step);
    const int64_t hash_interval = args_.check_weight_hash_across_dp_replicas_interval;
    if (hash_interval > 0 && it % hash_interval == 0) check_weight_hashes(it);
    if (args_.test_mode) check_qk_norm_replicas(it);
    if (it % args_.eval_interval == 0 && it >= args_.start_eval_at_iter)
      validate(strprintf("iteration %ld", static_cast<long>(it)), it);
    if (checkpointer_) {
      checkpointer_->poll();
      if (np_checkpointer_) np_checkpointer_->poll();
      // As Megatron's checkpoint_and_decide_exit: a non-persistent save only on iterations
      // without a persistent one.
      const int64_t np_interval = args_.non_persistent_save_interval;
      if (args_.save_interval > 0 && it % args_.save_interval == 0) {
        save_checkpoint(it);
      } else if (np_checkpointer_ && it % np_interval == 0) {
        save_checkpoint(it, /*non_persistent=*/true);
      }
    }
    if (const int code = exit_decision(it); code >= 0) {
      watchdog_->disarm();
      prefetcher_.reset();
      if (tensorboard_) tensorboard_->close();
      return code;
    }
  }
  return finish_training();
}

void Trainer::check_weight_hashes(int64_t iteration) {
  complete_param_gather();  // every replica's weights in, as Megatron disables its gather hook
  const ParallelState& ps = *parallel_;
  const std::vector<std::string> differ =
      replica_weight_mismatches(params_->params(), ps.dp_cp_group(), ps.edp_group());
  // Each replica group agrees on its own verdict; the world then agrees, so that every rank
  // stops together (a rank whose groups match would otherwise wait for the others in the next
  // collective) and exits cleanly with its own line. Corruption, not bad input: exit 1.
  std::string list;
  for (const std::string& d : differ) list += (list.empty() ? "" : "; ") + d;
  if (list.empty()) list = "on other ranks (their messages name the weights)";
  agree_on_each_failure(
      ps.world_group(), !differ.empty(),
      strprintf("Parameter hashes not matching across DP replicas after %ld iterations: %s. The "
                "replicas have diverged (silent data corruption, or a reduction that is not "
                "deterministic); resume from the last checkpoint that passed the check",
                static_cast<long>(iteration), list.c_str()),
      1);
  log_first(
      strprintf(">>> Weight hashes match after %ld iterations...", static_cast<long>(iteration)));
}

namespace {
// --test-mode's tensors: the query and key head norms' weights and biases (Megatron's
// run_realtime_tests compares exactly these).
bool is_qk_norm(const Param& p) {
  return p.name.find(".q_layernorm.") != std::string::npos ||
         p.name.find(".k_layernorm.") != std::string::npos;
}
}  // namespace

void Trainer::check_qk_norm_replicas(int64_t iteration) {
  complete_param_gather();
  const ParallelState& ps = *parallel_;
  std::vector<Param*> qk;
  for (Param* p : params_->params())
    if (is_qk_norm(*p)) qk.push_back(p);
  // Over the data-parallel replicas, then over the tensor-parallel ranks, which hold whole copies
  // of these (their gradients are summed over TP). (No expert Params among them: the expert group
  // argument is never used but must be the same collective on every rank.) Each group agrees on
  // its own verdict; the world then agrees on one flag, so that every rank stops together (a rank
  // whose groups match would otherwise wait for the others in the next collective), each naming
  // the weights that differ in its own groups (pipeline stages hold different ones).
  std::map<std::string, std::string> where;  // weight -> the parallelism it differs across
  const std::pair<ProcessGroup*, const char*> checks[] = {
      {&ps.dp_cp_group(), "data-parallel replicas"}, {&ps.tp_group(), "tensor-parallel ranks"}};
  for (const auto& [group, what] : checks) {
    for (const std::string& line : replica_weight_mismatches(qk, *group, *group)) {
      std::string& w = where[line.substr(0, line.find(':'))];
      w += (w.empty() ? "" : " and ") + std::string(what);
    }
  }
  std::string list;
  for (const auto& [name, what] : where)
    list += (list.empty() ? "" : "; ") + name + " differs across " + what;
  if (list.empty()) list = "on other ranks (their messages name the weights)";
  // Corruption, not bad input: a runtime failure (exit 1).
  agree_on_each_failure(ps.world_group(), !where.empty(),
                        strprintf("--test-mode: discrepancy between the query/key norm weights at "
                                  "iteration %ld: %s (silent data corruption: resume from the "
                                  "last good checkpoint)",
                                  static_cast<long>(iteration), list.c_str()),
                        1);
}

void Trainer::flip_one_weight_bit() {
  // The first weight the enabled replica checks cover (--test-mode: a query/key norm's).
  Param* target = params_->params().front();
  if (args_.test_mode) {
    for (Param* p : params_->params())
      if (is_qk_norm(*p)) {
        target = p;
        break;
      }
  }
  Param& p = *target;
  Tensor host = p.value.device() == Device::kCPU ? p.value : p.value.to(Device::kCPU);
  static_cast<uint8_t*>(host.raw())[0] ^= 1;  // the lowest bit of the first element
  if (p.value.device() != Device::kCPU) p.value.copy_from(host);
}

void Trainer::final_evaluations(int64_t iteration) {
  eval_iteration_ = iteration;
  watchdog_->enter("evaluation", iteration);
  const long it = static_cast<long>(iteration);
  validate(strprintf("iteration %ld on validation set", it), iteration);
  if (data_.test && args_.eval_iters > 0) {
    evaluate_and_print(strprintf("iteration %ld on test set", it), "", *data_.test, &consumed_test_,
                       iteration);
  }
}

int Trainer::finish_training() {
  prefetcher_.reset();
  complete_param_gather();
  const int64_t final_iteration = std::max(start_iteration_, args_.train_iters);
  // Megatron saves once more at the end unless the last iteration was just saved; a run that
  // loaded this very iteration from this directory has nothing new to save.
  if (checkpointer_ && final_iteration > 0 &&
      checkpointer_->last_saved_iteration() != final_iteration &&
      !(loaded_iteration_ == final_iteration && args_.load == args_.save)) {
    save_checkpoint(final_iteration);
  }
  if (checkpointer_) {
    watchdog_->enter("save-checkpoint", final_iteration);
    checkpointer_->finish();
    if (np_checkpointer_) np_checkpointer_->finish();
  }
  report_op_times();
  log_first("[after training is done] datetime: " + timestamp());
  final_evaluations(final_iteration);
  if (tensorboard_) tensorboard_->close();
  // Sharded main weights: every rank gathers them whole for the export (collective).
  const bool gather = params_->main_sharded() && !args_.save_hf.empty();
  if (gather) dist_optimizer_->gather_main_all();
  if (!args_.save_hf.empty() && first_rank_) {
    spec_->hf.save(args_.save_hf, *chunks_.front(), "", std::nullopt);
    log_first(" > saved the model as a Hugging Face directory to " + args_.save_hf);
  }
  if (gather) dist_optimizer_->release_main_all();
  watchdog_->disarm();
  return kExitOk;
}

}  // namespace megatron
