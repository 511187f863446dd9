// Context-parallel attention: the local query chunks against every key chunk of the sequence,
// block by block, merged through the log-sum-exps; the key chunks travel by ring (p2p), one
// all-gather, an all-to-all over heads (a2a), or an all-to-all inside the inner group and the
// ring over the outer one (a2a+p2p).
#include "parallel/context_parallel.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace megatron {

const char* cp_comm_type_name(CpCommType t) {
  switch (t) {
    case CpCommType::kP2P:
      return "p2p";
    case CpCommType::kAllGather:
      return "allgather";
    case CpCommType::kA2A:
      return "a2a";
    case CpCommType::kA2AP2P:
      return "a2a+p2p";
  }
  return "unknown";
}

CpCommType parse_cp_comm_type(const std::string& s) {
  if (s == "p2p") return CpCommType::kP2P;
  if (s == "allgather") return CpCommType::kAllGather;
  if (s == "a2a") return CpCommType::kA2A;
  if (s == "a2a+p2p") return CpCommType::kA2AP2P;
  MEGATRON_CHECK(false, "--cp-comm-type must be p2p, allgather, a2a or a2a+p2p, got '", s, "'");
  return CpCommType::kP2P;
}

ContextParallelContext ContextParallelContext::for_layer(int64_t layer) const {
  ContextParallelContext c = *this;
  if (!layer_comm.empty()) {
    // Layers past the list (multi-token prediction's, of the last layer's kind) take its last.
    MEGATRON_ASSERT(layer >= 0, "negative layer ", layer);
    c.comm = layer_comm[std::min(static_cast<size_t>(layer), layer_comm.size() - 1)];
  }
  return c;
}

int64_t ContextParallelContext::global_row(int64_t t, int64_t local) const {
  const int64_t c = local / 2, r = rank(), n = size();
  return t < c ? r * c + t : (2 * n - 1 - r) * c + (t - c);
}

Tensor cp_local_columns(const Tensor& field, const ContextParallelContext& cp) {
  MEGATRON_CHECK(field.ndim() == 2, "cp_local_columns: expected a [b, s] field, got ", field.str());
  const int64_t b = field.dim(0), s = field.dim(1), n = cp.size();
  MEGATRON_CHECK(s % (2 * n) == 0, "the sequence length (", s,
                 ") must be divisible by 2 x --context-parallel-size (", 2 * n, ")");
  const int64_t c = s / (2 * n), r = cp.rank();
  Tensor first = Tensor::empty({b, c}, field.dtype(), field.device());
  Tensor second = Tensor::empty({b, c}, field.dtype(), field.device());
  ops::slice_last_dim(first, field, r * c);
  ops::slice_last_dim(second, field, (2 * n - 1 - r) * c);
  Tensor out = Tensor::empty({b, 2 * c}, field.dtype(), field.device());
  ops::concat_last_dim(out, {first, second});
  return out;
}

Tensor cp_positions(int64_t local, int64_t b, const ContextParallelContext& cp) {
  Tensor p = Tensor::empty({local, b}, DType::kI64);
  int64_t* d = p.data<int64_t>();
  for (int64_t t = 0; t < local; ++t)
    for (int64_t i = 0; i < b; ++i) d[t * b + i] = cp.global_row(t, local);
  return p;
}

