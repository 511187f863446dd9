// ArgTable: the one table behind parsing (CLI11), --help, "was this flag given?" and Megatron's
// start-up argument dump. Each entry binds a flag to a field of a plain struct; the dump prints
// every entry under Megatron's name (flag without dashes, '-' -> '_') and Python-style values.
#pragma once

#include <functional>
#include <limits>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace megatron::cli {

class ArgTable {
 public:
  explicit ArgTable(CLI::App& app) : app_(app) {}

  // Entries added from now on belong to `name` (e.g. "model": the flags that fix the model's
  // architecture); record() and restore() work on one concern.
  void concern(const std::string& name) { concern_ = name; }

  // --flag VALUE bound to field (int64_t, double, std::string, or a list of strings). A single-
  // value flag given twice takes its last value, as argparse does (launch scripts that append
  // overrides rely on it); a list flag given twice collects both occurrences' values.
  template <typename T>
  void add(const std::string& flag, T& field, const std::string& help) {
    CLI::Option* opt = app_.add_option(flag, field, help)->capture_default_str();
    if constexpr (!std::is_same_v<T, std::vector<std::string>>) {
      opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    }
    entries_.push_back(bound(flag, dest_of(flag), opt, field));
  }
  // --flag sets field to true.
  void flag(const std::string& flag, bool& field, const std::string& help);
  // --foo and --no-foo on one field (argparse's store_true / store_false pair on one dest): each
  // sets it as the parser meets it, so the last given wins, as in argparse. One dump line.
  void flag_pair(const std::string& flag, const std::string& negative, bool& field,
                 const std::string& help, const std::string& negative_help);
  // --no-foo sets `dest` (a true-by-default field) to false, as Megatron's store_false flags do.
  void negative_flag(const std::string& flag, const std::string& dest, bool& field,
                     const std::string& help);
  // `alias` does what the switch `of` (registered before) does, under the same dest: a later
  // Megatron's second spelling of a switch (e.g. --disable-fp8-wgrad for --no-fp8-wgrad).
  void alias(const std::string& alias, const std::string& of);

  // Whether `flag` (or the other flag of its pair, which sets the same dest) was given.
  bool given(const std::string& flag) const;
  bool has(const std::string& flag) const;
  // Every entry's flag, in registration order; one entry's help text and value as the dump
  // prints it.
  std::vector<std::string> flags() const;
  std::string help_of(const std::string& flag) const;
  std::string text_of(const std::string& flag) const;
  // The entries of `concern` (every entry when empty) as {dest: value}, JSON-typed: what a
  // checkpoint records of the run's arguments.
  nlohmann::json record(const std::string& concern = "") const;
  // Sets the fields of `concern`'s entries from a record (keys are dests; absent keys are left
  // alone); flags in `keep` keep their value when given. Returns "FLAG OLD replaced by the
  // checkpoint's NEW" for each given flag it changed. A value of the wrong type is an error
  // naming `source` and the key.
  std::vector<std::string> restore(const std::string& concern, const nlohmann::json& saved,
                                   const std::set<std::string>& keep,
                                   const std::string& source) const;
  // Megatron's dump: the "arguments" banner, then "  name ....... value" sorted by name.
  void print_dump() const;

 private:
  struct Entry {
    std::string flag, dest;
    CLI::Option* option;
    std::function<std::string()> value;
    std::string concern;
    std::function<nlohmann::json()> to_json;
    std::function<void(const nlohmann::json&)> from_json;  // throws json::exception on a bad type
    std::function<void()> on_given = nullptr;  // a switch: what giving it does (for alias())
  };
  template <typename T>
  Entry bound(const std::string& flag, const std::string& dest, CLI::Option* opt, T& field) {
    return Entry{flag,
                 dest,
                 opt,
                 [&field] { return to_text(field); },
                 concern_,
                 [&field] { return nlohmann::json(field); },
                 [&field](const nlohmann::json& j) {
                   // An unset float flag (NaN, printed None) is recorded as null.
                   if constexpr (std::is_same_v<T, double>) {
                     if (j.is_null()) {
                       field = std::numeric_limits<double>::quiet_NaN();
                       return;
                     }
                   }
                   field = j.get<T>();
                 }};
  }
  static std::string dest_of(const std::string& flag);
  static std::string to_text(int64_t v) { return std::to_string(v); }
  static std::string to_text(double v);
  static std::string to_text(const std::string& v) { return v.empty() ? "None" : v; }
  static std::string to_text(bool v) { return v ? "True" : "False"; }
  static std::string to_text(const std::vector<std::string>& v) {
    if (v.empty()) return "None";
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", '" : "'") + v[i] + "'";
    return s + "]";
  }

  CLI::App& app_;
  std::vector<Entry> entries_;
  std::string concern_ = "general";
};

// Parses argv with CLI11. Returns -1 to continue, or an exit code: 0 after --help, 2 after a
// usage error (message on stderr naming the flag and suggesting --help; an unknown flag close to
// a known one gets "did you mean").
int parse(CLI::App& app, int argc, char** argv);

// parse() without printing, for a command that decides which rank prints: the same return
// codes, with the help text (0) or the error message (2) in *message.
int parse_quietly(CLI::App& app, int argc, char** argv, std::string* message);

}  // namespace megatron::cli
