// ProcessGroup's shared front end: argument checks, size-1 shortcuts and the f32 accumulation of
// bf16/f16 reductions, before the backend's do_* calls.
#include "comm/process_group.h"

#include <cstring>
#include <functional>
#include <utility>

#include "core/error.h"
#include "core/timer.h"

namespace megatron {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

// ---- Work ---------------------------------------------------------------------------------------

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    wait();
    impl_ = std::move(other.impl_);
  }
  return *this;
}

Work::~Work() {
  if (impl_) impl_->wait();
}

void Work::wait() {
  if (!impl_) return;
  impl_->wait();
  impl_.reset();
}

bool Work::is_completed() {
  if (!impl_) return true;
  if (!impl_->test()) return false;
  wait();
  return true;
}

namespace {

// An operation followed by a step that finishes its output once the transfer is done (copying an
// f32 accumulator back into a bf16 tensor).
class ThenWork final : public Work::Impl {
 public:
  ThenWork(Work inner, std::function<void()> then)
      : inner_(std::move(inner)), then_(std::move(then)) {}
  void wait() override {
    inner_.wait();
    if (then_) {
      std::function<void()> f = std::move(then_);
      then_ = nullptr;
      f();
    }
  }
  bool test() override { return inner_.is_completed(); }

 private:
  Work inner_;
  std::function<void()> then_;
};

// An asynchronous operation whose wait and test calls count towards its group's busy time.
class TimedWork final : public Work::Impl {
 public:
  TimedWork(Work inner, std::shared_ptr<double> busy)
      : inner_(std::move(inner)), busy_(std::move(busy)) {}
  void wait() override {
    Timer t;
    inner_.wait();
    *busy_ += t.elapsed();
  }
  bool test() override {
    Timer t;
    const bool done = inner_.is_completed();
    *busy_ += t.elapsed();
    return done;
  }

 private:
  Work inner_;
  std::shared_ptr<double> busy_;
};

Work then(Work inner, std::function<void()> f) {
  return Work(std::make_unique<ThenWork>(std::move(inner), std::move(f)));
}

// bf16 and f16 are reduced through an f32 accumulator.
bool reduces_through_f32(DType t) {
  return t == DType::kBF16 || t == DType::kF16;
}

// The size-1 case of the gathering collectives: the output is the input.
void copy_if_distinct(Tensor& out, const Tensor& in) {
  if (out.raw() == in.raw()) return;
  if (is_host_memory(out.device()) && is_host_memory(in.device())) {
    std::memmove(out.raw(), in.raw(), in.nbytes());
  } else {
    out.copy_from(in);
  }
}

// GPU tensors travel through host copies: the collectives here are MPI's, which reads and writes
// host memory. (A GPU-native group, NCCL, takes device memory instead.) The input is copied out
// before the collective and the output copied back when it completes.
bool on_gpu(const Tensor& t) {
  return t.defined() && !is_host_memory(t.device());
}
// Whether group g needs host copies of these tensors.
bool staged(const ProcessGroup& g, const Tensor& a, const Tensor& b = Tensor()) {
  return !g.takes_device_memory() && (on_gpu(a) || on_gpu(b));
}
Tensor host_buffer(const Tensor& like) {
  return Tensor::empty(like.shape(), like.dtype(), Device::kCPU);
}

void check_same_dtype(const char* op, const Tensor& out, const Tensor& in) {
  MEGATRON_CHECK(out.dtype() == in.dtype(), op, ": output ", out.str(), " and input ", in.str(),
                 " must have the same dtype");
}

void check_defined(const char* op, const Tensor& t) {
  MEGATRON_CHECK(t.defined(), op, ": the tensor is undefined (allocate it first)");
}

}  // namespace

// ---- ProcessGroup -------------------------------------------------------------------------------

