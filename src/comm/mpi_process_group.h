// MpiProcessGroup: ProcessGroup over an MPI communicator.
//
// Blocking operations use MPI's blocking calls, asynchronous ones the MPI-3 nonblocking
// collectives (MPI_Iallreduce, ...) and MPI_Isend/MPI_Irecv; their Work waits with MPI_Waitall.
// Open MPI advances a nonblocking collective only inside MPI calls, so an overlapped reduction
// progresses when someone waits on it or polls Work::is_completed(). Subgroups come from
// MPI_Comm_split. MPI counts are int: all-reduce, broadcast and send/recv split a larger tensor
// into several calls; gather, scatter and all-to-all require each rank's part to fit in one.
//
// MPI errors keep MPI's default handler (MPI_ERRORS_ARE_FATAL): a failed transfer aborts the
// whole job with MPI's message instead of leaving peers waiting. <mpi.h> appears only here and in
// mpi_runtime.cpp: the rest of the code sees ProcessGroup.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "comm/process_group.h"

namespace megatron {

class MpiProcessGroup final : public ProcessGroup {
 public:
  // A group over `comm`. With `owns_comm` the group frees the communicator when destroyed
  // (unless MPI has been finalized by then). Global ranks are ranks in MPI_COMM_WORLD.
  explicit MpiProcessGroup(MPI_Comm comm, bool owns_comm = false);
  ~MpiProcessGroup() override;

  MPI_Comm comm() const { return comm_; }

  // Largest number of elements one MPI call carries (default INT_MAX, MPI's count limit); tests
  // lower it to exercise the split into several calls.
  void set_max_count_per_call(int64_t n);

 protected:
  Work do_all_reduce(Tensor& t, ReduceOp op, bool async) override;
  Work do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op, bool async) override;
  Work do_all_gather(Tensor& out, const Tensor& in, bool async) override;
  Work do_broadcast(Tensor& t, int root, bool async) override;
  Work do_all_to_all(Tensor& out, const Tensor& in, bool async) override;
  Work do_all_to_all_v(Tensor& out, const Tensor& in, const std::vector<int64_t>& send,
                       const std::vector<int64_t>& recv) override;
  Work do_all_gather_v(Tensor& out, const Tensor& in, const std::vector<int64_t>& counts) override;
  Work do_send(const Tensor& t, int dst, int tag, bool async) override;
  Work do_recv(Tensor& t, int src, int tag, bool async) override;
  Work do_barrier(bool async) override;
  std::shared_ptr<ProcessGroup> do_split(const RankGroups& groups, int color, int key,
                                         std::vector<int> members) override;

 private:
  MpiProcessGroup(MPI_Comm comm, bool owns_comm, int rank, std::vector<int> global_ranks);

  // [offset, count) pieces of at most max_count_per_call_ elements covering numel elements; at
  // least one piece, so an empty tensor still sends and receives its (empty) message.
  std::vector<std::pair<int64_t, int>> pieces(int64_t numel) const;
  // Checks that one rank's share of a collective fits in an MPI count.
  int checked_count(int64_t n, const char* op) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owns_comm_ = false;
  int64_t max_count_per_call_;
  int tag_ub_ = 32767;  // the largest tag MPI guarantees; replaced by MPI_TAG_UB
};

}  // namespace megatron
