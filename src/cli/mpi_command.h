// What every subcommand that runs as an MPI job shares (train, generate, serve, evaluate): the
// argument phase that every rank passes or fails together, and the mapping of errors to exit
// codes without leaving a rank waiting in a collective.
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "comm/mpi_runtime.h"

namespace megatron::cli {

// Parses argv into `app` on every rank and runs `validate` (which throws InvalidArgument for
// bad input); then the ranks agree before the first collective. Returns -1 to go on, or the exit
// code every rank returns: 0 after --help (printed once by rank 0), 2 for bad input (every
// rank's reason printed by rank 0 as one block, a line per rank, so that lines never interleave).
int agreed_argument_phase(const MpiRuntime& mpi, CLI::App& app, int argc, char** argv,
                          const std::function<void()>& validate);

// Runs `body` (the command after MPI is up) and turns its errors into exit codes: an
// AgreedFailure (every rank stopped at the same point) is printed once and returns its code; in
// a one-process world any other error propagates to main(); with several ranks an error on one
// rank aborts the job (exit code 2 for bad input, 1 otherwise), so no rank waits forever.
int run_mpi_command(MpiRuntime& mpi, const std::function<int(MpiRuntime&)>& body);

}  // namespace megatron::cli
