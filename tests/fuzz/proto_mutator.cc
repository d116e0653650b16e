#include "tests/fuzz/proto_mutator.h"

#include <cmath>
#include <limits>
#include <memory>

namespace pacer::fuzz {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

namespace {

constexpr int kMaxDepth = 8;
constexpr int kMaxRepeated = 64;  // elements added by single edits (Amplify makes more)

}  // namespace

void ProtoMutator::CollectSlots(Message* msg, int depth, std::vector<Slot>* out) {
  const Reflection* r = msg->GetReflection();
  const auto* d = msg->GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    out->push_back({msg, f});
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
      if (f->is_repeated()) {
        for (int j = 0; j < r->FieldSize(*msg, f) && j < 4; ++j)
          seen_strings_.push_back(r->GetRepeatedString(*msg, f, j));
      } else if (r->HasField(*msg, f) || !f->has_presence()) {
        seen_strings_.push_back(r->GetString(*msg, f));
      }
    }
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE || depth >= kMaxDepth) continue;
    if (f->is_repeated()) {
      const int n = r->FieldSize(*msg, f);
      for (int j = 0; j < n; ++j) CollectSlots(r->MutableRepeatedMessage(msg, f, j), depth + 1, out);
    } else if (r->HasField(*msg, f)) {
      CollectSlots(r->MutableMessage(msg, f), depth + 1, out);
    }
  }
}

uint64_t ProtoMutator::BoundaryU64(uint64_t old) {
  static const uint64_t kValues[] = {0, 1, 2, 3, 7, 8, 16, 64, 100, 255, 256, 1000, 4096, 65535,
                                     65536, (1ull << 31) - 1, 1ull << 31, (1ull << 32) - 1,
                                     1ull << 32, 1ull << 53, (1ull << 63) - 1, 1ull << 63,
                                     ~0ull - 1, ~0ull};
  switch (rng_() % 6) {
    case 0: return old + 1;
    case 1: return old - 1;
    case 2: return rng_() % 16;
    case 3: return rng_();
    default: return kValues[rng_() % (sizeof kValues / sizeof *kValues)];
  }
}

int64_t ProtoMutator::BoundaryI64(int64_t old) {
  static const int64_t kValues[] = {0, 1, -1, 2, 100, 1000, -1000, 1 << 20,
                                    std::numeric_limits<int32_t>::min(),
                                    std::numeric_limits<int32_t>::max(),
                                    std::numeric_limits<int64_t>::min(),
                                    std::numeric_limits<int64_t>::min() + 1,
                                    std::numeric_limits<int64_t>::max(),
                                    1'700'000'000'000};  // a time in ms near the fuzzer's clock
  switch (rng_() % 6) {
    case 0: return static_cast<int64_t>(static_cast<uint64_t>(old) + 1);
    case 1: return static_cast<int64_t>(static_cast<uint64_t>(old) - 1);
    case 2: return static_cast<int64_t>(rng_() % 32) - 8;
    case 3: return static_cast<int64_t>(rng_());
    default: return kValues[rng_() % (sizeof kValues / sizeof *kValues)];
  }
}

double ProtoMutator::BoundaryDouble(double old) {
  static const double kValues[] = {0.0, -0.0, 1.0, -1.0, 0.5, 1e-300, 5e-324, 1e308, -1e308,
                                   std::numeric_limits<double>::infinity(),
                                   -std::numeric_limits<double>::infinity(),
                                   std::numeric_limits<double>::quiet_NaN(),
                                   std::numeric_limits<double>::max(), 1e9, 9.223372036854776e18,
                                   1.8446744073709552e19, 0.001, 3600.0};
  switch (rng_() % 5) {
    case 0: return old * 2;
    case 1: return old / 2 + 0.25;
    case 2: return static_cast<double>(rng_() % 100000) / 100.0;
    default: return kValues[rng_() % (sizeof kValues / sizeof *kValues)];
  }
}

