// The shared MPI argument phase and error handling of the job subcommands (mpi_command.h).
#include "cli/mpi_command.h"

#include <cstdio>
#include <vector>

#include "cli/arg_table.h"
#include "comm/agreement.h"
#include "core/logging.h"
#include "tensor/tensor.h"

namespace megatron::cli {

namespace {

// Exit code every rank agrees on after the argument phase: the largest code any rank reached
// (-1 = go on, 0 = --help printed, 2 = bad input). The phase talks to no other rank; the
// agreement comes before the first collective, so all ranks then leave together with exit code 2
// and no rank is killed before its reason is printed.
int agree_on_exit_code(const MpiRuntime& mpi, int rc) {
  if (mpi.world_size() == 1) return rc;
  Tensor worst = Tensor::empty({1}, DType::kF64);
  worst.data<double>()[0] = rc;
  mpi.world()->all_reduce(worst, ReduceOp::kMax);
  return static_cast<int>(worst.data<double>()[0]);
}

// One block printed by rank 0 with a line per rank ("[rank r] ..."; `silent` for a rank with no
// message of its own): ranks writing their own lines at once interleave mid-line under mpirun's
// output forwarding.
void log_rank_block(const std::vector<std::string>& all, const char* silent) {
  std::string block;
  for (size_t r = 0; r < all.size(); ++r) {
    block += (r == 0 ? "" : "\nerror: ") +
             strprintf("[rank %zu] %s", r, all[r].empty() ? silent : all[r].c_str());
  }
  log_error(block);
}

// Each rank's reason for refusing the arguments (empty if it had none). Collective over the world.
void report_refusals(const MpiRuntime& mpi, const std::string& refusal) {
  if (mpi.world_size() == 1) {
    if (!refusal.empty()) log_error(refusal);
    return;
  }
  const std::vector<std::string> all = all_gather_strings(*mpi.world(), refusal);
  if (mpi.rank() == 0) log_rank_block(all, "stopping: another rank refused the arguments");
}

}  // namespace

int agreed_argument_phase(const MpiRuntime& mpi, CLI::App& app, int argc, char** argv,
                          const std::function<void()>& validate) {
  int rc = -1;
  std::string refusal, help;
  try {
    std::string message;
    rc = parse_quietly(app, argc, argv, &message);
    (rc == 0 ? help : refusal) = message;
    if (rc < 0) validate();
  } catch (const InvalidArgument& e) {
    if (mpi.world_size() == 1) throw;
    refusal = e.what();
    rc = 2;
  }
  const int agreed = agree_on_exit_code(mpi, rc);
  if (agreed == 0 && mpi.rank() == 0) std::fputs(help.c_str(), stdout);
  if (agreed == 2) report_refusals(mpi, refusal);
  return agreed;
}

int run_mpi_command(MpiRuntime& mpi, const std::function<int(MpiRuntime&)>& body) {
  try {
    return body(mpi);
  } catch (const AgreedFailure& e) {
    // Every rank stopped at the same point, no rank is left waiting, and rank 0 speaks for all of
    // them: each rank's own message where the failure carries them, else the lowest failing
    // rank's.
    if (mpi.world_size() == 1) {
      log_error(e.what());
    } else if (!e.messages().empty()) {
      if (mpi.rank() == 0) log_rank_block(e.messages(), "stopping with the other ranks");
    } else if (mpi.rank() == 0) {
      log_error(strprintf("[rank 0] all %d ranks stopped: %s", mpi.world_size(), e.what()));
    }
    return e.exit_code();
  } catch (const InvalidArgument& e) {
    if (mpi.world_size() == 1) throw;
    log_error(strprintf("[rank %d] %s", mpi.rank(), e.what()));
    MpiRuntime::abort(2);
  } catch (const std::exception& e) {
    if (mpi.world_size() == 1) throw;
    log_error(strprintf("[rank %d] %s", mpi.rank(), e.what()));
    MpiRuntime::abort(1);
  }
  return 1;
}

}  // namespace megatron::cli