ProcessGroup::ProcessGroup(int rank, std::vector<int> global_ranks)
    : rank_(rank), global_ranks_(std::move(global_ranks)) {
  MEGATRON_ASSERT(0 <= rank_ && rank_ < size(), "rank ", rank_, " of a group of ", size());
}

Work ProcessGroup::reduce(Tensor& t, ReduceOp op, bool async) {
  check_defined("all_reduce", t);
  if (size() == 1) return Work();
  if (staged(*this, t)) {
    Tensor h = t.to(Device::kCPU);
    Work w = reduce(h, op, async);
    return then(std::move(w), [target = t, h]() mutable { target.copy_from(h); });
  }
  if (reduces_through_f32(t.dtype())) {
    Tensor acc = t.to(DType::kF32);
    Work w = do_all_reduce(acc, op, async);
    return then(std::move(w), [target = t, acc]() mutable { target.copy_from(acc); });
  }
  return do_all_reduce(t, op, async);
}

Work ProcessGroup::reduce_scatter_impl(Tensor& out, const Tensor& in, ReduceOp op, bool async) {
  check_defined("reduce_scatter", out);
  check_defined("reduce_scatter", in);
  check_same_dtype("reduce_scatter", out, in);
  MEGATRON_CHECK(in.numel() == out.numel() * size(), "reduce_scatter: the input ", in.str(),
                 " must hold group size (", size(), ") x output ", out.str(), " = ",
                 out.numel() * size(), " elements");
  if (size() == 1) {
    copy_if_distinct(out, in);
    return Work();
  }
  if (staged(*this, out, in)) {
    Tensor hout = host_buffer(out);
    Work w = reduce_scatter_impl(hout, to_host(in), op, async);
    return then(std::move(w), [target = out, hout]() mutable { target.copy_from(hout); });
  }
  if (reduces_through_f32(in.dtype())) {
    Tensor in32 = in.to(DType::kF32);
    Tensor out32 = Tensor::empty(Shape{out.numel()}, DType::kF32, out.device());
    Work w = do_reduce_scatter(out32, in32, op, async);
    return then(std::move(w), [target = out, out32]() mutable { target.copy_from(out32); });
  }
  return do_reduce_scatter(out, in, op, async);
}

Work ProcessGroup::all_gather_impl(Tensor& out, const Tensor& in, bool async) {
  check_defined("all_gather", out);
  check_defined("all_gather", in);
  check_same_dtype("all_gather", out, in);
  MEGATRON_CHECK(out.numel() == in.numel() * size(), "all_gather: the output ", out.str(),
                 " must hold group size (", size(), ") x input ", in.str(), " = ",
                 in.numel() * size(), " elements");
  if (size() == 1) {
    copy_if_distinct(out, in);
    return Work();
  }
  if (staged(*this, out, in)) {
    Tensor hout = host_buffer(out);
    Work w = all_gather_impl(hout, to_host(in), async);
    return then(std::move(w), [target = out, hout]() mutable { target.copy_from(hout); });
  }
  return do_all_gather(out, in, async);
}

Work ProcessGroup::broadcast_impl(Tensor& t, int root, bool async) {
  check_defined("broadcast", t);
  MEGATRON_CHECK(0 <= root && root < size(), "broadcast: root ", root,
                 " is not a rank of this group of ", size());
  if (size() == 1) return Work();
  if (staged(*this, t)) {
    Tensor h = t.to(Device::kCPU);
    Work w = broadcast_impl(h, root, async);
    return then(std::move(w), [target = t, h]() mutable { target.copy_from(h); });
  }
  return do_broadcast(t, root, async);
}

