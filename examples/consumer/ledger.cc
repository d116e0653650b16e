#include "examples/consumer/ledger.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <sstream>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pacer {
namespace {

// "<b>-<e>" with b <= e.
bool ParseRange(const std::string& s, uint64_t* b, uint64_t* e) {
  const auto dash = s.find('-');
  return dash != std::string::npos && absl::SimpleAtoi(s.substr(0, dash), b) &&
         absl::SimpleAtoi(s.substr(dash + 1), e) && *b <= *e;
}

}  // namespace

absl::StatusOr<LedgerWriter> LedgerWriter::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return absl::UnavailableError("cannot open ledger '" + path + "'");
  return LedgerWriter(fd);
}

LedgerWriter::~LedgerWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void LedgerWriter::Write(const std::string& line) {
  ssize_t n = ::write(fd_, line.data(), line.size());
  (void)n;
}

void LedgerWriter::Leased(const Lease& lease) {
  std::string line = absl::StrCat("L ", lease.lease_id(), " ", lease.epoch(), " ");
  for (int i = 0; i < lease.records_size(); ++i) {
    if (i) line += ",";
    absl::StrAppend(&line, lease.records(i).begin(), "-", lease.records(i).end());
  }
  absl::StrAppend(&line, " ds=", lease.dataset(), " part=", lease.partition(), " pos=",
                  lease.begin(), "-", lease.end(), " start=", lease.records_done());
  if (lease.backup()) line += " backup=1";
  Write(line + "\n");
}

void LedgerWriter::Intent(uint64_t lease, uint64_t prefix) {
  Write(absl::StrCat("I ", lease, " ", prefix, "\n"));
}

void LedgerWriter::Ack(uint64_t lease, uint64_t prefix) {
  Write(absl::StrCat("A ", lease, " ", prefix, "\n"));
}

absl::StatusOr<std::map<uint64_t, LedgerLease>> ReadLedger(const std::string& path) {
  std::map<uint64_t, LedgerLease> out;
  std::ifstream in(path);
  if (!in) return out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    std::istringstream ss(line);
    char kind = 0;
    uint64_t lease = 0;
    ss >> kind >> lease;
    if (!ss) return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": bad line '", line, "'"));
    if (kind == 'L') {
      LedgerLease& l = out[lease];
      l = LedgerLease();  // a repeated L line (never written) replaces, it does not append
      ss >> l.epoch;
      if (!ss) return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": bad line '", line, "'"));
      std::string token;
      bool pos = false;
      for (bool first = true; ss >> token; first = false) {
        const auto eq = token.find('=');
        if (first && eq == std::string::npos) {  // the record ranges
          std::istringstream rs(token);
          std::string r;
          while (std::getline(rs, r, ',')) {
            uint64_t b = 0, e = 0;
            if (!ParseRange(r, &b, &e)) {
              return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": bad range '", r, "'"));
            }
            l.records.emplace_back(b, e);
          }
          continue;
        }
        if (eq == std::string::npos) {
          return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": bad field '", token, "'"));
        }
        const std::string key = token.substr(0, eq), value = token.substr(eq + 1);
        bool ok = true;
        if (key == "ds") {
          l.dataset = value;
        } else if (key == "part") {
          uint64_t p = 0;
          ok = absl::SimpleAtoi(value, &p) && p <= UINT32_MAX;
          l.partition = static_cast<uint32_t>(p);
        } else if (key == "pos") {
          ok = ParseRange(value, &l.begin, &l.end);
          pos = ok;
        } else if (key == "start") {
          ok = absl::SimpleAtoi(value, &l.start);
        } else if (key == "backup") {
          l.backup = value == "1";
        }  // other keys: written by a newer writer, ignored
        if (!ok) {
          return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": bad field '", token, "'"));
        }
      }
      l.has_position = pos;
    } else if (kind == 'I' || kind == 'A') {
      uint64_t prefix = 0;
      ss >> prefix;
      auto it = out.find(lease);
      if (!ss || it == out.end()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": bad line '", line, "'"));
      }
      uint64_t& field = kind == 'I' ? it->second.intent : it->second.acked;
      field = std::max(field, prefix);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": unknown kind '", line, "'"));
    }
  }
  return out;
}

int ResolvePendingIntents(const std::string& path, const RegisterWorkerResponse& registration,
                          LedgerWriter& writer) {
  auto ledger = ReadLedger(path);
  if (!ledger.ok()) return 0;
  int resolved = 0;
  for (const auto& ended : registration.previous_leases()) {
    auto it = ledger->find(ended.lease_id());
    if (it == ledger->end() || it->second.intent <= it->second.acked) continue;
    if (ended.records_done() > it->second.acked) {
      writer.Ack(ended.lease_id(), ended.records_done());
      ++resolved;
    }
  }
  return resolved;
}

