// ArgTable's CLI11 bindings, Megatron's argument dump (sorted, dot-padded, Python-style values) and
// the parse wrapper that maps CLI11 errors to exit code 2.
#include "cli/arg_table.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <stdexcept>

#include "core/error.h"
#include "core/logging.h"
#include "train/arguments.h"

namespace megatron::cli {

void ArgTable::flag(const std::string& flag, bool& field, const std::string& help) {
  CLI::Option* opt = app_.add_flag(flag, field, help);
  entries_.push_back(bound(flag, dest_of(flag), opt, field));
  entries_.back().on_given = [&field] { field = true; };
}

void ArgTable::flag_pair(const std::string& flag, const std::string& negative, bool& field,
                         const std::string& help, const std::string& negative_help) {
  // Callbacks triggered on parse run in command-line order (plain flags are set after parsing,
  // in declaration order).
  CLI::Option* on = app_.add_flag_callback(
      flag, [&field] { field = true; }, help);
  on->trigger_on_parse();
  entries_.push_back(bound(flag, dest_of(flag), on, field));
  entries_.back().on_given = [&field] { field = true; };
  CLI::Option* off = app_.add_flag_callback(
      negative, [&field] { field = false; }, negative_help);
  off->trigger_on_parse();
  entries_.push_back(bound(negative, dest_of(flag), off, field));
  entries_.back().on_given = [&field] { field = false; };
}

void ArgTable::negative_flag(const std::string& flag, const std::string& dest, bool& field,
                             const std::string& help) {
  CLI::Option* opt = app_.add_flag_callback(
      flag, [&field] { field = false; }, help);
  entries_.push_back(bound(flag, dest, opt, field));
  entries_.back().on_given = [&field] { field = false; };
}

void ArgTable::alias(const std::string& alias, const std::string& of) {
  const auto it =
      std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.flag == of; });
  // A wrong alias is a defect of the registration code, not of the user's input.
  if (it == entries_.end() || !it->on_given) {
    throw std::logic_error("ArgTable::alias: " + of + " is not a registered switch");
  }
  Entry entry = *it;
  entry.flag = alias;
  // Set as the parser meets it, so that with a flag pair the last one given wins.
  entry.option = app_.add_flag_callback(alias, entry.on_given, "The same as " + of);
  entry.option->trigger_on_parse();
  entries_.push_back(std::move(entry));
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
  std::set<std::string> done;  // a flag pair's dest once, given by either of its flags
  for (const Entry& e : entries_) {
    if (e.concern != concern || !saved.contains(e.dest) || !done.insert(e.dest).second) continue;
    const bool given = this->given(e.flag);
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
  for (const Entry& e : entries_) {
    if (e.flag != flag) continue;
    // A flag pair's flags both set its dest: either one given is the dest given.
    for (const Entry& other : entries_)
      if (other.dest == e.dest && other.option->count() > 0) return true;
    return false;
  }
  return false;
}

bool ArgTable::has(const std::string& flag) const {
  for (const Entry& e : entries_)
    if (e.flag == flag) return true;
  return false;
}

std::vector<std::string> ArgTable::flags() const {
  std::vector<std::string> out;
  for (const Entry& e : entries_) out.push_back(e.flag);
  return out;
}

std::string ArgTable::help_of(const std::string& flag) const {
  for (const Entry& e : entries_)
    if (e.flag == flag) return e.option->get_description();
  return "";
}

std::string ArgTable::text_of(const std::string& flag) const {
  for (const Entry& e : entries_)
    if (e.flag == flag) return e.value();
  return "";
}

std::string ArgTable::dest_of(const std::string& flag) {
  std::string d = flag.substr(flag.find_first_not_of('-'));
  std::replace(d.begin(), d.end(), '-', '_');
  return d;
}

std::string ArgTable::to_text(double v) {
  if (!is_set(v)) return "None";  // a float flag left unset (train/arguments.h kUnset)
  return python_float(v);
}

void ArgTable::print_dump() const {
  std::vector<std::pair<std::string, std::string>> rows;
  std::set<std::string> dests;  // a flag pair's two flags share one line
  for (const Entry& e : entries_)
    if (dests.insert(e.dest).second) rows.emplace_back(e.dest, e.value());
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

namespace {

// Edit distance (insertions, deletions, substitutions), for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// "unknown flag --x" for each unexpected argument, with the closest flag of the command when one
// is within a quarter of its length (at least 2 edits): typos and singular/plural slips.
std::string unknown_flags_message(const CLI::App& app, const std::vector<std::string>& extras) {
  std::vector<std::string> known;
  for (const CLI::Option* opt : app.get_options()) {
    for (const std::string& name : opt->get_lnames()) known.push_back("--" + name);
  }
  std::string out;
  bool after_flag = false;  // the values of an unknown flag are not reported again
  for (const std::string& arg : extras) {
    if (arg.rfind("--", 0) != 0) {
      if (!after_flag) out += (out.empty() ? "" : "; ") + ("unexpected argument '" + arg + "'");
      continue;
    }
    after_flag = true;
    if (!out.empty()) out += "; ";
    const std::string flag = arg.substr(0, arg.find('='));
    std::string best;
    size_t best_distance = std::max<size_t>(2, flag.size() / 4) + 1;
    for (const std::string& k : known) {
      const size_t d = edit_distance(flag, k);
      if (d < best_distance) best_distance = d, best = k;
    }
    out += "unknown flag " + flag + (best.empty() ? "" : " (did you mean " + best + "?)");
  }
  return out;
}

}  // namespace

int parse_quietly(CLI::App& app, int argc, char** argv, std::string* message) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    *message = app.help();
    return 0;
  } catch (const CLI::ExtrasError& e) {
    *message = unknown_flags_message(app, app.remaining()) + " (see `megatron " + app.get_name() +
               " --help`)";
    return 2;
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
