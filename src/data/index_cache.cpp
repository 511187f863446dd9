// .npy arrays and the index-cache protocol: see the header.
#include "data/index_cache.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace megatron {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// numpy.lib.format pads the header so the data starts on a 64-byte boundary, after leaving room
// for the first dimension to grow to 21 digits (ARRAY_ALIGN and GROWTH_AXIS_MAX_DIGITS there).
constexpr size_t kArrayAlign = 64;
constexpr size_t kGrowthAxisMaxDigits = 21;

std::string errno_text() {
  return std::strerror(errno);
}

// Python's repr of a shape tuple: "()", "(7,)", "(7, 2)".
std::string shape_repr(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

// Value of `key` in the header dict, from just after its colon; npos when absent. Accepts either
// quote, since other writers than NumPy emit JSON-like headers.
size_t find_key(const std::string& header, const std::string& key) {
  for (char q : {'\'', '"'}) {
    const std::string needle = std::string(1, q) + key + std::string(1, q);
    size_t pos = header.find(needle);
    if (pos == std::string::npos) continue;
    pos = header.find(':', pos + needle.size());
    if (pos != std::string::npos) return pos + 1;
  }
  return std::string::npos;
}

size_t skip_spaces(const std::string& s, size_t pos) {
  while (pos < s.size() && (s[pos] == ' ' || s[pos] == '\t')) ++pos;
  return pos;
}

struct NpyHeader {
  NpyDType dtype;
  std::vector<int64_t> shape;
  size_t data_offset;
};

NpyHeader parse_header(const unsigned char* bytes, size_t size, const std::string& path) {
  auto bad = [&](const std::string& what) {
    return InvalidArgument("index cache file " + path + " is not a readable .npy array: " + what);
  };
  if (size < kMagicLen + 4 || std::memcmp(bytes, kMagic, kMagicLen) != 0) {
    throw bad("missing the \\x93NUMPY magic (truncated or not a .npy file)");
  }
  const int major = bytes[6];
  size_t header_len, header_start;
  if (major == 1) {
    header_len = static_cast<size_t>(bytes[8]) | (static_cast<size_t>(bytes[9]) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) throw bad("truncated header");
    header_len = 0;
    for (int i = 0; i < 4; ++i) header_len |= static_cast<size_t>(bytes[8 + i]) << (8 * i);
    header_start = 12;
  } else {
    throw bad("format version " + std::to_string(major) + " is not 1, 2 or 3");
  }
  if (header_start + header_len > size) throw bad("truncated header");
  const std::string header(reinterpret_cast<const char*>(bytes) + header_start, header_len);

  NpyHeader h{};
  size_t pos = find_key(header, "descr");
  if (pos == std::string::npos) throw bad("header has no 'descr'");
  pos = skip_spaces(header, pos);
  if (pos >= header.size() || (header[pos] != '\'' && header[pos] != '"')) {
    throw bad("header 'descr' is not a string");
  }
  const size_t end = header.find(header[pos], pos + 1);
  if (end == std::string::npos) throw bad("header 'descr' is unterminated");
  const std::string descr = header.substr(pos + 1, end - pos - 1);
  if (descr == "<i2") {
    h.dtype = NpyDType::kInt16;
  } else if (descr == "<i4") {
    h.dtype = NpyDType::kInt32;
  } else if (descr == "<i8") {
    h.dtype = NpyDType::kInt64;
  } else if (descr == "<u4") {
    h.dtype = NpyDType::kUInt32;
  } else {
    throw bad("dtype '" + descr + "' is not one of <i2, <i4, <i8, <u4");
  }

  pos = find_key(header, "fortran_order");
  if (pos == std::string::npos) throw bad("header has no 'fortran_order'");
  pos = skip_spaces(header, pos);
  if (header.compare(pos, 5, "False") != 0) {
    throw bad("Fortran order is not supported (the index caches are C order)");
  }

  pos = find_key(header, "shape");
  if (pos == std::string::npos) throw bad("header has no 'shape'");
  pos = skip_spaces(header, pos);
  if (pos >= header.size() || header[pos] != '(') throw bad("header 'shape' is not a tuple");
  const size_t close = header.find(')', pos);
  if (close == std::string::npos) throw bad("header 'shape' is unterminated");
  std::string tuple = header.substr(pos + 1, close - pos - 1);
  std::istringstream in(tuple);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t a = item.find_first_not_of(" \t");
    if (a == std::string::npos) continue;  // the empty tail after "(7,"
    const size_t b = item.find_last_not_of(" \t");
    const std::string digits = item.substr(a, b - a + 1);
    char* stop = nullptr;
    errno = 0;
    const long long v = std::strtoll(digits.c_str(), &stop, 10);
    if (errno != 0 || *stop != '\0' || v < 0) throw bad("bad dimension '" + digits + "'");
    h.shape.push_back(v);
  }
  if (h.shape.size() > 2) throw bad("rank " + std::to_string(h.shape.size()) + " > 2");
  h.data_offset = header_start + header_len;
  return h;
}

