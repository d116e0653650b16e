// Journal (journal.h) is an interface; Journal::Open (the RocksDB journal) is defined in
// rocks_journal.cc beside the implementation it opens.
#include "sharding_service/journal.h"