namespace {

// The geometry of a packed QKV [K c, b, ng, qpg + 2, hn] holding K chunks of c rows.
struct Layout {
  int64_t L, c, b, ng, qpg, hn;  // rows, chunk rows, batch, groups, queries per group
  int64_t chunks() const { return L / c; }
  int64_t np() const { return ng * qpg; }
  int64_t kv_numel() const { return L * b * ng * hn; }  // one of K, V for the rows
};

Layout layout_of(const Tensor& qkv, int64_t chunk_rows) {
  MEGATRON_CHECK(
      qkv.ndim() == 5 && qkv.dim(3) >= 3 && chunk_rows > 0 && qkv.dim(0) % chunk_rows == 0,
      "context-parallel attention: expected a packed QKV [K c, b, ng, qpg + 2, hn], "
      "got ",
      qkv.str());
  return Layout{qkv.dim(0), chunk_rows, qkv.dim(1), qkv.dim(2), qkv.dim(3) - 2, qkv.dim(4)};
}

// The ring the key/value chunks travel: its members, and which chunks each one holds. A member
// stands for `inner` consecutive CP ranks (1, or the inner a2a group of a2a+p2p, whose rows it
// holds after the inner all-to-all); CP rank r holds chunks r and 2n - 1 - r. Member m's row
// chunk k is chunk k % 2 of CP rank m inner + k / 2.
struct Ring {
  ProcessGroup* group;
  int inner;
  int n;  // the context-parallel size
  int64_t c;
  int members() const { return group->size(); }
  int me() const { return group->rank(); }
  int64_t start(int member, int64_t k) const {
    const int64_t r = static_cast<int64_t>(member) * inner + k / 2;
    return (k % 2 == 0 ? r : 2 * n - 1 - r) * c;
  }
  // The member whose K/V this one holds at step i (its own at step 0).
  int source_at(int step) const { return (me() - step + members()) % members(); }
};

// K then V of the rows, contiguous: [2, L b ng hn].
Tensor local_kv(const Tensor& qkv, const Layout& d) {
  const int64_t rows = d.L * d.b * d.ng, width = (d.qpg + 2) * d.hn;
  Tensor kv = Tensor::empty({2, d.kv_numel()}, qkv.dtype(), qkv.device());
  for (int part = 0; part < 2; ++part) {
    Tensor dst = kv.slice0(part, part + 1).view({rows, d.hn});
    ops::slice_last_dim(dst, qkv.view({rows, width}), (d.qpg + part) * d.hn);
  }
  return kv;
}

// Key (part 0) or value (part 1) chunk j of a [2, L b ng hn] K/V buffer, as [c, b, ng, hn].
Tensor kv_chunk(const Tensor& kv, int part, int64_t j, const Layout& d) {
  return kv.slice0(part, part + 1).view({d.L, d.b, d.ng, d.hn}).slice0(j * d.c, (j + 1) * d.c);
}

// The query heads of row chunk q, read in place from the packed QKV.
ops::AttentionView query_chunk(const Tensor& qkv, int64_t q, const Layout& d) {
  ops::AttentionView v = ops::packed_qkv_view(qkv, ops::QkvPart::kQuery);
  v.offset += q * d.c * v.stride_s;
  v.s = d.c;
  return v;
}

// The specs of the blocks (query chunk q, a key chunk at its global start).
struct Blocks {
  const ops::AttentionSpec& spec;
  const Ring& ring;
  Layout d;
  std::vector<ops::AttentionSpec> query;  // per query chunk: its offset and doc_start columns