std::string ProtoMutator::MutateString(const std::string& in, bool bytes) {
  static const std::string kSpecial[] = {"", "..", "/", "a/../b", "\n", "%s%n", std::string("\0x", 2),
                                         "\xc3\xa9", "\xf0\x9d\x94\x98", " ", "*", "-1", "0",
                                         "gen-0/", "w0\nw1"};
  std::string s = in;
  switch (rng_() % 10) {
    case 0:
    case 1:
    case 2:
      if (!dictionary_.empty()) return dictionary_[rng_() % dictionary_.size()];
      return s;
    case 3:
      if (!seen_strings_.empty()) return seen_strings_[rng_() % seen_strings_.size()];
      return s;
    case 4:
      return kSpecial[rng_() % (sizeof kSpecial / sizeof *kSpecial)];
    case 5: {  // lengthen
      static const size_t kLengths[] = {16, 255, 256, 257, 1024, 4095, 4096, 4097, 65536};
      const size_t n = kLengths[rng_() % (sizeof kLengths / sizeof *kLengths)];
      s.append(n > s.size() ? n - s.size() : 1, static_cast<char>('a' + rng_() % 26));
      return s;
    }
    case 6:  // cut
      if (!s.empty()) s.resize(rng_() % s.size());
      return s;
    case 7: {  // a few characters in or out
      const size_t pos = s.empty() ? 0 : rng_() % (s.size() + 1);
      if (OneIn(2) && pos < s.size()) {
        s.erase(pos, 1 + rng_() % 4);
      } else {
        s.insert(pos, 1, static_cast<char>(0x20 + rng_() % 95));
      }
      return s;
    }
    case 8:  // random bytes: any byte in a bytes field, rarely invalid UTF-8 in a string field
      if (bytes || OneIn(8)) {
        std::string r(rng_() % 64, '\0');
        for (char& c : r) c = static_cast<char>(rng_());
        return r;
      }
      return s + std::to_string(rng_() % 10);
    default:
      if (!dictionary_.empty()) return dictionary_[rng_() % dictionary_.size()] + s;
      return s;
  }
}