Work ProcessGroup::all_to_all_impl(Tensor& out, const Tensor& in, bool async) {
  check_defined("all_to_all", out);
  check_defined("all_to_all", in);
  check_same_dtype("all_to_all", out, in);
  MEGATRON_CHECK(out.numel() == in.numel() && in.numel() % size() == 0, "all_to_all: input ",
                 in.str(), " and output ", out.str(),
                 " must have the same number of elements, divisible by the group size (", size(),
                 ")");
  if (size() == 1) {
    copy_if_distinct(out, in);
    return Work();
  }
  if (staged(*this, out, in)) {
    Tensor hout = host_buffer(out);
    Work w = all_to_all_impl(hout, to_host(in), async);
    return then(std::move(w), [target = out, hout]() mutable { target.copy_from(hout); });
  }
  return do_all_to_all(out, in, async);
}

void ProcessGroup::all_to_all_v(Tensor& out, const Tensor& in,
                                const std::vector<int64_t>& send_counts,
                                const std::vector<int64_t>& recv_counts) {
  const Timer timer;
  check_same_dtype("all_to_all_v", out, in);
  MEGATRON_CHECK(static_cast<int>(send_counts.size()) == size() &&
                     static_cast<int>(recv_counts.size()) == size(),
                 "all_to_all_v: ", send_counts.size(), " send and ", recv_counts.size(),
                 " receive counts for a group of ", size());
  int64_t ns = 0, nr = 0;
  for (int i = 0; i < size(); ++i) {
    MEGATRON_CHECK(send_counts[i] >= 0 && recv_counts[i] >= 0, "all_to_all_v: negative count");
    ns += send_counts[i];
    nr += recv_counts[i];
  }
  MEGATRON_CHECK(ns == in.numel() && nr == out.numel(), "all_to_all_v: counts sum to ", ns,
                 " sent and ", nr, " received, the tensors hold ", in.numel(), " and ",
                 out.numel());
  count_sent(static_cast<int64_t>(dtype_size(in.dtype())) * (ns - send_counts[rank()]), 1.0);
  if (size() == 1) {
    copy_if_distinct(out, in);
  } else if (staged(*this, out, in)) {
    Tensor hout = host_buffer(out);
    all_to_all_v(hout, to_host(in), send_counts, recv_counts);
    out.copy_from(hout);
  } else {
    // Every member takes part even with nothing to move: the exchange is collective.
    const Tensor source = in.defined() && out.defined() && in.raw() == out.raw() ? in.clone() : in;
    do_all_to_all_v(out, source, send_counts, recv_counts).wait();
  }
  *busy_ += timer.elapsed();
}

void ProcessGroup::all_gather_v(Tensor& out, const Tensor& in, const std::vector<int64_t>& counts) {
  const Timer timer;
  check_same_dtype("all_gather_v", out, in);
  MEGATRON_CHECK(static_cast<int>(counts.size()) == size(), "all_gather_v: ", counts.size(),
                 " counts for a group of ", size());
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  MEGATRON_CHECK(n == out.numel() && counts[rank()] == in.numel(), "all_gather_v: counts sum to ",
                 n, " with ", counts[rank()], " from this rank; the tensors hold ", out.numel(),
                 " and ", in.numel());
  count_sent(static_cast<int64_t>(dtype_size(out.dtype())) * (n - counts[rank()]), 1.0);
  if (size() == 1) {
    copy_if_distinct(out, in);
  } else if (staged(*this, out, in)) {
    Tensor hout = host_buffer(out);
    all_gather_v(hout, to_host(in), counts);
    out.copy_from(hout);
  } else {
    do_all_gather_v(out, in, counts).wait();
  }
  *busy_ += timer.elapsed();
}

Work ProcessGroup::send_impl(const Tensor& t, int dst, int tag, bool async) {
  check_defined("send", t);
  MEGATRON_CHECK(0 <= dst && dst < size() && dst != rank(), "send: destination ", dst,
                 " must be another rank of this group of ", size(), " (this is rank ", rank(), ")");
  MEGATRON_CHECK(tag >= 0, "send: tag must be >= 0, got ", tag);
  if (staged(*this, t)) {
    const Tensor h = t.to(Device::kCPU);
    return then(do_send(h, dst, tag, async), [h] {});  // keeps the host copy until sent
  }
  return do_send(t, dst, tag, async);
}

