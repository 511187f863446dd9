// ProcessGroup over an MPI communicator: blocking and MPI_I* collectives, split into several calls
// where counts exceed INT_MAX.
#include "comm/mpi_process_group.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <utility>

#include "core/error.h"

namespace megatron {

namespace {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw InternalError(detail::concat(what, " failed: ", std::string(text, len)));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kU8:
      return MPI_UINT8_T;  // FP8 codes: moved, never reduced
    case DType::kBF16:
    case DType::kF16:
      return MPI_UINT16_T;  // moved bit for bit; never reduced (ProcessGroup reduces them in f32)
  }
  MEGATRON_ASSERT(false, "unknown dtype");
}

MPI_Datatype mpi_reduce_type(DType t) {
  MEGATRON_ASSERT(t != DType::kBF16 && t != DType::kF16, "a ", dtype_name(t),
                  " reduction reached MPI; ProcessGroup should have converted it to f32");
  return mpi_type(t);
}

MPI_Op mpi_op(ReduceOp op) {
  return op == ReduceOp::kSum ? MPI_SUM : MPI_MAX;
}

bool overlaps(const Tensor& a, const Tensor& b) {
  auto a0 = reinterpret_cast<uintptr_t>(a.raw()), b0 = reinterpret_cast<uintptr_t>(b.raw());
  return a.nbytes() > 0 && b.nbytes() > 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

char* bytes(const Tensor& t) {
  return static_cast<char*>(t.raw());
}

int comm_rank(MPI_Comm comm) {
  int r = 0;
  check_mpi(MPI_Comm_rank(comm, &r), "MPI_Comm_rank");
  return r;
}

// The MPI_COMM_WORLD rank of every member of `comm`, in `comm`'s rank order.
std::vector<int> world_ranks(MPI_Comm comm) {
  MPI_Group group, world;
  check_mpi(MPI_Comm_group(comm, &group), "MPI_Comm_group");
  check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group");
  int n = 0;
  MPI_Group_size(group, &n);
  std::vector<int> local(n), global(n);
  std::iota(local.begin(), local.end(), 0);
  check_mpi(MPI_Group_translate_ranks(group, n, local.data(), world, global.data()),
            "MPI_Group_translate_ranks");
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return global;
}

MPI_Comm valid_comm(MPI_Comm comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  MEGATRON_CHECK(initialized,
                 "MpiProcessGroup: MPI is not initialized (create an MpiRuntime first)");
  MEGATRON_CHECK(comm != MPI_COMM_NULL, "MpiProcessGroup: the communicator is MPI_COMM_NULL");
  return comm;
}

// Requests in flight, the tensors they read or write (kept alive until done), the receives whose
// element count must be checked, and a step that finishes the output once all are complete.
class MpiWork final : public Work::Impl {
 public:
  void wait() override {
    if (!requests_.empty()) {
      std::vector<MPI_Status> status(requests_.size());
      check_mpi(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), status.data()),
                "MPI_Waitall");
      for (const auto& [index, count, type] : receives_) check_count(status[index], count, type);
      requests_.clear();
      receives_.clear();
    }
    keep_alive_.clear();
    if (finish_) {
      std::function<void()> f = std::move(finish_);
      finish_ = nullptr;
      f();
    }
  }
  bool test() override {
    // MPI_Testall would release the requests and drop their statuses, which the receive check
    // needs; MPI_Request_get_status only looks.
    for (MPI_Request& r : requests_) {
      int done = 0;
      check_mpi(MPI_Request_get_status(r, &done, MPI_STATUS_IGNORE), "MPI_Request_get_status");
      if (!done) return false;
    }
    return true;
  }

  void add(MPI_Request r) { requests_.push_back(r); }
  void add_receive(MPI_Request r, int count, MPI_Datatype type) {
    receives_.push_back({requests_.size(), count, type});
    requests_.push_back(r);
  }
  void keep(const Tensor& t) { keep_alive_.push_back(t); }
  void then(std::function<void()> f) { finish_ = std::move(f); }

  // A recv shorter than the sender's message fails in MPI (truncation); a longer one would succeed
  // silently with stale elements at the end, so compare the counts.
  static void check_count(const MPI_Status& status, int expected, MPI_Datatype type) {
    int got = 0;
    MPI_Get_count(&status, type, &got);
    MEGATRON_CHECK(got == expected, "recv: expected ", expected, " elements from rank ",
                   status.MPI_SOURCE, " (tag ", status.MPI_TAG, "), got ", got,
                   "; sender and receiver must agree on the tensor size");
  }

 private:
  struct Receive {
    size_t index;
    int count;
    MPI_Datatype type;
  };
  std::vector<MPI_Request> requests_;
  std::vector<Receive> receives_;
  std::vector<Tensor> keep_alive_;
  std::function<void()> finish_;
};

