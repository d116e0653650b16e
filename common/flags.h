// Command-line parsing on boost::program_options with Pacer's conventions (docs/design.md §9):
// every binary prints --help, and exits 2 with a one-line reason on a bad flag.
#pragma once

#include <boost/program_options.hpp>
#include <string>
#include <vector>

namespace pacer {

struct ParsedFlags {
  boost::program_options::variables_map vm;
  // Words after a literal "--" (e.g. the worker command of pacer-agent), untouched.
  std::vector<std::string> passthrough;
  // Positional words before "--".
  std::vector<std::string> positional;
};

// Parses argv against `options`. On --help prints `usage` and the options, exits 0; on
// --version prints "<program> <PacerVersion()>", exits 0 (common/version.h). On error
// prints "<program>: <reason>" to stderr and exits 2.
ParsedFlags ParseFlagsOrExit(int argc, char** argv, const std::string& usage,
                             const boost::program_options::options_description& options,
                             bool allow_positional = false);

// Prints "<program>: <message>" and exits with `code`.
[[noreturn]] void ExitWithError(const std::string& program, const std::string& message,
                                int code = 2);

}  // namespace pacer