Work ProcessGroup::recv_impl(Tensor& t, int src, int tag, bool async) {
  check_defined("recv", t);
  MEGATRON_CHECK(0 <= src && src < size() && src != rank(), "recv: source ", src,
                 " must be another rank of this group of ", size(), " (this is rank ", rank(), ")");
  MEGATRON_CHECK(tag >= 0, "recv: tag must be >= 0, got ", tag);
  if (staged(*this, t)) {
    Tensor h = host_buffer(t);
    Work w = do_recv(h, src, tag, async);
    return then(std::move(w), [target = t, h]() mutable { target.copy_from(h); });
  }
  return do_recv(t, src, tag, async);
}

void ProcessGroup::count_sent(int64_t n, double fraction) {
  if (size() > 1) *bytes_sent_ += static_cast<int64_t>(static_cast<double>(n) * fraction);
}

namespace {
// (W - 1) / W: the share of a buffer a ring or pairwise exchange sends from each rank.
double others(int w) {
  return static_cast<double>(w - 1) / static_cast<double>(w);
}
// The bytes a reduction of t moves: 16-bit values travel as their f32 accumulator (reduce).
int64_t reduced_bytes(const Tensor& t) {
  return reduces_through_f32(t.dtype()) ? t.numel() * 4 : t.nbytes();
}
}  // namespace

void ProcessGroup::all_reduce(Tensor& t, ReduceOp op) {
  Timer timer;
  count_sent(reduced_bytes(t), 2 * others(size()));
  reduce(t, op, false).wait();
  *busy_ += timer.elapsed();
}
void ProcessGroup::reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) {
  Timer timer;
  count_sent(reduced_bytes(in), others(size()));
  reduce_scatter_impl(out, in, op, false).wait();
  *busy_ += timer.elapsed();
}
void ProcessGroup::all_gather(Tensor& out, const Tensor& in) {
  Timer timer;
  count_sent(out.nbytes(), others(size()));
  all_gather_impl(out, in, false).wait();
  *busy_ += timer.elapsed();
}
void ProcessGroup::broadcast(Tensor& t, int root) {
  Timer timer;
  count_sent(t.nbytes(), 1.0);
  broadcast_impl(t, root, false).wait();
  *busy_ += timer.elapsed();
}
void ProcessGroup::all_to_all(Tensor& out, const Tensor& in) {
  Timer timer;
  count_sent(in.nbytes(), others(size()));
  all_to_all_impl(out, in, false).wait();
  *busy_ += timer.elapsed();
}
void ProcessGroup::send(const Tensor& t, int dst, int tag) {
  Timer timer;
  count_sent(t.nbytes(), 1.0);
  send_impl(t, dst, tag, false).wait();
  *busy_ += timer.elapsed();
}
void ProcessGroup::recv(Tensor& t, int src, int tag) {
  Timer timer;
  recv_impl(t, src, tag, false).wait();
  *busy_ += timer.elapsed();
}
void ProcessGroup::barrier() {
  Timer timer;
  if (size() > 1) do_barrier(false).wait();
  *busy_ += timer.elapsed();
}

Work ProcessGroup::all_reduce_async(Tensor& t, ReduceOp op) {
  count_sent(reduced_bytes(t), 2 * others(size()));
  return timed(reduce(t, op, true));
}
Work ProcessGroup::reduce_scatter_async(Tensor& out, const Tensor& in, ReduceOp op) {
  count_sent(reduced_bytes(in), others(size()));
  return timed(reduce_scatter_impl(out, in, op, true));
}
Work ProcessGroup::all_gather_async(Tensor& out, const Tensor& in) {
  count_sent(out.nbytes(), others(size()));
  return timed(all_gather_impl(out, in, true));
}
Work ProcessGroup::broadcast_async(Tensor& t, int root) {
  count_sent(t.nbytes(), 1.0);
  return timed(broadcast_impl(t, root, true));
}
Work ProcessGroup::all_to_all_async(Tensor& out, const Tensor& in) {
  count_sent(in.nbytes(), others(size()));
  return timed(all_to_all_impl(out, in, true));
}
Work ProcessGroup::send_async(const Tensor& t, int dst, int tag) {
  count_sent(t.nbytes(), 1.0);
  return timed(send_impl(t, dst, tag, true));
}
Work ProcessGroup::recv_async(Tensor& t, int src, int tag) {
  return timed(recv_impl(t, src, tag, true));
}
Work ProcessGroup::barrier_async() {
  return size() > 1 ? do_barrier(true) : Work();
}

