// RerunStateMachine: Megatron's result validation with in-place re-runs (--rerun-mode), which
// tells a transient hardware fault from a reproducible result before the optimizer applies it.
//
// Results are validated where Megatron validates them: each micro-batch's local loss sum on the
// last pipeline stage (NaN, Inf; spiky with --check-for-spiky-loss) and each gradient bucket's
// local norm before its data-parallel reduction (NaN, Inf; unexpectedly large with
// --check-for-large-grads). With validate_results (Megatron's default), a rejected result on any
// rank makes every rank re-run the iteration's forward and backward in place (the same batches,
// dropout masks and FP8 state):
//   - not reproducible: a transient fault. A checkpoint of the last completed iteration is
//     saved and every rank exits 17 (Megatron's EXIT_CODE_FAILED_ON_RESULT_VALIDATION).
//   - reproducible: the checkpoint carries the machine's state, every rank exits 16
//     (EXIT_CODE_RESUME_TO_DISAMBIGUATE). The job restarted from it re-runs the iteration; on the
//     node and device of the rank that saw the result it exits 16 again (no new checkpoint), on
//     another one the result is compared again: a different result means the first device was
//     faulty (exit 17), the same result is a correct one, fatal for NaN and Inf (exit 17),
//     training continues for a spiky loss or large gradients.
// The first iteration of a job is not validated (Megatron's rule: a checkpoint needs a step).
// disabled validates without re-running (a rejected result ends the run); report_stats re-runs
// every iteration once and reports how far the results differ (the determinism of the step).
//
// Megatron's semantics (megatron/core/rerun_state_machine.py, core_r0.14.0) with these choices:
// the machine runs for every model (Megatron's GPT and Mamba loss functions only); a node is
// named by $SLURMD_NODENAME, else the host name, and a device is the CUDA device or, on the CPU,
// the local rank; a checkpoint saved on a transient fault records no machine state (Megatron's
// would resume into a re-run it cannot finish: the iteration simply runs again); error
// injection draws from a hash of (seed, iteration, validation, rank) instead of Python's random
// module; Megatron r0.14's report_stats value fails its own enum conversion (its mode is named
// report_determinism_stats) and is taken here as meant; each message's statistics are reported
// under the message (Megatron's report reads caller fields it does not record).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace megatron {

enum class RerunMode { kDisabled, kValidateResults, kReportStats };
// Megatron's RerunState, with its numbers (they are in checkpoints).
enum class RerunState : int {
  kNotRunningYet = 0,
  kInitialRun = 1,
  kRerunningInPlace = 2,
  kWillRerunFromCheckpoint = 3,
  kRerunningFromCheckpoint = 4,
  kRerunningAgainFromCheckpoint = 5,
};
// --error-injection-type: what an injected rejection turns out to be.
enum class RerunDiagnostic { kCorrectResult, kTransientError, kPersistentError };

// Flag values; InvalidArgument naming the flag otherwise.
RerunMode parse_rerun_mode(const std::string& value);
RerunDiagnostic parse_rerun_diagnostic(const std::string& value);

// Where a rank runs, to tell whether a re-run from a checkpoint landed elsewhere.
struct RerunIdentity {
  int rank = 0;
  std::string node;
  int device = 0;
};
// This process's identity: $SLURMD_NODENAME or the host name, and `device` as given (the
// command's: the rank's CUDA device, else its local rank on the node).
RerunIdentity this_rerun_identity(int rank, int device);

class RerunStateMachine {
 public:
  struct Options {
    RerunMode mode = RerunMode::kValidateResults;
    int64_t error_injection_rate = 0;  // inject about once in this many validations; 0: never
    RerunDiagnostic error_injection_type = RerunDiagnostic::kTransientError;
    uint64_t seed = 0;  // of the injection draws
    // Whether any result is validated at all (a check flag is on): without, no rank can ask for
    // a re-run and the passes end without a collective.
    bool validations = true;
    std::string tracker_file;  // --result-rejected-tracker-filename; empty: none
    RerunIdentity identity;
    // Whether any rank of the world passes true (an all-reduce; collective).
    std::function<bool(bool)> any_rank;
    // Every rank's string, in rank order (collective): report_stats gathers its statistics.
    std::function<std::vector<std::string>(const std::string&)> gather;
    // Megatron's messages: rank 0's warnings, and each rank's own warnings and errors.
    std::function<void(const std::string&)> log_first;
    std::function<void(const std::string&)> log_warning;
    std::function<void(const std::string&)> log_error;
  };
  // Throws InvalidArgument naming --result-rejected-tracker-filename if it cannot be appended to.
  explicit RerunStateMachine(Options options);

