// ProcessGroup: the collectives and point-to-point transfers of a group of ranks, on Tensors.
//
// This is the backend boundary: MpiProcessGroup implements it over an MPI communicator today, a
// NCCL implementation will fill the same hooks later. Callers see one contract:
//
//   all_reduce(t, op)        t = op over ranks of t, in place (op: sum or max)
//   reduce_scatter(out, in)  in: size * n elements; rank r gets elements [r*n, (r+1)*n) of the
//                            sum over ranks (out: n elements). On a [s, ...] tensor split on dim 0
//                            this is Megatron's reduce-scatter along the sequence.
//   all_gather(out, in)      out = concat(in of rank 0, ..., in of rank size-1), rank order
//   broadcast(t, root)       t = t of `root` on every rank
//   all_to_all(out, in)      in and out: size chunks of n elements; chunk j of in goes to rank j,
//                            chunk i of out comes from rank i
//   all_to_all_v(out, in, send_counts, recv_counts)
//                            the same with chunks of their own sizes (counts in elements, one
//                            per rank, in rank order; recv_counts[i] = rank i's send_counts[me]):
//                            MPI_Alltoallv, the MoE token exchange
//   all_gather_v(out, in, counts)
//                            out = concat(in of every rank), rank i contributing counts[i]
//                            elements (MPI_Allgatherv)
//   send(t, dst) / recv(t, src)  one tensor between two ranks; recv's tensor has the sent numel
//   barrier()
//
// Ranks (root, dst, src) are ranks within this group. Element counts are checked, shapes are not:
// every tensor is contiguous, so only the flat layout matters. Each operation has a blocking form
// and an asynchronous `_async` form returning a Work to wait on; the tensors must stay untouched
// until then. Every member must issue the same collectives in the same order, async or not.
//
// Dtypes: moves (gather, broadcast, all-to-all, send/recv) take any dtype bit for bit. Reductions
// take f32, f64, i32, i64 natively; bf16 and f16 are converted to f32, reduced in f32 and rounded
// back once, so the result is the correctly rounded f32 sum instead of a sum rounded after every
// addition (whose error would grow with the group size and depend on the reduction order).
//
// A size-1 group communicates nothing: reductions and broadcast leave the tensor as it is, and
// gather, reduce-scatter and all-to-all copy input to output when they are different buffers.
//
// A group is used by one thread at a time: MPI is initialised for calls from the main thread.
// This is not a launcher and not a rank-layout policy: see MpiRuntime and ParallelState.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/rank_generator.h"
#include "tensor/tensor.h"

namespace megatron {

enum class ReduceOp : uint8_t { kSum, kMax };

const char* reduce_op_name(ReduceOp op);

// A handle on an operation in flight. wait() blocks until it is complete and its outputs are
// written; a default-constructed Work is already complete. A Work dropped without wait() waits in
// its destructor, so a buffer can never be freed under a running transfer.
class Work {
 public:
  // What a backend provides for one in-flight operation.
  class Impl {
   public:
    virtual ~Impl() = default;
    // Blocks until done and finishes the outputs (e.g. converts an f32 result back to bf16).
    virtual void wait() = 0;
    // True when the transfer is done (then wait() no longer blocks). Polling also lets MPI make
    // progress on operations that it only advances inside its calls.
    virtual bool test() = 0;
  };