int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void write_all(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw InvalidArgument("cannot write " + path + ": " + errno_text() +
                            "; pass a writable --data-cache-path");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Writes the pieces to a temporary file beside `path`, fsyncs it, renames it over `path` and
// fsyncs the directory, so readers see either the old file or the complete new one.
void write_pieces_atomic(const std::string& path, std::span<const std::string_view> pieces) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw InvalidArgument("cannot create " + tmp + ": " + errno_text() +
                          "; pass a writable --data-cache-path");
  }
  try {
    for (std::string_view piece : pieces) write_all(fd, piece.data(), piece.size(), tmp);
    if (::fsync(fd) != 0) {
      throw InvalidArgument("cannot fsync " + tmp + ": " + errno_text());
    }
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = errno_text();
    ::unlink(tmp.c_str());
    throw InvalidArgument("cannot rename " + tmp + " to " + path + ": " + err);
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // best effort: some file systems refuse fsync on directories
    ::close(dfd);
  }
}

}  // namespace

size_t npy_dtype_size(NpyDType t) {
  switch (t) {
    case NpyDType::kInt16:
      return 2;
    case NpyDType::kInt32:
      return 4;
    case NpyDType::kInt64:
      return 8;
    case NpyDType::kUInt32:
      return 4;
  }
  return 0;
}

const char* npy_descr(NpyDType t) {
  switch (t) {
    case NpyDType::kInt16:
      return "<i2";
    case NpyDType::kInt32:
      return "<i4";
    case NpyDType::kInt64:
      return "<i8";
    case NpyDType::kUInt32:
      return "<u4";
  }
  return "?";
}

const char* npy_dtype_name(NpyDType t) {
  switch (t) {
    case NpyDType::kInt16:
      return "int16";
    case NpyDType::kInt32:
      return "int32";
    case NpyDType::kInt64:
      return "int64";
    case NpyDType::kUInt32:
      return "uint32";
  }
  return "?";
}

NpyArray::NpyArray(NpyDType dtype, std::vector<int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  MEGATRON_ASSERT(shape_.size() <= 2, "NpyArray supports rank 0-2");
  for (int64_t d : shape_) MEGATRON_ASSERT(d >= 0, "negative dimension");
  numel_ = shape_numel(shape_);
  storage_.assign(nbytes(), std::byte{0});
  data_ = storage_.data();
}

NpyArray::NpyArray(NpyArray&& other) noexcept {
  *this = std::move(other);
}

NpyArray& NpyArray::operator=(NpyArray&& other) noexcept {
  if (this == &other) return *this;
  release();
  dtype_ = other.dtype_;
  shape_ = std::move(other.shape_);
  numel_ = other.numel_;
  storage_ = std::move(other.storage_);
  map_ = other.map_;
  map_size_ = other.map_size_;
  data_ = map_ ? other.data_ : storage_.data();
  other.map_ = nullptr;
  other.map_size_ = 0;
  other.data_ = nullptr;
  other.numel_ = 0;
  other.shape_.clear();
  return *this;
}

NpyArray::~NpyArray() {
  release();
}

void NpyArray::release() {
  if (map_) ::munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
  data_ = nullptr;
  storage_.clear();
}

