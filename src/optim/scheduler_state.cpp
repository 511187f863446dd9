// Megatron's scheduler state dict and its load rules (scheduler_state.h).
#include "optim/scheduler_state.h"

#include <functional>

#include "core/error.h"
#include "core/logging.h"

namespace megatron {

const char* lr_decay_style_name(LrDecayStyle s) {
  switch (s) {
    case LrDecayStyle::kConstant:
      return "constant";
    case LrDecayStyle::kLinear:
      return "linear";
    case LrDecayStyle::kCosine:
      return "cosine";
    case LrDecayStyle::kInverseSquareRoot:
      return "inverse-square-root";
    case LrDecayStyle::kWSD:
      return "WSD";
  }
  return "?";
}

const char* weight_decay_incr_style_name(WeightDecayIncrStyle s) {
  switch (s) {
    case WeightDecayIncrStyle::kConstant:
      return "constant";
    case WeightDecayIncrStyle::kLinear:
      return "linear";
    case WeightDecayIncrStyle::kCosine:
      return "cosine";
  }
  return "?";
}

nlohmann::json scheduler_state_dict(const LrSchedule& lr, const WeightDecaySchedule& wd,
                                    int64_t num_steps) {
  return {{"max_lr", lr.max_lr},
          {"lr_warmup_steps", lr.warmup_samples},
          {"num_steps", num_steps},
          {"lr_decay_style", lr_decay_style_name(lr.style)},
          {"lr_decay_steps", lr.decay_samples},
          {"min_lr", lr.min_lr},
          {"start_wd", wd.start},
          {"end_wd", wd.end},
          {"wd_incr_style", weight_decay_incr_style_name(wd.style)},
          {"wd_incr_steps", wd.incr_samples}};
}

std::vector<std::string> load_scheduler_state(const nlohmann::json& saved, SchedulerLoad mode,
                                              LrSchedule& lr, WeightDecaySchedule& wd,
                                              const std::string& where) {
  std::vector<std::string> lines;
  // Megatron's _check_and_set for one parameter, given as text (for the messages) and as the
  // setter that takes the checkpoint's value.
  auto check_and_set = [&](const char* name, const std::string& mine, const std::string& theirs,
                           const std::function<void()>& take_theirs) {
    if (mode == SchedulerLoad::kOverride) {
      lines.push_back(std::string(" > overriding ") + name + " value to " + mine);
      return;
    }
    MEGATRON_CHECK(mode == SchedulerLoad::kUseCheckpoint || mine == theirs,
                   "OptimizerParamScheduler: class input value ", mine, " and checkpoint value ",
                   theirs, " for ", name, " do not match (", where,
                   "): keep this run's with --override-opt_param-scheduler, take the "
                   "checkpoint's with --use-checkpoint-opt_param-scheduler, or give the flags the "
                   "checkpoint was trained with");
    lines.push_back(std::string(" > using checkpoint value ") + theirs + " for " + name);
    take_theirs();
  };
  try {
    auto number = [&](const char* key, const char* name, double& field) {
      if (!saved.contains(key)) return;
      const double v = saved.at(key).get<double>();
      check_and_set(name, python_float(field), python_float(v), [&] { field = v; });
    };
    auto count = [&](const char* key, const char* name, int64_t& field) {
      if (!saved.contains(key)) return;
      const auto v = saved.at(key).get<int64_t>();
      check_and_set(name, std::to_string(field), std::to_string(v), [&] { field = v; });
    };
    number("max_lr", "learning rate", lr.max_lr);
    number("min_lr", "minimum learning rate", lr.min_lr);
    number("lr_warmup_steps", "warmup iterations", lr.warmup_samples);
    count("lr_decay_steps", "total number of iterations", lr.decay_samples);
    if (saved.contains("lr_decay_style")) {
      const std::string v = saved.at("lr_decay_style").get<std::string>();
      check_and_set("learning rate decay style", lr_decay_style_name(lr.style), v,
                    [&] { lr.style = parse_lr_decay_style(v); });
    }
    if (saved.contains("start_wd")) {  // as Megatron: the weight-decay fields come together
      number("start_wd", "start weight decay", wd.start);
      number("end_wd", "end weight decay", wd.end);
      count("wd_incr_steps", "total number of weight decay iterations", wd.incr_samples);
      const std::string v = saved.at("wd_incr_style").get<std::string>();
      check_and_set("weight decay incr style", weight_decay_incr_style_name(wd.style), v,
                    [&] { wd.style = parse_weight_decay_incr_style(v); });
    }
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_CHECK(false, where, ": the learning-rate schedule's state is malformed (", e.what(),
                   ")");
  }
  return lines;
}

}  // namespace megatron
