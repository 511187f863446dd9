// Sharded checkpoints: directory names, the tracker, the save protocol and the box reader.
#include "checkpoint/sharded_checkpoint.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "comm/agreement.h"
#include "core/error.h"

namespace megatron::checkpoint {

namespace fs = std::filesystem;

namespace {

std::string system_error() {
  return std::strerror(errno);
}

// Writes `text` to `path` atomically: temporary sibling, fsync, rename. Errors name the path.
void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MEGATRON_CHECK(fd >= 0, "cannot write ", path, ": creating ", tmp, " failed: ", system_error());
  size_t done = 0;
  bool ok = true;
  while (ok && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  const std::string why = ok ? "" : system_error();
  ok = ok && ::fsync(fd) == 0;
  const std::string sync_why = ok ? "" : system_error();
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    MEGATRON_CHECK(false, "cannot write ", path, ": ", why.empty() ? "fsync failed: " : "",
                   why.empty() ? sync_why : why);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string e = system_error();
    ::unlink(tmp.c_str());
    MEGATRON_CHECK(false, "cannot write ", path, ": renaming ", tmp, " failed: ", e);
  }
}

// A rename is durable only once its directory is synced.
void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some filesystems refuse directory descriptors
  ::fsync(fd);
  ::close(fd);
}

std::string rank_file_name(int rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "rank_%05d.safetensors", rank);
  return buf;
}

std::vector<int64_t> int_list(const nlohmann::json& j) {
  return j.get<std::vector<int64_t>>();
}

}  // namespace

std::string iteration_dir_name(int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "iter_%07ld", static_cast<long>(iteration));
  return buf;
}

std::string iteration_dir(const std::string& root, int64_t iteration) {
  return (fs::path(root) / iteration_dir_name(iteration)).string();
}

