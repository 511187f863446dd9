// Safetensors reader and writer; see safetensors.h for the format and the guarantees.
//
// Validation follows the reference implementation check for check, so a file is accepted here
// exactly when the reference would load it (and its dtypes are ones megatron-cpp has). Every
// rejection is an InvalidArgument that names the file, the tensor or field, and the problem,
// because a bad checkpoint is something the user fixes, not a bug.
#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "core/error.h"

namespace megatron::safetensors {

// Tensor bytes go to and from disk as they lie in memory, and the format is little-endian.
static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; a big-endian host would need byte swaps");

namespace {

using json = nlohmann::json;

// The reference reader's bound on the header, which also stops a corrupt length from making us
// read (and parse) gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr uint64_t kLengthBytes = 8;
constexpr char kMetadataKey[] = "__metadata__";

struct DTypeName {
  DType dtype;
  const char* name;
};
// In the reference writer's order: its dtype enum sorted descending, which puts the widest
// alignment first and breaks ties the same way (I64 before F64, F32 before I32, BF16 before F16).
constexpr DTypeName kDTypes[] = {
    {DType::kI64, "I64"},   {DType::kF64, "F64"}, {DType::kF32, "F32"}, {DType::kI32, "I32"},
    {DType::kBF16, "BF16"}, {DType::kF16, "F16"}, {DType::kU8, "U8"},
};

int writer_rank(DType dtype) {
  for (int i = 0; i < static_cast<int>(std::size(kDTypes)); ++i) {
    if (kDTypes[i].dtype == dtype) return i;
  }
  MEGATRON_ASSERT(false, "dtype ", dtype_name(dtype), " has no safetensors name");
}

// Dtypes the format defines but megatron-cpp has no storage for; named so the error can say
// "unsupported" rather than "unknown".
bool is_other_safetensors_dtype(const std::string& s) {
  static const std::set<std::string> kOthers = {
      "BOOL",    "I8",      "I16",         "U16",         "U32", "U64",     "C64",    "F8_E5M2",
      "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4",  "F6_E2M3", "F6_E3M2"};
  return kOthers.count(s) != 0;
}

std::string supported_list() {
  std::string s;
  for (const DTypeName& d : kDTypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

// A JSON integer in [0, 2^64); floats and negatives are rejected, as the reference's usize is.
bool as_u64(const json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

// "1 byte", "2 bytes".
std::string count(uint64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

std::string system_error() {
  return std::strerror(errno);
}

// Parses one header entry; `where` prefixes every message ("safetensors file P: tensor 'x'").
TensorInfo parse_entry(const std::string& name, const json& entry, const std::string& where) {
  MEGATRON_CHECK(entry.is_object(), where, ": entry must be a JSON object with dtype, shape and ",
                 "data_offsets, got ", entry.type_name());
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    MEGATRON_CHECK(entry.contains(field), where, ": missing field \"", field, "\"");
  }
  TensorInfo info;
  info.name = name;

  const json& dtype = entry["dtype"];
  MEGATRON_CHECK(dtype.is_string(), where, ": field \"dtype\" must be a string, got ",
                 dtype.dump());
  const std::string dtype_str = dtype.get<std::string>();
  bool found = false;
  for (const DTypeName& d : kDTypes) {
    if (dtype_str == d.name) {
      info.dtype = d.dtype;
      found = true;
    }
  }
  MEGATRON_CHECK(found, where, " has ",
                 is_other_safetensors_dtype(dtype_str) ? "unsupported dtype " : "unknown dtype ",
                 dtype_str, "; megatron-cpp reads only ", supported_list(),
                 ", so convert the checkpoint to one of those (e.g. to F32 or BF16)");

  const json& shape = entry["shape"];
  MEGATRON_CHECK(shape.is_array(), where, ": field \"shape\" must be a list of non-negative ",
                 "integers, got ", shape.dump());
  MEGATRON_CHECK(shape.size() <= static_cast<size_t>(Shape::kMaxDims), where, ": shape ",
                 shape.dump(), " has ", shape.size(), " dims; megatron-cpp supports at most ",
                 Shape::kMaxDims);
  std::vector<int64_t> dims;
  for (const json& d : shape) {
    uint64_t v = 0;
    MEGATRON_CHECK(as_u64(d, &v), where, ": field \"shape\" must be a list of non-negative ",
                   "integers, got ", shape.dump());
    MEGATRON_CHECK(v <= static_cast<uint64_t>(INT64_MAX), where, ": dimension ", v, " in shape ",
                   shape.dump(), " is too large");
    dims.push_back(static_cast<int64_t>(v));
  }
  info.shape = Shape(dims.begin(), dims.end());

  const json& offsets = entry["data_offsets"];
  MEGATRON_CHECK(offsets.is_array() && offsets.size() == 2 && as_u64(offsets[0], &info.begin) &&
                     as_u64(offsets[1], &info.end),
                 where, ": field \"data_offsets\" must be [begin, end] with non-negative ",
                 "integers, got ", offsets.dump());
  MEGATRON_CHECK(info.end >= info.begin, where, ": data_offsets [", info.begin, ", ", info.end,
                 "] end before they begin");

  // The byte count, checked for overflow in 64 bits as the reference does in usize.
  uint64_t bytes = dtype_size(info.dtype);
  for (int64_t d : dims) {
    MEGATRON_CHECK(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes), where,
                   ": the byte size of shape ", info.shape.str(), " of ", dtype_str,
                   " overflows 64 bits");
  }
  MEGATRON_CHECK(info.end - info.begin == bytes, where, ": shape ", info.shape.str(), " of ",
                 dtype_str, " needs ", bytes, " bytes but data_offsets [", info.begin, ", ",
                 info.end, "] span ", info.end - info.begin, " bytes");
  return info;
}

// Closes a descriptor and removes the temporary file unless the rename happened.
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  void set_fd(int fd) { fd_ = fd; }
  // Closes explicitly so that a delayed write error (NFS, quota) is reported, not lost.
  int close() {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }
  void commit() { committed_ = true; }

 private:
  std::string path_;
  int fd_ = -1;
  bool committed_ = false;
};

// write(2) in a loop: it may write less than asked (signals, >2 GiB requests).
bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

const char* dtype_string(DType dtype) {
  return kDTypes[writer_rank(dtype)].name;
}

File File::open(const std::string& path) {
  const std::string where = "safetensors file " + path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MEGATRON_CHECK(fd >= 0, "cannot open ", where, ": ", system_error());
  struct stat st {};
  std::string why;
  if (::fstat(fd, &st) != 0) {
    why = system_error();
  } else if (S_ISDIR(st.st_mode)) {
    why = "it is a directory";
  } else if (!S_ISREG(st.st_mode)) {
    why = "it is not a regular file";
  }
  if (!why.empty()) {
    ::close(fd);
    MEGATRON_CHECK(false, "cannot open ", where, ": ", why);
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < kLengthBytes) {
    ::close(fd);
    MEGATRON_CHECK(false, where, " is too short: ", file_size, " bytes, but a safetensors file ",
                   "starts with an 8-byte header length; the file is truncated or not a ",
                   "safetensors file");
  }
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  MEGATRON_CHECK(map != MAP_FAILED, "cannot map ", where, ": ", std::strerror(map_errno));

  File f;  // owns the mapping from here, so every check below unmaps on failure
  f.path_ = path;
  f.base_ = static_cast<const unsigned char*>(map);
  f.size_ = file_size;

  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(f.base_[i]) << (8 * i);
  MEGATRON_CHECK(n <= kMaxHeaderBytes, where, ": header length ", n,
                 " exceeds the safetensors limit of ", kMaxHeaderBytes,
                 " bytes; the file is corrupt or not a safetensors file");
  MEGATRON_CHECK(kLengthBytes + n <= file_size, where, ": header length ", n, " needs ",
                 kLengthBytes + n, " bytes but the file has only ", file_size,
                 "; the file is truncated");
  f.data_start_ = kLengthBytes + n;

  json header;
  try {
    const char* text = reinterpret_cast<const char*>(f.base_ + kLengthBytes);
    header = json::parse(text, text + n);
  } catch (const json::parse_error& e) {
    MEGATRON_CHECK(false, where, ": header is not valid JSON (", e.what(),
                   "); the file is corrupt or not a safetensors file");
  }
  MEGATRON_CHECK(header.is_object(), where, ": header must be a JSON object, got ",
                 header.type_name());

  std::vector<const TensorInfo*> by_offset;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      if (value.is_null()) continue;  // the reference's Option<map>: null means none
      MEGATRON_CHECK(value.is_object(), where, ": \"__metadata__\" must be a JSON object of ",
                     "strings, got ", value.type_name());
      for (const auto& [mkey, mvalue] : value.items()) {
        MEGATRON_CHECK(mvalue.is_string(), where, ": \"__metadata__\" entry \"", mkey,
                       "\" must be a string, got ", mvalue.dump());
        f.metadata_[mkey] = mvalue.get<std::string>();
      }
      continue;
    }
    TensorInfo info = parse_entry(key, value, where + ": tensor '" + key + "'");
    by_offset.push_back(&(f.tensors_[key] = std::move(info)));
  }

