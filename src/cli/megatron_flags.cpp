// The flag table parsed from the TSV compiled into the binary, its registration in the CLI, the
// start-up lines and refusals, the consistency check and the Markdown page.
#include "cli/megatron_flags.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"

namespace megatron::cli {

namespace {

constexpr const char* kTable =
#include "megatron_flags_tsv.inc"
    ;

std::vector<MegatronFlag> parse_table() {
  std::vector<MegatronFlag> rows;
  std::istringstream in(kTable);
  std::string line;
  // "#release NAME" starts a release's rows (the first file's rows are r0.14's).
  std::string release = "core_r0.14.0";
  while (std::getline(in, line)) {
    if (line.rfind("#release ", 0) == 0) release = line.substr(9);
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> cols;
    size_t at = 0;
    for (size_t tab; (tab = line.find('\t', at)) != std::string::npos; at = tab + 1) {
      cols.push_back(line.substr(at, tab - at));
    }
    cols.push_back(line.substr(at));
    // A malformed row is a defect of the build, not of the user's input.
    if (cols.size() != 5) throw std::logic_error("megatron_flags.tsv: malformed row: " + line);
    rows.push_back(MegatronFlag{cols[0], cols[1], cols[2], cols[3], cols[4], release});
  }
  return rows;
}

// "only V": the value accepted.
std::string only_value(const MegatronFlag& row) {
  return row.status.rfind("only ", 0) == 0 ? row.status.substr(5) : std::string();
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

}  // namespace

const std::vector<MegatronFlag>& megatron_flags() {
  static const std::vector<MegatronFlag> rows = parse_table();
  return rows;
}

const std::vector<OwnFlag>& own_train_flags() {
  static const std::vector<OwnFlag> own = {
      {"--model", "the architecture; `megatron pretrain_gpt` sets it, as pretrain_gpt.py is"},
      {"--num-threads", "OpenMP threads of each rank (Megatron's processes use one GPU each)"},
      {"--device", "cpu or cuda (Megatron always computes on the GPU of its local rank)"},
      {"--tf32", "TF32 in f32 GEMMs on a GPU (PyTorch's allow_tf32; Megatron trains in bf16/fp16)"},
      {"--gemm-peak-gflops", "the peak model-FLOPs utilisation is reported against"},
      {"--no-verify-integrity", "skips the per-tensor checksums checked on load by default"},
      {"--save-hf", "writes the trained model as a Hugging Face directory at the end"},
      {"--onebit-freeze-step",
       "1-bit Adam's uncompressed warm-up steps (DeepSpeed's OneBitAdam freeze_step; 1-bit Adam "
       "is `--optimizer onebit_adam`, DeepSpeed's \"type\": \"OneBitAdam\")"},
      {"--inject-fault", "testing hook for the fault-handling tests"},
      {"--log-expert-load", "the MoE experts' load balance in the iteration line"},
      {"--task", "the finetuning task (Megatron's tasks/main.py flag; `megatron finetune`)"},
      {"--train-data", "finetuning training files (Megatron's tasks/main.py flag)"},
      {"--valid-data", "finetuning validation files (Megatron's tasks/main.py flag)"},
      {"--epochs", "finetuning epochs (Megatron's tasks/main.py flag)"},
      {"--softmax-scale",
       "the attention score scale (Megatron's TransformerConfig.softmax_scale, no flag there); "
       "Hugging Face's T5 uses 1"},
      {"--gated-linear-unit",
       "GeGLU (Megatron's TransformerConfig.gated_linear_unit with GELU, no flag there); T5 v1.1"},
      {"--transformer-block-type",
       "pre_ln or post_ln (NeMo's name): post-LN is the original BERT's layout, which Megatron "
       "core no longer builds"},
      {"--freeze-LM", "pretrain_vlm.py's flag (its extra arguments, not arguments.py)"},
      {"--pretrained-vision-checkpoint",
       "the vision tower of Megatron's combine step (examples/multimodal's "
       "combine_state_dicts.py merges converted checkpoints instead)"},
      {"--freeze-ViT", "pretrain_vlm.py's flag (its extra arguments, not arguments.py)"},
      {"--disable-vision-class-token", "pretrain_vlm.py's flag (its extra arguments)"},
      {"--dataloader-seq-length", "pretrain_vlm.py's flag (its extra arguments)"},
      {"--vision-model-type", "examples/multimodal's flag (clip)"},
      {"--vision-hidden-size",
       "the ViT's width (pretrain_vlm copies the language model's config; examples/multimodal "
       "fixes CLIP ViT-L's in code)"},
      {"--vision-num-attention-heads", "the ViT's heads (see --vision-hidden-size)"},
      {"--vision-ffn-hidden-size", "the ViT's MLP width (see --vision-hidden-size)"},
      {"--vision-projection-type",
       "mlp or affine (Megatron's MultimodalProjector projector_type, set in code there)"},
      {"--vision-projection-ffn-hidden-size",
       "the mlp projector's width (examples/multimodal sets it per language model in code)"},
  };
  return own;
}

namespace {

// What a flag of `megatron train` means to an inference command that does not take it: a row of
// the table's form (status accepted or "only V", and the note printed when the flag is given).
MegatronFlag as_inference_flag(const MegatronFlag& row, const std::string& command) {
  static const std::map<std::string, std::pair<std::string, std::string>> kSpecific = {
      {"--context-parallel-size",
       {"only 1",
        "inference runs one model replica of tensor x pipeline ranks, without context "
        "parallelism"}},
      {"--use-checkpoint-args",
       {"accepted", "inference always takes the model's arguments from the checkpoint (--load)"}},
      {"--exit-on-missing-checkpoint",
       {"accepted", "a missing checkpoint always stops inference (exit code 2)"}},
      {"--no-load-rng", {"accepted", "inference loads the model's weights only"}},
      {"--no-load-optim", {"accepted", "inference loads the model's weights only"}},
      {"--finetune", {"accepted", "inference loads the model's weights only"}},
      {"--num-layers-per-virtual-pipeline-stage",
       {"accepted",
        "inference runs one model chunk per pipeline rank; a checkpoint of an interleaved run "
        "loads into that layout"}},
      {"--num-virtual-stages-per-pipeline-rank",
       {"accepted",
        "inference runs one model chunk per pipeline rank; a checkpoint of an interleaved run "
        "loads into that layout"}},
      {"--micro-batch-size",
       {"accepted",
        "a training batch size: prompts generated together are "
        "--inference-max-requests"}},
      {"--global-batch-size",
       {"accepted",
        "a training batch size: prompts generated together are "
        "--inference-max-requests"}},
  };
  MegatronFlag out = row;
  const auto it = kSpecific.find(row.flag);
  if (it != kSpecific.end()) {
    out.status = it->second.first;
    out.note = it->second.second;
  } else {
    out.status = "accepted";
    out.note = "a training flag: no effect on `megatron " + command + "`";
  }
  return out;
}

}  // namespace

MegatronCompatFlags::MegatronCompatFlags(ArgTable& table, const std::string& command)
    : table_(table) {
  table.concern("megatron-compat");
  const bool inference = command != "train";
  for (const MegatronFlag& table_row : megatron_flags()) {
    if (table.has(table_row.flag)) continue;
    const MegatronFlag* listed = &table_row;
    if (table_row.status == "implemented") {  // a flag of `megatron train`
      if (!inference) continue;
      listed = &inference_rows_.emplace_back(as_inference_flag(table_row, command));
    }
    const MegatronFlag& row = *listed;
    const std::string help = "[Megatron flag, " +
                             (row.status == "accepted" ? std::string("accepted") : row.status) +
                             " here] " + row.note;
    Registered r{&row};
    if (row.values == "0") {
      switches_.push_back(false);
      r.on = &switches_.back();
      table.flag(row.flag, *r.on, help);
    } else if (row.values == "1") {
      values_.emplace_back();
      r.value = &values_.back();
      table.add(row.flag, *r.value, help);
    } else {
      lists_.emplace_back();
      r.list = &lists_.back();
      table.add(row.flag, *r.list, help);
    }
    registered_.push_back(r);
  }
}

std::vector<std::string> MegatronCompatFlags::resolve() const {
  std::vector<std::string> lines;
  for (const Registered& r : registered_) {
    const MegatronFlag& row = *r.row;
    if (!table_.given(row.flag)) continue;
    const std::string value = r.on ? "" : r.value ? *r.value : joined(*r.list);
    const std::string given = row.flag + (value.empty() ? "" : " " + value);
    const std::string only = only_value(row);
    if (row.status == "refused" || (!only.empty() && value != only)) {
      MEGATRON_CHECK(false, given, ": ", row.note,
                     only.empty() ? "" : " (only " + only + " is accepted)",
                     "; drop the flag (docs/FLAGS.md lists every Megatron flag)");
    }
    lines.push_back(" > " + given + ": " + row.note);
  }
  return lines;
}

std::vector<std::string> check_megatron_flags(const ArgTable& train) {
  std::vector<std::string> problems;
  std::set<std::string> in_table;
  for (const MegatronFlag& row : megatron_flags()) {
    if (!in_table.insert(row.flag).second) problems.push_back(row.flag + ": listed twice");
    const bool implemented = row.status == "implemented";
    if (implemented && !train.has(row.flag)) {
      problems.push_back(row.flag + ": the table says implemented, `megatron train` lacks it");
    }
    if (!implemented && train.has(row.flag)) {
      problems.push_back(row.flag + ": `megatron train` implements it, the table says " +
                         row.status);
    }
    if (!implemented && row.note.empty()) problems.push_back(row.flag + ": no note");
    const bool known_status = implemented || row.status == "accepted" || row.status == "refused" ||
                              !only_value(row).empty();
    if (!known_status) problems.push_back(row.flag + ": unknown status '" + row.status + "'");
  }
  std::set<std::string> own;
  for (const OwnFlag& f : own_train_flags()) own.insert(f.flag);
  for (const std::string& flag : train.flags()) {
    if (!in_table.count(flag) && !own.count(flag)) {
      problems.push_back(flag +
                         ": a flag of `megatron train` that is neither in Megatron's table "
                         "nor listed as our own (own_train_flags)");
    }
  }
  return problems;
}

std::string megatron_flags_markdown(const ArgTable& train) {
  std::ostringstream md;
  md << "# Megatron's flags in megatron-cpp\n\n"
     << "Every flag of Megatron-LM's `megatron/training/arguments.py` (core_r0.14.0), in its "
        "order, then every flag Megatron core 0.19 (core_v0.19.0) added to its parser, in that "
        "parser's order, and what `megatron train` (and `megatron pretrain_gpt`) does with "
        "each. Generated by `megatron flags --markdown` from `src/cli/megatron_flags.tsv`, "
        "`src/cli/megatron_flags_core019.tsv` and the flags `megatron train` registers; the "
        "test suite fails when this page, the tables or the command disagree.\n\n"
     << "- **implemented**: Megatron's meaning (the description is `megatron train --help`'s).\n"
     << "- **accepted**: parsed; when given, one start-up line says what it means here (the "
        "note).\n"
     << "- **only V**: accepted with the value V; any other value is refused with the note.\n"
     << "- **refused**: the run stops before it starts (exit code 2), naming the flag, with the "
        "note.\n\n"
     << "`megatron generate`, `megatron serve` and `megatron evaluate` take the same table, as "
        "Megatron's text-generation server and tasks/main.py parse all of arguments.py: their "
        "own flags (`--help`) with Megatron's meaning, the rows below as they stand, and the "
        "implemented training flags they do not use accepted, each with its start-up line "
        "(mostly: no effect), except --context-parallel-size other than 1.\n\n";
  auto cell = [](std::string s) {
    std::string out;
    for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
    return out;
  };
  // One section per release: its counts, then its rows.
  std::vector<std::string> releases;
  for (const MegatronFlag& row : megatron_flags()) {
    if (releases.empty() || releases.back() != row.release) releases.push_back(row.release);
  }
  for (const std::string& release : releases) {
    std::map<std::string, int> counts;
    size_t total = 0;
    for (const MegatronFlag& row : megatron_flags()) {
      if (row.release != release) continue;
      ++counts[only_value(row).empty() ? row.status : "accepted with one value"];
      ++total;
    }
    md << "## "
       << (release == "core_r0.14.0" ? "arguments.py, core_r0.14.0" : "Added by " + release)
       << "\n\nCounts: ";
    bool first = true;
    for (const auto& [status, n] : counts) {
      md << (first ? "" : ", ") << n << " " << status;
      first = false;
    }
    md << " (" << total << " flags).\n\n"
       << "| flag | group | status | meaning here |\n|---|---|---|---|\n";
    for (const MegatronFlag& row : megatron_flags()) {
      if (row.release != release) continue;
      const std::string meaning = row.status == "implemented" ? train.help_of(row.flag) : row.note;
      md << "| `" << row.flag << "` | " << row.group << " | " << row.status << " | "
         << cell(meaning) << " |\n";
    }
    md << "\n";
  }
  md << "## Flags of megatron-cpp's own\n\n| flag | why | description |\n|---|---|---|\n";
  for (const OwnFlag& f : own_train_flags()) {
    md << "| `" << f.flag << "` | " << cell(f.why) << " | " << cell(train.help_of(f.flag))
       << " |\n";
  }
  return md.str();
}

}  // namespace megatron::cli