std::optional<int64_t> read_tracker(const std::string& root) {
  const std::string path = (fs::path(root) / kTrackerFile).string();
  std::ifstream in(path);
  if (!in) {
    MEGATRON_CHECK(!fs::exists(path), "cannot read the checkpoint tracker ", path, ": ",
                   system_error());
    return std::nullopt;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  bool digits = !text.empty() && text.size() <= 18;
  for (char c : text) digits = digits && c >= '0' && c <= '9';
  MEGATRON_CHECK(digits, "the checkpoint tracker ", path, " holds '", text.substr(0, 40),
                 "', not an iteration number: it is corrupt; write the iteration of a complete "
                 "checkpoint directory (iter_NNNNNNN with a metadata.json) into it, or pass "
                 "--ckpt-step N");
  return std::stoll(text);
}

std::string prepare_save(ProcessGroup& world, const std::string& root, int64_t iteration) {
  const std::string staging = iteration_dir(root, iteration) + ".staging";
  run_agreed(world, [&] {
    if (world.rank() != 0) return;
    std::error_code ec;
    fs::create_directories(root, ec);
    MEGATRON_CHECK(!ec && fs::is_directory(root), "--save: cannot create the checkpoint directory ",
                   root, " (", ec.message(), ")");
    fs::remove_all(staging, ec);  // a save that died before committing
    MEGATRON_CHECK(!ec, "--save: cannot remove the stale directory ", staging, " (", ec.message(),
                   ")");
    fs::create_directory(staging, ec);
    MEGATRON_CHECK(!ec, "--save: cannot create ", staging, " (", ec.message(), ")");
  });
  return staging;
}

nlohmann::json write_rank_file(const std::string& staging, int world_rank,
                               const std::vector<ShardEntry>& entries,
                               const std::function<bool()>& after_tensor) {
  if (entries.empty()) return nlohmann::json::object();
  const std::string name = rank_file_name(world_rank);
  const std::string path = (fs::path(staging) / name).string();
  std::vector<std::pair<std::string, Tensor>> tensors;
  nlohmann::json shards = nlohmann::json::array();
  for (const ShardEntry& e : entries) {
    MEGATRON_ASSERT(e.data.dtype() == DType::kF32 && e.data.numel() == e.box.numel(),
                    "shard entry ", e.tensor, " is not ", e.box.numel(), " f32 elements");
    const std::string key = e.tensor + "@" + offset_text(e.box);
    tensors.emplace_back(key, e.data.view(Shape(e.box.extent.begin(), e.box.extent.end())));
    shards.push_back({{"tensor", e.tensor},
                      {"key", key},
                      {"global_shape", e.global_shape},
                      {"offset", e.box.offset},
                      {"extent", e.box.extent},
                      {"xxh3", xxh3_hex(e.data.raw(), e.data.nbytes())}});
  }
  safetensors::write(path, tensors, {{"format", "megatron-cpp"}}, after_tensor);
  struct stat st {};
  MEGATRON_CHECK(::stat(path.c_str(), &st) == 0, "cannot stat ", path, ": ", system_error());
  return {{"file", name},
          {"bytes", static_cast<int64_t>(st.st_size)},
          {"sha256", sha256_file(path)},
          {"shards", shards}};
}

int64_t commit_save(ProcessGroup& world, const std::string& root, int64_t iteration,
                    const std::string& staging, const nlohmann::json& record,
                    const std::string& error, const nlohmann::json& state) {
  try {
    agree_on_failure(world, error, 1);
  } catch (const AgreedFailure&) {
    if (world.rank() == 0) {
      std::error_code ec;
      fs::remove_all(staging, ec);
    }
    throw;
  }
  const std::vector<std::string> records = all_gather_strings(world, record.dump());
  int64_t total = 0;
  for (const std::string& text : records) {
    const nlohmann::json r = nlohmann::json::parse(text);
    if (!r.empty()) total += r["bytes"].get<int64_t>();
  }
  run_agreed(world, [&] {
    if (world.rank() != 0) return;
    nlohmann::json meta = state;
    meta["format"] = kFormatName;
    meta["format_version"] = kFormatVersion;
    meta["iteration"] = iteration;
    nlohmann::json files = nlohmann::json::object();
    nlohmann::json tensors = nlohmann::json::object();
    for (const std::string& text : records) {
      const nlohmann::json r = nlohmann::json::parse(text);
      if (r.empty()) continue;
      files[r["file"].get<std::string>()] = {{"bytes", r["bytes"]}, {"sha256", r["sha256"]}};
      for (const nlohmann::json& s : r["shards"]) {
        nlohmann::json& t = tensors[s["tensor"].get<std::string>()];
        t["dtype"] = "F32";
        t["shape"] = s["global_shape"];
        t["shards"].push_back({{"file", r["file"]},
                               {"key", s["key"]},
                               {"offset", s["offset"]},
                               {"extent", s["extent"]},
                               {"xxh3", s["xxh3"]}});
      }
    }
    meta["files"] = files;
    meta["tensors"] = tensors;
    write_file_atomic((fs::path(staging) / kMetadataFile).string(), meta.dump(1));
    fsync_dir(staging);
    // Put the directory in place: an older checkpoint of the same iteration (a run that resumed
    // and saved it again) is moved aside first and removed only after the new one is in place.
    const std::string final_dir = iteration_dir(root, iteration);
    const std::string old = final_dir + ".old";
    std::error_code ec;
    fs::remove_all(old, ec);
    if (fs::exists(final_dir)) {
      fs::rename(final_dir, old, ec);
      MEGATRON_CHECK(!ec, "cannot move the previous ", final_dir, " aside (", ec.message(), ")");
    }
    fs::rename(staging, final_dir, ec);
    MEGATRON_CHECK(!ec, "cannot rename ", staging, " to ", final_dir, " (", ec.message(), ")");
    fsync_dir(root);
    fs::remove_all(old, ec);
    write_file_atomic((fs::path(root) / kTrackerFile).string(), std::to_string(iteration) + "\n");
    fsync_dir(root);
  });
  return total;
}

std::string sha256_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MEGATRON_CHECK(in, "cannot read ", path, " to check its SHA-256: ", system_error());
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  MEGATRON_ASSERT(ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1, "EVP sha256 init");
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(ctx, buf.data(), static_cast<size_t>(in.gcount()));
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, digest, &len);
  EVP_MD_CTX_free(ctx);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

