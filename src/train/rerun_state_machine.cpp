// Megatron's rerun state machine: validation, in-place re-runs, the exit decision and its
// checkpoint record.
#include "train/rerun_state_machine.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <limits>
#include <regex>
#include <set>
#include <stdexcept>

#include "core/error.h"
#include "core/logging.h"
#include "train/exit_codes.h"

namespace megatron {
namespace {

constexpr double kMatch = 0.0;
constexpr double kMismatch = std::numeric_limits<double>::infinity();
// Megatron's QuickStats keeps at most this many differences.
constexpr size_t kMaxStatSamples = 100000;
// Megatron reports determinism statistics every this many iterations.
constexpr int64_t kReportingInterval = 2;

// Megatron's _compare_floats: 0 for the same value (NaN = NaN), infinity when one is NaN or
// infinite and the other is not, else the relative difference |a - b| / mean(a, b).
// (Two infinities of opposite signs give NaN there, which no tolerance exceeds: a match.)
double compare(double a, double b) {
  if (a == b || (std::isnan(a) && std::isnan(b))) return kMatch;
  if (std::isnan(a) != std::isnan(b) || std::isinf(a) != std::isinf(b)) return kMismatch;
  return std::fabs((a - b) / (a + b) * 2);
}

// A number as Python prints it where it matters here (nan, inf), else 17 digits.
std::string number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return strprintf("%.17g", v);
}

double parse_number(const nlohmann::json& j) {
  if (j.is_number()) return j.get<double>();
  const std::string s = j.get<std::string>();
  if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (s == "inf") return std::numeric_limits<double>::infinity();
  if (s == "-inf") return -std::numeric_limits<double>::infinity();
  return std::strtod(s.c_str(), nullptr);
}

const char* diagnostic_name(RerunDiagnostic d) {
  switch (d) {
    case RerunDiagnostic::kCorrectResult:
      return "correct_result";
    case RerunDiagnostic::kTransientError:
      return "transient_error";
    case RerunDiagnostic::kPersistentError:
      return "persistent_error";
  }
  return "";
}

const char* mode_name(RerunMode m) {
  switch (m) {
    case RerunMode::kDisabled:
      return "disabled";
    case RerunMode::kValidateResults:
      return "validate_results";
    case RerunMode::kReportStats:
      return "report_stats";
  }
  return "";
}

// 1234567 -> "1,234,567" (Python's {:,}).
std::string grouped(int64_t n) {
  std::string s = std::to_string(n), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

// SplitMix64's finaliser: the injection draws.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

RerunMode parse_rerun_mode(const std::string& value) {
  if (value == "disabled") return RerunMode::kDisabled;
  if (value == "validate_results") return RerunMode::kValidateResults;
  if (value == "report_stats") return RerunMode::kReportStats;
  throw InvalidArgument("--rerun-mode: invalid choice '" + value +
                        "' (choose from disabled, validate_results, report_stats)");
}

RerunDiagnostic parse_rerun_diagnostic(const std::string& value) {
  for (RerunDiagnostic d : {RerunDiagnostic::kCorrectResult, RerunDiagnostic::kTransientError,
                            RerunDiagnostic::kPersistentError})
    if (value == diagnostic_name(d)) return d;
  throw InvalidArgument("--error-injection-type: invalid choice '" + value +
                        "' (choose from correct_result, transient_error, persistent_error)");
}

RerunIdentity this_rerun_identity(int rank, int device) {
  RerunIdentity id;
  id.rank = rank;
  id.device = device;
  if (const char* slurm = std::getenv("SLURMD_NODENAME"); slurm && *slurm) {
    id.node = slurm;
  } else {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) == 0) id.node = host;
  }
  return id;
}

RerunStateMachine::RerunStateMachine(Options options) : o_(std::move(options)), mode_(o_.mode) {
  if (!o_.tracker_file.empty()) {
    // As Megatron: make sure now that the file can be appended to.
    std::FILE* f = std::fopen(o_.tracker_file.c_str(), "a");
    if (!f) {
      throw InvalidArgument("--result-rejected-tracker-filename: cannot append to " +
                            o_.tracker_file + "; give a writable path");
    }
    std::fclose(f);
  }
  if (o_.identity.rank == 0 && o_.log_first)
    o_.log_first(std::string("RerunStateMachine initialized in mode ") + mode_name(mode_));
}