  Blocks(const ops::AttentionSpec& s, const Ring& r, const Layout& lay) : spec(s), ring(r), d(lay) {
    MEGATRON_CHECK(!spec.key_valid.defined() && !spec.bias.defined(),
                   "context parallelism supports causal and document masks only (no key padding, "
                   "no additive bias)");
    const int64_t total = 2 * ring.n * d.c;
    for (int64_t q = 0; q < d.chunks(); ++q) {
      ops::AttentionSpec qs = spec;
      qs.q_offset = ring.start(ring.me(), q);
      qs.q_positions = spec.q_positions > 0 ? spec.q_positions : total;
      qs.kv_positions = spec.kv_positions > 0 ? spec.kv_positions : total;
      if (spec.doc_start.defined()) {
        qs.doc_start = Tensor::empty({d.b, d.c}, spec.doc_start.dtype(), spec.doc_start.device());
        ops::slice_last_dim(qs.doc_start, spec.doc_start, q * d.c);
      }
      query.push_back(std::move(qs));
    }
  }
  // Whether any query of chunk q sees a key of the chunk starting at kv_start: not when every key
  // follows the chunk's last query (causal), or precedes its first query's window.
  bool visible(int64_t q, int64_t kv_start) const {
    const int64_t q0 = query[q].q_offset;
    if (spec.causal && kv_start > q0 + d.c - 1) return false;
    return spec.window < 0 || kv_start + d.c - 1 >= q0 - spec.window;
  }
  ops::AttentionSpec block(int64_t q, int64_t kv_start) const {
    ops::AttentionSpec s = query[q];
    s.kv_offset = kv_start;
    return s;
  }
};

// Forward state of the query chunks: each one's output rows and lse so far.
struct Partial {
  std::vector<Tensor> out, lse;
  std::vector<bool> any;
};

// Adds the blocks of key/value buffer `kv` (member `src`'s chunks) to the partial results.
void forward_blocks(Partial& acc, const Tensor& qkv, const Tensor& kv, int src, const Blocks& bl) {
  const Layout& d = bl.d;
  for (int64_t q = 0; q < d.chunks(); ++q) {
    const ops::AttentionView qv = query_chunk(qkv, q, d);
    for (int64_t j = 0; j < d.chunks(); ++j) {
      const int64_t kv_start = bl.ring.start(src, j);
      if (!bl.visible(q, kv_start)) continue;
      const ops::AttentionView kview = ops::attention_view(kv_chunk(kv, 0, j, d), d.ng);
      const ops::AttentionView vview = ops::attention_view(kv_chunk(kv, 1, j, d), d.ng);
      const ops::AttentionSpec s = bl.block(q, kv_start);
      if (!acc.any[q]) {
        ops::attention_forward(acc.out[q], acc.lse[q], qv, kview, vview, s);
        acc.any[q] = true;
      } else {
        Tensor o = Tensor::empty(acc.out[q].shape(), acc.out[q].dtype(), acc.out[q].device());
        Tensor l = Tensor::empty(acc.lse[q].shape(), acc.lse[q].dtype(), acc.lse[q].device());
        ops::attention_forward(o, l, qv, kview, vview, s);
        ops::attention_merge(acc.out[q], acc.lse[q], o, l);
      }
    }
  }
}

// dQ of the query chunks and this member's share of dK, dV of `src`'s chunks ([2, L b ng hn],
// accumulated) from the blocks of key/value buffer `kv`.
void backward_blocks(Tensor& dq, Tensor& dkv, const Tensor& dout, const Tensor& qkv,
                     const Tensor& kv, const Tensor& out, const std::vector<Tensor>& lse, int src,
                     const Blocks& bl) {
  const Layout& d = bl.d;
  const DType t = qkv.dtype();
  const Device dev = qkv.device();
  for (int64_t q = 0; q < d.chunks(); ++q) {
    const ops::AttentionView qv = query_chunk(qkv, q, d);
    const Tensor out_q = out.slice0(q * d.c, (q + 1) * d.c);
    const Tensor dout_q = dout.slice0(q * d.c, (q + 1) * d.c);
    Tensor dq_q = dq.slice0(q * d.c, (q + 1) * d.c);
    for (int64_t j = 0; j < d.chunks(); ++j) {
      const int64_t kv_start = bl.ring.start(src, j);
      if (!bl.visible(q, kv_start)) continue;
      Tensor tdq = Tensor::empty({d.c, d.b, d.np(), d.hn}, t, dev);
      Tensor tdk = Tensor::empty({d.c, d.b, d.ng, d.hn}, t, dev);
      Tensor tdv = Tensor::empty({d.c, d.b, d.ng, d.hn}, t, dev);
      ops::attention_backward(ops::attention_view(tdq, d.ng), ops::attention_view(tdk, d.ng),
                              ops::attention_view(tdv, d.ng), Tensor(), dout_q, qv,
                              ops::attention_view(kv_chunk(kv, 0, j, d), d.ng),
                              ops::attention_view(kv_chunk(kv, 1, j, d), d.ng), out_q, lse[q],
                              bl.block(q, kv_start));
      ops::add_inplace(dq_q, tdq);
      Tensor dk = kv_chunk(dkv, 0, j, d), dv = kv_chunk(dkv, 1, j, d);
      ops::add_inplace(dk, tdk);
      ops::add_inplace(dv, tdv);
    }
  }
}

// dqkv packed from dq [L, b, np, hn] and dK, dV ([2, L b ng hn]).
void pack_gradients(Tensor& dqkv, const Tensor& dq, const Tensor& dkv, const Layout& d) {
  const int64_t rows = d.L * d.b * d.ng;
  Tensor packed = dqkv.view({rows, (d.qpg + 2) * d.hn});
  ops::concat_last_dim(packed, {dq.view({rows, d.qpg * d.hn}), dkv.slice0(0, 1).view({rows, d.hn}),
                                dkv.slice0(1, 2).view({rows, d.hn})});
}

constexpr int kKvTag = 1, kDkvTag = 2;

// Attention of the ring member's query chunks over every member's key chunks: by the ring
// (gather false) or one all-gather of K/V over the ring's group.
void ring_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const ops::AttentionSpec& spec,
                  const Ring& ring, bool gather) {
  const Layout d = layout_of(qkv, ring.c);
  const Blocks bl(spec, ring, d);
  ProcessGroup& g = *ring.group;
  const int n = ring.members(), next = (ring.me() + 1) % n, prev = (ring.me() - 1 + n) % n;
  Partial acc;
  for (int64_t q = 0; q < d.chunks(); ++q) {
    acc.out.push_back(out.slice0(q * d.c, (q + 1) * d.c));
    acc.lse.push_back(Tensor::empty({d.b, d.np(), d.c}, lse.dtype(), lse.device()));
    acc.any.push_back(false);
  }
  Tensor kv = local_kv(qkv, d);
  if (gather) {
    Tensor all = Tensor::empty({n, 2, d.kv_numel()}, kv.dtype(), kv.device());
    g.all_gather(all, kv);
    for (int i = 0; i < n; ++i) {
      const int src = ring.source_at(i);
      forward_blocks(acc, qkv, all.slice0(src, src + 1).view({2, d.kv_numel()}), src, bl);
    }
  } else {
    for (int i = 0; i < n; ++i) {
      // The next step's K/V is in flight while this step's blocks compute.
      Tensor incoming;
      Work recv, send;
      if (i + 1 < n) {
        incoming = Tensor::empty(kv.shape(), kv.dtype(), kv.device());
        recv = g.recv_async(incoming, prev, kKvTag);
        send = g.send_async(kv, next, kKvTag);
      }
      forward_blocks(acc, qkv, kv, ring.source_at(i), bl);
      if (i + 1 < n) {
        recv.wait();
        send.wait();
        kv = incoming;
      }
    }
  }
  // Under a causal mask every query chunk sees at least its own diagonal block.
  for (bool any : acc.any) MEGATRON_ASSERT(any, "a query chunk saw no key block");
  ops::concat_last_dim(lse, acc.lse);
}

