// Megatron's indexed dataset: `<prefix>.bin` (token ids back to back) and `<prefix>.idx` (header,
// sequence lengths, byte pointers, document indices), byte for byte the MMIDIDX version-1 format
// of megatron/core/datasets/indexed_dataset.py.
//
// IndexedDataset maps both files and validates everything at open (magic, version, dtype code,
// counts, pointers equal to the prefix sums of the lengths, document indices monotone and ending
// at the sequence count, .bin size), throwing InvalidArgument naming the file and the field.
// IndexedDatasetBuilder writes the pair. A "sequence" is what GPT calls a document when
// preprocessing did not split sentences.
//
// Multimodal datasets (Megatron's multimodal=True) add one int8 mode per sequence after the
// document indices (sequence_modes); they are opened and written only when asked for, as in
// Megatron, and a text reader refuses them with that reason.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace megatron {

// Megatron's dtype codes in the .idx header.
enum class IndexDType : uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8
};
size_t index_dtype_size(IndexDType t);
// uint16 when the vocabulary has fewer than 65500 ids, else int32 (what Megatron's writer picks).
IndexDType index_dtype_for_vocab(int64_t vocab_size);

class IndexedDataset {
 public:
  // Opens prefix.idx and prefix.bin (read-only mmap) and validates them; multimodal: the index
  // carries sequence_modes.
  static IndexedDataset open(const std::string& prefix, bool multimodal = false);
  IndexedDataset(IndexedDataset&&) noexcept;
  IndexedDataset& operator=(IndexedDataset&&) noexcept;
  IndexedDataset(const IndexedDataset&) = delete;
  ~IndexedDataset();

  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return static_cast<int64_t>(document_indices_.size()) - 1; }
  std::span<const int32_t> sequence_lengths() const { return sequence_lengths_; }
  std::span<const int64_t> sequence_pointers() const { return sequence_pointers_; }
  std::span<const int64_t> document_indices() const { return document_indices_; }
  IndexDType dtype() const { return dtype_; }
  const std::string& prefix() const { return prefix_; }
  bool multimodal() const { return multimodal_; }
  // One mode per sequence (multimodal datasets only; empty otherwise).
  std::span<const int8_t> sequence_modes() const { return modes_storage_; }
  // The whole .bin: every sequence's items back to back.
  std::span<const unsigned char> bin_bytes() const { return {bin_map_, bin_size_}; }

  // Copies `length` tokens of sequence `i`, starting at token `offset`, into out (as int64).
  void read(int64_t i, int64_t offset, int64_t length, int64_t* out) const;

 private:
  IndexedDataset() = default;
  std::string prefix_;
  IndexDType dtype_ = IndexDType::kUInt16;
  int64_t num_sequences_ = 0;
  bool multimodal_ = false;
  std::span<const int32_t> sequence_lengths_;
  std::span<const int64_t> sequence_pointers_;
  std::span<const int64_t> document_indices_;
  // The .idx arrays start at byte 34, so in a mapping they are never aligned for int32/int64;
  // open() copies them out of the map into these, which the spans above view.
  std::vector<int32_t> lengths_storage_;
  std::vector<int64_t> pointers_storage_;
  std::vector<int64_t> documents_storage_;
  std::vector<int8_t> modes_storage_;
  const unsigned char* bin_map_ = nullptr;
  size_t bin_size_ = 0;
};

class IndexedDatasetBuilder {
 public:
  // Starts bin_path under a temporary name in the same folder; tokens are appended as they come.
  // Nothing appears under the final names until finalize(); an unfinalized builder leaves none.
  // multimodal: every sequence also gets a mode (add_item's), written after the document indices.
  IndexedDatasetBuilder(const std::string& bin_path, IndexDType dtype, bool multimodal = false);
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;
  ~IndexedDatasetBuilder();
  // Appends one sequence. Ids must fit the dtype. mode: its sequence mode in a multimodal
  // dataset (ignored otherwise, as Megatron's add_item ignores it).
  void add_item(std::span<const int64_t> tokens, int8_t mode = 0);
  // Appends every document of `other` (Megatron's add_index, tools/merge_datasets.py): its
  // sequences, their document boundaries and modes, and its .bin bytes as they are. The dtypes
  // and the multimodal kinds must agree. As Megatron's, sequences added since the last
  // end_document() become part of other's first document.
  void add_index(const IndexedDataset& other);
  // Closes the current document (Megatron's end_document).
  void end_document();
  // Flushes .bin and writes the .idx (both atomically: temp name, fsync, rename).
  void finalize(const std::string& idx_path);

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace megatron
