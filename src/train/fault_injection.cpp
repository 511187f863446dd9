// Parsing and firing of the --inject-fault testing hook.
#include "train/fault_injection.h"

#include <chrono>
#include <stdexcept>
#include <thread>

#include "core/error.h"
#include "core/logging.h"

namespace megatron {

namespace {
bool parse_int(const std::string& s, int64_t* out) {
  try {
    size_t used = 0;
    *out = std::stoll(s, &used);
    return used == s.size() && !s.empty();
  } catch (const std::logic_error&) {
    return false;
  }
}
}  // namespace

FaultInjection FaultInjection::parse(const std::string& spec) {
  FaultInjection f;
  if (spec.empty()) return f;
  const size_t a = spec.find(':'), b = a == std::string::npos ? a : spec.find(':', a + 1);
  MEGATRON_CHECK(b != std::string::npos,
                 "--inject-fault expects KIND:RANK:ITERATION (e.g. "
                 "exception:1:3), got '",
                 spec, "'");
  const std::string kind = spec.substr(0, a);
  if (kind == "exception") {
    f.kind = Kind::kException;
  } else if (kind == "inf-grad") {
    f.kind = Kind::kInfGrad;
  } else if (kind == "hang") {
    f.kind = Kind::kHang;
  } else if (kind == "kill-in-save") {
    f.kind = Kind::kKillInSave;
  } else if (kind == "fail-in-save") {
    f.kind = Kind::kFailInSave;
  } else if (kind == "flip-weight") {
    f.kind = Kind::kFlipWeight;
  } else {
    MEGATRON_CHECK(false, "--inject-fault: unknown kind '", kind,
                   "' (known: exception, inf-grad, hang, kill-in-save, fail-in-save, "
                   "flip-weight)");
  }
  int64_t rank = -1;
  const std::string iters = spec.substr(b + 1);
  const size_t dash = iters.find('-', 1);
  f.last_iteration = -2;
  const bool ok =
      parse_int(spec.substr(a + 1, b - a - 1), &rank) &&
      (dash == std::string::npos ? parse_int(iters, &f.iteration)
                                 : parse_int(iters.substr(0, dash), &f.iteration) &&
                                       parse_int(iters.substr(dash + 1), &f.last_iteration));
  MEGATRON_CHECK(ok,
                 "--inject-fault: RANK and ITERATION must be integers (ITERATION may be a "
                 "range FIRST-LAST), got '",
                 spec, "'");
  if (f.last_iteration == -2) f.last_iteration = f.iteration;
  MEGATRON_CHECK(f.last_iteration >= f.iteration, "--inject-fault: empty iteration range in '",
                 spec, "'");
  f.rank = static_cast<int>(rank);
  MEGATRON_CHECK(f.rank >= 0 && f.iteration >= 1,
                 "--inject-fault: RANK must be >= 0 and "
                 "ITERATION >= 1, got '",
                 spec, "'");
  return f;
}

void FaultInjection::at_iteration_start(int world_rank, int64_t it) const {
  if (kind == Kind::kException && world_rank == rank && it == iteration) {
    throw std::runtime_error(
        strprintf("injected fault (--inject-fault): rank %d fails at the "
                  "start of iteration %ld",
                  rank, static_cast<long>(it)));
  }
  if (kind == Kind::kHang && world_rank == rank && it == iteration) {
    log_error(
        strprintf("[rank %d] injected fault (--inject-fault): rank %d hangs at the start "
                  "of iteration %ld",
                  rank, rank, static_cast<long>(it)));
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

}  // namespace megatron
