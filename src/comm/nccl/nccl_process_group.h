// NcclProcessGroup: collectives on GPU memory through NCCL, beside an MPI group of the same ranks.
//
// GPU tensors go to NCCL on the device's stream (the legacy default stream the kernels run on):
// the collective is ordered after the kernels that produced its input and before those that read
// its output, and any read back to the host waits for it, so its Work is complete at once. Host
// tensors (the trainer's loss and timing scalars) go to the MPI group, as do point-to-point
// transfers: the pipeline matches messages by tag, and NCCL's send/recv has no tags (its Work
// stages GPU tensors through the host). NCCL refuses two ranks on one GPU: with more ranks than
// GPUs on a node the trainer keeps MPI with host staging (ProcessGroup's default for GPU
// tensors).
#pragma once

#include <memory>
#include <vector>

#include "comm/process_group.h"

namespace megatron {

// Whether this build has NCCL (the CUDA device with the toolkit's NCCL).
bool nccl_available();

// A group over the ranks of `host` (an MPI group), with a NCCL communicator created collectively
// (rank 0 of `host` makes the id, `host` broadcasts it). Collective over `host`. Throws
// InvalidArgument where the build has no NCCL.
std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<ProcessGroup> host);

}  // namespace megatron