  // Tensors must tile the data buffer from 0 with no gaps or overlaps, in offset order.
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  uint64_t expected = 0;
  for (const TensorInfo* t : by_offset) {
    MEGATRON_CHECK(t->begin == expected, where, ": tensor '", t->name, "' data_offsets [", t->begin,
                   ", ", t->end, "] are not contiguous: ",
                   expected == 0 ? std::string("the first tensor must start at 0")
                                 : "the previous tensor ends at " + std::to_string(expected),
                   " (tensors must tile the data buffer with no gaps or overlaps)");
    expected = t->end;
  }
  const uint64_t data_size = file_size - f.data_start_;
  if (expected != data_size) {
    const uint64_t want = f.data_start_ + expected;
    MEGATRON_CHECK(false, where, " is truncated or has trailing bytes: its header describes ", want,
                   " bytes (8 + ", n, " header + ", expected, " data) but the file has ", file_size,
                   " (",
                   want > file_size ? count(want - file_size, "byte") + " short"
                                    : count(file_size - want, "trailing byte"),
                   ")");
  }
  return f;
}

File::File(File&& other) noexcept
    : path_(std::move(other.path_)),
      base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      data_start_(other.data_start_),
      tensors_(std::move(other.tensors_)),
      metadata_(std::move(other.metadata_)) {}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    data_start_ = other.data_start_;
    tensors_ = std::move(other.tensors_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

File::~File() {
  unmap();
}

void File::unmap() {
  if (base_ != nullptr) ::munmap(const_cast<unsigned char*>(base_), size_);
  base_ = nullptr;
  size_ = 0;
}

const TensorInfo& File::info(const std::string& name) const {
  auto it = tensors_.find(name);
  MEGATRON_CHECK(it != tensors_.end(), "tensor '", name, "' not found in safetensors file ", path_,
                 " (it has ", tensors_.size(), " tensors)");
  return it->second;
}

const void* File::data(const std::string& name) const {
  return base_ + data_start_ + info(name).begin;
}

Tensor File::read(const std::string& name) const {
  const TensorInfo& i = info(name);
  Tensor t = Tensor::empty(i.shape, i.dtype);
  MEGATRON_ASSERT(t.nbytes() == i.end - i.begin, "validated sizes disagree for ", name);
  if (t.nbytes() > 0) std::memcpy(t.raw(), base_ + data_start_ + i.begin, t.nbytes());
  return t;
}

void write(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
           const std::map<std::string, std::string>& metadata,
           const std::function<bool()>& after_tensor) {
  const std::string where = "safetensors file " + path;

  // Everything that can be rejected is rejected before a file is created.
  std::vector<const std::pair<std::string, Tensor>*> order;
  std::set<std::string> seen;
  for (const auto& entry : tensors) {
    MEGATRON_CHECK(entry.first != kMetadataKey, "cannot write ", where, ": \"", kMetadataKey,
                   "\" is reserved for metadata and cannot name a tensor");
    MEGATRON_CHECK(seen.insert(entry.first).second, "cannot write ", where,
                   ": duplicate tensor name '", entry.first, "'");
    MEGATRON_CHECK(entry.second.defined(), "cannot write ", where, ": tensor '", entry.first,
                   "' is undefined (default-constructed)");
    order.push_back(&entry);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    int ra = writer_rank(a->second.dtype()), rb = writer_rank(b->second.dtype());
    return ra != rb ? ra < rb : a->first < b->first;
  });

  // ordered_json keeps insertion order, which is the reference's key order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header[kMetadataKey] = std::move(m);
  }
  uint64_t offset = 0;
  for (const auto* entry : order) {
    const Tensor& t = entry->second;
    nlohmann::ordered_json info = nlohmann::ordered_json::object();
    info["dtype"] = dtype_string(t.dtype());
    info["shape"] = nlohmann::ordered_json::array();
    for (int64_t d : t.shape()) info["shape"].push_back(d);
    info["data_offsets"] = {offset, offset + t.nbytes()};
    offset += t.nbytes();
    header[entry->first] = std::move(info);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::type_error& e) {
    MEGATRON_CHECK(false, "cannot write ", where, ": a tensor name or metadata string is not ",
                   "valid UTF-8 (", e.what(), ")");
  }
  text.resize((text.size() + 7) / 8 * 8, ' ');
  MEGATRON_CHECK(text.size() <= kMaxHeaderBytes, "cannot write ", where, ": header would be ",
                 text.size(), " bytes, over the safetensors limit of ", kMaxHeaderBytes,
                 " (too many tensors or too much metadata)");
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(text.size() >> (8 * i));

