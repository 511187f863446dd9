// The exit codes of `megatron train`, for schedulers and wrapper scripts.
//
//   0  training finished (--train-iters, or --exit-interval reached)
//   1  runtime failure: a rank failed, a save failed, the watchdog fired, the loss diverged
//   2  bad input: flags, data, tokenizer or checkpoint files; the message names them
//   3  saved and exited early on --exit-signal or --exit-duration-in-mins: requeue the job,
//      it resumes from the checkpoint just written (Megatron exits 0 here; a distinct code lets
//      `sbatch` scripts tell "finished" from "interrupted")
//  16  a result failed validation and reproduced in a re-run (--rerun-mode validate_results):
//      resume from the checkpoint just written, on other nodes, to establish a diagnostic
//      (Megatron's EXIT_CODE_RESUME_TO_DISAMBIGUATE); also when that re-run landed on the same
//      node and device again
//  17  a result failed validation and the diagnostic is final: a transient fault (the
//      checkpoint of the last iteration was saved), a fault of the first device, or a correct
//      but fatal result such as a reproducible NaN (Megatron's
//      EXIT_CODE_FAILED_ON_RESULT_VALIDATION)
#pragma once

namespace megatron {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitSavedRequeue = 3;
inline constexpr int kExitResumeToDisambiguate = 16;
inline constexpr int kExitFailedOnResultValidation = 17;

}  // namespace megatron
