#include "examples/consumer/ledger.h"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace pacer {

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
      std::string ranges;
      ss >> l.epoch >> ranges;
      std::istringstream rs(ranges);
      std::string r;
      while (std::getline(rs, r, ',')) {
        auto dash = r.find('-');
        if (dash == std::string::npos) {
          return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": bad range '", r, "'"));
        }
        l.records.emplace_back(std::stoull(r.substr(0, dash)), std::stoull(r.substr(dash + 1)));
      }
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

void ForEachCountedRange(const std::map<uint64_t, LedgerLease>& ledger,
                         const std::function<void(uint32_t, uint64_t, uint64_t)>& fn) {
  for (const auto& [id, l] : ledger) {
    uint64_t left = l.acked;
    for (const auto& [b, e] : l.records) {
      if (left == 0) break;
      const uint64_t take = std::min(left, e - b);
      fn(l.epoch, b, b + take);
      left -= take;
    }
  }
}

}  // namespace pacer