bool RerunStateMachine::should_run_forward_backward(int64_t iteration) {
  calls_this_pass_.clear();
  validations_this_pass_ = 0;
  // Whether any rank raised `flag`; without validations nothing can be raised (no collective).
  auto agreed = [&](bool flag) { return o_.validations && o_.any_rank(flag); };
  switch (state_) {
    case RerunState::kNotRunningYet:
      iteration_ = iteration;
      state_ = RerunState::kInitialRun;
      rerun_requested_ = checkpoint_requested_ = false;
      restart_again_requested_ = continue_requested_ = false;
      // A diagnosis that ended in "continue" must not match a later re-run's validations
      // (Megatron keeps the old call, which another rank's re-run would then compare against).
      failed_call_.reset();
      initial_result_ = 0;
      suspicious_node_.clear();
      suspicious_device_ = -1;
      return true;
    case RerunState::kInitialRun:
      if (mode_ == RerunMode::kDisabled || !agreed(rerun_requested_)) {
        state_ = RerunState::kNotRunningYet;
        return false;
      }
      if (mode_ == RerunMode::kValidateResults)
        o_.log_first("Need to rerun step to check reproducibility of initial result");
      state_ = RerunState::kRerunningInPlace;
      return true;
    case RerunState::kRerunningInPlace:
      if (mode_ == RerunMode::kReportStats) {
        state_ = RerunState::kNotRunningYet;
        if (iteration_ % kReportingInterval == 0) report_stats();
        saved_results_.clear();
        return false;
      }
      if (agreed(checkpoint_requested_)) state_ = RerunState::kWillRerunFromCheckpoint;
      return false;
    case RerunState::kWillRerunFromCheckpoint:
      iteration_ = iteration;
      state_ = RerunState::kRerunningFromCheckpoint;
      return true;
    case RerunState::kRerunningFromCheckpoint:
      if (agreed(restart_again_requested_)) {
        o_.log_first(
            "Need to restart job from the same checkpoint because it was scheduled on the same "
            "node/GPU");
        state_ = RerunState::kRerunningAgainFromCheckpoint;
      } else if (agreed(continue_requested_)) {
        o_.log_first("Continuing normal execution because failed validation was not fatal");
        state_ = RerunState::kNotRunningYet;
      }
      return false;
    case RerunState::kRerunningAgainFromCheckpoint:
      break;
  }
  throw InternalError("rerun state machine: an iteration started after the decision to exit");
}

RerunStateMachine::Decision RerunStateMachine::should_checkpoint_and_exit() {
  first_iteration_complete_ = true;
  if (mode_ != RerunMode::kValidateResults) return {};
  switch (state_) {
    case RerunState::kRerunningInPlace:
      o_.log_first(
          "Exiting now. A checkpoint at the last iteration is being saved if further examination "
          "is needed");
      return {true, true, kExitFailedOnResultValidation};
    case RerunState::kWillRerunFromCheckpoint:
      o_.log_first(
          "Saving a checkpoint and exiting now. Please resume the job from the checkpoint to "
          "rerun the last iteration and establish a diagnostic");
      return {true, true, kExitResumeToDisambiguate};
    case RerunState::kRerunningFromCheckpoint:
      o_.log_first(
          "Exiting now. A checkpoint at the last iteration already exists if further examination "
          "is needed");
      return {false, true, kExitFailedOnResultValidation};
    case RerunState::kRerunningAgainFromCheckpoint:
      o_.log_first(
          "Exiting now. Please resume the job from the same checkpoint to rerun the last "
          "iteration and establish a diagnostic");
      return {false, true, kExitResumeToDisambiguate};
    default:
      return {};
  }
}

