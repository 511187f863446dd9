// AllToAllPlan: split sizes, the EP all-to-all, the ETP gather / reduce-scatter, the sort.
#include "transformer/moe/alltoall_dispatcher.h"

#include "tensor/ops.h"
#include "transformer/moe/permutation.h"

namespace megatron {
namespace {

using moe::index_tensor;

// all_gather of a small i64 vector: [size, n].
std::vector<int64_t> gather_counts(const std::vector<int64_t>& mine, ProcessGroup& g) {
  const Tensor in = index_tensor(mine);
  Tensor out = Tensor::empty({static_cast<int64_t>(mine.size()) * g.size()}, DType::kI64);
  g.all_gather(out, in);
  return std::vector<int64_t>(out.data<int64_t>(), out.data<int64_t>() + out.numel());
}

std::vector<int64_t> times(const std::vector<int64_t>& rows, int64_t c) {
  std::vector<int64_t> out(rows);
  for (int64_t& x : out) x *= c;
  return out;
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

}  // namespace

AllToAllPlan::AllToAllPlan(const std::vector<uint8_t>& map, int64_t tokens, int64_t experts,
                           int64_t first, int64_t local, ProcessGroup& ep, ProcessGroup& etp)
    : ep_(&ep), etp_(&etp) {
  const int64_t T = tokens, E = experts, L = local;
  const int P = ep.size(), Q = etp.size();
  // Permutation 1: this rank's assignments by global expert, tokens in order.
  std::vector<int64_t> n_local(static_cast<size_t>(E), 0);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t t = 0; t < T; ++t)
      if (map[t * E + e]) {
        send_tokens_.push_back(t);
        send_experts_.push_back(e);
        ++n_local[e];
      }
  send_index_ = index_tensor(send_tokens_);
  input_splits_.assign(static_cast<size_t>(P), 0);
  for (int64_t e = 0; e < E; ++e) input_splits_[e / L] += n_local[e];
  // What every EP peer sends to this rank's experts, then the same for every ETP peer.
  const std::vector<int64_t> all = gather_counts(n_local, ep);  // [P, E]
  std::vector<int64_t> mine(static_cast<size_t>(P * L));        // [P, L]
  output_splits_.assign(static_cast<size_t>(P), 0);
  for (int j = 0; j < P; ++j)
    for (int64_t l = 0; l < L; ++l) {
      mine[j * L + l] = all[j * E + first + l];
      output_splits_[j] += mine[j * L + l];
    }
  const std::vector<int64_t> cnt = Q > 1 ? gather_counts(mine, etp) : mine;  // [Q, P, L]
  etp_rows_.assign(static_cast<size_t>(Q), 0);
  std::vector<int64_t> offset(cnt.size());
  int64_t at = 0;
  for (int q = 0; q < Q; ++q)
    for (int j = 0; j < P; ++j)
      for (int64_t l = 0; l < L; ++l) {
        const size_t i = static_cast<size_t>((q * P + j) * L + l);
        offset[i] = at;
        at += cnt[i];
        etp_rows_[q] += cnt[i];
      }
  gathered_ = at;
  // Permutation 2: (ETP source, EP source, expert) chunks to (expert, ETP source, EP source).
  std::vector<int64_t> perm;
  counts_.assign(static_cast<size_t>(L), 0);
  for (int64_t l = 0; l < L; ++l)
    for (int q = 0; q < Q; ++q)
      for (int j = 0; j < P; ++j) {
        const size_t i = static_cast<size_t>((q * P + j) * L + l);
        for (int64_t r = 0; r < cnt[i]; ++r) perm.push_back(offset[i] + r);
        counts_[l] += cnt[i];
      }
  perm_ = index_tensor(perm);
}

Tensor AllToAllPlan::to_experts(const Tensor& rows) const {
  const int64_t c = rows.dim(-1);
  Tensor recv = Tensor::empty({sum(output_splits_), c}, rows.dtype(), rows.device());
  ep_->all_to_all_v(recv, rows, times(input_splits_, c), times(output_splits_, c));
  Tensor gathered = recv;
  if (etp_->size() > 1) {
    gathered = Tensor::empty({gathered_, c}, rows.dtype(), rows.device());
    etp_->all_gather_v(gathered, recv, times(etp_rows_, c));
  }
  return moe::gather_rows(gathered, perm_);
}

Tensor AllToAllPlan::from_experts(const Tensor& rows) const {
  const int64_t c = rows.dim(-1);
  Tensor unsorted = Tensor::zeros({gathered_, c}, rows.dtype(), rows.device());
  ops::scatter_add_rows(unsorted, rows, perm_);  // a permutation: each row lands once
  Tensor mine = unsorted;
  const int Q = etp_->size();
  if (Q > 1) {
    // Reduce-scatter with uneven blocks: every ETP rank's partials of this rank's rows, summed.
    const int64_t R = sum(output_splits_);
    Tensor parts = Tensor::empty({Q * R, c}, rows.dtype(), rows.device());
    const std::vector<int64_t> recv(static_cast<size_t>(Q), R * c);
    etp_->all_to_all_v(parts, unsorted, times(etp_rows_, c), recv);
    mine = parts.slice0(0, R).clone();
    for (int q = 1; q < Q; ++q) ops::add_inplace(mine, parts.slice0(q * R, (q + 1) * R));
  }
  Tensor back = Tensor::empty({sum(input_splits_), c}, rows.dtype(), rows.device());
  ep_->all_to_all_v(back, mine, times(output_splits_, c), times(input_splits_, c));
  return back;
}

}  // namespace megatron
