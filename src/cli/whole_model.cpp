// Whole models for `megatron convert` and upcycling: see the header.
#include "cli/whole_model.h"

#include "checkpoint/sharded_checkpoint.h"
#include "cli/train_args.h"
#include "train/checkpointing.h"
#include "train/model_config.h"

namespace megatron::cli {

namespace cp = checkpoint;

void build_whole_model(WholeModel& m) {
  m.cfg = transformer_config_from_args(m.args);
  m.spec = &model_spec(m.args.model);
  m.chunks = m.spec->build_chunks(ModelOptions{m.cfg, false}, ChunkPlacement{});
  m.params = std::make_unique<ParamSet>(m.chunks.front()->parameters(), DType::kF32);
}

WholeModel whole_model_from_hf(const std::string& dir, const std::string& model) {
  WholeModel m;
  CLI::App none;
  ArgTable table(none);
  m.args.model = model;
  m.args.pretrained_checkpoint = dir;
  merge_pretrained_config(m.args, table);
  if (model == "llava") {
    // The weights do not depend on the text length; the layers and image size come from
    // config.json.
    m.args.dataloader_seq_length = 1;
    resolve_encoder_decoder(m.args, table, /*training=*/false);
  }
  m.args.tokenizer_type = "HuggingFaceTokenizer";
  build_whole_model(m);
  m.spec->hf.load(dir, *m.chunks.front(), *m.params);
  return m;
}

WholeModel whole_model_from_checkpoint(const std::string& root, int64_t step) {
  WholeModel m;
  CLI::App none;
  ArgTable table(none);
  register_model_args(table, m.args);  // the fields the checkpoint's record restores
  m.args.load = root;
  m.args.ckpt_step = step;
  m.args.use_checkpoint_args = true;
  merge_checkpoint_args(m.args, table, false);
  const std::optional<int64_t> it = step >= 0 ? step : cp::read_tracker(root);
  cp::CheckpointReader reader = cp::CheckpointReader::open(cp::iteration_dir(root, *it));
  m.args.vocab_size = reader.metadata().at("args").at("vocab_size").get<int64_t>();
  m.args.model = reader.metadata().at("args").value("model", std::string("gpt"));
  build_whole_model(m);
  load_shards(reader, CheckpointTarget{m.params.get(), nullptr, nullptr, 0, 0, {}},
              /*optim=*/false);
  if (!reader.metadata().value("release", false))
    m.state = run_state_from_json(reader.metadata(), cp::iteration_dir(root, *it));
  return m;
}

void save_whole_checkpoint(const WholeModel& m, const std::string& root, int64_t iteration,
                           RunState state) {
  std::shared_ptr<ProcessGroup> self = make_self_process_group();
  const std::string staging = cp::prepare_save(*self, root, iteration);
  const nlohmann::json record = cp::write_rank_file(
      staging, 0,
      shard_entries(CheckpointTarget{m.params.get(), nullptr, nullptr, 0, 0, {}}, false, false));
  nlohmann::json meta = {
      {"args", model_args_json(m.args, m.cfg)},
      {"has_optimizer_state", false},
      // Iteration 0 is a release (pretrained weights, `megatron convert`: a run that loads it
      // starts at iteration 0, as Megatron treats release checkpoints); upcycling's iteration 1
      // is a training checkpoint.
      {"release", iteration == 0},
      {"padded_vocab_size", m.cfg.padded_vocab_size},
      {"tokenizer", {{"type", m.args.tokenizer_type}, {"vocab_size", m.cfg.vocab_size}}},
      {"layout", {{"world_size", 1}}}};
  state.iteration = iteration;
  meta["run_state"] = run_state_json(state);
  cp::commit_save(*self, root, iteration, staging, record, "", meta);
}

}  // namespace megatron::cli