void RerunStateMachine::skip_iteration(int64_t iteration) {
  if (state_ != RerunState::kWillRerunFromCheckpoint) return;
  o_.log_first(
      strprintf("Iteration %ld, to be re-run from the checkpoint, is skipped: continuing "
                "normal execution",
                static_cast<long>(iteration)));
  state_ = RerunState::kNotRunningYet;
  failed_call_.reset();
  injected_.reset();
}

bool RerunStateMachine::wants_results() const {
  switch (mode_) {
    case RerunMode::kDisabled:
    case RerunMode::kReportStats:
      return true;
    case RerunMode::kValidateResults:
      if (state_ == RerunState::kInitialRun) return first_iteration_complete_ && !rerun_requested_;
      // A re-run counts every validation to find the one that failed.
      return state_ == RerunState::kRerunningInPlace ||
             state_ == RerunState::kRerunningFromCheckpoint;
  }
  return false;
}

void RerunStateMachine::validate(double result, const std::function<bool(double)>& reject,
                                 const std::string& message, double tolerance, bool fatal) {
  const RerunIdentity& id = o_.identity;
  if (mode_ == RerunMode::kDisabled) {
    if (reject(result)) {
      log_rejection("rerun_disabled", result, message);
      throw std::runtime_error(strprintf(
          "Rank %d, node %s, device %d, iteration %ld: Unexpected result %s (message='%s'); "
          "lower --lr, or pass --no-check-for-nan-in-loss-and-grad",
          id.rank, id.node.c_str(), id.device, static_cast<long>(iteration_),
          number(result).c_str(), message.c_str()));
    }
    return;
  }
  MEGATRON_ASSERT(state_ != RerunState::kNotRunningYet,
                  "a result validated outside of an iteration's forward and backward");
  const Call call{message, ++calls_this_pass_[message]};
  ++validations_this_pass_;

  if (mode_ == RerunMode::kReportStats) {
    // Every iteration runs twice: the n-th call of a message compared with its first run.
    if (state_ == RerunState::kInitialRun) {
      rerun_requested_ = true;
      saved_results_[{message, call.sequence}] = result;
    } else if (state_ == RerunState::kRerunningInPlace) {
      auto it = saved_results_.find({message, call.sequence});
      MEGATRON_ASSERT(it != saved_results_.end(), "result of the initial run missing for '",
                      message, "'");
      stats_[message].record(compare(it->second, result));
    }
    return;
  }

  auto log_failure = [&](const std::string& what) {
    o_.log_error(strprintf("Rank %d, node %s, device %d: %s!", id.rank, id.node.c_str(), id.device,
                           what.c_str()));
  };
  if (!logged_enabled_) {
    logged_enabled_ = true;
    if (id.rank == 0) o_.log_first("Result validation enabled");
  }

  if (state_ == RerunState::kInitialRun && !rerun_requested_) {
    // Not on the first iteration: a checkpoint needs the optimizer to have stepped once.
    if (!first_iteration_complete_) return;
    const bool rejected = maybe_inject() || reject(result);
    if (rejected) {
      failed_call_ = call;
      initial_result_ = result;
      rerun_requested_ = true;
      log_rejection("initial_run", result, message);
      o_.log_error(
          strprintf("Unexpected result %s on rank %d at iteration #%ld invokation #%ld "
                    "(message='%s')",
                    number(result).c_str(), id.rank, static_cast<long>(iteration_),
                    static_cast<long>(call.sequence), message.c_str()));
    }
    return;
  }
  const bool rerun =
      state_ == RerunState::kRerunningInPlace || state_ == RerunState::kRerunningFromCheckpoint;
  if (!rerun || !failed_call_ || !(call == *failed_call_)) return;
  const double comparison = maybe_miscompare(initial_result_, result);
  const std::string pair =
      number(result) + (comparison > tolerance ? " != " : " = ") + number(initial_result_);
  if (state_ == RerunState::kRerunningInPlace) {
    if (comparison > tolerance) {
      o_.log_warning("First rerun: unexpected result is not reproducible within the tolerance (" +
                     pair + ")");
      log_rejection("first_rerun_not_reproducible", result, message);
      log_failure("Possible transient error");
    } else {
      checkpoint_requested_ = true;
      // Remembered to tell whether the re-run from the checkpoint runs elsewhere.
      suspicious_node_ = id.node;
      suspicious_device_ = id.device;
      log_rejection("first_rerun_reproducible", result, message);
      o_.log_warning("First rerun: unexpected result is reproducible within the tolerance (" +
                     pair + "). Need to rerun on a different GPU to verify correctness");
    }
    return;
  }
  if (id.node == suspicious_node_ && id.device == suspicious_device_) {
    o_.log_error(strprintf(
        "Got rescheduled on the same GPU. Need to resume again from the same checkpoint (node: "
        "%s, gpu: %d)",
        suspicious_node_.c_str(), suspicious_device_));
    restart_again_requested_ = true;
  } else if (comparison > tolerance) {
    log_rejection("second_rerun_not_reproducible", result, message);
    o_.log_warning(
        "Second rerun: unexpected result is not reproducible on a different GPU, therefore was "
        "likely incorrect (" +
        pair + ")");
    log_failure("Possible persistent error");
  } else {
    log_rejection("second_rerun_reproducible", result, message);
    o_.log_warning(
        "Second rerun: unexpected result is reproducible on a different GPU, therefore it was "
        "likely correct (" +
        pair + ")");
    log_failure("Correct result (but possible Application error) (" + message + ")");
    if (!fatal) continue_requested_ = true;
  }
}

