// How the transformer layers are cut into pipeline stages: Megatron's get_num_layers_to_build and
// get_transformer_layer_offset (megatron/core/transformer), as one list of layer counts.
//
// The model is cut into pp x V virtual stages; virtual stage g = chunk * pp + rank holds a
// contiguous block of layers, the blocks in order of g. By default every block has
// num_layers / (pp V) layers. Megatron's uneven splits change the counts, not the order:
//   --decoder-first-pipeline-num-layers F / --decoder-last-pipeline-num-layers L: pipeline rank 0
//     holds F layers, the last rank L, each middle rank (num_layers - F - L) / middle ranks; each
//     rank's layers are split evenly over its V chunks (so F and L divide by V);
//   --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split: the
//     embedding (loss) counts as one more layer of the first (last) virtual stage, which builds
//     one transformer layer fewer (possibly none);
//   --pipeline-model-parallel-layout "Et*3|(tt|)*29,L": every virtual stage spelled out, '|'
//     between stages, E the embedding, t a transformer layer, L the loss, (...)*n and x*n
//     repeats; the number of stages over pp is V.
// Layer numbers stay global (layer i is the same parameters in every split), so checkpoints
// load across splits as across any other layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megatron {

struct PipelineSplit {
  int64_t first_stage_layers = 0;   // --decoder-first-pipeline-num-layers (0: not given)
  int64_t last_stage_layers = 0;    // --decoder-last-pipeline-num-layers (0: not given)
  bool embedding_in_split = false;  // --account-for-embedding-in-pipeline-split
  bool loss_in_split = false;       // --account-for-loss-in-pipeline-split
  // --pipeline-model-parallel-layout: the transformer layers of each virtual stage, in order
  // (empty: no layout given).
  std::vector<int64_t> layout;

  bool uneven() const { return first_stage_layers > 0 || last_stage_layers > 0; }
  bool even() const { return !uneven() && !embedding_in_split && !loss_in_split && layout.empty(); }
};

// Megatron's --pipeline-model-parallel-layout string as the transformer layers of each virtual
// stage: ',' dropped, (...)*n and then x*n unrolled (PipelineParallelLayerLayout's two
// substitutions, so the same strings parse the same way), stages split at '|'. The first stage
// must start with the one E and the last end with the one L; 'm' (multi-token prediction) is not
// implemented. InvalidArgument naming the flag otherwise.
std::vector<int64_t> parse_pipeline_layout(const std::string& text);

// The layers the split divides: num_layers, plus one each for an embedding or loss counted in
// (not for a layout, whose stages are given).
int64_t split_units(int64_t num_layers, const PipelineSplit& s);

// Megatron's rules for the split (TransformerConfig's and validate_args'), in its words with our
// flags named; InvalidArgument when one fails. pp >= 1, vpp >= 1 chunks per rank (a layout's
// stages must number pp x vpp).
void validate_pipeline_split(int64_t num_layers, int64_t pp, int64_t vpp, const PipelineSplit& s);

// The transformer layers of every virtual stage g = chunk * pp + rank, in order of g (they sum to
// num_layers): virtual stage g holds layers [sum of the counts before g, + its count). Assumes
// validate_pipeline_split passed.
std::vector<int64_t> virtual_stage_layer_counts(int64_t num_layers, int64_t pp, int64_t vpp,
                                                const PipelineSplit& s);

// Chunk `chunk` of pipeline rank `rank`: its first global layer and its number of layers.
struct LayerRange {
  int64_t first = 0, count = 0;
};
LayerRange chunk_layer_range(int64_t num_layers, int64_t pp, int64_t vpp, const PipelineSplit& s,
                             int64_t rank, int64_t chunk);

}  // namespace megatron
