// FaultInjection: the --inject-fault testing hook, "KIND:RANK:ITERATION" (ITERATION may be a
// range FIRST-LAST, for inf-grad).
//
// It lets the tests make one rank of a real job fail at a chosen iteration, to check what the
// rest of the job does: KIND "exception" throws a runtime error on world rank RANK at the start
// of ITERATION, as a rank whose step fails would (the CLI then aborts the whole MPI job with that
// rank's message); KIND "inf-grad" puts +inf into one local gradient of that rank after the
// iteration's backward, before any reduction, as an fp16 overflow would; KIND "hang" makes that
// rank sleep forever at the start of ITERATION (the watchdog test); KIND "kill-in-save" makes it
// kill itself (SIGKILL) in the middle of writing its file of the checkpoint of ITERATION (the
// torn-save test); KIND "fail-in-save" makes that file's write fail there as a full disk would
// (ENOSPC), to test that a failed save is agreed on and discarded; KIND "flip-weight" flips the
// lowest bit of the first compute weight of that rank's first parameter after ITERATION's step,
// as silent memory corruption would (the weight-hash check's test). It is not a chaos tool
// and does nothing unless the flag is given.
#pragma once

#include <cstdint>
#include <string>

namespace megatron {

struct FaultInjection {
  enum class Kind : uint8_t {
    kNone,
    kException,
    kInfGrad,
    kHang,
    kKillInSave,
    kFailInSave,
    kFlipWeight
  };
  Kind kind = Kind::kNone;
  int rank = -1;
  int64_t iteration = -1, last_iteration = -1;  // [iteration, last_iteration]

  // Parses the flag's value; empty: none. Throws InvalidArgument naming --inject-fault.
  static FaultInjection parse(const std::string& spec);
  // Throws the injected failure (exception), or hangs (hang), when this is `rank` at `iteration`.
  void at_iteration_start(int world_rank, int64_t it) const;
  // Whether this is `rank` at `iteration` of an inf-grad injection.
  bool inf_grad_at(int world_rank, int64_t it) const {
    return kind == Kind::kInfGrad && world_rank == rank && it >= iteration && it <= last_iteration;
  }
  // Whether this is `rank` after the step of `iteration` of a flip-weight injection.
  bool flip_weight_at(int world_rank, int64_t it) const {
    return kind == Kind::kFlipWeight && world_rank == rank && it >= iteration &&
           it <= last_iteration;
  }
};

}  // namespace megatron
