// The pipeline layer split (layer_split.h): Megatron's rules and per-stage layer counts.
#include "pipeline/layer_split.h"

#include <algorithm>
#include <regex>
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

// Python's re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text): every non-overlapping
// match, left to right, replaced by its first group repeated.
std::string unroll(const std::string& text, const std::regex& pattern) {
  std::string out;
  auto begin = text.cbegin();
  std::smatch m;
  while (std::regex_search(begin, text.cend(), m, pattern)) {
    out.append(begin, m[0].first);
    const std::string what = m[1].str();
    const int64_t n = std::stoll(m[2].str());
    MEGATRON_CHECK(n >= 0 && n <= 1000000, "--pipeline-model-parallel-layout: repeat count ", n,
                   " of '", what, "' is out of range");
    for (int64_t i = 0; i < n; ++i) out += what;
    begin = m[0].second;
  }
  out.append(begin, text.cend());
  return out;
}

}  // namespace

std::vector<int64_t> parse_pipeline_layout(const std::string& text) {
  std::string s = text;
  s.erase(std::remove(s.begin(), s.end(), ','), s.end());  // purely cosmetic commas
  s = unroll(s, std::regex(R"(\(([^)]+)\)\*(\d+))"));
  s = unroll(s, std::regex(R"((.)\*(\d+))"));
  std::vector<int64_t> counts(1, 0);
  int64_t embeddings = 0, losses = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '|') {
      counts.push_back(0);
    } else if (c == 't') {
      ++counts.back();
    } else if (c == 'E') {
      MEGATRON_CHECK(i == 0, "--pipeline-model-parallel-layout '", text,
                     "': the embedding (E) must be the first layer of the first stage");
      ++embeddings;
    } else if (c == 'L') {
      MEGATRON_CHECK(i + 1 == s.size(), "--pipeline-model-parallel-layout '", text,
                     "': the loss (L) must be the last layer of the last stage");
      ++losses;
    } else {
      MEGATRON_CHECK(c != 'm', "--pipeline-model-parallel-layout '", text,
                     "': multi-token prediction layers (m) are not implemented");
      MEGATRON_CHECK(false, "--pipeline-model-parallel-layout '", text,
                     "': invalid layer character '", std::string(1, c),
                     "'; known layer characters: E (embedding), t (transformer layer), L (loss), "
                     "| between stages, (...)*n and x*n repeats");
    }
  }
  MEGATRON_CHECK(embeddings == 1 && losses == 1, "--pipeline-model-parallel-layout '", text,
                 "': the first layer must be the embedding (E) and the last the loss (L), each "
                 "exactly once");
  return counts;
}

int64_t split_units(int64_t num_layers, const PipelineSplit& s) {
  if (!s.layout.empty()) return num_layers;
  return num_layers + (s.embedding_in_split ? 1 : 0) + (s.loss_in_split ? 1 : 0);
}

void validate_pipeline_split(int64_t num_layers, int64_t pp, int64_t vpp, const PipelineSplit& s) {
  MEGATRON_CHECK(pp >= 1 && vpp >= 1, "--pipeline-model-parallel-size (", pp,
                 ") and the virtual pipeline stages (", vpp, ") must be >= 1");
  MEGATRON_CHECK(s.first_stage_layers >= 0 && s.last_stage_layers >= 0,
                 "--decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers "
                 "must be larger than 0");
  if (!s.layout.empty()) {
    MEGATRON_CHECK(!s.uneven() && !s.embedding_in_split && !s.loss_in_split,
                   "--pipeline-model-parallel-layout cannot be set with other pipeline layout "
                   "arguments (--decoder-first/last-pipeline-num-layers, "
                   "--account-for-embedding/loss-in-pipeline-split)");
    const auto stages = static_cast<int64_t>(s.layout.size());
    MEGATRON_CHECK(stages % pp == 0,
                   "The length of pipeline_model_parallel_layout must be "
                   "divisible by pipeline_model_parallel_size: --pipeline-model-parallel-layout "
                   "has ",
                   stages, " stages, --pipeline-model-parallel-size is ", pp);
    MEGATRON_CHECK(stages == pp * vpp, "--pipeline-model-parallel-layout's ", stages,
                   " stages are ", stages / pp, " virtual stages per pipeline rank, not ", vpp,
                   " (--num-virtual-stages-per-pipeline-rank: drop it, the layout sets it)");
    int64_t total = 0;
    for (int64_t n : s.layout) total += n;
    MEGATRON_CHECK(total == num_layers, "Number of decoder layers ", total,
                   " in --pipeline-model-parallel-layout must match --num-layers ", num_layers);
    return;
  }
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
  if (!s.layout.empty()) return s.layout;
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