  // The loop around an iteration's forward and backward (collective after the first pass):
  //   while (m.should_run_forward_backward(it)) { ...zero gradients, forward, backward... }
  // `iteration` is the iteration being run (the logged number). True once for the first run and
  // again for each re-run; the caller restores what a pass changes (replays the same batches).
  bool should_run_forward_backward(int64_t iteration);
  // After the loop: whether to save the last completed iteration and whether to exit, with which
  // code (16 or 17). Megatron's should_checkpoint_and_exit.
  struct Decision {
    bool checkpoint = false;
    bool exit = false;
    int code = 0;
  };
  Decision should_checkpoint_and_exit();
  // The iteration is skipped (--iterations-to-skip, a tracker file): a re-run of it pending from
  // a checkpoint is dropped and normal execution resumes (Megatron's dummy step would leave the
  // machine mid re-run and exit 17 on the next iteration).
  void skip_iteration(int64_t iteration);
  // Whether a validate() now looks at its result: callers may skip computing one otherwise.
  bool wants_results() const;
  // Megatron's validate_result for one scalar. reject(result): whether it fails validation.
  // tolerance: the relative difference a re-run may show and still reproduce it. fatal: exit
  // even when a re-run elsewhere confirms the result. Throws std::runtime_error (exit 1) on a
  // rejection in disabled mode.
  void validate(double result, const std::function<bool(double)>& reject,
                const std::string& message, double tolerance, bool fatal);
  // Megatron's is_unexpectedly_large: the first num_samples values (NaN/Inf ignored) set the
  // maximum; later ones are rejected at threshold times it or more.
  bool is_unexpectedly_large(double value, double threshold, const std::string& context,
                             int num_samples = 100);

  RerunMode mode() const { return mode_; }
  RerunState state() const { return state_; }

  // Checkpoint record: null when there is nothing to resume (no re-run pending). rank_state is
  // this rank's part (the caller gathers them); common_state the part every rank shares.
  bool has_checkpoint_state() const;
  nlohmann::json common_state() const;
  nlohmann::json rank_state() const;
  // Restores a record saved by a job of the same layout (the caller checks it). Ignored, with a
  // note, in disabled mode.
  void load(const nlohmann::json& common, const nlohmann::json& mine);

 private:
  struct Call {
    std::string message;
    int64_t sequence = 0;
    bool operator==(const Call&) const = default;
  };
  // Megatron's QuickStats: relative differences between a result and its re-run.
  struct Stats {
    std::vector<double> samples;
    int64_t zeros = 0;
    double max = 0;
    void record(double d);
    std::string describe();
  };
  void log_rejection(const std::string& status, double result, const std::string& message) const;
  bool maybe_inject();
  double maybe_miscompare(double initial, double result);
  void report_stats();

  Options o_;
  RerunMode mode_;
  RerunState state_ = RerunState::kNotRunningYet;
  int64_t iteration_ = 0;
  bool first_iteration_complete_ = false;
  bool logged_enabled_ = false;
  // Per-rank requests, agreed on over the world at the end of a pass.
  bool rerun_requested_ = false, checkpoint_requested_ = false;
  bool restart_again_requested_ = false, continue_requested_ = false;
  std::map<std::string, int64_t> calls_this_pass_;  // validations per message
  int64_t validations_this_pass_ = 0;               // all messages (injection draws)
  std::optional<Call> failed_call_;
  double initial_result_ = 0;
  std::string suspicious_node_;
  int suspicious_device_ = -1;
  std::optional<RerunDiagnostic> injected_;  // an injection not yet resolved
  std::map<std::string, int64_t> large_value_counts_;
  std::map<std::string, double> max_values_;
  // report_stats: the initial pass's results by call, and each message's differences.
  std::map<std::pair<std::string, int64_t>, double> saved_results_;
  std::map<std::string, Stats> stats_;
};

// Megatron's get_skipped_iterations_from_tracker_file: the iterations a tracker file shows
// rejected twice on the same rank (reruns disabled, or reproducible in a re-run), unless more
// than one rank of a job rejected them. The logged iteration numbers, ascending; a missing file
// gives none. not_skipped (optional): those left out because several ranks rejected them.
std::vector<int64_t> skipped_iterations_from_tracker(const std::string& path,
                                                     std::vector<int64_t>* not_skipped = nullptr);

}  // namespace megatron