// Blocking calls are done by the time the Work exists; the finish step (copy out of a staging
// buffer) runs at once.
Work finish_blocking(std::function<void()> f) {
  if (f) f();
  return Work();
}

}  // namespace

MpiProcessGroup::MpiProcessGroup(MPI_Comm comm, bool owns_comm)
    // Each argument validates `comm` itself: their evaluation order is unspecified.
    : MpiProcessGroup(valid_comm(comm), owns_comm, comm_rank(valid_comm(comm)),
                      world_ranks(valid_comm(comm))) {}

MpiProcessGroup::MpiProcessGroup(MPI_Comm comm, bool owns_comm, int rank,
                                 std::vector<int> global_ranks)
    : ProcessGroup(rank, std::move(global_ranks)),
      comm_(comm),
      owns_comm_(owns_comm),
      max_count_per_call_(INT_MAX) {
  // MPI_TAG_UB is an attribute of MPI_COMM_WORLD and holds for every communicator.
  int* ub = nullptr;
  int found = 0;
  check_mpi(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found), "MPI_Comm_get_attr");
  if (found && ub) tag_ub_ = *ub;
}

MpiProcessGroup::~MpiProcessGroup() {
  if (!owns_comm_ || comm_ == MPI_COMM_NULL) return;
  // A group may outlive MpiRuntime (held by a layer); after MPI_Finalize the handle is gone.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

void MpiProcessGroup::set_max_count_per_call(int64_t n) {
  MEGATRON_CHECK(n >= 1 && n <= INT_MAX, "set_max_count_per_call: ", n, " is outside [1, ", INT_MAX,
                 "]");
  max_count_per_call_ = n;
}

std::vector<std::pair<int64_t, int>> MpiProcessGroup::pieces(int64_t numel) const {
  std::vector<std::pair<int64_t, int>> out;
  int64_t off = 0;
  do {
    int64_t n = std::min(max_count_per_call_, numel - off);
    out.emplace_back(off, static_cast<int>(n));
    off += n;
  } while (off < numel);
  return out;
}

int MpiProcessGroup::checked_count(int64_t n, const char* op) const {
  MEGATRON_CHECK(n <= max_count_per_call_, op, ": each rank's part has ", n,
                 " elements, more than one MPI call carries (", max_count_per_call_,
                 "); split the tensor into smaller buckets");
  return static_cast<int>(n);
}

Work MpiProcessGroup::do_all_reduce(Tensor& t, ReduceOp op, bool async) {
  MPI_Datatype type = mpi_reduce_type(t.dtype());
  size_t esize = dtype_size(t.dtype());
  auto work = std::make_unique<MpiWork>();
  for (auto [off, n] : pieces(t.numel())) {
    char* p = bytes(t) + off * esize;
    if (async) {
      MPI_Request r;
      check_mpi(MPI_Iallreduce(MPI_IN_PLACE, p, n, type, mpi_op(op), comm_, &r), "MPI_Iallreduce");
      work->add(r);
    } else {
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, p, n, type, mpi_op(op), comm_), "MPI_Allreduce");
    }
  }
  if (!async) return Work();
  work->keep(t);
  return Work(std::move(work));
}

