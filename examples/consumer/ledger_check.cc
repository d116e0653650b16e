// pacer-ledger-check: verifies consumer ledgers: every record of every epoch counted exactly once
// (a tail backup pair counts once, as the sharding service counts it; see ledger.h).
//   pacer-ledger-check --records N --epochs E LEDGER...
// Exits 0 and prints a summary when it holds, 1 with the first offending records otherwise.
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "common/version.h"
#include "examples/consumer/ledger.h"

int main(int argc, char** argv) {
  uint64_t records = 0;
  uint32_t epochs = 1;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--records") && i + 1 < argc) records = std::stoull(argv[++i]);
    else if (!std::strcmp(argv[i], "--epochs") && i + 1 < argc) epochs = std::stoul(argv[++i]);
    else if (!std::strcmp(argv[i], "--help")) {
      std::cout << "Usage: pacer-ledger-check --records N --epochs E LEDGER...\n"
                   "       pacer-ledger-check --version\n";
      return 0;
    } else if (!std::strcmp(argv[i], "--version")) {
      std::cout << "pacer-ledger-check " << pacer::PacerVersion() << "\n";
      return 0;
    } else if (argv[i][0] == '-') {
      std::cerr << "pacer-ledger-check: unknown option '" << argv[i] << "'\n";
      return 2;
    } else {
      files.push_back(argv[i]);
    }
  }
  if (records == 0 || files.empty()) {
    std::cerr << "pacer-ledger-check: need --records and at least one ledger (see --help)\n";
    return 2;
  }
  std::vector<std::vector<uint8_t>> count(epochs, std::vector<uint8_t>(records, 0));
  uint64_t outside = 0;
  // All ledgers at once: a tail backup and the lease it backs are usually in two of them.
  auto ledger = pacer::ReadLedgers(files);
  if (!ledger.ok()) {
    std::cerr << "pacer-ledger-check: " << ledger.status().message() << "\n";
    return 1;
  }
  pacer::ForEachCountedRange(*ledger, [&](uint32_t e, uint64_t b, uint64_t end) {
    for (uint64_t r = b; r < end; ++r) {
      if (e >= epochs || r >= records) ++outside;
      else if (count[e][r] < 255) count[e][r]++;
    }
  });
  bool ok = outside == 0;
  for (uint32_t e = 0; e < epochs; ++e) {
    uint64_t missing = 0, twice = 0;
    for (uint64_t r = 0; r < records; ++r) {
      missing += count[e][r] == 0;
      twice += count[e][r] > 1;
    }
    std::cout << "epoch " << e << ": " << records - missing - twice << " records counted once, "
              << missing << " missing, " << twice << " counted twice\n";
    ok = ok && missing == 0 && twice == 0;
  }
  if (outside) std::cout << outside << " counted records outside the dataset\n";
  std::cout << (ok ? "exactly once: OK" : "exactly once: VIOLATED") << std::endl;
  return ok ? 0 : 1;
}
