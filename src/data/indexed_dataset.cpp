// Reader and writer of Megatron's MMIDIDX version-1 indexed dataset (see the header).
//
// The reader trusts nothing in the .idx: every count is checked against the file length before
// any array is touched, and every derived quantity (pointers, document boundaries, .bin size) is
// recomputed and compared, so a corrupt or mismatched pair fails at open with the file and field
// named instead of producing garbage samples hours into training. The writer streams tokens to
// the .bin and keeps only the per-sequence index in memory; both files appear under their final
// names only once complete (temporary name, fsync, rename).
#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "core/error.h"

namespace megatron {

namespace {

constexpr unsigned char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr uint64_t kVersion = 1;
// magic (9) + version (8) + dtype code (1) + sequence_count (8) + document_count (8).
constexpr size_t kHeaderBytes = 34;
constexpr const char* kRerun = "; the index is corrupt, re-run megatron preprocess";

// Closes a file descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string errno_text() {
  return std::strerror(errno);
}

// Size of an open file, or a caller error naming it.
size_t file_size(int fd, const std::string& path) {
  struct stat st {};
  MEGATRON_CHECK(::fstat(fd, &st) == 0, path, ": cannot stat (", errno_text(), ")");
  return static_cast<size_t>(st.st_size);
}

// Read-only private mapping of a whole file; nullptr for an empty file (mmap rejects length 0).
const unsigned char* map_file(int fd, size_t size, const std::string& path) {
  if (size == 0) return nullptr;
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  MEGATRON_CHECK(p != MAP_FAILED, path, ": cannot mmap ", size, " bytes (", errno_text(), ")");
  return static_cast<const unsigned char*>(p);
}

uint64_t load_u64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));  // little-endian on every platform we build for
  return v;
}

std::string hex_bytes(const unsigned char* p, size_t n) {
  static const char* kDigits = "0123456789ABCDEF";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += kDigits[p[i] >> 4];
    s += kDigits[p[i] & 15];
  }
  return s;
}

bool known_dtype_code(uint8_t code) {
  return code >= 1 && code <= 8;
}

// Copies `n` tokens of type T at `src` (aligned: pointers are multiples of the item size and the
// mapping is page-aligned) into int64 ids.
template <typename T>
void widen(const unsigned char* src, int64_t n, int64_t* out) {
  const T* p = reinterpret_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int64_t>(p[i]);
}

// Narrows ids to T into out (appended), checking that each id is representable.
template <typename T>
void narrow(std::span<const int64_t> ids, std::vector<unsigned char>& out, const std::string& path,
            const char* dtype_name) {
  const size_t at = out.size();
  out.resize(at + ids.size() * sizeof(T));
  T* dst = reinterpret_cast<T*>(out.data() + at);
  if constexpr (std::is_integral_v<T>) {
    constexpr int64_t lo = static_cast<int64_t>(std::numeric_limits<T>::min());
    constexpr int64_t hi = static_cast<int64_t>(std::numeric_limits<T>::max());
    bool ok = true;
    for (size_t i = 0; i < ids.size(); ++i) {
      ok &= ids[i] >= lo && ids[i] <= hi;
      dst[i] = static_cast<T>(ids[i]);
    }
    if (!ok) [[unlikely]] {
      for (int64_t id : ids)
        MEGATRON_CHECK(id >= lo && id <= hi, path, ": token id ", id, " does not fit the ",
                       dtype_name, " token type (", lo, "..", hi,
                       "); the tokenizer's vocabulary is larger than the dtype chosen for it, "
                       "pick the dtype with index_dtype_for_vocab(vocab size)");
    }
  } else {
    for (size_t i = 0; i < ids.size(); ++i) dst[i] = static_cast<T>(ids[i]);
  }
}

const char* dtype_name(IndexDType t) {
  switch (t) {
    case IndexDType::kUInt8:
      return "uint8";
    case IndexDType::kInt8:
      return "int8";
    case IndexDType::kInt16:
      return "int16";
    case IndexDType::kInt32:
      return "int32";
    case IndexDType::kInt64:
      return "int64";
    case IndexDType::kFloat64:
      return "float64";
    case IndexDType::kFloat32:
      return "float32";
    case IndexDType::kUInt16:
      return "uint16";
  }
  return "unknown";
}

