// Golden scripts: a folder of `.txt` files, each a script whose commands a test runs and whose
// expected answers it holds; the test compares what it got with the file, or rewrites the file
// when PACER_REWRITE_GOLDENS is set (review the diff after an intended change). Used by the
// sharding state's scripts (tests/sharding/testdata) and the controller's (tests/pacerd/testdata);
// each test keeps its own commands (its ScriptRun); the block format and its rewriting are here.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace pacer::testing_golden {

// Runs a script through `run` (one command line in, its output out) and returns the file as it
// should read with the actual outputs. A script is comment lines (`#`), blank lines and blocks: a
// command line, `----`, and the expected output up to the next blank line (replaced).
inline std::string RewriteScript(const std::string& text,
                                 const std::function<std::string(const std::string&)>& run) {
  std::vector<std::string> lines;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::string out;
  for (size_t i = 0; i < lines.size();) {
    const std::string& line = lines[i];
    if (line.empty() || line[0] == '#') {
      out += line + "\n";
      ++i;
      continue;
    }
    out += line + "\n----\n" + run(line) + "\n";
    ++i;
    if (i < lines.size() && lines[i] == "----") {
      ++i;
      while (i < lines.size() && !lines[i].empty()) ++i;  // the expected output, replaced
    }
  }
  return out;
}

// The `.txt` files of `dir`, by name.
inline std::vector<std::string> ScriptNames(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".txt") names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// A test name for a script file: its name without `.txt`, other characters than letters and
// digits as '_'.
inline std::string TestNameOf(const ::testing::TestParamInfo<std::string>& p) {
  std::string n = p.param.substr(0, p.param.size() - 4);
  for (char& c : n) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return n;
}

// The file's text; empty (with a test failure) when it cannot be read.
inline std::string ReadScript(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

// With PACER_REWRITE_GOLDENS set, writes `got` over the golden and returns true (the caller
// skips its comparison); false otherwise.
inline bool RewriteIfAsked(const std::string& path, const std::string& got) {
  if (std::getenv("PACER_REWRITE_GOLDENS") == nullptr) return false;
  std::ofstream(path, std::ios::trunc) << got;
  return true;
}

constexpr const char* kRewriteHint =
    " (after an intended change: PACER_REWRITE_GOLDENS=1, then review the diff)";

}  // namespace pacer::testing_golden
