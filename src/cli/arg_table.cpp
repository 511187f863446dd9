// ArgTable's CLI11 bindings, Megatron's argument dump (sorted, dot-padded, Python-style values) and
// the parse wrapper that maps CLI11 errors to exit code 2.
#include "cli/arg_table.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "core/logging.h"

namespace megatron::cli {

void ArgTable::flag(const std::string& flag, bool& field, const std::string& help) {
  CLI::Option* opt = app_.add_flag(flag, field, help);
  entries_.push_back(bound(flag, dest_of(flag), opt, field));
}

void ArgTable::negative_flag(const std::string& flag, const std::string& dest, bool& field,
                             const std::string& help) {
  CLI::Option* opt = app_.add_flag_callback(
      flag, [&field] { field = false; }, help);
  entries_.push_back(bound(flag, dest, opt, field));
}

nlohmann::json ArgTable::record(const std::string& concern) const {
  nlohmann::json out = nlohmann::json::object();
  for (const Entry& e : entries_) {
    if (concern.empty() || e.concern == concern) out[e.dest] = e.to_json();
  }
  return out;
}

std::vector<std::string> ArgTable::restore(const std::string& concern, const nlohmann::json& saved,
                                           const std::set<std::string>& keep,
                                           const std::string& source) const {
  std::vector<std::string> changed;
  for (const Entry& e : entries_) {
    if (e.concern != concern || !saved.contains(e.dest)) continue;
    const bool given = e.option->count() > 0;
    if (given && keep.count(e.flag)) continue;
    const std::string before = e.value();
    try {
      e.from_json(saved.at(e.dest));
    } catch (const nlohmann::json::exception&) {
      MEGATRON_CHECK(false, source, ": argument ", e.dest, " has the wrong type");
    }
    if (given && e.value() != before) {
      changed.push_back(e.flag + " " + before + " replaced by the checkpoint's " + e.value());
    }
  }
  return changed;
}

bool ArgTable::given(const std::string& flag) const {
  for (const Entry& e : entries_)
    if (e.flag == flag) return e.option->count() > 0;
  return false;
}

std::string ArgTable::dest_of(const std::string& flag) {
  std::string d = flag.substr(flag.find_first_not_of('-'));
  std::replace(d.begin(), d.end(), '-', '_');
  return d;
}

std::string ArgTable::to_text(double v) {
  // Python's repr for the common cases: 0.1, 1e-05, 10000.0.
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof(buf), "%.*g", p, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

void ArgTable::print_dump() const {
  std::vector<std::pair<std::string, std::string>> rows;
  for (const Entry& e : entries_) rows.emplace_back(e.dest, e.value());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    std::string la = a.first, lb = b.first;
    std::transform(la.begin(), la.end(), la.begin(), ::tolower);
    std::transform(lb.begin(), lb.end(), lb.begin(), ::tolower);
    return la < lb;
  });
  log_line("------------------------ arguments ------------------------");
  for (const auto& [name, value] : rows) {
    const int dots = std::max(0, 48 - static_cast<int>(name.size()));
    log_line("  " + name + " " + std::string(static_cast<size_t>(dots), '.') + " " + value);
  }
  log_line("-------------------- end of arguments ---------------------");
}

int parse_quietly(CLI::App& app, int argc, char** argv, std::string* message) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    *message = app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    *message = std::string(e.what()) + " (see `megatron " + app.get_name() + " --help`)";
    return 2;
  }
  return -1;
}

int parse(CLI::App& app, int argc, char** argv) {
  std::string message;
  const int rc = parse_quietly(app, argc, argv, &message);
  if (rc == 0) std::fputs(message.c_str(), stdout);
  if (rc == 2) log_error(message);
  return rc;
}

}  // namespace megatron::cli