// Writes all of `n` bytes or throws naming the path (a full disk is the usual cause).
void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    MEGATRON_CHECK(w > 0, path, ": write failed (", errno_text(), ")");
    p += w;
    n -= static_cast<size_t>(w);
  }
}

std::string temp_name(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid());
}

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Makes a rename durable: the new directory entry is only on disk once the directory is synced.
void sync_dir(const std::string& path) {
  Fd dir{::open(parent_dir(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dir.fd >= 0) ::fsync(dir.fd);  // best effort: some filesystems refuse fsync on directories
}

}  // namespace

size_t index_dtype_size(IndexDType t) {
  switch (t) {
    case IndexDType::kUInt8:
    case IndexDType::kInt8:
      return 1;
    case IndexDType::kInt16:
    case IndexDType::kUInt16:
      return 2;
    case IndexDType::kInt32:
    case IndexDType::kFloat32:
      return 4;
    case IndexDType::kInt64:
    case IndexDType::kFloat64:
      return 8;
  }
  MEGATRON_ASSERT(false, "unknown IndexDType code ", static_cast<int>(t));
  return 0;
}

IndexDType index_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexDType::kUInt16 : IndexDType::kInt32;
}

// ------------------------------------------------------------------------------------------------
// Reader

IndexedDataset IndexedDataset::open(const std::string& prefix, bool multimodal) {
  IndexedDataset ds;
  ds.prefix_ = prefix;
  ds.multimodal_ = multimodal;
  const std::string idx_path = prefix + ".idx";
  const std::string bin_path = prefix + ".bin";

  Fd idx{::open(idx_path.c_str(), O_RDONLY | O_CLOEXEC)};
  MEGATRON_CHECK(idx.fd >= 0, idx_path, ": cannot open (", errno_text(),
                 "); expected the index written by megatron preprocess next to ", bin_path,
                 " (the data path is the prefix without .bin/.idx)");
  const size_t idx_size = file_size(idx.fd, idx_path);
  MEGATRON_CHECK(idx_size >= kHeaderBytes, idx_path, ": file is ", idx_size,
                 " bytes, shorter than the ", kHeaderBytes, "-byte header", kRerun);
  const unsigned char* m = map_file(idx.fd, idx_size, idx_path);
  // The arrays are copied out below, so the mapping only lives for the duration of open().
  struct Unmap {
    const unsigned char* p;
    size_t n;
    ~Unmap() { ::munmap(const_cast<unsigned char*>(p), n); }
  } unmap{m, idx_size};

  MEGATRON_CHECK(std::memcmp(m, kMagic, sizeof(kMagic)) == 0, idx_path, ": magic is ",
                 hex_bytes(m, sizeof(kMagic)), ", expected ", hex_bytes(kMagic, sizeof(kMagic)),
                 " (\"MMIDIDX\\0\\0\"); this is not a Megatron indexed-dataset index");
  const uint64_t version = load_u64(m + 9);
  MEGATRON_CHECK(version == kVersion, idx_path, ": version is ", version, ", expected ", kVersion,
                 kRerun);
  const uint8_t code = m[17];
  MEGATRON_CHECK(known_dtype_code(code), idx_path, ": dtype code is ", static_cast<int>(code),
                 ", expected one of Megatron's codes 1..8 (1 uint8 ... 4 int32 ... 8 uint16)",
                 kRerun);
  ds.dtype_ = static_cast<IndexDType>(code);
  const size_t itemsize = index_dtype_size(ds.dtype_);

  const uint64_t seq_count = load_u64(m + 18);
  const uint64_t doc_count = load_u64(m + 26);
  MEGATRON_CHECK(doc_count >= 1, idx_path,
                 ": document_count is 0, expected at least 1 (document_indices always starts "
                 "with 0)",
                 kRerun);
  // The counts fix the file length; checked arithmetic so a huge corrupt count cannot wrap.
  // A multimodal index has one int8 mode per sequence after the document indices.
  uint64_t expected = 0, a = 0, b = 0;
  const bool overflow = __builtin_mul_overflow(seq_count, uint64_t{12}, &a) ||
                        __builtin_mul_overflow(doc_count, uint64_t{8}, &b) ||
                        __builtin_add_overflow(a, b, &expected) ||
                        __builtin_add_overflow(expected, uint64_t{kHeaderBytes}, &expected);
  const uint64_t modes = multimodal ? seq_count : 0;
  if (overflow || expected + modes != idx_size) {
    MEGATRON_CHECK(overflow || multimodal || seq_count == 0 || expected + seq_count != idx_size,
                   idx_path, ": file has ", seq_count,
                   " bytes after document_indices, the sequence_modes of a multimodal dataset; "
                   "only text datasets are supported here");
    MEGATRON_CHECK(overflow || !multimodal || expected != idx_size, idx_path,
                   ": no sequence_modes after document_indices: this is a text dataset, not a "
                   "multimodal one");
    MEGATRON_CHECK(false, idx_path, ": file is ", idx_size, " bytes, expected 34 + 12*S + 8*D",
                   multimodal ? " + S" : "", " = ",
                   (overflow ? std::string("more than 2^64") : std::to_string(expected + modes)),
                   " for sequence_count S = ", seq_count, " and document_count D = ", doc_count,
                   " in its header; the file is truncated or the counts are wrong", kRerun);
  }
  const size_t S = static_cast<size_t>(seq_count);
  const size_t D = static_cast<size_t>(doc_count);
  ds.num_sequences_ = static_cast<int64_t>(S);

  const unsigned char* lengths_at = m + kHeaderBytes;
  const unsigned char* pointers_at = lengths_at + 4 * S;
  const unsigned char* documents_at = pointers_at + 8 * S;
  ds.lengths_storage_.resize(S);
  ds.pointers_storage_.resize(S);
  ds.documents_storage_.resize(D);
  if (S) std::memcpy(ds.lengths_storage_.data(), lengths_at, 4 * S);
  if (S) std::memcpy(ds.pointers_storage_.data(), pointers_at, 8 * S);
  std::memcpy(ds.documents_storage_.data(), documents_at, 8 * D);
  if (multimodal) {
    ds.modes_storage_.resize(S);
    if (S) std::memcpy(ds.modes_storage_.data(), documents_at + 8 * D, S);
  }
  ds.sequence_lengths_ = ds.lengths_storage_;
  ds.sequence_pointers_ = ds.pointers_storage_;
  ds.document_indices_ = ds.documents_storage_;

  // Pointers must be the running byte offsets of the sequences, exactly as Megatron's writer
  // computes them; the last one plus its length is the .bin size.
  int64_t offset = 0;
  for (size_t i = 0; i < S; ++i) {
    const int32_t len = ds.lengths_storage_[i];
    MEGATRON_CHECK(len >= 0, idx_path, ": sequence_lengths[", i, "] is ", len, ", expected >= 0",
                   kRerun);
    MEGATRON_CHECK(ds.pointers_storage_[i] == offset, idx_path, ": sequence_pointers[", i, "] is ",
                   ds.pointers_storage_[i], ", expected ", offset,
                   " (prefix sum of sequence_lengths times the ", itemsize, "-byte item size)",
                   kRerun);
    int64_t bytes = 0;
    MEGATRON_CHECK(!__builtin_mul_overflow(static_cast<int64_t>(len),
                                           static_cast<int64_t>(itemsize), &bytes) &&
                       !__builtin_add_overflow(offset, bytes, &offset),
                   idx_path, ": sequence_lengths sum past 2^63 bytes at sequence ", i, kRerun);
  }
  const std::vector<int64_t>& docs = ds.documents_storage_;
  MEGATRON_CHECK(docs[0] == 0, idx_path, ": document_indices[0] is ", docs[0], ", expected 0",
                 kRerun);
  for (size_t k = 1; k < D; ++k) {
    // Equal neighbours are legal: preprocess writes an empty document (no sequences) that way.
    MEGATRON_CHECK(docs[k] >= docs[k - 1], idx_path, ": document_indices[", k, "] is ", docs[k],
                   ", less than document_indices[", k - 1, "] = ", docs[k - 1],
                   " (expected non-decreasing)", kRerun);
  }
  MEGATRON_CHECK(docs[D - 1] == ds.num_sequences_, idx_path, ": document_indices[", D - 1,
                 "] (the last) is ", docs[D - 1], ", expected sequence_count ", S, kRerun);

  Fd bin{::open(bin_path.c_str(), O_RDONLY | O_CLOEXEC)};
  MEGATRON_CHECK(bin.fd >= 0, bin_path, ": cannot open (", errno_text(), "); ", idx_path,
                 " exists but its token file does not, re-run megatron preprocess");
  const size_t bin_size = file_size(bin.fd, bin_path);
  MEGATRON_CHECK(
      static_cast<int64_t>(bin_size) == offset, bin_path, ": file is ", bin_size,
      " bytes, expected ", offset, " (sum of sequence_lengths in ", idx_path, " times the ",
      itemsize, "-byte ", dtype_name(ds.dtype_), " item size); the ",
      (static_cast<int64_t>(bin_size) < offset ? "file is truncated" : "file has trailing bytes"),
      " or does not belong to this index, re-run megatron preprocess");
  ds.bin_map_ = map_file(bin.fd, bin_size, bin_path);
  ds.bin_size_ = bin_size;
  return ds;
}