  Work() = default;
  explicit Work(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Work(Work&&) noexcept = default;
  Work& operator=(Work&& other) noexcept;  // waits for the operation it replaces
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  ~Work();

  void wait();
  // True once complete; completes the outputs when it returns true.
  bool is_completed();

 private:
  std::unique_ptr<Impl> impl_;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // This process's rank in the group, 0 <= rank < size.
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(global_ranks_.size()); }
  // The world rank of each member, in group-rank order.
  const std::vector<int>& global_ranks() const { return global_ranks_; }

  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::kSum);
  void reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::kSum);
  void all_gather(Tensor& out, const Tensor& in);
  void broadcast(Tensor& t, int root);
  void all_to_all(Tensor& out, const Tensor& in);
  void all_to_all_v(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_counts,
                    const std::vector<int64_t>& recv_counts);
  void all_gather_v(Tensor& out, const Tensor& in, const std::vector<int64_t>& counts);
  void send(const Tensor& t, int dst, int tag = 0);
  void recv(Tensor& t, int src, int tag = 0);
  void barrier();

  [[nodiscard]] Work all_reduce_async(Tensor& t, ReduceOp op = ReduceOp::kSum);
  [[nodiscard]] Work reduce_scatter_async(Tensor& out, const Tensor& in,
                                          ReduceOp op = ReduceOp::kSum);
  [[nodiscard]] Work all_gather_async(Tensor& out, const Tensor& in);
  [[nodiscard]] Work broadcast_async(Tensor& t, int root);
  [[nodiscard]] Work all_to_all_async(Tensor& out, const Tensor& in);
  [[nodiscard]] Work send_async(const Tensor& t, int dst, int tag = 0);
  [[nodiscard]] Work recv_async(Tensor& t, int src, int tag = 0);
  [[nodiscard]] Work barrier_async();

  // Seconds this rank has spent inside this group's communication so far: blocking calls, and
  // wait/test calls on its asynchronous operations (time a transfer overlaps with compute is not
  // counted). What the step-time breakdown reports as communication.
  double busy_seconds() const { return *busy_; }
  // Bytes this rank has sent in this group's collectives and sends so far, as the standard
  // algorithms move them (NCCL's bus-bandwidth accounting): an all-reduce of n bytes 2 (W-1)/W n,
  // a reduce-scatter, all-gather or all-to-all of n bytes in total (W-1)/W n, the v-forms what
  // goes to other ranks, a broadcast or send n; a reduction of 16-bit values counts the f32 it
  // sends (the accumulator). Size-1 groups send nothing. For comparing the
  // traffic of two ways of doing one thing (1-bit Adam's compressed momentum against the
  // gradient all-reduce), not a wire-level count.
  int64_t bytes_sent() const { return *bytes_sent_; }

  // Whether the backend takes GPU tensors itself (NCCL); otherwise they travel through host
  // copies (MPI reads host memory).
  virtual bool takes_device_memory() const { return false; }

  // New groups out of this one. Collective: every member calls it with the same `groups`, lists
  // of ranks of this group, disjoint (not every rank needs to be listed). Returns the group that
  // holds this rank, its members ranked in the order listed, or nullptr when none does.
  std::shared_ptr<ProcessGroup> split(const RankGroups& groups);

 protected:
  ProcessGroup(int rank, std::vector<int> global_ranks);

  // Backend hooks. The public methods have already checked the arguments, handled the size-1
  // group and converted bf16/f16 reductions to f32, so a hook sees: size() > 1; reductions on
  // f32, f64, i32 or i64 only; reduce_scatter / all_gather / all_to_all counts that divide
  // exactly; roots and peers in range, peers != rank(). The input and output of reduce_scatter,
  // all_gather and all_to_all may overlap (a shard that lives inside the full buffer).
  // With async false a backend may complete the operation before returning (MPI uses its
  // blocking calls, which are faster than a started-and-waited one); the caller waits on the
  // returned Work either way.
  virtual Work do_all_reduce(Tensor& t, ReduceOp op, bool async) = 0;
  virtual Work do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op, bool async) = 0;
  virtual Work do_all_gather(Tensor& out, const Tensor& in, bool async) = 0;
  virtual Work do_broadcast(Tensor& t, int root, bool async) = 0;
  virtual Work do_all_to_all(Tensor& out, const Tensor& in, bool async) = 0;
  // Counts checked against the tensors; in and out distinct buffers.
  virtual Work do_all_to_all_v(Tensor& out, const Tensor& in, const std::vector<int64_t>& send,
                               const std::vector<int64_t>& recv) = 0;
  virtual Work do_all_gather_v(Tensor& out, const Tensor& in,
                               const std::vector<int64_t>& counts) = 0;
  virtual Work do_send(const Tensor& t, int dst, int tag, bool async) = 0;
  virtual Work do_recv(Tensor& t, int src, int tag, bool async) = 0;
  virtual Work do_barrier(bool async) = 0;
  // Collective over this group. color: index of this rank's new group, or -1 when it is in none;
  // key: its position there; members: the world ranks of that group in order (empty for -1);
  // groups: split()'s lists (a backend beside another group splits that one by them too).
  // Returns the new group, or nullptr for color -1.
  virtual std::shared_ptr<ProcessGroup> do_split(const RankGroups& groups, int color, int key,
                                                 std::vector<int> members) = 0;

 private:
  Work reduce(Tensor& t, ReduceOp op, bool async);
  Work reduce_scatter_impl(Tensor& out, const Tensor& in, ReduceOp op, bool async);
  Work all_gather_impl(Tensor& out, const Tensor& in, bool async);
  Work broadcast_impl(Tensor& t, int root, bool async);
  Work all_to_all_impl(Tensor& out, const Tensor& in, bool async);
  Work send_impl(const Tensor& t, int dst, int tag, bool async);
  Work recv_impl(Tensor& t, int src, int tag, bool async);

  Work timed(Work w);  // counts w's wait and test calls in busy_

  int rank_ = 0;
  std::vector<int> global_ranks_;
  std::shared_ptr<double> busy_ = std::make_shared<double>(0.0);
  std::shared_ptr<int64_t> bytes_sent_ = std::make_shared<int64_t>(0);
  // Adds `fraction` of n bytes to bytes_sent_ (a size-1 group sends nothing).
  void count_sent(int64_t n, double fraction);
};

// A group holding only this process, without MPI: what a single-process model uses as its
// tensor-parallel group (every collective is then the identity, see above).
std::shared_ptr<ProcessGroup> make_self_process_group();

}  // namespace megatron
