#include "journal/high_water_mark.h"

#include <rocksdb/file_system.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pacer {
namespace {

// "pacer-journal-hwm-v2 gen=<20> seq=<20> crc=<8>\n"
constexpr size_t kDigits = 20;
constexpr size_t kGenAt = sizeof(kHwmFormatV2) - 1 + 5;  // after "pacer-journal-hwm-v2 gen="
constexpr size_t kSeqAt = kGenAt + kDigits + 5;          // after " seq="
constexpr size_t kCrcAt = kSeqAt + kDigits + 5;          // after " crc="
constexpr size_t kLineBytes = kCrcAt + 8 + 1;
constexpr size_t kFileBytes = 2 * HighWaterMark::kSlotBytes;
static_assert(kLineBytes < HighWaterMark::kSlotBytes);

// CRC-32C (Castagnoli), bit by bit: the mark is 84 bytes, written a few hundred times a second.
uint32_t Crc32c(const char* data, size_t n) {
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= static_cast<unsigned char>(data[i]);
    for (int b = 0; b < 8; ++b) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

std::string Line(uint64_t gen, uint64_t seq) {
  char head[kCrcAt + 1];
  std::snprintf(head, sizeof head, "%s gen=%020" PRIu64 " seq=%020" PRIu64 " crc=", kHwmFormatV2, gen, seq);
  char crc[10];
  std::snprintf(crc, sizeof crc, "%08x\n", Crc32c(head, kCrcAt - 5));
  return std::string(head, kCrcAt) + std::string(crc, 9);
}

bool Digits(const std::string& s, size_t at, size_t n, int base, uint64_t* out) {
  uint64_t v = 0;
  for (size_t i = at; i < at + n; ++i) {
    const char c = s[i];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (base == 16 && c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return false;
    if (base == 10 && v > (UINT64_MAX - static_cast<uint64_t>(d)) / 10) return false;
    v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

// One v2 slot at `at`: its gen and seq when it verifies.
bool ParseSlot(const std::string& text, size_t at, uint64_t* gen, uint64_t* seq) {
  if (text.size() < at + kLineBytes) return false;
  const std::string line = text.substr(at, kLineBytes);
  uint64_t crc = 0;
  if (line.compare(0, kGenAt, std::string(kHwmFormatV2) + " gen=") != 0 ||
      line.compare(kSeqAt - 5, 5, " seq=") != 0 || line.compare(kCrcAt - 5, 5, " crc=") != 0 ||
      line.back() != '\n' || !Digits(line, kGenAt, kDigits, 10, gen) ||
      !Digits(line, kSeqAt, kDigits, 10, seq) || !Digits(line, kCrcAt, 8, 16, &crc)) {
    return false;
  }
  return crc == Crc32c(line.data(), kCrcAt - 5);
}

// v1: "pacer-journal-hwm-v1 seq=N\n".
bool ParseV1(const std::string& text, uint64_t* seq) {
  const std::string prefix = std::string(kHwmFormatV1) + " seq=";
  if (text.size() <= prefix.size() + 1 || text.compare(0, prefix.size(), prefix) != 0 ||
      text.back() != '\n') {
    return false;
  }
  const size_t digits = text.size() - 1 - prefix.size();
  return digits <= 19 && Digits(text, prefix.size(), digits, 10, seq);
}

std::string Parent(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

std::string HighWaterMark::SlotForTest(uint64_t gen, uint64_t seq) {
  std::string slot = Line(gen, seq);
  slot.resize(kSlotBytes, '\0');
  return slot;
}

absl::StatusOr<std::optional<HighWaterMark::Found>> HighWaterMark::Read(rocksdb::FileSystem* fs,
                                                                        const std::string& path) {
  rocksdb::IOStatus st = fs->FileExists(path, rocksdb::IOOptions(), nullptr);
  if (st.IsNotFound()) return std::optional<Found>();
  std::unique_ptr<rocksdb::FSSequentialFile> file;
  st = fs->NewSequentialFile(path, rocksdb::FileOptions(), &file, nullptr);
  if (!st.ok()) return absl::UnavailableError("journal: cannot read '" + path + "': " + st.ToString());
  std::string text;
  std::string buf(kSlotBytes, '\0');
  for (;;) {
    rocksdb::Slice got;
    st = file->Read(buf.size(), rocksdb::IOOptions(), &got, buf.data(), nullptr);
    if (!st.ok()) return absl::UnavailableError("journal: cannot read '" + path + "': " + st.ToString());
    if (got.empty() || text.size() > 4 * kFileBytes) break;
    text.append(got.data(), got.size());
  }
  Found found;
  uint64_t gen[2] = {0, 0}, seq[2] = {0, 0};
  const bool valid[2] = {ParseSlot(text, 0, &gen[0], &seq[0]),
                         ParseSlot(text, kSlotBytes, &gen[1], &seq[1])};
  if (valid[0] || valid[1]) {
    const int newest = !valid[0] || (valid[1] && gen[1] > gen[0]) ? 1 : 0;
    found.seq = seq[newest];
    found.format = kHwmFormatV2;
    found.torn = !valid[0] || !valid[1];
    return std::optional<Found>(found);
  }
  if (ParseV1(text, &found.seq)) {
    found.format = kHwmFormatV1;
    return std::optional<Found>(found);
  }
  // Another version ("pacer-journal-hwm-v3 ..."): a newer pacerd's, not damage.
  const std::string family = "pacer-journal-hwm-v";
  if (text.compare(0, family.size(), family) == 0) {
    size_t end = family.size();
    while (end < text.size() && end < family.size() + 8 && text[end] >= '0' && text[end] <= '9') ++end;
    const std::string format = text.substr(0, end);
    if (end > family.size() && format != kHwmFormatV1 && format != kHwmFormatV2) {
      return absl::FailedPreconditionError(absl::StrCat(
          "journal: the high-water mark '", path, "' has format '", format, "'; this pacerd reads '",
          kHwmFormatV1, "', '", kHwmFormatV2, "' (was it written by a newer pacerd?)"));
    }
  }
  return absl::DataLossError("journal: the high-water mark '" + path +
                             "' is damaged (no slot holds a valid mark)");
}

absl::StatusOr<std::unique_ptr<HighWaterMark>> HighWaterMark::Create(rocksdb::FileSystem* fs,
                                                                     const std::string& path,
                                                                     uint64_t seq) {
  const std::string tmp = path + ".tmp";
  const rocksdb::IOOptions io;
  auto fail = [&](const rocksdb::IOStatus& st) {
    return absl::UnavailableError("journal: cannot write the high-water mark '" + path + "': " +
                                  st.ToString());
  };
  // Slot 0 holds the mark (gen 1); slot 1 the same seq at gen 0, overwritten first.
  std::string bytes = SlotForTest(1, seq) + SlotForTest(0, seq);
  std::unique_ptr<rocksdb::FSWritableFile> out;
  rocksdb::IOStatus st = fs->NewWritableFile(tmp, rocksdb::FileOptions(), &out, nullptr);
  if (!st.ok()) return fail(st);
  st = out->Append(bytes, io, nullptr);
  if (st.ok()) st = out->Sync(io, nullptr);
  rocksdb::IOStatus closed = out->Close(io, nullptr);
  if (st.ok()) st = closed;
  if (!st.ok()) return fail(st);
  st = fs->RenameFile(tmp, path, io, nullptr);
  if (!st.ok()) return fail(st);
  std::unique_ptr<rocksdb::FSDirectory> dir;
  st = fs->NewDirectory(Parent(path), io, &dir, nullptr);
  if (st.ok()) st = dir->Fsync(io, nullptr);
  if (!st.ok()) return fail(st);
  std::unique_ptr<rocksdb::FSRandomRWFile> file;
  st = fs->NewRandomRWFile(path, rocksdb::FileOptions(), &file, nullptr);
  if (!st.ok()) return fail(st);
  return std::unique_ptr<HighWaterMark>(new HighWaterMark(path, std::move(file), seq));
}

HighWaterMark::HighWaterMark(std::string path, std::unique_ptr<rocksdb::FSRandomRWFile> file,
                             uint64_t seq)
    : path_(std::move(path)), file_(std::move(file)), seq_(seq) {}

HighWaterMark::~HighWaterMark() {
  if (file_) file_->Close(rocksdb::IOOptions(), nullptr).PermitUncheckedError();
}

absl::Status HighWaterMark::Advance(uint64_t seq) {
  const int slot = 1 - slot_;
  const std::string line = Line(gen_ + 1, seq);
  const rocksdb::IOOptions io;
  rocksdb::IOStatus st = file_->Write(static_cast<uint64_t>(slot) * kSlotBytes, line, io, nullptr);
  if (st.ok()) st = file_->Sync(io, nullptr);  // fdatasync: the file's size never changes
  if (!st.ok()) {
    return absl::UnavailableError("journal: cannot write the high-water mark '" + path_ + "': " +
                                  st.ToString());
  }
  slot_ = slot;
  ++gen_;
  seq_ = seq;
  return absl::OkStatus();
}

}  // namespace pacer