void ring_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                   const Tensor& lse, const ops::AttentionSpec& spec, const Ring& ring,
                   bool gather) {
  const Layout d = layout_of(qkv, ring.c);
  const Blocks bl(spec, ring, d);
  ProcessGroup& g = *ring.group;
  const int n = ring.members(), next = (ring.me() + 1) % n, prev = (ring.me() - 1 + n) % n;
  std::vector<Tensor> lse_q;
  for (int64_t q = 0; q < d.chunks(); ++q) {
    lse_q.push_back(Tensor::empty({d.b, d.np(), d.c}, lse.dtype(), lse.device()));
    ops::slice_last_dim(lse_q.back(), lse, q * d.c);
  }
  Tensor dq = Tensor::zeros({d.L, d.b, d.np(), d.hn}, qkv.dtype(), qkv.device());
  Tensor kv = local_kv(qkv, d);
  Tensor mine;  // this member's dK, dV at the end
  if (gather) {
    Tensor all = Tensor::empty({n, 2, d.kv_numel()}, kv.dtype(), kv.device());
    g.all_gather(all, kv);
    Tensor dall = Tensor::zeros(all.shape(), kv.dtype(), kv.device());
    for (int i = 0; i < n; ++i) {
      const int src = ring.source_at(i);
      Tensor dsrc = dall.slice0(src, src + 1).view({2, d.kv_numel()});
      backward_blocks(dq, dsrc, dout, qkv, all.slice0(src, src + 1).view({2, d.kv_numel()}), out,
                      lse_q, src, bl);
    }
    mine = Tensor::empty(kv.shape(), kv.dtype(), kv.device());
    g.reduce_scatter(mine, dall);
  } else if (n == 1) {  // a ring of one member holds every block itself
    mine = Tensor::zeros(kv.shape(), kv.dtype(), kv.device());
    backward_blocks(dq, mine, dout, qkv, kv, out, lse_q, 0, bl);
  } else {
    // The K/V go round the ring as in forward. Each block's dK, dV follow one step behind: a
    // member receives what members src .. me - 1 summed for the block it now holds, adds its own
    // share and passes it on; after n steps every block's dK, dV arrive back at their owner.
    Tensor travelling, incoming_d;
    Work d_send, d_recv;
    for (int i = 0; i < n; ++i) {
      const int src = ring.source_at(i);
      Tensor incoming;
      Work recv, send;
      if (i + 1 < n) {
        incoming = Tensor::empty(kv.shape(), kv.dtype(), kv.device());
        recv = g.recv_async(incoming, prev, kKvTag);
        send = g.send_async(kv, next, kKvTag);
      }
      Tensor share = Tensor::zeros(kv.shape(), kv.dtype(), kv.device());
      backward_blocks(dq, share, dout, qkv, kv, out, lse_q, src, bl);
      if (i > 0) {
        d_recv.wait();
        ops::add_inplace(incoming_d, share);
        share = incoming_d;
      }
      d_send.wait();  // one dK/dV message in flight per direction
      travelling = share;
      d_send = g.send_async(travelling, next, kDkvTag);
      incoming_d = Tensor::empty(kv.shape(), kv.dtype(), kv.device());
      d_recv = g.recv_async(incoming_d, prev, kDkvTag);
      if (i + 1 < n) {
        recv.wait();
        send.wait();
        kv = incoming;
      }
    }
    d_recv.wait();
    d_send.wait();
    mine = incoming_d;
  }
  pack_gradients(dqkv, dq, mine, d);
}

