// The sharding journal (journal.h) on today's implementation, RocksLog (journal/rocks_log.h:
// the layout and the checks on open), under the name the sharding tests know it by
// (RocksJournal::HwmPath).
#pragma once

#include "journal/rocks_log.h"
#include "sharding_service/journal.h"

namespace pacer {

using RocksJournal = RocksLog;

}  // namespace pacer