Work MpiProcessGroup::do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op, bool async) {
  MPI_Datatype type = mpi_reduce_type(in.dtype());
  int n = checked_count(out.numel(), "reduce_scatter");
  // MPI_IN_PLACE for reduce-scatter leaves the result at the start of the buffer, not at this
  // rank's shard, so an output inside the input goes through a staging buffer.
  Tensor target =
      overlaps(out, in) ? Tensor::empty(Shape{out.numel()}, out.dtype(), out.device()) : out;
  std::function<void()> finish;
  if (target.raw() != out.raw()) finish = [out, target]() mutable { out.copy_from(target); };
  if (!async) {
    check_mpi(MPI_Reduce_scatter_block(in.raw(), target.raw(), n, type, mpi_op(op), comm_),
              "MPI_Reduce_scatter_block");
    return finish_blocking(std::move(finish));
  }
  auto work = std::make_unique<MpiWork>();
  MPI_Request r;
  check_mpi(MPI_Ireduce_scatter_block(in.raw(), target.raw(), n, type, mpi_op(op), comm_, &r),
            "MPI_Ireduce_scatter_block");
  work->add(r);
  work->keep(in);
  work->keep(target);
  work->then(std::move(finish));
  return Work(std::move(work));
}

Work MpiProcessGroup::do_all_gather(Tensor& out, const Tensor& in, bool async) {
  MPI_Datatype type = mpi_type(in.dtype());
  int n = checked_count(in.numel(), "all_gather");
  // A shard inside the gathered buffer (the distributed optimizer's parameter shard) is copied
  // out first: MPI forbids overlapping send and receive buffers.
  Tensor source = overlaps(out, in) ? in.clone() : in;
  if (!async) {
    check_mpi(MPI_Allgather(source.raw(), n, type, out.raw(), n, type, comm_), "MPI_Allgather");
    return Work();
  }
  auto work = std::make_unique<MpiWork>();
  MPI_Request r;
  check_mpi(MPI_Iallgather(source.raw(), n, type, out.raw(), n, type, comm_, &r), "MPI_Iallgather");
  work->add(r);
  work->keep(source);
  work->keep(out);
  return Work(std::move(work));
}

Work MpiProcessGroup::do_broadcast(Tensor& t, int root, bool async) {
  MPI_Datatype type = mpi_type(t.dtype());
  size_t esize = dtype_size(t.dtype());
  auto work = std::make_unique<MpiWork>();
  for (auto [off, n] : pieces(t.numel())) {
    char* p = bytes(t) + off * esize;
    if (async) {
      MPI_Request r;
      check_mpi(MPI_Ibcast(p, n, type, root, comm_, &r), "MPI_Ibcast");
      work->add(r);
    } else {
      check_mpi(MPI_Bcast(p, n, type, root, comm_), "MPI_Bcast");
    }
  }
  if (!async) return Work();
  work->keep(t);
  return Work(std::move(work));
}

Work MpiProcessGroup::do_all_to_all(Tensor& out, const Tensor& in, bool async) {
  MPI_Datatype type = mpi_type(in.dtype());
  int n = checked_count(in.numel() / size(), "all_to_all");
  Tensor source = overlaps(out, in) ? in.clone() : in;
  if (!async) {
    check_mpi(MPI_Alltoall(source.raw(), n, type, out.raw(), n, type, comm_), "MPI_Alltoall");
    return Work();
  }
  auto work = std::make_unique<MpiWork>();
  MPI_Request r;
  check_mpi(MPI_Ialltoall(source.raw(), n, type, out.raw(), n, type, comm_, &r), "MPI_Ialltoall");
  work->add(r);
  work->keep(source);
  work->keep(out);
  return Work(std::move(work));
}

Work MpiProcessGroup::do_all_to_all_v(Tensor& out, const Tensor& in,
                                      const std::vector<int64_t>& send,
                                      const std::vector<int64_t>& recv) {
  MPI_Datatype type = mpi_type(in.dtype());
  const int n = size();
  std::vector<int> sc(n), rc(n), sd(n), rd(n);
  int64_t s_at = 0, r_at = 0;
  for (int i = 0; i < n; ++i) {
    sc[i] = checked_count(send[i], "all_to_all_v");
    rc[i] = checked_count(recv[i], "all_to_all_v");
    sd[i] = checked_count(s_at, "all_to_all_v");
    rd[i] = checked_count(r_at, "all_to_all_v");
    s_at += send[i];
    r_at += recv[i];
  }
  // An empty tensor may have no storage: MPI takes any address for zero counts.
  static char empty;
  void* sbuf = in.numel() > 0 ? const_cast<void*>(in.raw()) : &empty;
  void* rbuf = out.numel() > 0 ? out.raw() : &empty;
  check_mpi(
      MPI_Alltoallv(sbuf, sc.data(), sd.data(), type, rbuf, rc.data(), rd.data(), type, comm_),
      "MPI_Alltoallv");
  return Work();
}