// ---- all-to-all over heads ----------------------------------------------------------------------
// Row tensors [L, b, G, X] (X: the elements of one group in a row) between "this rank's rows,
// every group" and "the rows of every rank of group g, groups [r G/n, (r + 1) G/n)". Rank j's
// rows are chunks j' and 2N - 1 - j' of the sequence (j' its CP rank); `natural` puts the rows in
// sequence order (Ulysses: g is the whole CP group), else in rank order (a2a+p2p's inner group).

// A copy through the op boundary (a one-part concatenation).
void copy_into(Tensor dst, const Tensor& src) {
  ops::concat_last_dim(dst, {src});
}

Tensor rows_to_groups(const Tensor& x, int64_t G, int64_t X, ProcessGroup& g, bool natural) {
  const int n = g.size();
  const int64_t L = x.dim(0), b = x.dim(1), gl = G / n, c = L / 2, S = L * n;
  Tensor send = Tensor::empty({n, L * b, gl * X}, x.dtype(), x.device());
  const Tensor flat = x.view({L * b, G * X});
  for (int j = 0; j < n; ++j) {
    Tensor block = send.slice0(j, j + 1).view({L * b, gl * X});
    ops::slice_last_dim(block, flat, j * gl * X);
  }
  Tensor recv = Tensor::empty(send.shape(), x.dtype(), x.device());
  g.all_to_all(recv, send);
  if (!natural) return recv.view({S, b, gl, X});
  Tensor full = Tensor::empty({S, b, gl, X}, x.dtype(), x.device());
  for (int j = 0; j < n; ++j) {
    const Tensor rows = recv.slice0(j, j + 1).view({L, b, gl, X});
    copy_into(full.slice0(j * c, (j + 1) * c), rows.slice0(0, c));
    copy_into(full.slice0((2 * n - 1 - j) * c, (2 * n - j) * c), rows.slice0(c, L));
  }
  return full;
}

