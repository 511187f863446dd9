// NCCL process groups (see nccl_process_group.h). Compiled with the CUDA device and NCCL; without
// them only nccl_available() and a clear error remain.
#include "comm/nccl/nccl_process_group.h"

#include <cstring>
#include <string>

#include "core/error.h"

#if MEGATRON_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace megatron {

#if !MEGATRON_HAVE_NCCL

bool nccl_available() {
  return false;
}

std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<ProcessGroup>) {
  throw InvalidArgument("this build of megatron has no NCCL (it comes with the CUDA toolkit)");
}

#else

bool nccl_available() {
  return true;
}

namespace {

void check(ncclResult_t r, const char* what) {
  MEGATRON_ASSERT(r == ncclSuccess, "NCCL ", what, ": ", ncclGetErrorString(r));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU8:
      return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::kMax ? ncclMax : ncclSum;
}

bool on_gpu(const Tensor& t) {
  return t.defined() && t.device() == Device::kCUDA;
}

// Bytes from element `at` of t's storage.
void* at_element(const Tensor& t, int64_t at) {
  return static_cast<char*>(t.raw()) + at * static_cast<int64_t>(dtype_size(t.dtype()));
}

bool overlaps(const Tensor& a, const Tensor& b) {
  const char *a0 = static_cast<const char*>(a.raw()), *b0 = static_cast<const char*>(b.raw());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

class NcclProcessGroup final : public ProcessGroup {
 public:
  NcclProcessGroup(std::shared_ptr<ProcessGroup> host, ncclComm_t comm)
      : ProcessGroup(host->rank(), host->global_ranks()), host_(std::move(host)), comm_(comm) {}
  ~NcclProcessGroup() override {
    if (comm_) ncclCommDestroy(comm_);
  }

  bool takes_device_memory() const override { return true; }

 protected:
  Work do_all_reduce(Tensor& t, ReduceOp op, bool async) override {
    if (!on_gpu(t))
      return async ? host_->all_reduce_async(t, op) : (host_->all_reduce(t, op), Work());
    check(ncclAllReduce(t.raw(), t.raw(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                        nccl_op(op), comm_, 0),
          "all_reduce");
    return Work();
  }

  Work do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op, bool async) override {
    if (!on_gpu(out) && !on_gpu(in)) {
      return async ? host_->reduce_scatter_async(out, in, op)
                   : (host_->reduce_scatter(out, in, op), Work());
    }
    // NCCL works in place only when the output is this rank's shard of the input.
    const bool in_place = out.raw() == at_element(in, rank() * out.numel());
    const Tensor source = !in_place && overlaps(out, in) ? in.clone() : in;
    check(ncclReduceScatter(source.raw(), out.raw(), static_cast<size_t>(out.numel()),
                            nccl_type(out.dtype()), nccl_op(op), comm_, 0),
          "reduce_scatter");
    return Work();
  }

  Work do_all_gather(Tensor& out, const Tensor& in, bool async) override {
    if (!on_gpu(out) && !on_gpu(in)) {
      return async ? host_->all_gather_async(out, in) : (host_->all_gather(out, in), Work());
    }
    const bool in_place = in.raw() == at_element(out, rank() * in.numel());
    const Tensor source = !in_place && overlaps(out, in) ? in.clone() : in;
    check(ncclAllGather(source.raw(), out.raw(), static_cast<size_t>(in.numel()),
                        nccl_type(in.dtype()), comm_, 0),
          "all_gather");
    return Work();
  }

  Work do_broadcast(Tensor& t, int root, bool async) override {
    if (!on_gpu(t)) {
      return async ? host_->broadcast_async(t, root) : (host_->broadcast(t, root), Work());
    }
    check(ncclBroadcast(t.raw(), t.raw(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                        root, comm_, 0),
          "broadcast");
    return Work();
  }

  Work do_all_to_all(Tensor& out, const Tensor& in, bool async) override {
    if (!on_gpu(out) && !on_gpu(in)) {
      return async ? host_->all_to_all_async(out, in) : (host_->all_to_all(out, in), Work());
    }
    const int64_t chunk = in.numel() / size();
    std::vector<int64_t> counts(static_cast<size_t>(size()), chunk);
    exchange(out, overlaps(out, in) ? in.clone() : in, counts, counts);
    return Work();
  }

  Work do_all_to_all_v(Tensor& out, const Tensor& in, const std::vector<int64_t>& send,
                       const std::vector<int64_t>& recv) override {
    if (!on_gpu(out) && !on_gpu(in)) {
      host_->all_to_all_v(out, in, send, recv);
      return Work();
    }
    exchange(out, in, send, recv);
    return Work();
  }

  Work do_all_gather_v(Tensor& out, const Tensor& in, const std::vector<int64_t>& counts) override {
    if (!on_gpu(out) && !on_gpu(in)) {
      host_->all_gather_v(out, in, counts);
      return Work();
    }
    // One broadcast per rank, grouped: rank p's part lands at its offset everywhere.
    check(ncclGroupStart(), "group start");
    int64_t at = 0;
    for (int p = 0; p < size(); ++p) {
      const void* src = p == rank() ? in.raw() : nullptr;
      check(ncclBroadcast(src, at_element(out, at), static_cast<size_t>(counts[p]),
                          nccl_type(out.dtype()), p, comm_, 0),
            "all_gather_v");
      at += counts[p];
    }
    check(ncclGroupEnd(), "group end");
    return Work();
  }

  // Tagged point-to-point: through the MPI group (ProcessGroup's host staging for GPU tensors).
  Work do_send(const Tensor& t, int dst, int tag, bool async) override {
    const Tensor h = to_host(t);
    return async ? host_->send_async(h, dst, tag) : (host_->send(h, dst, tag), Work());
  }

  Work do_recv(Tensor& t, int src, int tag, bool) override {
    Tensor h = on_gpu(t) ? Tensor::empty(t.shape(), t.dtype(), Device::kCPU) : t;
    host_->recv(h, src, tag);
    if (h.raw() != t.raw()) t.copy_from(h);
    return Work();
  }

  Work do_barrier(bool async) override {
    return async ? host_->barrier_async() : (host_->barrier(), Work());
  }

  std::shared_ptr<ProcessGroup> do_split(const RankGroups& groups, int color, int,
                                         std::vector<int>) override {
    // The MPI group splits by the same lists; the new group makes its own NCCL communicator.
    std::shared_ptr<ProcessGroup> host_sub = host_->split(groups);
    if (color < 0 || !host_sub) return nullptr;
    return make_nccl_process_group(host_sub);
  }

 private:
  // Grouped send/recv of consecutive parts of `in` and `out`.
  void exchange(Tensor& out, const Tensor& in, const std::vector<int64_t>& send,
                const std::vector<int64_t>& recv) {
    const ncclDataType_t type = nccl_type(in.dtype());
    check(ncclGroupStart(), "group start");
    int64_t s_at = 0, r_at = 0;
    for (int p = 0; p < size(); ++p) {
      if (send[p] > 0) {
        check(ncclSend(at_element(in, s_at), static_cast<size_t>(send[p]), type, p, comm_, 0),
              "send");
      }
      if (recv[p] > 0) {
        check(ncclRecv(at_element(out, r_at), static_cast<size_t>(recv[p]), type, p, comm_, 0),
              "recv");
      }
      s_at += send[p];
      r_at += recv[p];
    }
    check(ncclGroupEnd(), "group end");
  }

  std::shared_ptr<ProcessGroup> host_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<ProcessGroup> host) {
  MEGATRON_CHECK(host, "make_nccl_process_group: no host group");
  ncclUniqueId id{};
  // The id travels as i32 words through the MPI group.
  Tensor words = Tensor::zeros({(static_cast<int64_t>(sizeof(id)) + 3) / 4}, DType::kI32);
  if (host->rank() == 0) {
    check(ncclGetUniqueId(&id), "get unique id");
    std::memcpy(words.raw(), &id, sizeof(id));
  }
  host->broadcast(words, 0);
  std::memcpy(&id, words.raw(), sizeof(id));
  ncclComm_t comm = nullptr;
  check(ncclCommInitRank(&comm, host->size(), id, host->rank()), "comm init");
  return std::make_shared<NcclProcessGroup>(std::move(host), comm);
}

#endif

}  // namespace megatron