void ProtoMutator::MutateScalar(Message* msg, const FieldDescriptor* f, int index) {
  const Reflection* r = msg->GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: {
      const int32_t v = static_cast<int32_t>(BoundaryI64(rep ? r->GetRepeatedInt32(*msg, f, index) : r->GetInt32(*msg, f)));
      rep ? r->SetRepeatedInt32(msg, f, index, v) : r->SetInt32(msg, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      const int64_t v = BoundaryI64(rep ? r->GetRepeatedInt64(*msg, f, index) : r->GetInt64(*msg, f));
      rep ? r->SetRepeatedInt64(msg, f, index, v) : r->SetInt64(msg, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      const uint32_t v = static_cast<uint32_t>(BoundaryU64(rep ? r->GetRepeatedUInt32(*msg, f, index) : r->GetUInt32(*msg, f)));
      rep ? r->SetRepeatedUInt32(msg, f, index, v) : r->SetUInt32(msg, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      const uint64_t v = BoundaryU64(rep ? r->GetRepeatedUInt64(*msg, f, index) : r->GetUInt64(*msg, f));
      rep ? r->SetRepeatedUInt64(msg, f, index, v) : r->SetUInt64(msg, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      const double v = BoundaryDouble(rep ? r->GetRepeatedDouble(*msg, f, index) : r->GetDouble(*msg, f));
      rep ? r->SetRepeatedDouble(msg, f, index, v) : r->SetDouble(msg, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_FLOAT: {
      const float v = static_cast<float>(BoundaryDouble(rep ? r->GetRepeatedFloat(*msg, f, index) : r->GetFloat(*msg, f)));
      rep ? r->SetRepeatedFloat(msg, f, index, v) : r->SetFloat(msg, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      const bool v = !(rep ? r->GetRepeatedBool(*msg, f, index) : r->GetBool(*msg, f));
      rep ? r->SetRepeatedBool(msg, f, index, v) : r->SetBool(msg, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      const auto* e = f->enum_type();
      int v = e->value(rng_() % e->value_count())->number();
      if (OneIn(6)) v = static_cast<int>(BoundaryI64(v));  // an unnamed number (open enums)
      const bool open = f->file()->syntax() == google::protobuf::FileDescriptor::SYNTAX_PROTO3;
      if (open || e->FindValueByNumber(v)) {
        rep ? r->SetRepeatedEnumValue(msg, f, index, v) : r->SetEnumValue(msg, f, v);
      }
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      const bool bytes = f->type() == FieldDescriptor::TYPE_BYTES;
      std::string v = MutateString(rep ? r->GetRepeatedString(*msg, f, index) : r->GetString(*msg, f), bytes);
      rep ? r->SetRepeatedString(msg, f, index, std::move(v)) : r->SetString(msg, f, std::move(v));
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
}

void ProtoMutator::MutateSlot(const Slot& slot) {
  Message* msg = slot.msg;
  const FieldDescriptor* f = slot.field;
  const Reflection* r = msg->GetReflection();
  if (f->is_repeated()) {
    const int n = r->FieldSize(*msg, f);
    const int op = static_cast<int>(rng_() % 6);
    if (n == 0 || op == 0 || (op == 1 && n < kMaxRepeated)) {  // add an element
      if (n >= kMaxRepeated) return;
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        Message* added = r->AddMessage(msg, f);
        if (n > 0 && OneIn(2)) added->CopyFrom(r->GetRepeatedMessage(*msg, f, rng_() % n));
      } else {
        switch (f->cpp_type()) {
          case FieldDescriptor::CPPTYPE_INT32: r->AddInt32(msg, f, 0); break;
          case FieldDescriptor::CPPTYPE_INT64: r->AddInt64(msg, f, 0); break;
          case FieldDescriptor::CPPTYPE_UINT32: r->AddUInt32(msg, f, 0); break;
          case FieldDescriptor::CPPTYPE_UINT64: r->AddUInt64(msg, f, 0); break;
          case FieldDescriptor::CPPTYPE_DOUBLE: r->AddDouble(msg, f, 0); break;
          case FieldDescriptor::CPPTYPE_FLOAT: r->AddFloat(msg, f, 0); break;
          case FieldDescriptor::CPPTYPE_BOOL: r->AddBool(msg, f, false); break;
          case FieldDescriptor::CPPTYPE_ENUM: r->AddEnumValue(msg, f, f->enum_type()->value(0)->number()); break;
          case FieldDescriptor::CPPTYPE_STRING: r->AddString(msg, f, ""); break;
          default: break;
        }
        MutateScalar(msg, f, n);
      }
      return;
    }
    switch (op) {
      case 2: {  // drop one (the last, after a swap from anywhere)
        const int i = static_cast<int>(rng_() % n);
        if (i != n - 1) r->SwapElements(msg, f, i, n - 1);
        r->RemoveLast(msg, f);
        return;
      }
      case 3:
        if (n > 1) r->SwapElements(msg, f, rng_() % n, rng_() % n);
        return;
      case 4:
        if (OneIn(4)) r->ClearField(msg, f);
        return;
      default:
        if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) MutateScalar(msg, f, rng_() % n);
        return;
    }
  }
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    if (!r->HasField(*msg, f)) {
      r->MutableMessage(msg, f);  // created (in a oneof: that field chosen)
    } else if (OneIn(4)) {
      r->ClearField(msg, f);
    }
    return;
  }
  if (OneIn(12)) {
    r->ClearField(msg, f);
    return;
  }
  MutateScalar(msg, f, -1);
}

void ProtoMutator::Mutate(Message* msg, size_t max_bytes) {
  std::unique_ptr<Message> backup(msg->New());
  backup->CopyFrom(*msg);
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::vector<Slot> slots;
    seen_strings_.clear();
    CollectSlots(msg, 0, &slots);
    if (slots.empty()) return;
    // Deeper fields are many; the top-level ones (the sequence itself) get a fair share too.
    const Slot& slot = OneIn(4) ? slots[rng_() % std::min<size_t>(slots.size(), msg->GetDescriptor()->field_count())]
                                : slots[rng_() % slots.size()];
    MutateSlot(slot);
    if (msg->ByteSizeLong() <= max_bytes) return;
    msg->CopyFrom(*backup);
  }
}

void ProtoMutator::CrossOver(const Message& other, Message* msg, size_t max_bytes) {
  if (other.GetDescriptor() != msg->GetDescriptor()) return;
  const auto* d = msg->GetDescriptor();
  const Reflection* r = msg->GetReflection();
  std::unique_ptr<Message> backup(msg->New());
  backup->CopyFrom(*msg);
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (!f->is_repeated() || f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    const int n = r->FieldSize(other, f);
    if (n == 0) continue;
    // Keep a prefix of msg's elements, then a run of other's: a sequence spliced from two.
    const int keep = r->FieldSize(*msg, f) == 0 ? 0 : static_cast<int>(rng_() % (r->FieldSize(*msg, f) + 1));
    while (r->FieldSize(*msg, f) > keep) r->RemoveLast(msg, f);
    const int from = static_cast<int>(rng_() % n);
    const int count = 1 + static_cast<int>(rng_() % (n - from));
    for (int j = from; j < from + count && r->FieldSize(*msg, f) < kMaxRepeated; ++j)
      r->AddMessage(msg, f)->CopyFrom(r->GetRepeatedMessage(other, f, j));
  }
  if (msg->ByteSizeLong() > max_bytes) msg->CopyFrom(*backup);
}

}  // namespace pacer::fuzz