Tensor groups_to_rows(const Tensor& full, int64_t G, int64_t X, ProcessGroup& g, bool natural) {
  const int n = g.size();
  const int64_t S = full.dim(0), b = full.dim(1), gl = G / n, L = S / n, c = L / 2;
  Tensor send = Tensor::empty({n, L, b, gl * X}, full.dtype(), full.device());
  for (int j = 0; j < n; ++j) {
    Tensor rows = send.slice0(j, j + 1).view({L, b, gl * X});
    if (!natural) {
      copy_into(rows, full.slice0(j * L, (j + 1) * L).view({L, b, gl * X}));
      continue;
    }
    copy_into(rows.slice0(0, c), full.slice0(j * c, (j + 1) * c).view({c, b, gl * X}));
    copy_into(rows.slice0(c, L),
              full.slice0((2 * n - 1 - j) * c, (2 * n - j) * c).view({c, b, gl * X}));
  }
  Tensor recv = Tensor::empty(send.shape(), full.dtype(), full.device());
  g.all_to_all(recv, send);
  Tensor out = Tensor::empty({L, b, G, X}, full.dtype(), full.device());
  std::vector<Tensor> parts;
  for (int j = 0; j < n; ++j) parts.push_back(recv.slice0(j, j + 1).view({L * b, gl * X}));
  Tensor flat = out.view({L * b, G * X});
  ops::concat_last_dim(flat, parts);
  return out;
}

// Column chunk k of [R, K c] tensors, and the order the chunks of member j's L columns take.
std::vector<Tensor> column_chunks(const Tensor& rows, int64_t c) {
  std::vector<Tensor> out;
  for (int64_t k = 0; k < rows.dim(1) / c; ++k) {
    out.push_back(Tensor::empty({rows.dim(0), c}, rows.dtype(), rows.device()));
    ops::slice_last_dim(out.back(), rows, k * c);
  }
  return out;
}

// The same for a [b, H, L] row statistic (lse: the sequence is the last dim).
Tensor lse_to_groups(const Tensor& lse, ProcessGroup& g, bool natural) {
  const int n = g.size();
  const int64_t b = lse.dim(0), H = lse.dim(1), L = lse.dim(2), hl = H / n, c = L / 2;
  Tensor send = Tensor::empty({n, b, hl * L}, lse.dtype(), lse.device());
  for (int j = 0; j < n; ++j) {
    Tensor block = send.slice0(j, j + 1).view({b, hl * L});
    ops::slice_last_dim(block, lse.view({b, H * L}), j * hl * L);
  }
  Tensor recv = Tensor::empty(send.shape(), lse.dtype(), lse.device());
  g.all_to_all(recv, send);
  std::vector<Tensor> chunks(2 * n);
  for (int j = 0; j < n; ++j) {
    const std::vector<Tensor> halves = column_chunks(recv.slice0(j, j + 1).view({b * hl, L}), c);
    chunks[natural ? j : 2 * j] = halves[0];
    chunks[natural ? 2 * n - 1 - j : 2 * j + 1] = halves[1];
  }
  Tensor full = Tensor::empty({b, hl, L * n}, lse.dtype(), lse.device());
  Tensor flat = full.view({b * hl, L * n});
  ops::concat_last_dim(flat, chunks);
  return full;
}

Tensor lse_to_rows(const Tensor& full, ProcessGroup& g, bool natural) {
  const int n = g.size();
  const int64_t b = full.dim(0), hl = full.dim(1), S = full.dim(2), L = S / n, c = L / 2;
  const std::vector<Tensor> chunks = column_chunks(full.view({b * hl, S}), c);
  Tensor send = Tensor::empty({n, b * hl, L}, full.dtype(), full.device());
  for (int j = 0; j < n; ++j) {
    Tensor block = send.slice0(j, j + 1).view({b * hl, L});
    ops::concat_last_dim(
        block, {chunks[natural ? j : 2 * j], chunks[natural ? 2 * n - 1 - j : 2 * j + 1]});
  }
  Tensor recv = Tensor::empty(send.shape(), full.dtype(), full.device());
  g.all_to_all(recv, send);
  Tensor lse = Tensor::empty({b, hl * n, L}, full.dtype(), full.device());
  std::vector<Tensor> parts;
  for (int j = 0; j < n; ++j) parts.push_back(recv.slice0(j, j + 1).view({b, hl * L}));
  Tensor out = lse.view({b, hl * n * L});
  ops::concat_last_dim(out, parts);
  return lse;
}

