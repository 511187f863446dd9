// The flags of Megatron's rerun state machine (train/rerun_state_machine.h) and of the result
// validations it runs: --rerun-mode, --error-injection-rate/-type,
// --result-rejected-tracker-filename, --check-for-spiky-loss, --check-for-large-grads.
#include "cli/train_args.h"
#include "core/error.h"
#include "train/rerun_state_machine.h"

namespace megatron::cli {

void register_rerun_args(ArgTable& t, Arguments& a) {
  t.negative_flag("--no-check-for-nan-in-loss-and-grad", "check_for_nan_in_loss_and_grad",
                  a.check_for_nan_in_loss_and_grad,
                  "Do not validate the loss and gradients for NaN/Inf (on by default; off with "
                  "dynamic fp16 loss scaling, where they drive the scale)");
  t.flag("--check-for-spiky-loss", a.check_for_spiky_loss,
         "Validate each micro-batch's loss against 10x the largest of the first 100 (a re-run "
         "decides; training continues when the spike reproduces elsewhere)");
  t.flag("--check-for-large-grads", a.check_for_large_grads,
         "Validate each gradient bucket's norm against 10x the largest of the first 100");
  t.add("--rerun-mode", a.rerun_mode,
        "validate_results (re-run an iteration whose result fails validation: exit 17 on a "
        "transient fault, 16 to resume elsewhere when it reproduces), disabled (a rejected "
        "result ends the run) or report_stats (run every iteration twice and report how far "
        "the results differ)");
  t.add("--error-injection-rate", a.error_injection_rate,
        "Inject a rejected result about once in this many validations (testing; 0: never)");
  t.add("--error-injection-type", a.error_injection_type,
        "What an injected rejection turns out to be: correct_result, transient_error or "
        "persistent_error");
  t.add("--result-rejected-tracker-filename", a.result_rejected_tracker_filename,
        "Append every rejected result to this file; at start-up, skip the iterations it shows "
        "rejected twice on one rank");
}

void validate_rerun_args(const Arguments& a) {
  parse_rerun_mode(a.rerun_mode);
  parse_rerun_diagnostic(a.error_injection_type);
  MEGATRON_CHECK(a.error_injection_rate >= 0, "--error-injection-rate must be >= 0, got ",
                 a.error_injection_rate);
}

}  // namespace megatron::cli