absl::StatusOr<std::map<uint64_t, LedgerLease>> ReadLedgers(
    const std::vector<std::string>& paths) {
  std::map<uint64_t, LedgerLease> all;
  for (const auto& path : paths) {
    auto one = ReadLedger(path);
    if (!one.ok()) return one.status();
    for (auto& [id, l] : *one) {
      if (!all.emplace(id, std::move(l)).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": lease ", id, " is in another ledger too"));
      }
    }
  }
  return all;
}

namespace {

// Calls fn for the records at indices [from, to) of the lease's delivery order.
void EmitIndices(const LedgerLease& l, uint64_t from, uint64_t to,
                 const std::function<void(uint32_t, uint64_t, uint64_t)>& fn) {
  uint64_t at = 0;  // index of the first record of the current range
  for (const auto& [b, e] : l.records) {
    if (at >= to) break;
    const uint64_t n = e - b;
    const uint64_t lo = std::max(from, at), hi = std::min(to, at + n);
    if (lo < hi) fn(l.epoch, b + (lo - at), b + (hi - at));
    at += n;
  }
}

uint64_t RecordCount(const LedgerLease& l) {
  uint64_t n = 0;
  for (const auto& [b, e] : l.records) n += e - b;
  return n;
}

// Positions [begin + start, begin + acked) the lease counted (empty when acked <= start).
std::pair<uint64_t, uint64_t> CountedPositions(const LedgerLease& l) {
  const uint64_t len = l.end - l.begin;
  return {l.begin + std::min(l.start, len), l.begin + std::min(std::max(l.acked, l.start), len)};
}

}  // namespace

void ForEachCountedRange(const std::map<uint64_t, LedgerLease>& ledger,
                         const std::function<void(uint32_t, uint64_t, uint64_t)>& fn) {
  // Pair each tail backup with its primary: the non-backup lease of the same dataset, epoch
  // and partition with the same end and the largest begin <= the backup's begin (a primary's
  // requeued suffix, leased again later, begins past every position a backup of the earlier
  // lease counted; ties go to the newest lease before the backup).
  using Key = std::tuple<std::string, uint32_t, uint32_t, uint64_t>;
  std::map<Key, std::vector<uint64_t>> primaries;  // by (dataset, epoch, partition, end)
  for (const auto& [id, l] : ledger) {
    if (l.has_position && !l.backup && l.end > l.begin && RecordCount(l) == l.end - l.begin)
      primaries[Key{l.dataset, l.epoch, l.partition, l.end}].push_back(id);
  }
  std::map<uint64_t, std::vector<uint64_t>> backups_of;  // primary id -> its backups
  std::map<uint64_t, uint64_t> paired;                   // backup id -> primary id
  for (const auto& [id, l] : ledger) {
    if (!l.has_position || !l.backup) continue;
    auto it = primaries.find(Key{l.dataset, l.epoch, l.partition, l.end});
    if (it == primaries.end()) continue;
    uint64_t best = 0;
    for (uint64_t pid : it->second) {
      const LedgerLease& p = ledger.at(pid);
      if (pid >= id || p.begin > l.begin) continue;
      if (best == 0 || p.begin > ledger.at(best).begin ||
          (p.begin == ledger.at(best).begin && pid > best))
        best = pid;
    }
    if (best == 0) continue;
    backups_of[best].push_back(id);
    paired[id] = best;
  }

  for (const auto& [id, l] : ledger) {
    if (paired.count(id)) continue;  // emitted with its primary
    auto group = backups_of.find(id);
    if (group == backups_of.end()) {
      // Alone: the records at indices [start, acked) (start 0 in an old ledger).
      EmitIndices(l, l.has_position ? l.start : 0, l.acked, fn);
      continue;
    }
    // A pair: the union of the positions its members counted, as records of the primary.
    std::vector<std::pair<uint64_t, uint64_t>> spans{CountedPositions(l)};
    for (uint64_t bid : group->second) spans.push_back(CountedPositions(ledger.at(bid)));
    std::sort(spans.begin(), spans.end());
    uint64_t lo = 0, hi = 0;
    bool open = false;
    for (const auto& [b, e] : spans) {
      if (b >= e) continue;
      if (open && b <= hi) {
        hi = std::max(hi, e);
        continue;
      }
      if (open) EmitIndices(l, lo - l.begin, hi - l.begin, fn);
      lo = b;
      hi = e;
      open = true;
    }
    if (open) EmitIndices(l, lo - l.begin, hi - l.begin, fn);
  }
}

}  // namespace pacer