// The document starts [b, n L] of the rows of every rank of g from the local [b, L] ones.
Tensor gather_doc_start(const Tensor& local, ProcessGroup& g, bool natural) {
  const int n = g.size();
  const int64_t b = local.dim(0), L = local.dim(1), c = L / 2;
  Tensor all = Tensor::empty({n, b, L}, local.dtype(), local.device());
  g.all_gather(all, local.clone());
  std::vector<Tensor> chunks(2 * n);
  for (int j = 0; j < n; ++j) {
    const std::vector<Tensor> halves = column_chunks(all.slice0(j, j + 1).view({b, L}), c);
    chunks[natural ? j : 2 * j] = halves[0];
    chunks[natural ? 2 * n - 1 - j : 2 * j + 1] = halves[1];
  }
  Tensor full = Tensor::empty({b, L * n}, local.dtype(), local.device());
  ops::concat_last_dim(full, chunks);
  return full;
}

// The spec after an all-to-all over g: this rank's heads, the gathered document starts.
ops::AttentionSpec heads_spec(const ops::AttentionSpec& spec, const Layout& d, ProcessGroup& g,
                              bool natural, const char* comm) {
  MEGATRON_CHECK(!spec.key_valid.defined() && !spec.bias.defined(),
                 "context parallelism supports causal and document masks only (no key padding, "
                 "no additive bias)");
  MEGATRON_CHECK(d.ng % g.size() == 0, "--cp-comm-type ", comm, ": the ", d.ng,
                 " query groups of a tensor-parallel rank do not split over ", g.size(),
                 " context-parallel ranks");
  ops::AttentionSpec s = spec;
  s.head_offset = spec.head_offset + g.rank() * (d.ng / g.size()) * d.qpg;
  if (s.total_heads == 0) s.total_heads = d.np();
  if (spec.doc_start.defined()) s.doc_start = gather_doc_start(spec.doc_start, g, natural);
  // The largest-score statistic of this rank's heads: the slots of those heads (the others stay
  // as they are; the trainer takes the max over the context-parallel ranks).
  if (spec.max_logit.defined()) {
    const int64_t heads = d.ng / g.size() * d.qpg;
    s.max_logit = spec.max_logit.flat_view(g.rank() * heads, {heads});
  }
  return s;
}

// This rank's rows of the packed QKV, out (or dout) and lse, all-to-all'ed over g.
struct Heads {
  Tensor qkv, out, dout, lse;
};

Heads to_heads(const Tensor& qkv, const Tensor& out, const Tensor& dout, const Tensor& lse,
               const Layout& d, ProcessGroup& g, bool natural) {
  const int64_t P = d.qpg + 2, gl = d.ng / g.size(), X = d.qpg * d.hn, S = d.L * g.size();
  Heads h;
  h.qkv = rows_to_groups(qkv, d.ng, P * d.hn, g, natural).view({S, d.b, gl, P, d.hn});
  if (out.defined()) {
    h.out = rows_to_groups(out.view({d.L, d.b, d.ng, X}), d.ng, X, g, natural)
                .view({S, d.b, gl * d.qpg, d.hn});
    h.dout = rows_to_groups(dout.view({d.L, d.b, d.ng, X}), d.ng, X, g, natural)
                 .view({S, d.b, gl * d.qpg, d.hn});
    h.lse = lse_to_groups(lse, g, natural);
  }
  return h;
}

// Ulysses (a2a over the whole CP group, whole-sequence attention) or a2a+p2p (a2a over the inner
// group, then the ring over the outer one).
void heads_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const ops::AttentionSpec& spec,
                   const ContextParallelContext& cp) {
  const bool hier = cp.comm == CpCommType::kA2AP2P;
  ProcessGroup& g = hier ? *cp.inner : *cp.group;
  const Layout d = layout_of(qkv, qkv.dim(0) / 2);
  const ops::AttentionSpec s = heads_spec(spec, d, g, !hier, cp_comm_type_name(cp.comm));
  const Heads h = to_heads(qkv, Tensor(), Tensor(), Tensor(), d, g, !hier);
  const int64_t S = h.qkv.dim(0), gl = d.ng / g.size(), X = d.qpg * d.hn;
  Tensor hout = Tensor::empty({S, d.b, gl * d.qpg, d.hn}, qkv.dtype(), qkv.device());
  Tensor hlse = Tensor::empty({d.b, gl * d.qpg, S}, qkv.dtype(), qkv.device());
  if (hier) {
    ring_forward(hout, hlse, h.qkv, s, Ring{cp.outer, g.size(), cp.size(), d.c}, false);
  } else {
    ops::attention_forward(hout, hlse, ops::packed_qkv_view(h.qkv, ops::QkvPart::kQuery),
                           ops::packed_qkv_view(h.qkv, ops::QkvPart::kKey),
                           ops::packed_qkv_view(h.qkv, ops::QkvPart::kValue), s);
  }
  copy_into(out, groups_to_rows(hout.view({S, d.b, gl, X}), d.ng, X, g, !hier).view(out.shape()));
  copy_into(lse, lse_to_rows(hlse, g, !hier));
}