Work ProcessGroup::timed(Work w) {
  return Work(std::make_unique<TimedWork>(std::move(w), busy_));
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(const RankGroups& groups) {
  // Every member validates the same lists, so a bad list fails on every rank before any of them
  // enters the collective.
  std::vector<int> seen(size(), 0);
  int color = -1, key = -1;
  for (size_t g = 0; g < groups.size(); ++g) {
    MEGATRON_CHECK(!groups[g].empty(), "split: group ", g, " is empty");
    for (size_t k = 0; k < groups[g].size(); ++k) {
      int r = groups[g][k];
      MEGATRON_CHECK(0 <= r && r < size(), "split: rank ", r, " in group ", g,
                     " is not a rank of this group of ", size());
      MEGATRON_CHECK(seen[r]++ == 0, "split: rank ", r, " appears in more than one group");
      if (r == rank_) {
        color = static_cast<int>(g);
        key = static_cast<int>(k);
      }
    }
  }
  std::vector<int> members;
  if (color >= 0) {
    for (int r : groups[color]) members.push_back(global_ranks_[r]);
  }
  return do_split(groups, color, key, std::move(members));
}

// ---- the group of one process ------------------------------------------------------------------

namespace {

// Size 1: the public methods never reach a communication hook (they return before), so every
// hook is unreachable except split, which can only produce another group of one.
class SelfProcessGroup final : public ProcessGroup {
 public:
  SelfProcessGroup() : ProcessGroup(0, {0}) {}

 protected:
  Work do_all_reduce(Tensor&, ReduceOp, bool) override { return unreachable("all_reduce"); }
  Work do_reduce_scatter(Tensor&, const Tensor&, ReduceOp, bool) override {
    return unreachable("reduce_scatter");
  }
  Work do_all_gather(Tensor&, const Tensor&, bool) override { return unreachable("all_gather"); }
  Work do_broadcast(Tensor&, int, bool) override { return unreachable("broadcast"); }
  Work do_all_to_all(Tensor&, const Tensor&, bool) override { return unreachable("all_to_all"); }
  Work do_all_to_all_v(Tensor&, const Tensor&, const std::vector<int64_t>&,
                       const std::vector<int64_t>&) override {
    return unreachable("all_to_all_v");
  }
  Work do_all_gather_v(Tensor&, const Tensor&, const std::vector<int64_t>&) override {
    return unreachable("all_gather_v");
  }
  Work do_send(const Tensor&, int, int, bool) override { return unreachable("send"); }
  Work do_recv(Tensor&, int, int, bool) override { return unreachable("recv"); }
  Work do_barrier(bool) override { return Work(); }
  std::shared_ptr<ProcessGroup> do_split(const RankGroups&, int color, int,
                                         std::vector<int>) override {
    return color < 0 ? nullptr : std::make_shared<SelfProcessGroup>();
  }

 private:
  static Work unreachable(const char* op) {
    MEGATRON_ASSERT(false, "a group of one process has no peer for ", op);
    return Work();
  }
};

}  // namespace

std::shared_ptr<ProcessGroup> make_self_process_group() {
  return std::make_shared<SelfProcessGroup>();
}

}  // namespace megatron
