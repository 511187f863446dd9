// JSONL manifests and WebDataset shards of image-text samples (image/image_text_data.h).
#include "image/image_text_data.h"

#include <archive.h>
#include <archive_entry.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "image/decode.h"

namespace megatron::image {
namespace {

using json = nlohmann::json;

bool is_image_ext(const std::string& ext) {
  return ext == "png" || ext == "jpg" || ext == "jpeg";
}

// The prompt and answer of a LLaVA conversation (its first human and gpt turns).
void read_conversation(const json& turns, ImageTextSample* s, const std::string& where) {
  MEGATRON_CHECK(turns.is_array() && !turns.empty(), where,
                 ": \"conversations\" must be a non-empty list of {\"from\", \"value\"} turns");
  for (const json& t : turns) {
    MEGATRON_CHECK(
        t.is_object() && t.contains("from") && t.contains("value") && t["value"].is_string(), where,
        ": every turn needs \"from\" and a string \"value\"");
    const std::string from = t["from"].get<std::string>();
    if ((from == "human" || from == "user") && s->prompt.empty())
      s->prompt = t["value"].get<std::string>();
    if ((from == "gpt" || from == "assistant") && s->text.empty())
      s->text = t["value"].get<std::string>();
  }
  MEGATRON_CHECK(!s->text.empty(), where, ": the conversation has no \"gpt\" answer");
}

std::string extension(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? std::string() : name.substr(dot + 1);
}

}  // namespace

std::vector<ImageTextSample> read_manifest(const std::string& path, bool load_images) {
  std::ifstream in(path);
  MEGATRON_CHECK(in.good(), "manifest ", path, ": cannot open it (missing or unreadable)");
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::vector<ImageTextSample> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      MEGATRON_CHECK(false, where, ": not JSON (", e.what(), ")");
    }
    MEGATRON_CHECK(j.is_object() && j.contains("image") && j["image"].is_string(), where,
                   ": each line must be a JSON object with an \"image\" path");
    ImageTextSample s;
    s.key = j.contains("id") ? (j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump())
                             : std::to_string(n);
    const std::filesystem::path image = j["image"].get<std::string>();
    s.source = (image.is_absolute() ? image : dir / image).string();
    s.image_ext = extension(s.source);
    if (j.contains("conversations")) {
      read_conversation(j["conversations"], &s, where);
    } else {
      MEGATRON_CHECK(j.contains("text") && j["text"].is_string(), where,
                     ": give the caption as \"text\" (or LLaVA's \"conversations\")");
      s.text = j["text"].get<std::string>();
    }
    if (load_images) {
      try {
        s.image = read_bytes(s.source);
      } catch (const InvalidArgument& e) {
        MEGATRON_CHECK(false, where, ": ", e.what());
      }
    }
    out.push_back(std::move(s));
  }
  MEGATRON_CHECK(!out.empty(), "manifest ", path, ": no samples");
  return out;
}

