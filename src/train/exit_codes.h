// The exit codes of `megatron train`, for schedulers and wrapper scripts.
//
//   0  training finished (--train-iters, or --exit-interval reached)
//   1  runtime failure: a rank failed, a save failed, the watchdog fired, the loss diverged
//   2  bad input: flags, data, tokenizer or checkpoint files; the message names them
//   3  saved and exited early on --exit-signal or --exit-duration-in-mins: requeue the job,
//      it resumes from the checkpoint just written (Megatron exits 0 here; a distinct code lets
//      `sbatch` scripts tell "finished" from "interrupted")
#pragma once

namespace megatron {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitSavedRequeue = 3;

}  // namespace megatron