bool RerunStateMachine::is_unexpectedly_large(double value, double threshold,
                                              const std::string& context, int num_samples) {
  const double v = std::fabs(value);
  if (std::isnan(v) || std::isinf(v)) return false;  // checked separately
  int64_t& n = large_value_counts_[context];
  double& mx = max_values_[context];
  if (n < num_samples) {
    ++n;
    mx = std::max(mx, v);
    if (n == num_samples)
      o_.log_warning(strprintf("Max value for %s: %s", context.c_str(), number(mx).c_str()));
    return false;
  }
  return v >= mx * threshold;
}

bool RerunStateMachine::maybe_inject() {
  if (o_.error_injection_rate <= 0 || injected_) return false;
  const uint64_t h = mix(o_.seed ^ mix(static_cast<uint64_t>(iteration_) ^
                                       mix(static_cast<uint64_t>(validations_this_pass_) ^
                                           mix(static_cast<uint64_t>(o_.identity.rank)))));
  if (h % static_cast<uint64_t>(o_.error_injection_rate) != 0) return false;
  injected_ = o_.error_injection_type;
  static const char* names[] = {"Expected result", "Transient error", "Persistent error"};
  o_.log_warning(std::string("Injecting error type ") + names[static_cast<int>(*injected_)]);
  return true;
}

double RerunStateMachine::maybe_miscompare(double initial, double result) {
  if (!injected_) return compare(initial, result);
  const RerunDiagnostic d = *injected_;
  if (state_ == RerunState::kRerunningInPlace) {
    // A transient error does not reproduce; the others do, on the same device.
    if (d != RerunDiagnostic::kTransientError) return kMatch;
    injected_.reset();
    return kMismatch;
  }
  // Re-run from the checkpoint elsewhere: a persistent error does not reproduce there.
  MEGATRON_ASSERT(d != RerunDiagnostic::kTransientError, "transient injection left unresolved");
  injected_.reset();
  return d == RerunDiagnostic::kPersistentError ? kMismatch : kMatch;
}

