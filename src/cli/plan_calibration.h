// The `cpu` cluster of `megatron plan`: this machine measured, one rank per "device".
//
// A rank runs `threads` OpenMP threads (the machine's cores shared among the planned ranks, as
// the trainer does); with more ranks than cores each rank has a share of a core, so its measured
// times stretch by ranks / cores. Measured once per process and cached per shape: every GEMM
// shape the model asks for (oneDNN, the trainer's own call, median of several runs), the core
// attention at each shape (the trainer's kernel, forward and backward), and the memory bandwidth
// of an elementwise pass. Collectives: under mpiexec with two or more ranks, an all-reduce
// and an all-gather of several sizes on this job's ranks fit latency + bytes / bandwidth; alone,
// shared memory is modelled as two copies per byte (Open MPI's copy in, copy out) and a 20 us
// step. What it is not: a model of another machine (run it there).
#pragma once

#include <cstdint>

#include "comm/process_group.h"
#include "plan/cluster.h"

namespace megatron::cli {

// ranks: the ranks planned on this machine; cores: its cores; world: this job's group (null or
// size 1: no collective measurement).
plan::Cluster calibrate_cpu_cluster(int64_t ranks, int64_t cores, ProcessGroup* world);

}  // namespace megatron::cli