IndexedDataset::IndexedDataset(IndexedDataset&& o) noexcept {
  *this = std::move(o);
}

IndexedDataset& IndexedDataset::operator=(IndexedDataset&& o) noexcept {
  if (this == &o) return *this;
  if (bin_map_) ::munmap(const_cast<unsigned char*>(bin_map_), bin_size_);
  prefix_ = std::move(o.prefix_);
  dtype_ = o.dtype_;
  num_sequences_ = o.num_sequences_;
  multimodal_ = o.multimodal_;
  modes_storage_ = std::move(o.modes_storage_);
  // Moving a vector keeps its buffer, so the spans stay valid; they are re-pointed anyway.
  lengths_storage_ = std::move(o.lengths_storage_);
  pointers_storage_ = std::move(o.pointers_storage_);
  documents_storage_ = std::move(o.documents_storage_);
  sequence_lengths_ = lengths_storage_;
  sequence_pointers_ = pointers_storage_;
  document_indices_ = documents_storage_;
  bin_map_ = std::exchange(o.bin_map_, nullptr);
  bin_size_ = std::exchange(o.bin_size_, 0);
  o.num_sequences_ = 0;
  o.sequence_lengths_ = {};
  o.sequence_pointers_ = {};
  o.document_indices_ = {};
  return *this;
}

