#include "cmd/pacerctl/output.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <iomanip>
#include <sstream>

namespace pacer::ctl {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

Json Scalar(const Message& m, const FieldDescriptor* f, int index) {
  const Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: return rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f);
    case FieldDescriptor::CPPTYPE_INT64: return rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f);
    case FieldDescriptor::CPPTYPE_UINT32: return rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f);
    case FieldDescriptor::CPPTYPE_UINT64: return rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f);
    case FieldDescriptor::CPPTYPE_DOUBLE: return rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f);
    case FieldDescriptor::CPPTYPE_FLOAT: return rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f);
    case FieldDescriptor::CPPTYPE_BOOL: return rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f);
    case FieldDescriptor::CPPTYPE_ENUM: {
      const auto* v = rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f);
      return v->name();
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string s = rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
      if (f->type() == FieldDescriptor::TYPE_BYTES) {
        std::ostringstream hex;  // bytes: hex (none of pacerctl's replies carries any)
        for (unsigned char c : s) hex << std::hex << std::setw(2) << std::setfill('0') << int(c);
        return hex.str();
      }
      return s;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return ProtoToJson(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f));
  }
  return nullptr;
}

std::string MapKey(const Message& entry) {
  const FieldDescriptor* k = entry.GetDescriptor()->map_key();
  Json key = Scalar(entry, k, -1);
  return key.is_string() ? key.get<std::string>() : key.dump();
}

void EmitYaml(YAML::Emitter& out, const Json& v) {
  if (v.is_object()) {
    out << YAML::BeginMap;
    for (auto it = v.begin(); it != v.end(); ++it) {
      out << YAML::Key << it.key() << YAML::Value;
      EmitYaml(out, it.value());
    }
    out << YAML::EndMap;
  } else if (v.is_array()) {
    out << YAML::BeginSeq;
    for (const auto& e : v) EmitYaml(out, e);
    out << YAML::EndSeq;
  } else if (v.is_string()) {
    out << YAML::DoubleQuoted << v.get<std::string>();
  } else if (v.is_boolean()) {
    out << (v.get<bool>() ? "true" : "false");
  } else if (v.is_null()) {
    out << YAML::Null;
  } else {
    out << v.dump();  // numbers: the same digits as JSON
  }
}

}  // namespace

std::optional<Format> ParseFormat(const std::string& name) {
  if (name == "table") return Format::kTable;
  if (name == "wide") return Format::kWide;
  if (name == "json") return Format::kJson;
  if (name == "yaml") return Format::kYaml;
  return std::nullopt;
}

Json ProtoToJson(const Message& m) {
  Json out = Json::object();
  const auto* d = m.GetDescriptor();
  const Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_map()) {
      Json map = Json::object();
      for (int j = 0; j < r->FieldSize(m, f); ++j) {
        const Message& entry = r->GetRepeatedMessage(m, f, j);
        map[MapKey(entry)] = Scalar(entry, entry.GetDescriptor()->map_value(), -1);
      }
      out[f->name()] = std::move(map);
    } else if (f->is_repeated()) {
      Json list = Json::array();
      for (int j = 0; j < r->FieldSize(m, f); ++j) list.push_back(Scalar(m, f, j));
      out[f->name()] = std::move(list);
    } else if (f->has_presence() && !r->HasField(m, f)) {
      continue;  // unset message, optional or oneof member
    } else {
      out[f->name()] = Scalar(m, f, -1);
    }
  }
  return out;
}

std::string ToYaml(const Json& doc) {
  YAML::Emitter out;
  EmitYaml(out, doc);
  return std::string(out.c_str()) + "\n";
}

std::string Table::Render(bool wide) const {
  std::vector<size_t> show;
  for (size_t c = 0; c < columns_.size(); ++c) {
    if (wide || !columns_[c].wide_only) show.push_back(c);
  }
  std::vector<size_t> width(columns_.size(), 0);
  for (size_t c : show) {
    width[c] = columns_[c].header.size();
    for (const auto& row : rows_) {
      if (c < row.size()) width[c] = std::max(width[c], row[c].size());
    }
  }
  std::ostringstream out;
  auto line = [&](auto cell) {
    std::string text;
    for (size_t k = 0; k < show.size(); ++k) {
      std::string v = cell(show[k]);
      text += v;
      if (k + 1 < show.size()) text += std::string(width[show[k]] - v.size() + 3, ' ');
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out << text << "\n";
  };
  line([&](size_t c) { return columns_[c].header; });
  for (const auto& row : rows_) line([&](size_t c) { return c < row.size() ? row[c] : ""; });
  return out.str();
}

std::string Render(const View& view, Format format, bool compact) {
  switch (format) {
    case Format::kJson: return view.doc.dump(compact ? -1 : 2) + "\n";
    case Format::kYaml: return ToYaml(view.doc);
    case Format::kWide: return view.wide.empty() ? view.table : view.wide;
    case Format::kTable: break;
  }
  return view.table;
}

std::string Fixed(double v, int digits) {
  if (std::isnan(v)) return "-";
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << v;
  return out.str();
}

std::string ClockTime(int64_t ms) {
  if (ms <= 0) return "-";
  std::time_t t = ms / 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%H:%M:%S", &tm);
  return buf;
}

std::string Ago(int64_t ms, int64_t now_ms) {
  if (ms <= 0) return "-";
  const double s = std::max<double>(0, (now_ms - ms) / 1000.0);
  if (s < 60) return Fixed(s, 1) + " s ago";
  if (s < 3600) return Fixed(s / 60, 0) + " min ago";
  return Fixed(s / 3600, 1) + " h ago";
}

}  // namespace pacer::ctl