NpyArray NpyArray::load(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InvalidArgument("cannot open index cache file " + path + ": " + errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
    ::close(fd);
    throw InvalidArgument("index cache file " + path + " is empty or unreadable");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) throw InvalidArgument("cannot map " + path + ": " + errno_text());

  NpyArray a;
  a.map_ = map;
  a.map_size_ = size;  // from here on `a` unmaps on any throw
  const auto* bytes = static_cast<const unsigned char*>(map);
  const NpyHeader h = parse_header(bytes, size, path);
  a.dtype_ = h.dtype;
  a.shape_ = h.shape;
  a.numel_ = shape_numel(h.shape);
  if (h.data_offset + a.nbytes() != size) {
    throw InvalidArgument("index cache file " + path + " holds " +
                          std::to_string(size - h.data_offset) + " data bytes but its header (" +
                          npy_dtype_name(a.dtype_) + shape_repr(a.shape_) + ") needs " +
                          std::to_string(a.nbytes()) + " (truncated or overwritten)");
  }
  if (h.data_offset % npy_dtype_size(a.dtype_) == 0) {
    a.data_ = bytes + h.data_offset;
  } else {
    // Writers other than NumPy may leave the data unaligned: copy instead of misreading it.
    a.storage_.assign(reinterpret_cast<const std::byte*>(bytes + h.data_offset),
                      reinterpret_cast<const std::byte*>(bytes + size));
    ::munmap(a.map_, a.map_size_);
    a.map_ = nullptr;
    a.map_size_ = 0;
    a.data_ = a.storage_.data();
  }
  return a;
}

void NpyArray::save(const std::string& path) const {
  std::string dict = std::string("{'descr': '") + npy_descr(dtype_) +
                     "', 'fortran_order': False, 'shape': " + shape_repr(shape_) + ", }";
  if (!shape_.empty()) {
    const size_t digits = std::to_string(shape_[0]).size();
    if (digits < kGrowthAxisMaxDigits) dict.append(kGrowthAxisMaxDigits - digits, ' ');
  }
  const size_t hlen = dict.size() + 1;  // + the closing newline
  const size_t padlen = kArrayAlign - ((kMagicLen + 2 + 2 + hlen) % kArrayAlign);
  const size_t total = hlen + padlen;
  MEGATRON_ASSERT(total <= 0xffff, "a rank <= 2 header always fits format 1.0");
  std::string header(kMagic, kMagicLen);
  header.push_back('\x01');
  header.push_back('\x00');
  header.push_back(static_cast<char>(total & 0xff));
  header.push_back(static_cast<char>(total >> 8));
  header += dict;
  header.append(padlen, ' ');
  header.push_back('\n');
  const std::string_view pieces[] = {header,
                                     std::string_view(static_cast<const char*>(data_), nbytes())};
  write_pieces_atomic(path, pieces);
}

std::string md5_hex(std::string_view text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  MEGATRON_ASSERT(EVP_Digest(text.data(), text.size(), digest, &len, EVP_md5(), nullptr) == 1,
                  "OpenSSL MD5 failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  return hex;
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const std::string_view pieces[] = {bytes};
  write_pieces_atomic(path, pieces);
}

IndexCache::IndexCache(std::string dir, std::string_view class_name, std::string_view split,
                       std::string description)
    : dir_(std::move(dir)), description_(std::move(description)) {
  base_ = md5_hex(description_) + "-" + std::string(class_name) + "-" +
          (split.empty() ? std::string() : std::string(split) + "-");
}

std::string IndexCache::path(std::string_view suffix) const {
  return (std::filesystem::path(dir_) / (base_ + std::string(suffix))).string();
}

std::optional<std::vector<NpyArray>> IndexCache::load(std::span<const std::string_view> suffixes,
                                                      std::string* why) const {
  const std::string desc_path = path("description.txt");
  std::ifstream in(desc_path, std::ios::binary);
  if (!in) {
    *why = "no " + desc_path;
    return std::nullopt;
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str() != description_) {
    *why = desc_path + " does not match this dataset's description";
    return std::nullopt;
  }
  std::vector<NpyArray> arrays;
  for (std::string_view suffix : suffixes) {
    try {
      arrays.push_back(NpyArray::load(path(suffix)));
    } catch (const InvalidArgument& e) {
      *why = e.what();
      return std::nullopt;
    }
  }
  return arrays;
}

void IndexCache::save(std::span<const std::string_view> suffixes,
                      std::span<const NpyArray* const> arrays) const {
  MEGATRON_ASSERT(suffixes.size() == arrays.size(), "one suffix per array");
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    throw InvalidArgument("cannot create the index cache directory " + dir_ + ": " + ec.message() +
                          "; pass a writable --data-cache-path");
  }
  const std::string desc_path = path("description.txt");
  if (::unlink(desc_path.c_str()) != 0 && errno != ENOENT) {
    throw InvalidArgument("cannot remove the stale " + desc_path + ": " + errno_text());
  }
  for (size_t i = 0; i < arrays.size(); ++i) arrays[i]->save(path(suffixes[i]));
  write_file_atomic(desc_path, description_);
}

}  // namespace megatron
