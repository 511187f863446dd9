// DataConfig: the data flags of a run (Megatron's --data-path family, --mock-data, the mask and
// position options), and Datasets: the train, validation and test sample sources built from them.
//
// A per-concern config derived from the run's arguments (train/datasets.h), so that a model's
// dataset hookup (ModelSpec::build_datasets, ::batch_maker) needs no training flags.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/fim_config.h"
#include "data/sample_source.h"

namespace megatron {

struct DataConfig {
  bool mock_data = false;              // --mock-data: synthetic documents, no files
  std::vector<std::string> data_path;  // --data-path [weight] prefix ... (with --split)
  std::string split = "969, 30, 1";    // --split
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;  // per split
  bool multiple_validation_sets = false;     // one validation set per --valid-data-path prefix
  double mid_level_dataset_surplus = 0.005;  // --mid-level-dataset-surplus (blends)
  // --sft: the paths are JSON-lines conversations (data/sft_dataset.h) in this prompt format.
  bool sft = false;
  std::string sft_prompt_format = "nemotron-h-aligned";
  std::string data_cache_path;  // --data-cache-path ("" = beside the data)
  // --per-dataset-sequences-path: the file and its {prefix: (sequences, documents + 1)}.
  std::string per_dataset_sequences_path;
  std::map<std::string, std::pair<int64_t, int64_t>> sequences_per_dataset;
  int64_t seed = 1234;                      // --seed: sample order and mock documents
  bool eod_mask_loss = false;               // --eod-mask-loss
  bool reset_position_ids = false;          // --reset-position-ids
  bool reset_attention_mask = false;        // --reset-attention-mask
  bool allow_ambiguous_pad_tokens = false;  // --allow-ambiguous-pad-tokens (data/gpt_batch.h)
  bool inter_document_masking = false;      // --dataloader-inter-document-masking
  bool fim_data = false;                    // --fim-data: fill-in-the-middle samples
  FimConfig fim;                            // the other --fim-* flags
  double mask_prob = 0.15;                  // --mask-prob (BERT)
  double short_seq_prob = 0.1;              // --short-seq-prob (BERT)
  bool bert_binary_head = true;             // not --bert-no-binary-head
  int64_t decoder_seq_length = 0;           // --decoder-seq-length (T5)
  // Vision-language models (--model llava): the image size the CLIP transform resizes to, the
  // text tokens per sample (--dataloader-seq-length + 1, the image token included) and the
  // embeddings each image becomes in the language model's sequence of language_seq_length.
  int64_t img_h = 0, img_w = 0, text_seq_length = 0, image_embeddings = 0;
  int64_t language_seq_length = 0;
  // Finetuning (`megatron finetune`): --task, --train-data, --valid-data, and the samples of one
  // evaluation iteration (the global batch), to which validation data is padded.
  std::string task;
  std::vector<std::string> train_data, valid_data;
  int64_t eval_batch = 0;
};

// Samples each split must hold (Megatron's counts from the iterations, train/datasets.h).
struct SampleCounts {
  int64_t train = 0, valid = 0, test = 0;
  // --full-validation: the validation split is one epoch of its data, whatever `valid` says.
  bool valid_one_epoch = false;
};

struct Datasets {
  std::unique_ptr<SampleSource> train, valid, test;  // valid/test null when absent
  // --multiple-validation-sets: the validation sets after the first (valid).
  std::vector<std::unique_ptr<SampleSource>> more_valid;
};

}  // namespace megatron
