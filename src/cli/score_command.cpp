// `megatron score`: per-token log-probabilities of given token sequences under a model (the
// loglikelihood request of evaluation harnesses). Input: one sequence per line, token ids
// separated by spaces (Megatron's NullTokenizer text). Output: one JSON line per input line,
// {"logprobs": [log p(t_1 | t_0), ...], "loss": mean negative log-probability}. An encoder-decoder
// model (T5) scores pairs instead: encoder ids, a tab, target ids; the decoder reads the start
// token and the targets before each one, and logprobs has one entry per target token. A
// vision-language model (LLaVA) scores JSON lines of an image and token ids (image_generation.h).
#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/image_generation.h"
#include "cli/train_args.h"
#include "core/logging.h"
#include "core/threads.h"
#include "models/model_spec.h"
#include "models/t5/t5_chunk.h"
#include "models/t5/t5_hf.h"
#include "tensor/ops.h"
#include "train/model_config.h"
#include "train/trainer.h"  // tokenizer_args

namespace megatron::cli {

namespace {
std::vector<int64_t> parse_ids(const std::string& line, const std::string& file, int64_t lineno,
                               int64_t vocab) {
  std::istringstream in(line);
  std::vector<int64_t> ids;
  std::string tok;
  while (in >> tok) {
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(tok.c_str(), &end, 10);
    MEGATRON_CHECK(end && *end == '\0', file, ":", lineno, ": '", tok,
                   "' is not a token id (lines are space-separated integer ids)");
    MEGATRON_CHECK(errno != ERANGE, file, ":", lineno, ": token id ", tok,
                   " is outside the vocabulary [0, ", vocab, ")");
    MEGATRON_CHECK(v >= 0 && v < vocab, file, ":", lineno, ": token id ", v,
                   " is outside the vocabulary [0, ", vocab, ")");
    ids.push_back(v);
  }
  return ids;
}
}  // namespace

int score_command(int argc, char** argv) {
  CLI::App app("Score token sequences: per-token log-probabilities and mean loss", "score");
  Arguments args;
  ArgTable table(app);
  register_model_args(table, args);
  std::string input;
  app.add_option("--input", input,
                 "Text file, one sequence of space-separated token ids per line (--model llava: "
                 "JSON lines {\"image\": PATH, \"tokens\": [ids, -200 for the image]})")
      ->required();
  if (int rc = parse(app, argc, argv); rc >= 0) return rc;
  MEGATRON_CHECK(!args.pretrained_checkpoint.empty(),
                 "--pretrained-checkpoint is required: the model to score with");
  merge_pretrained_config(args, table);
  // A vision-language model scores lines of any length (up to its positions): no text length.
  if (args.model == "llava" && args.seq_length == 0) args.dataloader_seq_length = 1;
  resolve_encoder_decoder(args, table, /*training=*/false);
  validate_heterogeneous_args(args);  // a block list given by path (config.json brings its text)
  set_num_threads(static_cast<int>(args.num_threads));
  args.hidden_dropout = args.attention_dropout = 0;
  TransformerConfig cfg = transformer_config_from_args(args);
  const ModelSpec& spec = model_spec(args.model);
  std::vector<std::unique_ptr<ModelChunk>> chunks =
      spec.build_chunks(ModelOptions{cfg, false}, ChunkPlacement{});  // the whole model
  ModelChunk& model = *chunks.front();
  ParamSet params(model.parameters(), cfg.compute_dtype);
  spec.hf.load(args.pretrained_checkpoint, model, params);

  std::ifstream in(input);
  MEGATRON_CHECK(in.good(), "--input: cannot open '", input, "'");
  std::string line;
  int64_t lineno = 0;
  const auto* t5 = dynamic_cast<const T5Chunk*>(&model);
  // Hugging Face's T5 starts its decoder from decoder_start_token_id (the pad id, 0); a model of
  // Megatron's WordPiece tokenizer (given with --vocab-file) from its [BOS], as it was trained.
  int64_t t5_start = 0;
  if (t5) {
    t5_start = read_t5_hf_config(args.pretrained_checkpoint)
                   .raw.value("decoder_start_token_id", static_cast<int64_t>(0));
    if (args.tokenizer_type.rfind("BertWordPiece", 0) == 0 && !args.vocab_file.empty()) {
      const int64_t bos = build_tokenizer(tokenizer_args(args))->special_tokens().bos;
      if (bos >= 0) t5_start = bos;
    }
  }
  const std::string input_dir = std::filesystem::path(input).parent_path().string();
  while (std::getline(in, line)) {
    ++lineno;
    if (args.model == "llava") {
      if (line.empty()) continue;
      std::puts(score_image_line(model, cfg, line, input + ":" + std::to_string(lineno), input_dir)
                    .dump()
                    .c_str());
      continue;
    }
    if (t5) {  // "encoder ids <TAB> target ids": log p(target t | encoder input, targets < t)
      const size_t tab = line.find('\t');
      MEGATRON_CHECK(tab != std::string::npos, input, ":", lineno,
                     ": an encoder-decoder model scores pairs: encoder ids, a tab, target ids");
      const std::vector<int64_t> enc =
          parse_ids(line.substr(0, tab), input, lineno, cfg.vocab_size);
      const std::vector<int64_t> target =
          parse_ids(line.substr(tab + 1), input, lineno, cfg.vocab_size);
      MEGATRON_CHECK(!enc.empty() && !target.empty(), input, ":", lineno,
                     ": both the encoder input and the target need at least one token");
      const auto se = static_cast<int64_t>(enc.size()), sd = static_cast<int64_t>(target.size());
      T5Inputs t5_in;
      t5_in.enc_tokens = Tensor::empty({1, se}, DType::kI64);
      t5_in.dec_tokens = Tensor::empty({1, sd}, DType::kI64);
      t5_in.labels = Tensor::empty({1, sd}, DType::kI64);
      std::copy(enc.begin(), enc.end(), t5_in.enc_tokens.data<int64_t>());
      std::copy(target.begin(), target.end(), t5_in.labels.data<int64_t>());
      t5_in.dec_tokens.data<int64_t>()[0] = t5_start;
      std::copy(target.begin(), target.end() - 1, t5_in.dec_tokens.data<int64_t>() + 1);
      T5Model::Ctx ctx;
      const Tensor loss = t5->model().forward(t5_in, ctx, ForwardMode{});
      nlohmann::json out;
      double total = 0;
      for (int64_t i = 0; i < sd; ++i) {
        out["logprobs"].push_back(-loss.item(i));
        total += loss.item(i);
      }
      out["loss"] = total / static_cast<double>(sd);
      std::puts(out.dump().c_str());
      continue;
    }
    std::vector<int64_t> ids = parse_ids(line, input, lineno, cfg.vocab_size);
    nlohmann::json out;
    out["logprobs"] = nlohmann::json::array();
    if (ids.size() < 2) {
      out["loss"] = nullptr;  // nothing to predict
      std::puts(out.dump().c_str());
      continue;
    }
    const int64_t n = static_cast<int64_t>(ids.size()) - 1;
    MEGATRON_CHECK(cfg.position_embedding != PositionEmbedding::kLearnedAbsolute ||
                       n <= cfg.max_position_embeddings,
                   input, ":", lineno, ": ", n + 1, " tokens exceed the model's ",
                   cfg.max_position_embeddings, " positions (+1 for the first token)");
    Tensor tokens = Tensor::empty({1, n}, DType::kI64), labels = Tensor::empty({1, n}, DType::kI64);
    for (int64_t i = 0; i < n; ++i) {
      tokens.data<int64_t>()[i] = ids[static_cast<size_t>(i)];
      labels.data<int64_t>()[i] = ids[static_cast<size_t>(i) + 1];
    }
    const Tensor loss = spec.token_losses(model, tokens, labels);
    double total = 0;
    for (int64_t i = 0; i < n; ++i) {
      out["logprobs"].push_back(-loss.item(i));
      total += loss.item(i);
    }
    out["loss"] = total / static_cast<double>(n);
    std::puts(out.dump().c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace megatron::cli
