// Running a GoogleTest binary as every rank of an MPI job: only rank 0 keeps gtest's printer
// (other ranks print their failures tagged with the rank), a binary launched as N singletons
// fails instead of passing alone, and any rank's failure fails every rank, so CTest sees it
// whichever process it looks at.
#pragma once

#include "comm/mpi_runtime.h"

namespace megatron::testing {

// The value of --world-size=N in argv (0 when absent).
int expected_world_size(int argc, char** argv);

// RUN_ALL_TESTS on this rank; returns the process exit code (0 only if every rank passed).
int run_all_tests_on_every_rank(MpiRuntime& runtime, int expected_world);

}  // namespace megatron::testing
