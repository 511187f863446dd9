// Sequence classification data for finetuning (`megatron finetune --task`): Megatron's GLUE-style
// tasks (tasks/glue in Megatron-LM up to r0.11), read from TSV files or JSON lines.
//
// Tasks and where their fields are (TSV files have a header row; JSON lines use the same names):
//   MNLI            sentence1, sentence2, gold_label in {contradiction, entailment, neutral}
//   QQP             question1, question2, is_duplicate in {0, 1}
//   classification  text_a (or text), text_b (optional), label: any strings; the classes are the
//                   training files' labels in sorted order
// Texts are cleaned as Megatron's clean_text does (newlines to spaces, runs of whitespace to one
// space, " . " to ". ").
//
// A sample is Megatron's build_tokens_types_paddings_from_text: [CLS] A [SEP] (B [SEP]), types 0
// for [CLS] A [SEP] and 1 for B [SEP], cut to seq_length - 1 and closed by [SEP] when it was too
// long, padded with the [PAD] id (types too) and padding mask 0.
//
// As a SampleSource, record = text, types, padding_mask (seq_length each), then the label
// (ClassificationRecord). Training reads epochs of the examples, each epoch in the order of
// numpy.random.RandomState(seed + epoch).permutation (Megatron shuffles with torch's
// DistributedSampler seeded with seed + epoch, a stream we do not reproduce); a batch may span two
// epochs. Validation cycles through the examples padded to whole global batches with label -1
// samples (no loss, not counted), so every evaluation of ceil(n / global batch) iterations sees
// each example exactly once.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/sample_source.h"
#include "data/tokenizer.h"

namespace megatron {

struct ClassificationExample {
  std::string text_a, text_b;  // text_b empty: single sentences
  bool has_b = false;
  std::string label;
};

struct ClassificationTask {
  std::string name;                 // MNLI, QQP, classification
  std::string a, a_alt, b, label;   // field names (a_alt: accepted instead of a; "" none)
  std::vector<std::string> labels;  // fixed classes in id order, or empty: from the data
};

// --task NAME; refuses an unknown task, listing the known ones.
ClassificationTask classification_task(const std::string& name);

// Megatron's clean_text.
std::string clean_text(const std::string& text);

// Reads the examples of `files` (.tsv with a header row, or .jsonl / .json lines). Errors name the
// file, line and field, with the fix; exit code 2 through InvalidArgument.
std::vector<ClassificationExample> read_classification_examples(
    const ClassificationTask& task, const std::vector<std::string>& files, const char* flag);

// The task's classes: the fixed list, or the sorted distinct labels of the training examples.
std::vector<std::string> classification_labels(const ClassificationTask& task,
                                               const std::vector<ClassificationExample>& train);

// Megatron's build_tokens_types_paddings_from_ids into text, types, padding (seq_length each).
void build_tokens_types_paddings(std::span<const int64_t> a, const std::vector<int64_t>* b,
                                 int64_t seq_length, const SpecialTokens& special, int64_t* text,
                                 int64_t* types, int64_t* padding);

struct ClassificationRecord {
  static int64_t width(int64_t s) { return 3 * s + 1; }
  ClassificationRecord(const int64_t* r, int64_t s)
      : text(r, s), types(r + s, s), padding_mask(r + 2 * s, s), label(r[3 * s]) {}
  std::span<const int64_t> text, types, padding_mask;
  int64_t label;  // class id, or -1 for a padding sample
};

class ClassificationDataset : public SampleSource {
 public:
  // train: `size` samples over shuffled epochs; else (validation) the examples padded to a
  // multiple of `batch` and cycled to at least `size` samples. Labels outside `labels` are refused,
  // naming the file's flag.
  ClassificationDataset(const std::vector<ClassificationExample>& examples,
                        const std::vector<std::string>& labels, const Tokenizer& tokenizer,
                        int64_t seq_length, bool train, int64_t size, int64_t batch, uint32_t seed,
                        const char* flag);

  int64_t size() const override { return size_; }
  int64_t seq_length() const override { return seq_length_; }
  int64_t sample_width() const override { return ClassificationRecord::width(seq_length_); }
  void sample(int64_t index, int64_t* out) const override;
  int64_t num_examples() const { return static_cast<int64_t>(records_.size()); }

 private:
  int64_t seq_length_, size_;
  bool train_;
  uint32_t seed_;
  int64_t padded_ = 0;                         // validation: examples padded to whole batches
  std::vector<std::vector<int64_t>> records_;  // one record per example
};

}  // namespace megatron
