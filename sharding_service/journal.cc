#include "sharding_service/journal.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <rocksdb/write_batch.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace pacer {
namespace {

constexpr char kFormatKey[] = "m:format";
constexpr char kFormat[] = "pacer-journal-v2";
// Wire tag of JournalRecord.updates (field 1, length-delimited).
constexpr uint32_t kRecordUpdatesTag = (1 << 3) | 2;

std::string Key(char prefix, uint64_t seq) {
  std::string k(9, '\0');
  k[0] = prefix;
  for (int i = 0; i < 8; ++i) k[1 + i] = static_cast<char>((seq >> (56 - 8 * i)) & 0xff);
  return k;
}

uint64_t SeqOf(const rocksdb::Slice& key) {
  uint64_t seq = 0;
  for (int i = 0; i < 8; ++i) seq = (seq << 8) | static_cast<unsigned char>(key[1 + i]);
  return seq;
}

absl::Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  if (s.IsCorruption()) return absl::DataLossError(what + ": " + s.ToString());
  return absl::UnavailableError(what + ": " + s.ToString());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(const JournalOptions& options,
                                                       const SnapshotFn& on_snapshot,
                                                       const UpdateFn& on_update) {
  rocksdb::Options db_options;
  db_options.create_if_missing = true;
  db_options.paranoid_checks = true;
  db_options.info_log_level = rocksdb::WARN_LEVEL;
  db_options.keep_log_file_num = 2;
  db_options.max_background_jobs = 2;
  db_options.write_buffer_size = 16 << 20;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status st = rocksdb::DB::Open(db_options, options.dir, &raw);
  if (!st.ok()) {
    return FromRocks(st, "journal: cannot open RocksDB in '" + options.dir + "'");
  }
  std::unique_ptr<rocksdb::DB> db(raw);

  std::string format;
  st = db->Get(rocksdb::ReadOptions(), kFormatKey, &format);
  if (st.IsNotFound()) {
    rocksdb::WriteOptions wo;
    wo.sync = true;
    st = db->Put(wo, kFormatKey, kFormat);
    if (!st.ok()) return FromRocks(st, "journal: cannot write format key");
  } else if (!st.ok()) {
    return FromRocks(st, "journal: cannot read format key");
  } else if (format != kFormat) {
    return absl::FailedPreconditionError("journal in '" + options.dir + "' has format '" +
                                         format + "', expected '" + kFormat + "'");
  }

  // 1. The newest snapshot.
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  uint64_t snapshot_seq = 0;
  {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro));
    it->SeekForPrev(Key('s', ~uint64_t{0}));
    if (it->Valid() && it->key().size() == 9 && it->key()[0] == 's') {
      snapshot_seq = SeqOf(it->key());
      ShardingSnapshot snap;
      if (!snap.ParseFromArray(it->value().data(), static_cast<int>(it->value().size())) ||
          snap.seq() != snapshot_seq) {
        return absl::DataLossError(absl::StrCat("journal: snapshot at seq ", snapshot_seq,
                                                " in '", options.dir, "' is corrupt"));
      }
      if (auto s = on_snapshot(snap); !s.ok()) {
        return absl::DataLossError(absl::StrCat("journal: snapshot at seq ", snapshot_seq,
                                                " does not load: ", s.message()));
      }
    }
    if (!it->status().ok()) return FromRocks(it->status(), "journal: reading snapshots");
  }
  // 2. The tail: records of consecutive updates, each keyed by its first seq.
  uint64_t expected = snapshot_seq + 1;
  {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro));
    JournalRecord record;
    for (it->Seek(Key('j', expected)); it->Valid(); it->Next()) {
      const rocksdb::Slice key = it->key();
      if (key.size() != 9 || key[0] != 'j') break;
      const uint64_t first = SeqOf(key);
      if (first != expected) {
        return absl::DataLossError(absl::StrCat("journal: gap in '", options.dir,
                                                "': expected update ", expected, ", found ", first));
      }
      if (!record.ParseFromArray(it->value().data(), static_cast<int>(it->value().size())) ||
          record.updates_size() == 0) {
        return absl::DataLossError(absl::StrCat("journal: record of update ", first, " in '",
                                                options.dir, "' is corrupt"));
      }
      for (const Update& update : record.updates()) {
        if (update.seq() != expected) {
          return absl::DataLossError(absl::StrCat("journal: update ", expected, " in '",
                                                  options.dir, "' is corrupt (found seq ",
                                                  update.seq(), ")"));
        }
        if (auto s = on_update(update); !s.ok()) {
          return absl::DataLossError(
              absl::StrCat("journal: update ", expected, " does not apply: ", s.message()));
        }
        ++expected;
      }
    }
    if (!it->status().ok()) return FromRocks(it->status(), "journal: reading updates");
  }
  return std::unique_ptr<Journal>(
      new Journal(std::move(db), expected - 1, snapshot_seq, options));
}