IndexedDataset::~IndexedDataset() {
  if (bin_map_) ::munmap(const_cast<unsigned char*>(bin_map_), bin_size_);
}

void IndexedDataset::read(int64_t i, int64_t offset, int64_t length, int64_t* out) const {
  MEGATRON_CHECK(i >= 0 && i < num_sequences_, prefix_, ": sequence ", i,
                 " is out of range, the dataset has ", num_sequences_,
                 " sequences; an index cache built for another dataset would cause this");
  const int64_t len = sequence_lengths_[static_cast<size_t>(i)];
  MEGATRON_CHECK(offset >= 0 && length >= 0 && offset <= len && length <= len - offset, prefix_,
                 ": tokens [", offset, ", ", offset + length, ") of sequence ", i,
                 " are out of range, the sequence has ", len, " tokens");
  if (length == 0) return;
  const size_t itemsize = index_dtype_size(dtype_);
  const unsigned char* src = bin_map_ + sequence_pointers_[static_cast<size_t>(i)] +
                             static_cast<size_t>(offset) * itemsize;
  switch (dtype_) {
    case IndexDType::kUInt8:
      widen<uint8_t>(src, length, out);
      break;
    case IndexDType::kInt8:
      widen<int8_t>(src, length, out);
      break;
    case IndexDType::kInt16:
      widen<int16_t>(src, length, out);
      break;
    case IndexDType::kInt32:
      widen<int32_t>(src, length, out);
      break;
    case IndexDType::kInt64:
      widen<int64_t>(src, length, out);
      break;
    case IndexDType::kFloat64:
      widen<double>(src, length, out);
      break;
    case IndexDType::kFloat32:
      widen<float>(src, length, out);
      break;
    case IndexDType::kUInt16:
      widen<uint16_t>(src, length, out);
      break;
  }
}

// ------------------------------------------------------------------------------------------------
// Writer

