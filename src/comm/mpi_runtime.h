// MpiRuntime: MPI's lifetime and what a process learns from its launcher.
//
// One object, owned by main(): the constructor initialises MPI (MPI_Init_thread, the main thread
// alone calls MPI) and the destructor finalises it. Rank and world size come from
// MPI_COMM_WORLD, the local rank from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED): the ranks that
// share this node's memory. Nothing reads launcher-specific environment variables, so the same
// binary runs under `mpirun`/`mpiexec` and under Slurm's `srun` (`srun --mpi=pmix`); they are
// only looked for to tell a process started alone, which gets Open MPI's lighter singleton start
// (defaults the user's environment overrides; mpi_runtime.cpp).
//
// It is not a launcher, and it does not choose a parallel layout (ParallelState does).
#pragma once

#include <memory>

#include "comm/process_group.h"

namespace megatron {

// OpenMP threads per rank: this node's cores shared evenly among its ranks, capped by the cores
// this rank may run on (a launcher that binds each rank to fewer cores wins), at least one.
// node_cores: distinct cores available to the node's ranks together; own_cores: cores in this
// rank's affinity mask; local_ranks: ranks on this node.
int threads_per_rank(int node_cores, int own_cores, int local_ranks);

class MpiRuntime {
 public:
  // Initialises MPI; argc and argv may be null. If MPI is already initialised (by a host
  // program), this object uses it and leaves finalising to whoever initialised it.
  MpiRuntime(int* argc, char*** argv);
  MpiRuntime() : MpiRuntime(nullptr, nullptr) {}
  // Releases the world group and finalises MPI if this object initialised it.
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // Rank among the processes on this node, and how many there are.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // Distinct cores in the affinity masks of this node's ranks.
  int node_cores() const { return node_cores_; }
  // threads_per_rank() for this process: the default for --num-threads style settings.
  int default_threads_per_rank() const;

  // Every process, ranked as in MPI_COMM_WORLD (over a duplicate of it, so our traffic never
  // mixes with a host program's).
  const std::shared_ptr<ProcessGroup>& world() const { return world_; }

  // Ends every process of the job with `exit_code` (MPI_Abort): what a failing rank calls so
  // that no peer waits forever in a collective.
  [[noreturn]] static void abort(int exit_code);

 private:
  bool finalize_ = false;
  int rank_ = 0, world_size_ = 1, local_rank_ = 0, local_size_ = 1, node_cores_ = 1;
  std::shared_ptr<ProcessGroup> world_;
};

}  // namespace megatron
