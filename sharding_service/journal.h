// Journal: the sharding core's journal — its updates (Update) and snapshots (ShardingSnapshot)
// through the one generic journal of pacerd's state machines (journal/durable_log.h: the
// interface, its group-commit protocol and recovery guarantees; journal/typed_journal.h: the
// typed view; journal/rocks_log.h: today's RocksDB implementation). The controller's state
// machine journals through the same classes (controller/controller_store.h).
//
// The service depends only on this type; a replicated implementation of DurableLog (pacerd's
// state on etcd) can take RocksLog's place later without the service noticing.
//
// Formats ("m:format"; the layout: journal/rocks_log.h):
//   v2, v3: the journal before pinned entries (a v3 binary must not read a v4 dir, whose
//           snapshots name specs it cannot find);
//   v4:     pinned dataset specs ("specs apart");
//   v5:     as v4, with DeleteDatasetUpdate / ResetDatasetUpdate (a v4 build would not know them).
// v2..v4 dirs are read and upgraded to v5 with the first group this binary writes.
#pragma once

#include "journal/typed_journal.h"
#include "proto/pacer/sharding.pb.h"

namespace pacer {

inline constexpr char kJournalFormatV2[] = "pacer-journal-v2";
inline constexpr char kJournalFormatV3[] = "pacer-journal-v3";
inline constexpr char kJournalFormatV4[] = "pacer-journal-v4";
inline constexpr char kJournalFormatV5[] = "pacer-journal-v5";  // written

inline JournalFormat ShardingJournalFormat() {
  return {kJournalFormatV5, {kJournalFormatV2, kJournalFormatV3, kJournalFormatV4}};
}

template <>
struct JournalFormatOf<Update> {
  static JournalFormat Get() { return ShardingJournalFormat(); }
};

using Journal = TypedJournal<Update, ShardingSnapshot>;

}  // namespace pacer