struct IndexedDatasetBuilder::Impl {
  std::string bin_path, bin_tmp;
  IndexDType dtype;
  int fd = -1;
  // Converted tokens not yet written; flushed in large writes.
  std::vector<unsigned char> pending;
  std::vector<int32_t> sequence_lengths;
  std::vector<int64_t> document_indices{0};
  bool multimodal = false;
  std::vector<int8_t> sequence_modes;  // multimodal only
  bool finalized = false;

  static constexpr size_t kFlushBytes = 4 << 20;

  void flush() {
    if (pending.empty()) return;
    write_all(fd, pending.data(), pending.size(), bin_tmp);
    pending.clear();
  }
};

IndexedDatasetBuilder::IndexedDatasetBuilder(const std::string& bin_path, IndexDType dtype,
                                             bool multimodal)
    : impl_(new Impl) {
  impl_->bin_path = bin_path;
  impl_->multimodal = multimodal;
  impl_->bin_tmp = temp_name(bin_path);
  impl_->dtype = dtype;
  MEGATRON_CHECK(known_dtype_code(static_cast<uint8_t>(dtype)), bin_path, ": dtype code ",
                 static_cast<int>(dtype), " is not one of Megatron's codes 1..8");
  impl_->fd = ::open(impl_->bin_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (impl_->fd < 0) {
    const std::string why = errno_text();
    delete impl_;
    MEGATRON_CHECK(false, bin_path, ": cannot create (", why,
                   "); check that the folder of the output prefix exists and is writable");
  }
  impl_->pending.reserve(Impl::kFlushBytes + (1 << 16));
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (!impl_->finalized) {
    // Abandoned (an exception upstream): leave nothing behind under either name.
    if (impl_->fd >= 0) ::close(impl_->fd);
    ::unlink(impl_->bin_tmp.c_str());
  }
  delete impl_;
}

void IndexedDatasetBuilder::add_item(std::span<const int64_t> tokens, int8_t mode) {
  Impl& s = *impl_;
  MEGATRON_ASSERT(!s.finalized, "add_item after finalize on ", s.bin_path);
  MEGATRON_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                 s.bin_path, ": a sequence of ", tokens.size(),
                 " tokens does not fit the index's int32 sequence_lengths");
  const char* name = dtype_name(s.dtype);
  switch (s.dtype) {
    case IndexDType::kUInt8:
      narrow<uint8_t>(tokens, s.pending, s.bin_path, name);
      break;
    case IndexDType::kInt8:
      narrow<int8_t>(tokens, s.pending, s.bin_path, name);
      break;
    case IndexDType::kInt16:
      narrow<int16_t>(tokens, s.pending, s.bin_path, name);
      break;
    case IndexDType::kInt32:
      narrow<int32_t>(tokens, s.pending, s.bin_path, name);
      break;
    case IndexDType::kInt64:
      narrow<int64_t>(tokens, s.pending, s.bin_path, name);
      break;
    case IndexDType::kFloat64:
      narrow<double>(tokens, s.pending, s.bin_path, name);
      break;
    case IndexDType::kFloat32:
      narrow<float>(tokens, s.pending, s.bin_path, name);
      break;
    case IndexDType::kUInt16:
      narrow<uint16_t>(tokens, s.pending, s.bin_path, name);
      break;
  }
  s.sequence_lengths.push_back(static_cast<int32_t>(tokens.size()));
  if (s.multimodal) s.sequence_modes.push_back(mode);
  if (s.pending.size() >= Impl::kFlushBytes) s.flush();
}

void IndexedDatasetBuilder::add_index(const IndexedDataset& other) {
  Impl& s = *impl_;
  MEGATRON_ASSERT(!s.finalized, "add_index after finalize on ", s.bin_path);
  MEGATRON_CHECK(other.dtype() == s.dtype, other.prefix(), ".idx: dtype ",
                 dtype_name(other.dtype()), ", but ", s.bin_path, " is being written as ",
                 dtype_name(s.dtype),
                 ": datasets merge only with the same dtype (preprocess them with one tokenizer)");
  MEGATRON_CHECK(other.multimodal() == s.multimodal, other.prefix(), ".idx: opened as ",
                 other.multimodal() ? "multimodal" : "text", " for a ",
                 s.multimodal ? "multimodal" : "text", " output");
  const int64_t offset = static_cast<int64_t>(s.sequence_lengths.size());
  s.sequence_lengths.insert(s.sequence_lengths.end(), other.sequence_lengths().begin(),
                            other.sequence_lengths().end());
  const std::span<const int64_t> docs = other.document_indices();
  for (size_t k = 1; k < docs.size(); ++k) s.document_indices.push_back(offset + docs[k]);
  if (s.multimodal)
    s.sequence_modes.insert(s.sequence_modes.end(), other.sequence_modes().begin(),
                            other.sequence_modes().end());
  // The tokens as they are, after what is pending (written in order).
  s.flush();
  const std::span<const unsigned char> bytes = other.bin_bytes();
  if (!bytes.empty()) write_all(s.fd, bytes.data(), bytes.size(), s.bin_tmp);
}

