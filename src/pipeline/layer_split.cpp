// The pipeline layer split (layer_split.h): Megatron's rules and per-stage layer counts.
#include "pipeline/layer_split.h"

#include <string>

#include "core/error.h"

namespace megatron {

namespace {

// Pipeline ranks holding the middle of an uneven split, and the layers they share.
struct Middle {
  int64_t ranks = 0, layers = 0;
};
Middle middle_of(int64_t num_layers, int64_t pp, const PipelineSplit& s) {
  Middle m{pp, num_layers};
  if (s.first_stage_layers > 0) {
    m.ranks -= 1;
    m.layers -= s.first_stage_layers;
  }
  if (s.last_stage_layers > 0) {
    m.ranks -= 1;
    m.layers -= s.last_stage_layers;
  }
  return m;
}

}  // namespace

int64_t split_units(int64_t num_layers, const PipelineSplit& s) {
  return num_layers + (s.embedding_in_split ? 1 : 0) + (s.loss_in_split ? 1 : 0);
}

void validate_pipeline_split(int64_t num_layers, int64_t pp, int64_t vpp, const PipelineSplit& s) {
  MEGATRON_CHECK(pp >= 1 && vpp >= 1, "--pipeline-model-parallel-size (", pp,
                 ") and the virtual pipeline stages (", vpp, ") must be >= 1");
  MEGATRON_CHECK(s.first_stage_layers >= 0 && s.last_stage_layers >= 0,
                 "--decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers "
                 "must be larger than 0");
  if (s.uneven()) {
    MEGATRON_CHECK(!s.embedding_in_split && !s.loss_in_split,
                   "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers "
                   "cannot be set at the same time with --account-for-embedding-in-pipeline-split "
                   "/ --account-for-loss-in-pipeline-split; give one kind of split");
    for (auto [flag, n] : {std::pair{"--decoder-first-pipeline-num-layers", s.first_stage_layers},
                           std::pair{"--decoder-last-pipeline-num-layers", s.last_stage_layers}}) {
      MEGATRON_CHECK(n == 0 || n % vpp == 0, "number of layers at ", flag, " (", n,
                     ") must be divisible by the virtual pipeline parallel degree ", vpp);
    }
    const Middle m = middle_of(num_layers, pp, s);
    MEGATRON_CHECK(m.ranks >= 0,
                   "--decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers "
                   "size two stages, but --pipeline-model-parallel-size is 1: give one of them");
    MEGATRON_CHECK(m.layers >= 0, "--decoder-first-pipeline-num-layers (", s.first_stage_layers,
                   ") and --decoder-last-pipeline-num-layers (", s.last_stage_layers,
                   ") hold more than the model's --num-layers ", num_layers);
    MEGATRON_CHECK(
        (m.layers != 0) == (m.ranks != 0), "Mismatch: ", m.layers, " middle layers remaining but ",
        m.ranks, " middle PP stages available (--num-layers ", num_layers,
        ", --pipeline-model-parallel-size ", pp, ", --decoder-first/last-pipeline-num-layers ",
        s.first_stage_layers, "/", s.last_stage_layers, ")");
    if (m.ranks > 0) {
      MEGATRON_CHECK(m.layers % m.ranks == 0, "number of layers at middle stage: ", m.layers,
                     " must be divisible by the middle pipeline model parallel size ", m.ranks,
                     " (--num-layers minus --decoder-first/last-pipeline-num-layers, over the "
                     "other pipeline ranks)");
      MEGATRON_CHECK((m.layers / m.ranks) % vpp == 0,
                     "number of layers on each middle pipeline rank: ", m.layers / m.ranks,
                     " must be divisible by virtual pipeline parallel degree ", vpp);
    }
    return;
  }
  const int64_t units = split_units(num_layers, s);
  // "--num-layers (6)", or "--num-layers (6) plus the embedding (--account-for-...) = 7".
  std::string layers = "--num-layers (" + std::to_string(num_layers) + ")";
  if (s.embedding_in_split)
    layers += " plus the embedding (--account-for-embedding-in-pipeline-split)";
  if (s.loss_in_split) layers += " plus the loss (--account-for-loss-in-pipeline-split)";
  if (units != num_layers) layers += " = " + std::to_string(units);
  MEGATRON_CHECK(units % pp == 0,
                 "Number of layers should be divisible by the pipeline-model-parallel size: ",
                 layers, " is not divisible by --pipeline-model-parallel-size (", pp,
                 "); choose a multiple, or split unevenly with "
                 "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers");
  MEGATRON_CHECK((units / pp) % vpp == 0, "number of layers on each pipeline rank (", layers,
                 " over --pipeline-model-parallel-size (", pp, "): ", units / pp,
                 ") must be divisible by the virtual pipeline parallel degree ", vpp,
                 " (--num-virtual-stages-per-pipeline-rank or "
                 "--num-layers-per-virtual-pipeline-stage)");
}

std::vector<int64_t> virtual_stage_layer_counts(int64_t num_layers, int64_t pp, int64_t vpp,
                                                const PipelineSplit& s) {
  // Layers per pipeline rank, each rank's spread evenly over its chunks.
  std::vector<int64_t> per_rank(static_cast<size_t>(pp));
  if (s.uneven()) {
    const Middle m = middle_of(num_layers, pp, s);
    for (int64_t r = 0; r < pp; ++r) {
      int64_t n = m.ranks > 0 ? m.layers / m.ranks : 0;
      if (r == 0 && s.first_stage_layers > 0) n = s.first_stage_layers;
      if (r == pp - 1 && s.last_stage_layers > 0) n = s.last_stage_layers;
      per_rank[static_cast<size_t>(r)] = n;
    }
  } else {
    for (int64_t& n : per_rank) n = split_units(num_layers, s) / pp;
  }
  std::vector<int64_t> counts;
  for (int64_t v = 0; v < vpp; ++v) {
    for (int64_t r = 0; r < pp; ++r) counts.push_back(per_rank[static_cast<size_t>(r)] / vpp);
  }
  // The embedding (loss) is the first (last) virtual stage's extra unit, not a transformer layer.
  if (s.embedding_in_split) counts.front() -= 1;
  if (s.loss_in_split) counts.back() -= 1;
  return counts;
}

LayerRange chunk_layer_range(int64_t num_layers, int64_t pp, int64_t vpp, const PipelineSplit& s,
                             int64_t rank, int64_t chunk) {
  const std::vector<int64_t> counts = virtual_stage_layer_counts(num_layers, pp, vpp, s);
  const int64_t g = chunk * pp + rank;
  LayerRange out;
  for (int64_t i = 0; i < g; ++i) out.first += counts[static_cast<size_t>(i)];
  out.count = counts[static_cast<size_t>(g)];
  return out;
}

}  // namespace megatron