Journal::Journal(std::unique_ptr<rocksdb::DB> db, uint64_t last_seq, uint64_t last_snapshot_seq,
                 JournalOptions options)
    : options_(std::move(options)),
      db_(std::move(db)),
      last_seq_(last_seq),
      durable_seq_(last_seq),
      last_snapshot_seq_(last_snapshot_seq) {
  stats_.durable_seq = last_seq;
  writer_ = std::thread([this] { WriterLoop(); });
}

Journal::~Journal() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  writer_.join();
  db_->Close();
}

void Journal::Append(const Update& update) {
  std::string bytes = update.SerializeAsString();
  std::lock_guard<std::mutex> l(mu_);
  PACER_CHECK(update.seq() == last_seq_ + 1)
      << "journal append out of order: " << update.seq() << " after " << last_seq_;
  last_seq_ = update.seq();
  queue_.push_back(Entry{update.seq(), std::move(bytes), false});
  stats_.appends++;
  cv_.notify_one();
}

void Journal::WriteSnapshot(ShardingSnapshot snapshot) {
  std::string bytes = snapshot.SerializeAsString();
  std::lock_guard<std::mutex> l(mu_);
  PACER_CHECK(snapshot.seq() <= last_seq_) << "snapshot ahead of the journal";
  queue_.push_back(Entry{snapshot.seq(), std::move(bytes), true});
  cv_.notify_one();
}

void Journal::WhenDurable(uint64_t seq, Done done) {
  absl::Status status;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (health_.ok() && durable_seq_ < seq) {
      waiters_.emplace(seq, std::move(done));
      return;
    }
    status = health_;
  }
  done(status);
}

absl::Status Journal::Flush() {
  std::unique_lock<std::mutex> l(mu_);
  const uint64_t target = last_seq_;
  durable_cv_.wait(l, [&] { return durable_seq_ >= target || !health_.ok(); });
  return health_;
}

absl::Status Journal::health() const {
  std::lock_guard<std::mutex> l(mu_);
  return health_;
}

uint64_t Journal::last_seq() const {
  std::lock_guard<std::mutex> l(mu_);
  return last_seq_;
}

JournalStats Journal::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

void Journal::WriterLoop() {
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync;
  std::vector<Entry> batch_entries;
  for (;;) {
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty() && stopping_) break;
      batch_entries.swap(queue_);
      if (!health_.ok()) {  // never write past a failed batch: the log would have a hole
        batch_entries.clear();
        continue;
      }
    }
    rocksdb::WriteBatch batch;
    uint64_t max_seq = 0, snapshot_seq = 0, bytes = 0;
    uint64_t previous_snapshot = 0;
    {
      std::lock_guard<std::mutex> l(mu_);
      previous_snapshot = last_snapshot_seq_;
    }
    // One record per run of updates; a snapshot closes the run, so a record never straddles a
    // snapshot and the range delete below removes exactly the updates the snapshot holds.
    std::string record;
    uint64_t record_first = 0;
    auto close_record = [&] {
      if (record_first != 0) batch.Put(Key('j', record_first), record);
      record.clear();
      record_first = 0;
    };
    for (const Entry& e : batch_entries) {
      bytes += e.bytes.size();
      if (!e.snapshot) {
        if (record_first == 0) record_first = e.seq;
        // Field 1 (updates), length-delimited: a JournalRecord built by concatenation.
        google::protobuf::io::StringOutputStream out(&record);
        google::protobuf::io::CodedOutputStream coded(&out);
        coded.WriteTag(kRecordUpdatesTag);
        coded.WriteVarint32(static_cast<uint32_t>(e.bytes.size()));
        coded.WriteRaw(e.bytes.data(), static_cast<int>(e.bytes.size()));
        max_seq = std::max(max_seq, e.seq);
        continue;
      }
      close_record();
      batch.Put(Key('s', e.seq), e.bytes);
      batch.DeleteRange(Key('j', 0), Key('j', e.seq + 1));
      if (previous_snapshot != 0 && previous_snapshot != e.seq) {
        batch.Delete(Key('s', previous_snapshot));
      }
      previous_snapshot = snapshot_seq = e.seq;
    }
    close_record();
    const rocksdb::Status st = db_->Write(wo, &batch);
    std::vector<Done> ready;
    absl::Status status;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!st.ok()) {
        health_ = absl::UnavailableError("journal write failed (" + st.ToString() +
                                         "); pacerd must restart to recover from its data dir");
        PACER_LOG(ERROR) << health_.message();
        for (auto& [seq, done] : waiters_) ready.push_back(std::move(done));
        waiters_.clear();
      } else {
        stats_.batches++;
        stats_.bytes += bytes;
        if (snapshot_seq != 0) {
          last_snapshot_seq_ = snapshot_seq;
          stats_.snapshots++;
        }
        if (max_seq > durable_seq_) durable_seq_ = max_seq;
        stats_.durable_seq = durable_seq_;
        while (!waiters_.empty() && waiters_.begin()->first <= durable_seq_) {
          ready.push_back(std::move(waiters_.begin()->second));
          waiters_.erase(waiters_.begin());
        }
      }
      status = health_;
    }
    durable_cv_.notify_all();
    batch_entries.clear();
    for (auto& done : ready) done(status);
  }
}

}  // namespace pacer