void IndexedDatasetBuilder::end_document() {
  impl_->document_indices.push_back(static_cast<int64_t>(impl_->sequence_lengths.size()));
}

void IndexedDatasetBuilder::finalize(const std::string& idx_path) {
  Impl& s = *impl_;
  MEGATRON_ASSERT(!s.finalized, "finalize called twice on ", s.bin_path);
  const int64_t S = static_cast<int64_t>(s.sequence_lengths.size());
  MEGATRON_CHECK(s.document_indices.back() == S, s.bin_path, ": ", S - s.document_indices.back(),
                 " sequence(s) added after the last end_document(); call end_document() before "
                 "finalize() so every sequence belongs to a document");
  s.flush();
  MEGATRON_CHECK(::fsync(s.fd) == 0, s.bin_tmp, ": fsync failed (", errno_text(), ")");
  ::close(s.fd);
  s.fd = -1;

  // The .idx is small (12 bytes per sequence): build it in memory and write it in one go.
  const size_t itemsize = index_dtype_size(s.dtype);
  const uint64_t doc_count = s.document_indices.size();
  const size_t modes = s.multimodal ? static_cast<size_t>(S) : 0;
  std::vector<unsigned char> idx(kHeaderBytes + 12 * static_cast<size_t>(S) + 8 * doc_count +
                                 modes);
  unsigned char* p = idx.data();
  std::memcpy(p, kMagic, sizeof(kMagic));
  std::memcpy(p + 9, &kVersion, 8);
  p[17] = static_cast<unsigned char>(s.dtype);
  const uint64_t seq_count = static_cast<uint64_t>(S);
  std::memcpy(p + 18, &seq_count, 8);
  std::memcpy(p + 26, &doc_count, 8);
  p += kHeaderBytes;
  if (S) std::memcpy(p, s.sequence_lengths.data(), 4 * static_cast<size_t>(S));
  p += 4 * S;
  int64_t pointer = 0;
  for (int32_t len : s.sequence_lengths) {
    std::memcpy(p, &pointer, 8);
    p += 8;
    pointer += static_cast<int64_t>(len) * static_cast<int64_t>(itemsize);
  }
  std::memcpy(p, s.document_indices.data(), 8 * doc_count);
  p += 8 * doc_count;
  if (modes) std::memcpy(p, s.sequence_modes.data(), modes);

  const std::string idx_tmp = temp_name(idx_path);
  Fd out{::open(idx_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  MEGATRON_CHECK(out.fd >= 0, idx_path, ": cannot create (", errno_text(),
                 "); check that the folder exists and is writable");
  try {
    write_all(out.fd, idx.data(), idx.size(), idx_tmp);
    MEGATRON_CHECK(::fsync(out.fd) == 0, idx_tmp, ": fsync failed (", errno_text(), ")");
  } catch (...) {
    ::unlink(idx_tmp.c_str());
    throw;
  }
  // .bin first: a crash between the two renames leaves a new .bin beside an old (or no) .idx,
  // which open() rejects unless the old index happens to describe the same byte count.
  MEGATRON_CHECK(::rename(s.bin_tmp.c_str(), s.bin_path.c_str()) == 0, s.bin_path,
                 ": cannot rename from ", s.bin_tmp, " (", errno_text(), ")");
  s.finalized = true;
  if (::rename(idx_tmp.c_str(), idx_path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(idx_tmp.c_str());
    MEGATRON_CHECK(false, idx_path, ": cannot rename from ", idx_tmp, " (", why, ")");
  }
  sync_dir(s.bin_path);
  if (parent_dir(idx_path) != parent_dir(s.bin_path)) sync_dir(idx_path);
}

}  // namespace megatron