void RerunStateMachine::log_rejection(const std::string& status, double result,
                                      const std::string& message) const {
  if (o_.tracker_file.empty()) return;
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1000000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char ts[64];
  std::strftime(ts, sizeof(ts), "%Y-%m-%d %H:%M:%S", &tm);
  const char* job = std::getenv("SLURM_JOBID");
  const std::string line = strprintf(
      "ts=%s.%06ld node=%s device=%d jobID=%s rank=%d iteration=%ld status=%s "
      "result=%s message='%s'\n",
      ts, static_cast<long>(micros), o_.identity.node.c_str(), o_.identity.device,
      job && *job ? job : "N/A", o_.identity.rank, static_cast<long>(iteration_), status.c_str(),
      number(result).c_str(), message.c_str());
  // One append per line: ranks sharing the file do not interleave within a line.
  std::FILE* f = std::fopen(o_.tracker_file.c_str(), "a");
  if (!f || std::fputs(line.c_str(), f) < 0) {
    o_.log_error("Could not log validation error to " + o_.tracker_file);
  }
  if (f) std::fclose(f);
}

void RerunStateMachine::Stats::record(double d) {
  if (d == 0.0) {
    ++zeros;
    return;
  }
  if (samples.size() < kMaxStatSamples) samples.push_back(d);
  max = std::max(max, d);
}

std::string RerunStateMachine::Stats::describe() {
  std::sort(samples.begin(), samples.end());
  const auto z = zeros, n = static_cast<int64_t>(samples.size());
  if (n == 0) return grouped(z) + " samples, all identical";
  const int64_t t = z + n;
  double s = 0;
  for (double x : samples) s += x;
  auto at = [&](double p) {
    const int64_t i = static_cast<int64_t>(static_cast<double>(t) * p) - z;
    return i >= 0 ? strprintf("%.3E", samples[i]) : std::string("0.0");
  };
  return strprintf(
      "%s/%s total/identical samples, rel. variability: avg= %.3E, p50= %s, p90= "
      "%s, p99= %s, p99.9= %s, max: %.3E",
      grouped(t).c_str(), grouped(z).c_str(), s / static_cast<double>(t), at(0.5).c_str(),
      at(0.9).c_str(), at(0.99).c_str(), at(0.999).c_str(), max);
}

void RerunStateMachine::report_stats() {
  // Every rank's statistics to rank 0, which keeps the totals; the others start afresh.
  nlohmann::json mine = nlohmann::json::object();
  for (const auto& [message, st] : stats_) {
    nlohmann::json entry = nlohmann::json::object();
    entry["samples"] = nlohmann::json(st.samples);
    entry["zeros"] = st.zeros;
    entry["max"] = st.max;
    mine[message] = std::move(entry);
  }
  const std::vector<std::string> all = o_.gather(mine.dump());
  if (o_.identity.rank != 0) {
    stats_.clear();
    return;
  }
  for (size_t r = 1; r < all.size(); ++r) {
    const nlohmann::json theirs = nlohmann::json::parse(all[r]);
    for (auto it = theirs.begin(); it != theirs.end(); ++it) {
      const nlohmann::json& st = it.value();
      Stats& s = stats_[it.key()];
      for (double d : st["samples"].get<std::vector<double>>())
        if (s.samples.size() < kMaxStatSamples) s.samples.push_back(d);
      s.zeros += st["zeros"].get<int64_t>();
      s.max = std::max(s.max, st["max"].get<double>());
    }
  }
  std::string text = "Stats on computation determinism in validation calls";
  for (auto& [message, st] : stats_) text += "\n  " + message + ": " + st.describe();
  o_.log_first(text);
}

bool RerunStateMachine::has_checkpoint_state() const {
  return mode_ != RerunMode::kDisabled && state_ == RerunState::kWillRerunFromCheckpoint;
}

nlohmann::json RerunStateMachine::common_state() const {
  return {{"mode", mode_name(mode_)},
          {"state", static_cast<int>(state_)},
          {"current_iteration", iteration_}};
}

nlohmann::json RerunStateMachine::rank_state() const {
  nlohmann::json j = {{"rerun_requested", rerun_requested_},
                      {"checkpoint_requested", checkpoint_requested_},
                      {"restart_again_requested", restart_again_requested_},
                      {"continue_requested", continue_requested_},
                      {"initial_result", number(initial_result_)},
                      {"suspicious_node", suspicious_node_},
                      {"suspicious_device", suspicious_device_},
                      {"large_value_counts", large_value_counts_},
                      {"max_values", max_values_}};
  j["failed_validation_call"] = failed_call_ ? nlohmann::json{{"message", failed_call_->message},
                                                              {"sequence", failed_call_->sequence}}
                                             : nlohmann::json();
  j["injected_error_type"] =
      injected_ ? nlohmann::json(diagnostic_name(*injected_)) : nlohmann::json();
  return j;
}

