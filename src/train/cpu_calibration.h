// The `cpu` cluster of the planner: this machine measured, one rank per "device" (`megatron plan
// --gpu cpu`, and the trainer's start-up prediction of its own step).
//
// A rank runs `threads` OpenMP threads (the machine's cores shared among the planned ranks, as
// the trainer does); when it is measured alone for more ranks than cores, each rank would have a
// share of a core, so its measured times stretch by `stretch` (ranks / cores). Measured once per
// process and cached per shape: every GEMM shape the model asks for (oneDNN, the trainer's own
// call, median of several runs), the core attention at each shape (the trainer's kernel, forward
// and backward), and the memory bandwidth of an elementwise pass. Collectives: under mpiexec with
// two or more ranks, an all-reduce and an all-gather of several sizes on this job's ranks fit
// latency + bytes / bandwidth; alone, shared memory is modelled as two copies per byte (Open MPI's
// copy in, copy out) and a 20 us step. What it is not: a model of another machine (run it there).
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/process_group.h"
#include "plan/cluster.h"

namespace megatron {

struct CpuCalibration {
  int64_t ranks = 1;          // the ranks planned on this machine (the cluster's devices)
  int threads = 1;            // OpenMP threads per rank
  double stretch = 1;         // the factor on measured times (>= 1)
  double ranks_per_core = 1;  // the planned ranks over the cores (>= 1)
  // The job's ranks on this machine, every one of which calls this (null or size 1: no
  // collective measurement).
  ProcessGroup* group = nullptr;
  // The device peaks (MFU's denominator) in GFLOP/s; 0: measured on a 1024^3 GEMM.
  double peak_fp32_gflops = 0, peak_16bit_gflops = 0;
  // The memory-bandwidth probe's two buffers together (a run passes what its optimizer sweeps
  // anyway, so that the probe never raises its peak memory).
  int64_t probe_bytes = int64_t{32} << 20;
  // Each shape's timing: the median of runs over `budget` seconds and at least `min_runs` after a
  // warm-up call (the trainer takes one run: the warm-up builds the oneDNN primitives its first
  // step would build anyway, so its prediction costs about one more forward and backward of a
  // layer); the bandwidth and collective probes get ten budgets.
  double budget = 0.03;
  size_t min_runs = 3;
};
plan::Cluster calibrate_cpu_cluster(const CpuCalibration& options);

}  // namespace megatron