CheckpointReader CheckpointReader::open(const std::string& dir, Integrity integrity) {
  CheckpointReader r;
  r.dir_ = dir;
  r.integrity_ = integrity;
  const std::string path = (fs::path(dir) / kMetadataFile).string();
  MEGATRON_CHECK(fs::is_directory(dir), "checkpoint directory ", dir,
                 " does not exist: the tracker points to a checkpoint that is not there; pass "
                 "--ckpt-step N to load another iteration");
  MEGATRON_CHECK(fs::exists(path), "checkpoint directory ", dir, " has no ", kMetadataFile,
                 ": its save never completed, so it is not a checkpoint; pass --ckpt-step N to "
                 "load an older one");
  std::ifstream in(path);
  MEGATRON_CHECK(in, "cannot read ", path, ": ", system_error());
  try {
    r.meta_ = nlohmann::json::parse(in);
    MEGATRON_CHECK(r.meta_.is_object() && r.meta_.value("format", "") == kFormatName, path,
                   " is not a megatron-cpp checkpoint manifest (no \"format\": \"", kFormatName,
                   "\")");
    const int version = r.meta_.at("format_version").get<int>();
    MEGATRON_CHECK(version <= kFormatVersion, path, " has format version ", version,
                   "; this build reads up to ", kFormatVersion, ": use a newer megatron");
    for (const auto& [name, f] : r.meta_.at("files").items()) {
      const std::string file = (fs::path(dir) / name).string();
      MEGATRON_CHECK(fs::exists(file), "checkpoint shard ", file, " is missing (", path,
                     " lists it): restore it, or pass --ckpt-step N to load another iteration");
      const auto want = f.at("bytes").get<int64_t>();
      const auto got = static_cast<int64_t>(fs::file_size(file));
      MEGATRON_CHECK(got == want, "checkpoint shard ", file, " is ", got, " bytes but ", path,
                     " records ", want,
                     ": the file is truncated or was replaced; restore it, or "
                     "pass --ckpt-step N to load another iteration");
      r.sha256_[name] = f.at("sha256").get<std::string>();
    }
    for (const auto& [name, t] : r.meta_.at("tensors").items()) {
      TensorInfo info;
      info.shape = int_list(t.at("shape"));
      int64_t total = 1, covered = 0;
      for (int64_t d : info.shape) total *= d;
      for (const nlohmann::json& s : t.at("shards")) {
        // Checkpoints written before per-tensor checksums have none: their tensors load with the
        // size checks only.
        Shard sh{s.at("file").get<std::string>(), s.at("key").get<std::string>(),
                 Box{int_list(s.at("offset")), int_list(s.at("extent"))},
                 s.value("xxh3", std::string())};
        MEGATRON_CHECK(r.sha256_.count(sh.file), path, ": tensor ", name, " has a shard in ",
                       sh.file, ", which is not in its file list");
        MEGATRON_CHECK(
            sh.box.offset.size() == info.shape.size() && sh.box.extent.size() == info.shape.size(),
            path, ": a shard of ", name, " does not have ", info.shape.size(), " dimensions");
        for (size_t d = 0; d < info.shape.size(); ++d) {
          MEGATRON_CHECK(sh.box.offset[d] >= 0 && sh.box.extent[d] >= 0 &&
                             sh.box.offset[d] + sh.box.extent[d] <= info.shape[d],
                         path, ": a shard of ", name, " lies outside its shape");
        }
        covered += sh.box.numel();
        info.shards.push_back(std::move(sh));
      }
      MEGATRON_CHECK(covered == total, path, ": the shards of ", name, " hold ", covered,
                     " elements, its shape ", total, ": the manifest is inconsistent");
      r.tensors_[name] = std::move(info);
    }
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_CHECK(false, "checkpoint manifest ", path, " is unreadable (", e.what(),
                   "): it is truncated or corrupt; pass --ckpt-step N to load another iteration");
  }
  return r;
}

