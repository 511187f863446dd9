// MPI initialisation and finalisation, local rank from the shared-memory communicator, and the
// default thread count per rank.
#include "comm/mpi_runtime.h"

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "comm/mpi_process_group.h"
#include "core/error.h"
#include "core/threads.h"

namespace megatron {

int threads_per_rank(int node_cores, int own_cores, int local_ranks) {
  MEGATRON_CHECK(node_cores >= 1 && own_cores >= 1 && local_ranks >= 1,
                 "threads_per_rank: node cores (", node_cores, "), own cores (", own_cores,
                 ") and local ranks (", local_ranks, ") must all be >= 1");
  return std::min(std::max(1, node_cores / local_ranks), own_cores);
}

namespace {

void check_mpi(int rc, const char* what) {
  MEGATRON_CHECK(rc == MPI_SUCCESS, what, " failed with MPI error ", rc,
                 "; is the job started by mpirun/mpiexec or srun --mpi=pmix?");
}

// Distinct cores in the union of the affinity masks of `node`'s ranks. Launchers bind ranks in
// many ways (to a core, a socket, nothing); the union is what the node gives this job.
int node_core_count(MPI_Comm node, int local_size) {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof(mine), &mine) != 0) {
    for (int c = 0; c < available_cores() && c < CPU_SETSIZE; ++c) CPU_SET(c, &mine);
  }
  std::vector<cpu_set_t> all(local_size);
  check_mpi(MPI_Allgather(&mine, sizeof(cpu_set_t), MPI_BYTE, all.data(), sizeof(cpu_set_t),
                          MPI_BYTE, node),
            "MPI_Allgather");
  cpu_set_t any;
  CPU_ZERO(&any);
  for (cpu_set_t& s : all) CPU_OR(&any, &any, &s);
  return std::max(1, CPU_COUNT(&any));
}

// True when some launcher started this process (Open MPI's mpirun, a PMIx or PMI server: srun,
// Hydra): each sets one of these before exec.
bool started_by_launcher() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "PMI_FD"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

// A process started alone (`megatron train ...` on a laptop, every one-process test) is an MPI
// singleton. Open MPI then forks a daemon for dynamic process management we never use and probes
// UCX's network transports for a job that has no peer: 0.37 s of MPI_Init, 0.05 s of
// MPI_Finalize, against 0.04 s and 0.01 s for an isolated singleton on its own messaging layer
// (ob1). Defaults only: a value the user set wins, and under a launcher the transports are left
// to it (other MPI libraries ignore these variables).
void prefer_light_singleton() {
  setenv("OMPI_MCA_ess_singleton_isolated", "1", /*overwrite=*/0);  // read by singletons alone
  if (!started_by_launcher()) setenv("OMPI_MCA_pml", "ob1", /*overwrite=*/0);
}

}  // namespace

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    prefer_light_singleton();
    // Kernels run OpenMP threads, but only the main thread calls MPI.
    int provided = 0;
    check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    finalize_ = true;
    MEGATRON_CHECK(provided >= MPI_THREAD_FUNNELED,
                   "this MPI library does not support MPI_THREAD_FUNNELED (provided level ",
                   provided, ")");
  }
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &world_size_), "MPI_Comm_size");

  MPI_Comm world = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup");
  world_ = std::make_shared<MpiProcessGroup>(world, /*owns_comm=*/true);

  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type");
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_size(node, &local_size_);
  node_cores_ = node_core_count(node, local_size_);
  MPI_Comm_free(&node);
}

MpiRuntime::~MpiRuntime() {
  world_.reset();
  if (!finalize_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

int MpiRuntime::default_threads_per_rank() const {
  return threads_per_rank(node_cores_, available_cores(), local_size_);
}

void MpiRuntime::abort(int exit_code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

}  // namespace megatron