Work MpiProcessGroup::do_all_gather_v(Tensor& out, const Tensor& in,
                                      const std::vector<int64_t>& counts) {
  MPI_Datatype type = mpi_type(in.dtype());
  const int n = size();
  std::vector<int> rc(n), rd(n);
  int64_t at = 0;
  for (int i = 0; i < n; ++i) {
    rc[i] = checked_count(counts[i], "all_gather_v");
    rd[i] = checked_count(at, "all_gather_v");
    at += counts[i];
  }
  static char empty;
  Tensor source = overlaps(out, in) ? in.clone() : in;
  void* sbuf = source.numel() > 0 ? source.raw() : &empty;
  void* rbuf = out.numel() > 0 ? out.raw() : &empty;
  check_mpi(MPI_Allgatherv(sbuf, rc[rank()], type, rbuf, rc.data(), rd.data(), type, comm_),
            "MPI_Allgatherv");
  return Work();
}

Work MpiProcessGroup::do_send(const Tensor& t, int dst, int tag, bool async) {
  MEGATRON_CHECK(tag <= tag_ub_, "send: tag ", tag, " exceeds MPI's limit ", tag_ub_);
  MPI_Datatype type = mpi_type(t.dtype());
  size_t esize = dtype_size(t.dtype());
  auto work = std::make_unique<MpiWork>();
  // Messages between the same pair with the same tag arrive in order, so the pieces of a large
  // tensor reassemble in place on the receiver.
  for (auto [off, n] : pieces(t.numel())) {
    char* p = bytes(t) + off * esize;
    if (async) {
      MPI_Request r;
      check_mpi(MPI_Isend(p, n, type, dst, tag, comm_, &r), "MPI_Isend");
      work->add(r);
    } else {
      check_mpi(MPI_Send(p, n, type, dst, tag, comm_), "MPI_Send");
    }
  }
  if (!async) return Work();
  work->keep(t);
  return Work(std::move(work));
}

Work MpiProcessGroup::do_recv(Tensor& t, int src, int tag, bool async) {
  MEGATRON_CHECK(tag <= tag_ub_, "recv: tag ", tag, " exceeds MPI's limit ", tag_ub_);
  MPI_Datatype type = mpi_type(t.dtype());
  size_t esize = dtype_size(t.dtype());
  auto work = std::make_unique<MpiWork>();
  for (auto [off, n] : pieces(t.numel())) {
    char* p = bytes(t) + off * esize;
    MPI_Request r;
    if (async) {
      check_mpi(MPI_Irecv(p, n, type, src, tag, comm_, &r), "MPI_Irecv");
      work->add_receive(r, n, type);
    } else {
      MPI_Status status;
      check_mpi(MPI_Recv(p, n, type, src, tag, comm_, &status), "MPI_Recv");
      MpiWork::check_count(status, n, type);
    }
  }
  if (!async) return Work();
  work->keep(t);
  return Work(std::move(work));
}

Work MpiProcessGroup::do_barrier(bool async) {
  if (!async) {
    check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
    return Work();
  }
  auto work = std::make_unique<MpiWork>();
  MPI_Request r;
  check_mpi(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
  work->add(r);
  return Work(std::move(work));
}

std::shared_ptr<ProcessGroup> MpiProcessGroup::do_split(const RankGroups&, int color, int key,
                                                        std::vector<int> members) {
  MPI_Comm child = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child),
            "MPI_Comm_split");
  if (color < 0) {
    MEGATRON_ASSERT(child == MPI_COMM_NULL);
    return nullptr;
  }
  // Keys are the positions 0..n-1 inside the group, so MPI's ranks are those positions.
  MEGATRON_ASSERT(comm_rank(child) == key, "MPI ranked this process ", comm_rank(child),
                  " in its new group, expected ", key);
  auto group = std::shared_ptr<MpiProcessGroup>(
      new MpiProcessGroup(child, /*owns_comm=*/true, key, std::move(members)));
  group->max_count_per_call_ = max_count_per_call_;
  return group;
}

}  // namespace megatron