void RerunStateMachine::load(const nlohmann::json& common, const nlohmann::json& mine) {
  if (mode_ == RerunMode::kDisabled) {
    o_.log_first("RerunStateMachine disabled via CLI, ignoring machine state saved in checkpoint");
    return;
  }
  o_.log_first("Getting RerunStateMachine state from checkpoint. Will rerun step.");
  mode_ = parse_rerun_mode(common.at("mode").get<std::string>());
  state_ = static_cast<RerunState>(common.at("state").get<int>());
  iteration_ = common.at("current_iteration").get<int64_t>();
  rerun_requested_ = mine.at("rerun_requested").get<bool>();
  checkpoint_requested_ = mine.at("checkpoint_requested").get<bool>();
  restart_again_requested_ = mine.at("restart_again_requested").get<bool>();
  continue_requested_ = mine.at("continue_requested").get<bool>();
  initial_result_ = parse_number(mine.at("initial_result"));
  suspicious_node_ = mine.at("suspicious_node").get<std::string>();
  suspicious_device_ = mine.at("suspicious_device").get<int>();
  large_value_counts_ = mine.at("large_value_counts").get<std::map<std::string, int64_t>>();
  max_values_ = mine.at("max_values").get<std::map<std::string, double>>();
  failed_call_.reset();
  if (const nlohmann::json& c = mine.at("failed_validation_call"); !c.is_null())
    failed_call_ = Call{c.at("message").get<std::string>(), c.at("sequence").get<int64_t>()};
  injected_.reset();
  if (const nlohmann::json& t = mine.at("injected_error_type"); !t.is_null())
    injected_ = parse_rerun_diagnostic(t.get<std::string>());
}

std::vector<int64_t> skipped_iterations_from_tracker(const std::string& path,
                                                     std::vector<int64_t>* not_skipped) {
  std::set<int64_t> potential, ignore;
  std::set<std::pair<int64_t, int64_t>> seen;                                // (rank, iteration)
  std::map<std::string, std::map<int64_t, std::set<int64_t>>> ranks_by_job;  // job -> it -> ranks
  std::ifstream in(path);
  const std::regex re(
      "ts=.+ node=.+ device=.+ jobID=(.+) rank=(.+) iteration=(.+) status=(.+) result=.+ "
      "message=.+");
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, re)) continue;
    char* end = nullptr;
    const std::string rank_s = m[2].str(), it_s = m[3].str();
    const long long rank = std::strtoll(rank_s.c_str(), &end, 10);
    if (end == rank_s.c_str() || *end) continue;
    const long long it = std::strtoll(it_s.c_str(), &end, 10);
    if (end == it_s.c_str() || *end) continue;
    // "first_rerun_reproducible" or Python 3.12's "RerunValidationStatus.FIRST_RERUN_...".
    std::string status = m[4].str();
    status = status.substr(status.rfind('.') == std::string::npos ? 0 : status.rfind('.') + 1);
    std::transform(status.begin(), status.end(), status.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    if (status != "RERUN_DISABLED" && status != "FIRST_RERUN_REPRODUCIBLE" &&
        status != "SECOND_RERUN_REPRODUCIBLE")
      continue;
    if (seen.count({rank, it})) potential.insert(it);
    seen.insert({rank, it});
    std::set<int64_t>& ranks = ranks_by_job[m[1].str()][it];
    ranks.insert(rank);
    if (ranks.size() > 1) ignore.insert(it);
  }
  std::vector<int64_t> skip;
  for (int64_t it : potential)
    if (!ignore.count(it)) skip.push_back(it);
  if (not_skipped) not_skipped->assign(ignore.begin(), ignore.end());
  return skip;
}

}  // namespace megatron