void heads_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                    const Tensor& lse, const ops::AttentionSpec& spec,
                    const ContextParallelContext& cp) {
  const bool hier = cp.comm == CpCommType::kA2AP2P;
  ProcessGroup& g = hier ? *cp.inner : *cp.group;
  const Layout d = layout_of(qkv, qkv.dim(0) / 2);
  const int64_t P = d.qpg + 2, gl = d.ng / g.size();
  const ops::AttentionSpec s = heads_spec(spec, d, g, !hier, cp_comm_type_name(cp.comm));
  const Heads h = to_heads(qkv, out, dout, lse, d, g, !hier);
  Tensor hdqkv = Tensor::empty(h.qkv.shape(), qkv.dtype(), qkv.device());
  if (hier) {
    ring_backward(hdqkv, h.dout, h.qkv, h.out, h.lse, s, Ring{cp.outer, g.size(), cp.size(), d.c},
                  false);
  } else {
    using ops::packed_qkv_view, ops::QkvPart;
    ops::attention_backward(
        packed_qkv_view(hdqkv, QkvPart::kQuery), packed_qkv_view(hdqkv, QkvPart::kKey),
        packed_qkv_view(hdqkv, QkvPart::kValue), Tensor(), h.dout,
        packed_qkv_view(h.qkv, QkvPart::kQuery), packed_qkv_view(h.qkv, QkvPart::kKey),
        packed_qkv_view(h.qkv, QkvPart::kValue), h.out, h.lse, s);
  }
  const int64_t S = h.qkv.dim(0);
  copy_into(dqkv, groups_to_rows(hdqkv.view({S, d.b, gl, P * d.hn}), d.ng, P * d.hn, g, !hier)
                      .view(dqkv.shape()));
}

}  // namespace

void cp_attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv,
                          const ops::AttentionSpec& spec, const ContextParallelContext& cp) {
  if (cp.comm == CpCommType::kA2A || cp.comm == CpCommType::kA2AP2P) {
    heads_forward(out, lse, qkv, spec, cp);
    return;
  }
  ring_forward(out, lse, qkv, spec, Ring{cp.group, 1, cp.size(), qkv.dim(0) / 2},
               cp.comm == CpCommType::kAllGather);
}

void cp_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                           const Tensor& lse, const ops::AttentionSpec& spec,
                           const ContextParallelContext& cp) {
  if (cp.comm == CpCommType::kA2A || cp.comm == CpCommType::kA2AP2P) {
    heads_backward(dqkv, dout, qkv, out, lse, spec, cp);
    return;
  }
  ring_backward(dqkv, dout, qkv, out, lse, spec, Ring{cp.group, 1, cp.size(), qkv.dim(0) / 2},
                cp.comm == CpCommType::kAllGather);
}

Tensor cp_rows_to_groups(const Tensor& x, int64_t G, int64_t X, const ContextParallelContext& cp) {
  MEGATRON_CHECK(G % cp.size() == 0, G, " groups do not split over context parallel size ",
                 cp.size());
  return rows_to_groups(x, G, X, *cp.group, true);
}

Tensor cp_groups_to_rows(const Tensor& full, int64_t G, int64_t X,
                         const ContextParallelContext& cp) {
  return groups_to_rows(full, G, X, *cp.group, true);
}

Tensor cp_whole_doc_start(const Tensor& local, const ContextParallelContext& cp) {
  return gather_doc_start(to_host(local), *cp.group, /*natural=*/true);
}

}  // namespace megatron