const std::vector<int64_t>& CheckpointReader::global_shape(const std::string& tensor) const {
  auto it = tensors_.find(tensor);
  MEGATRON_CHECK(it != tensors_.end(), "checkpoint ", dir_, " has no tensor ", tensor);
  return it->second.shape;
}

const safetensors::File& CheckpointReader::file(const std::string& name) {
  auto it = open_.find(name);
  if (it != open_.end()) return *it->second;
  const std::string path = (fs::path(dir_) / name).string();
  if (integrity_ == Integrity::kTensorsAndFiles) {
    const std::string got = sha256_file(path);
    MEGATRON_CHECK(got == sha256_[name], "checkpoint shard ", path,
                   " fails --verify-integrity: ", "its SHA-256 is ", got,
                   ", metadata.json records ", sha256_[name],
                   ": the file is corrupt; restore it, or pass --ckpt-step N to load another "
                   "iteration");
  }
  auto f = std::make_unique<safetensors::File>(safetensors::File::open(path));
  return *open_.emplace(name, std::move(f)).first->second;
}

void CheckpointReader::read(const std::string& tensor, const Box& want, float* dst,
                            bool allow_outside) {
  global_shape(tensor);  // the error naming a missing tensor
  const TensorInfo& info = tensors_.at(tensor);
  MEGATRON_CHECK(want.offset.size() == info.shape.size(), "checkpoint ", dir_, ": tensor ", tensor,
                 " has ", info.shape.size(), " dimensions, this model's has ", want.offset.size());
  const Box whole{std::vector<int64_t>(info.shape.size(), 0), info.shape};
  const Box inside = intersect(want, whole);
  if (inside.numel() != want.numel()) {
    MEGATRON_CHECK(allow_outside, "checkpoint ", dir_, ": tensor ", tensor,
                   " is smaller than this model's (the model shapes differ)");
    std::fill(dst, dst + want.numel(), 0.0F);
  }
  int64_t copied = 0;
  for (const Shard& s : info.shards) {
    const Box region = intersect(s.box, inside);
    if (region.numel() == 0) continue;
    const safetensors::File& f = file(s.file);
    const safetensors::TensorInfo& ti = f.info(s.key);
    MEGATRON_CHECK(
        ti.dtype == DType::kF32 && ti.shape == Shape(s.box.extent.begin(), s.box.extent.end()),
        "checkpoint shard ", f.path(), ": tensor ", s.key,
        " is not the f32 box metadata.json describes");
    const std::string shard_id = s.file + "/" + s.key;
    if (integrity_ != Integrity::kSizesOnly && !s.xxh3.empty() && !checked_.count(shard_id)) {
      const std::string got = xxh3_hex(f.data(s.key), static_cast<size_t>(s.box.numel()) * 4);
      MEGATRON_CHECK(got == s.xxh3, "checkpoint shard ", f.path(), ": tensor ", s.key,
                     " fails its checksum (XXH3-64 ", got, ", ", kMetadataFile, " records ", s.xxh3,
                     "): the file is corrupt; restore it, or pass --ckpt-step N to load another "
                     "iteration (--no-verify-integrity loads it unchecked)");
      checked_.insert(shard_id);  // only a match is remembered: a mismatch fails every read
    }
    copy_region(static_cast<const float*>(f.data(s.key)), s.box, dst, want, region);
    copied += region.numel();
  }
  bytes_read_ += copied * static_cast<int64_t>(sizeof(float));
  MEGATRON_ASSERT(copied == inside.numel(), "checkpoint ", dir_, ": shards of ", tensor, " cover ",
                  copied, " of ", inside.numel(), " elements");
}

}  // namespace megatron::checkpoint