  // A sibling temporary file, renamed into place only once it is complete and on disk.
  TempFile tmp(path + ".tmp." + std::to_string(::getpid()));
  tmp.set_fd(::open(tmp.path().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (tmp.fd() < 0) {
    int err = errno;
    MEGATRON_CHECK(false, "cannot write ", where, ": creating ", tmp.path(),
                   " failed: ", std::strerror(err),
                   err == ENOENT ? " (does the directory exist?)" : "");
  }
  bool ok =
      write_all(tmp.fd(), length, sizeof(length)) && write_all(tmp.fd(), text.data(), text.size());
  for (size_t i = 0; ok && i < order.size(); ++i) {
    const Tensor& t = order[i]->second;
    ok = write_all(tmp.fd(), t.raw(), t.nbytes());
    if (ok && after_tensor) ok = after_tensor();
  }
  MEGATRON_CHECK(ok, "cannot write ", where, ": writing failed: ", system_error());
  MEGATRON_CHECK(::fsync(tmp.fd()) == 0, "cannot write ", where,
                 ": fsync failed: ", system_error());
  MEGATRON_CHECK(tmp.close() == 0, "cannot write ", where, ": close failed: ", system_error());
  MEGATRON_CHECK(::rename(tmp.path().c_str(), path.c_str()) == 0, "cannot write ", where,
                 ": renaming ", tmp.path(), " over it failed: ", system_error());
  tmp.commit();

  // The rename is durable only once the directory entry is; some file systems cannot sync a
  // directory (EINVAL), and there the rename is as durable as they make it.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  MEGATRON_CHECK(dfd >= 0, "wrote ", where,
                 " but cannot open its directory to sync it: ", system_error());
  int rc = ::fsync(dfd);
  int err = errno;
  ::close(dfd);
  MEGATRON_CHECK(rc == 0 || err == EINVAL, "wrote ", where,
                 " but syncing its directory failed: ", std::strerror(err));
}

}  // namespace megatron::safetensors