std::vector<ImageTextSample> read_webdataset(const std::string& tar_path) {
  struct Members {
    std::map<std::string, std::vector<uint8_t>> by_ext;
  };
  std::vector<std::string> order;
  std::map<std::string, Members> samples;
  archive* a = archive_read_new();
  archive_read_support_format_tar(a);
  archive_read_support_filter_all(a);  // .tar, .tar.gz, ...: what libarchive recognises
  auto fail = [&](const std::string& what) {
    const std::string msg = archive_error_string(a) ? archive_error_string(a) : "unknown error";
    archive_read_free(a);
    MEGATRON_CHECK(false, "WebDataset shard ", tar_path, ": ", what, " (", msg, ")");
  };
  if (archive_read_open_filename(a, tar_path.c_str(), 1 << 16) != ARCHIVE_OK)
    fail("cannot open it as a tar file");
  archive_entry* entry = nullptr;
  for (;;) {
    const int rc = archive_read_next_header(a, &entry);
    if (rc == ARCHIVE_EOF) break;
    if (rc != ARCHIVE_OK) fail("a corrupt or truncated member header");
    if (archive_entry_filetype(entry) != AE_IFREG) continue;
    const std::string name = archive_entry_pathname(entry);
    const size_t slash = name.rfind('/');
    const size_t dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
    if (dot == std::string::npos) continue;  // not KEY.EXT: not part of a sample
    const std::string key = name.substr(0, dot), ext = name.substr(dot + 1);
    std::vector<uint8_t> data(static_cast<size_t>(std::max<int64_t>(archive_entry_size(entry), 0)));
    size_t got = 0;
    while (got < data.size()) {
      const la_ssize_t n = archive_read_data(a, data.data() + got, data.size() - got);
      if (n < 0) fail("cannot read member " + name);
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    if (got != data.size()) fail("member " + name + " ends early (truncated)");
    if (!samples.count(key)) order.push_back(key);
    samples[key].by_ext[ext] = std::move(data);
  }
  archive_read_free(a);
  std::vector<ImageTextSample> out;
  for (const std::string& key : order) {
    Members& m = samples[key];
    ImageTextSample s;
    s.key = key;
    for (auto& [ext, data] : m.by_ext) {
      if (is_image_ext(ext)) {
        s.image_ext = ext;
        s.image = std::move(data);
      }
    }
    MEGATRON_CHECK(!s.image_ext.empty(), "WebDataset shard ", tar_path, ": sample ", key,
                   " has no image (", key, ".png, .jpg or .jpeg)");
    s.source = tar_path + ":" + key + "." + s.image_ext;
    const std::string where = tar_path + ":" + key;
    if (m.by_ext.count("txt")) {
      const std::vector<uint8_t>& t = m.by_ext["txt"];
      s.text.assign(t.begin(), t.end());
    } else if (m.by_ext.count("json")) {
      const std::vector<uint8_t>& t = m.by_ext["json"];
      json j;
      try {
        j = json::parse(t.begin(), t.end());
      } catch (const json::exception& e) {
        MEGATRON_CHECK(false, where, ".json: not JSON (", e.what(), ")");
      }
      if (j.is_array()) {
        read_conversation(j, &s, where + ".json");
      } else {
        MEGATRON_CHECK(j.is_object() && ((j.contains("caption") && j["caption"].is_string()) ||
                                         (j.contains("text") && j["text"].is_string())),
                       where, ".json: give \"caption\" or \"text\" (or a conversations list)");
        s.text =
            j.contains("caption") ? j["caption"].get<std::string>() : j["text"].get<std::string>();
        if (j.contains("prompt") && j["prompt"].is_string())
          s.prompt = j["prompt"].get<std::string>();
      }
    } else {
      MEGATRON_CHECK(false, "WebDataset shard ", tar_path, ": sample ", key, " has no text (", key,
                     ".txt or ", key, ".json)");
    }
    out.push_back(std::move(s));
  }
  MEGATRON_CHECK(!out.empty(), "WebDataset shard ", tar_path, ": no samples");
  return out;
}

void write_webdataset(const std::string& tar_path, const std::vector<ImageTextSample>& samples) {
  archive* a = archive_write_new();
  archive_write_set_format_ustar(a);
  auto fail = [&](const std::string& what) {
    const std::string msg = archive_error_string(a) ? archive_error_string(a) : "unknown error";
    archive_write_free(a);
    MEGATRON_CHECK(false, "WebDataset shard ", tar_path, ": ", what, " (", msg, ")");
  };
  if (archive_write_open_filename(a, tar_path.c_str()) != ARCHIVE_OK) fail("cannot create it");
  auto member = [&](const std::string& name, const void* data, size_t n) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, name.c_str());
    archive_entry_set_size(e, static_cast<la_int64_t>(n));
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    const bool ok = archive_write_header(a, e) == ARCHIVE_OK &&
                    archive_write_data(a, data, n) == static_cast<la_ssize_t>(n);
    archive_entry_free(e);
    if (!ok) fail("cannot write " + name);
  };
  for (const ImageTextSample& s : samples) {
    MEGATRON_CHECK(is_image_ext(s.image_ext), "WebDataset shard ", tar_path, ": sample ", s.key,
                   ": image extension '", s.image_ext, "' is not png, jpg or jpeg");
    member(s.key + "." + s.image_ext, s.image.data(), s.image.size());
    if (s.prompt.empty()) {
      member(s.key + ".txt", s.text.data(), s.text.size());
    } else {
      const std::string j = json{{"prompt", s.prompt}, {"text", s.text}}.dump();
      member(s.key + ".json", j.data(), j.size());
    }
  }
  if (archive_write_close(a) != ARCHIVE_OK) fail("cannot finish it");
  archive_write_free(a);
}

}  // namespace megatron::image
