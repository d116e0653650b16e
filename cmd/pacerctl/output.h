// pacerctl's output formats (kubectl's -o): table (default), wide (more columns), json, yaml.
//
// JSON comes from the protobuf messages by reflection (ProtoToJson), not from protobuf's JSON
// printer, which writes 64-bit integers as strings ("journal_seq": "0"): here every number is a
// JSON number, exact for the whole int64 / uint64 range. Field names are the proto names,
// enums their names, every scalar field is present (zero values included), unset messages and
// unset optional / oneof fields are left out. YAML is the same document (yaml-cpp).
#pragma once

#include <google/protobuf/message.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace pacer::ctl {

// Keys in insertion order: proto field order, and policy files in their own order.
using Json = nlohmann::ordered_json;

enum class Format { kTable, kWide, kJson, kYaml };

// "table" | "wide" | "json" | "yaml"; nullopt otherwise.
std::optional<Format> ParseFormat(const std::string& name);

Json ProtoToJson(const google::protobuf::Message& message);
std::string ToYaml(const Json& doc);

// A column-aligned table; wide-only columns are printed by -o wide only.
class Table {
 public:
  struct Column {
    std::string header;
    bool wide_only = false;
  };
  explicit Table(std::vector<Column> columns) : columns_(std::move(columns)) {}
  void Add(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  size_t size() const { return rows_.size(); }
  std::string Render(bool wide) const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// What a read command shows: the machine document and the human text (table and wide).
struct View {
  Json doc;
  std::string table;
  std::string wide;  // empty: same as table
};

// The view in `format`, ending with a newline. `compact` JSON (one line) for --watch streams.
std::string Render(const View& view, Format format, bool compact = false);

// Fixed-point number with `digits` decimals ("-" for NaN).
std::string Fixed(double v, int digits);
// "12:03:04" local time of a ms-since-epoch time; "-" for 0.
std::string ClockTime(int64_t ms);
// "3.2 s ago", "4 min ago" relative to now_ms; "-" for 0.
std::string Ago(int64_t ms, int64_t now_ms);

}  // namespace pacer::ctl
