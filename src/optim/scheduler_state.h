// The learning-rate and weight-decay schedules in a checkpoint: Megatron's
// OptimizerParamScheduler.state_dict() and the three ways its load_state_dict() treats the
// parameters saved there (megatron/core/optimizer_param_scheduler.py):
//
//   check (default)   every parameter of this run must equal the checkpoint's, else the load
//                     stops ("... do not match"), so a resumed run cannot silently change its
//                     schedule;
//   override          --override-opt_param-scheduler: this run's parameters, the checkpoint's
//                     ignored;
//   use checkpoint    --use-checkpoint-opt_param-scheduler: the checkpoint's parameters, this
//                     run's flags ignored.
//
// Steps are samples, as Megatron's scheduler counts them (iterations x global batch size). The
// position (num_steps) is restored by the caller either way; WSD's decay length, the warm-up's
// initial rate and the decoupled rates are not in Megatron's state dict and stay this run's.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "optim/lr_scheduler.h"

namespace megatron {

enum class SchedulerLoad : uint8_t { kCheck, kOverride, kUseCheckpoint };

// {"max_lr", "lr_warmup_steps", "num_steps", "lr_decay_style", "lr_decay_steps", "min_lr",
//  "start_wd", "end_wd", "wd_incr_style", "wd_incr_steps"} at `num_steps` samples.
nlohmann::json scheduler_state_dict(const LrSchedule& lr, const WeightDecaySchedule& wd,
                                    int64_t num_steps);

// Applies a saved state dict to `lr` and `wd` in `mode`; returns Megatron's lines
// (" > using checkpoint value V for NAME", " > overriding NAME value to V"). Under kCheck a
// parameter that differs throws InvalidArgument naming it, both values and the two flags. A saved
// dict lacking a field (an older checkpoint) leaves that parameter alone; `where` names the
// checkpoint in errors.
std::vector<std::string> load_scheduler_state(const nlohmann::json& saved, SchedulerLoad mode,
                                              LrSchedule& lr, WeightDecaySchedule& wd,
                                              const std::string& where);

const char* lr_decay_style_name(LrDecayStyle s);
const char* weight_decay_incr_style_name(WeightDecayIncrStyle s);

}  // namespace megatron
