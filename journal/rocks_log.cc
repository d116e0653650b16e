#include "journal/rocks_log.h"

#include <google/protobuf/message_lite.h>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cond_wait.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/rocksdb_logger.h"
#include "common/status.h"

namespace pacer {
namespace {

constexpr char kFormatKey[] = "m:format";
// Written with an imported older store, deleted once the high-water mark holds it.
constexpr char kImportedKey[] = "m:imported";
// Wire tag of JournalRecord.updates (field 1, length-delimited).
constexpr uint32_t kRecordUpdatesTag = (1 << 3) | 2;
constexpr char kAcceptHint[] =
    "; pacerd refuses to start with less than it acknowledged (an operator who accepts the loss "
    "starts it once with --accept-data-loss)";

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

std::string Parent(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string StripSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// The files of the folder, for error messages ("000012.log, CURRENT, MANIFEST-000005").
std::string ListFiles(rocksdb::FileSystem* fs, const std::string& dir) {
  std::vector<std::string> names;
  if (!fs->GetChildren(dir, rocksdb::IOOptions(), &names, nullptr).ok()) return "unreadable";
  std::vector<std::string> shown;
  for (const auto& n : names) {
    if (n == "." || n == ".." || n.rfind("LOG", 0) == 0 || n.rfind("OPTIONS", 0) == 0) continue;
    shown.push_back(n);
  }
  std::sort(shown.begin(), shown.end());
  return shown.empty() ? "none" : absl::StrJoin(shown, ", ");
}

bool HasFiles(rocksdb::FileSystem* fs, const std::string& dir) {
  std::vector<std::string> names;
  if (!fs->GetChildren(dir, rocksdb::IOOptions(), &names, nullptr).ok()) return false;
  for (const auto& n : names) {
    if (n != "." && n != "..") return true;
  }
  return false;
}

absl::Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  if (s.IsCorruption()) return absl::DataLossError(what + ": " + s.ToString());
  return absl::UnavailableError(what + ": " + s.ToString());
}

// A failed group: a full disk says so (pacerd resumes once space returns).
absl::Status WriteFailure(const rocksdb::Status& st, const std::string& dir) {
  if (st.IsNoSpace() || st.ToString().find("No space") != std::string::npos) {
    return absl::UnavailableError(
        "journal: disk full writing '" + dir + "' (" + st.ToString() +
        "): updates are refused until space is freed, then pacerd resumes by itself; nothing "
        "acknowledged is lost");
  }
  return absl::UnavailableError("journal write failed in '" + dir + "' (" + st.ToString() +
                                "): updates are refused until the journal is reopened");
}

// The updates of one record (JournalRecord: field 1, length-delimited, repeated), as bytes.
bool SplitRecord(const rocksdb::Slice& value, std::vector<std::string>* out) {
  out->clear();
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(value.data()),
                                           static_cast<int>(value.size()));
  for (;;) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) return in.CurrentPosition() == static_cast<int>(value.size());
    uint32_t size = 0;
    if (tag != kRecordUpdatesTag || !in.ReadVarint32(&size)) return false;
    std::string bytes;
    if (!in.ReadString(&bytes, static_cast<int>(size))) return false;
    out->push_back(std::move(bytes));
  }
}

}  // namespace

// What OpenAndReplay() found and opened.
struct RocksLog::Opened {
  std::unique_ptr<rocksdb::DB> db;
  uint64_t last_seq = 0;
  uint64_t snapshot_seq = 0;
  std::set<std::string> pinned;
  bool upgrade_format = false;
  JournalRecovery recovery;
  std::unique_ptr<HighWaterMark> hwm;  // written at this open (the recovered seq)
};

absl::StatusOr<std::unique_ptr<DurableLog>> OpenRocksLog(const JournalOptions& options,
                                                         const DurableLog::Replay& replay) {
  auto j = RocksLog::Open(options, replay);
  if (!j.ok()) return j.status();
  return std::unique_ptr<DurableLog>(std::move(*j));
}

std::string RocksLog::HwmPath(const JournalOptions& options) {
  return options.hwm_file.empty() ? StripSlashes(options.dir) + ".hwm" : options.hwm_file;
}

RocksLog::RocksLog(JournalOptions options, std::unique_ptr<rocksdb::Env> env)
    : options_(std::move(options)),
      hwm_path_(HwmPath(options_)),
      fs_(options_.fs ? options_.fs : rocksdb::FileSystem::Default()),
      env_(std::move(env)),
      marks_ack_(options_.sync && options_.mark_before_ack) {}

absl::StatusOr<std::unique_ptr<RocksLog>> RocksLog::Open(const JournalOptions& options,
                                                         const Replay& replay) {
  if (options.dir.empty()) return absl::InvalidArgumentError("journal: dir is required");
  if (options.format.written.empty()) return absl::InvalidArgumentError("journal: format is required");
  std::unique_ptr<rocksdb::Env> env;
  if (options.fs) env = rocksdb::NewCompositeEnv(options.fs);
  std::unique_ptr<RocksLog> j(new RocksLog(options, std::move(env)));
  auto opened = j->OpenAndReplay(replay, 0);
  if (!opened.ok()) return opened.status();
  {
    absl::MutexLock l(&j->mu_);  // no other thread yet: for the annotations
    j->Install(std::move(*opened));
  }
  j->writer_ = std::thread([p = j.get()] { p->WriterLoop(); });
  if (j->marks_ack_) {
    j->hwm_thread_ = std::thread([p = j.get()] { p->MarkLoop(); });
  } else if (options.sync) {
    j->hwm_thread_ = std::thread([p = j.get()] { p->HwmLoop(); });
  }
  return j;
}

absl::StatusOr<RocksLog::Opened> RocksLog::OpenAndReplay(const Replay& replay, uint64_t min_seq) {
  Opened out;
  OpenContext ctx;
  RETURN_IF_ERROR(ReadMarkAndFolder(&ctx, &out));
  RETURN_IF_ERROR(OpenDatabase(&ctx, &out));
  RETURN_IF_ERROR(CheckFormat(&ctx, &out));
  RETURN_IF_ERROR(ReplayInto(&ctx, &out, replay));
  RETURN_IF_ERROR(CheckAcknowledged(&ctx, &out, min_seq));
  return out;
}

// 0. What the high-water mark says, and whether a database is there.
absl::Status RocksLog::ReadMarkAndFolder(OpenContext* ctx, Opened* out) {
  const std::string& dir = options_.dir;
  const bool accept = options_.accept_data_loss;
  if (auto h = HighWaterMark::Read(fs_.get(), hwm_path_); !h.ok()) {
    // Damage may be accepted; a mark in a newer pacerd's format never is.
    if (!accept || h.status().code() != absl::StatusCode::kDataLoss) return h.status();
    ctx->accepted.push_back(std::string(h.status().message()));
  } else if (h->has_value()) {
    ctx->hwm = (*h)->seq;
    out->recovery.hwm_format = (*h)->format;
    out->recovery.hwm_torn = (*h)->torn;
    if ((*h)->torn) {
      PACER_LOG(WARNING) << "journal: one slot of the high-water mark '" << hwm_path_
                         << "' is torn (a mark write cut short, never acknowledged); the other holds "
                         << (*h)->seq;
    }
  }
  out->recovery.hwm_seq = ctx->hwm.value_or(0);
  ctx->exists = fs_->FileExists(dir + "/CURRENT", rocksdb::IOOptions(), nullptr).ok();
  if (!ctx->exists) {
    const bool had_files = HasFiles(fs_.get(), dir);
    std::string why;
    if (options_.must_exist) why = "the data dir's IDENTITY says it was created";
    if (ctx->hwm && *ctx->hwm > 0) {
      why = absl::StrCat(why.empty() ? "" : why + ", and ", "'", hwm_path_, "' says updates up to ",
                         *ctx->hwm, " were acknowledged");
    }
    if (had_files && why.empty()) why = "the folder holds files (" + ListFiles(fs_.get(), dir) + ")";
    if (!why.empty()) {
      const std::string what =
          had_files ? "'" + dir + "/CURRENT' is missing (the folder holds " +
                          ListFiles(fs_.get(), dir) + ")"
                    : "the journal folder '" + dir + "' is " +
                          (fs_->FileExists(dir, rocksdb::IOOptions(), nullptr).ok() ? "empty"
                                                                                     : "missing");
      if (!accept) return absl::DataLossError("journal: " + what + ", but " + why + kAcceptHint);
      ctx->accepted.push_back(what + " (" + why + "): started empty");
      if (had_files) {  // keep the evidence; start in a fresh folder
        const std::string aside = absl::StrCat(dir, ".lost-", std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                  std::chrono::system_clock::now().time_since_epoch())
                                                                  .count());
        auto st = fs_->RenameFile(dir, aside, rocksdb::IOOptions(), nullptr);
        if (!st.ok()) return absl::UnavailableError("journal: cannot move '" + dir + "' aside: " + st.ToString());
        PACER_LOG(WARNING) << "journal: the damaged folder was moved to '" << aside << "'";
      }
    }
  }
  return absl::OkStatus();
}

// 1. RocksDB, refusing WAL damage rather than rolling back to a point in time.
absl::Status RocksLog::OpenDatabase(OpenContext* ctx, Opened* out) {
  const std::string& dir = options_.dir;
  const bool accept = options_.accept_data_loss;
  rocksdb::Options db_options;
  db_options.create_if_missing = !ctx->exists;
  db_options.paranoid_checks = true;
  // A torn *tail* is dropped, corruption anywhere else is an error
  // (kTolerateCorruptedTailRecords): a record cut short at the end of the WAL is a write that
  // was in progress when the power went or the disk filled, and with sync=true such a write was
  // never acknowledged. A checksum mismatch, a bad record type or a truncated record that is not
  // at the end still refuses. A WAL cut back further than one write (truncated on purpose, or a
  // lost tail of whole records) is caught by step 4: the mark holds every acknowledged update
  // (it is written before a group is acknowledged), so any acknowledged update missing is
  // DATA_LOSS, after a clean stop and after a crash alike; what the WAL holds past the mark was
  // never acknowledged, and dropping it is no loss.
  // Recovering after a failed write adds this process's own durable seq (min_seq) to the floor.
  db_options.wal_recovery_mode = accept ? rocksdb::WALRecoveryMode::kPointInTimeRecovery
                                        : rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  db_options.track_and_verify_wals_in_manifest = !accept;
  db_options.info_log_level = rocksdb::WARN_LEVEL;
  // No LOG file on the data disk: a full disk made its writer abort pacerd (rocksdb_logger.h).
  db_options.info_log = std::make_shared<RocksDbLogger>("journal");
  db_options.keep_log_file_num = 2;
  db_options.max_background_jobs = 2;
  db_options.write_buffer_size = 16 << 20;
  if (env_) db_options.env = env_.get();
  if (!ctx->exists) {  // (RocksDB would log an ERROR about the missing folder before creating it)
    (void)fs_->CreateDirIfMissing(Parent(dir), rocksdb::IOOptions(), nullptr);
    (void)fs_->CreateDirIfMissing(dir, rocksdb::IOOptions(), nullptr);
  }
  rocksdb::DB* raw = nullptr;
  rocksdb::Status st = rocksdb::DB::Open(db_options, dir, &raw);
  if (!st.ok()) {
    if (ctx->exists && (st.IsCorruption() || st.IsPathNotFound() || st.IsInvalidArgument() ||
                   st.ToString().find("No such file") != std::string::npos)) {
      return absl::DataLossError("journal: the RocksDB database in '" + dir +
                                 "' is damaged or incomplete (" + st.ToString() + "; files: " +
                                 ListFiles(fs_.get(), dir) + ")" +
                                 (accept ? std::string("; it cannot be opened even accepting a "
                                                       "loss: move the folder away to start empty")
                                         : std::string(kAcceptHint)));
    }
    return FromRocks(st, "journal: cannot open RocksDB in '" + dir + "'");
  }
  out->db.reset(raw);
  out->recovery.created = !ctx->exists;
  return absl::OkStatus();
}

// 2. The format (or an older store, imported).
absl::Status RocksLog::CheckFormat(OpenContext* ctx, Opened* out) {
  const std::string& dir = options_.dir;
  const bool accept = options_.accept_data_loss;
  const JournalFormat& formats = options_.format;
  std::string format;
  rocksdb::Status st = out->db->Get(rocksdb::ReadOptions(), kFormatKey, &format);
  // A folder without a format key and without a high-water mark (every log writes its mark when
  // it is created) is from before the log: an older store, imported when the owner knows it.
  if (st.IsNotFound() && ctx->exists && !ctx->hwm && options_.import_legacy) {
    auto legacy = options_.import_legacy(*out->db);
    if (!legacy.ok()) {
      return absl::Status(legacy.status().code(),
                          absl::StrCat("journal: the older store in '", dir, "' cannot be imported: ",
                                       legacy.status().message(),
                                       legacy.status().code() == absl::StatusCode::kDataLoss
                                           ? kAcceptHint
                                           : ""));
    }
    if (legacy->has_value()) {
      // One batch: a crash before it leaves the old layout (imported again at the next open),
      // after it the new one. The mark is written at the end of this open; until then
      // kImportedKey says why the folder has none (and is deleted once the mark is written).
      rocksdb::WriteBatch batch;
      for (const auto& k : (*legacy)->delete_keys) batch.Delete(k);
      for (const auto& [from, to] : (*legacy)->delete_ranges) batch.DeleteRange(from, to);
      batch.Put(kFormatKey, formats.written);
      batch.Put(Key('s', 1), (*legacy)->snapshot);
      batch.Put(kImportedKey, (*legacy)->what);
      rocksdb::WriteOptions wo;
      wo.sync = true;
      st = out->db->Write(wo, &batch);
      if (!st.ok()) return FromRocks(st, "journal: cannot write the imported store in '" + dir + "'");
      PACER_LOG(WARNING) << "journal: '" << dir << "' imported from " << (*legacy)->what
                         << " into " << formats.written;
      format = formats.written;
      st = rocksdb::Status::OK();
    }
  }
  if (st.IsNotFound() && ctx->exists && !accept) {
    return absl::DataLossError("journal: the RocksDB database in '" + dir +
                               "' has lost its contents (no format key; files: " +
                               ListFiles(fs_.get(), dir) + ")" + kAcceptHint);
  }
  const bool readable = std::find(formats.readable.begin(), formats.readable.end(), format) !=
                        formats.readable.end();
  if (st.IsNotFound()) {
    rocksdb::WriteOptions wo;
    wo.sync = true;
    st = out->db->Put(wo, kFormatKey, formats.written);
    if (!st.ok()) return FromRocks(st, "journal: cannot write format key");
  } else if (!st.ok()) {
    return FromRocks(st, "journal: cannot read format key");
  } else if (readable && format != formats.written) {
    out->upgrade_format = true;  // written anew with the first group this binary writes
  } else if (format != formats.written) {
    std::vector<std::string> known = formats.readable;
    known.push_back(formats.written);
    return absl::FailedPreconditionError(absl::StrCat(
        "journal in '", dir, "' has format '", format, "'; this pacerd reads '",
        absl::StrJoin(known, "', '"), "' (was it written by a newer pacerd?)"));
  }
  out->recovery.format = ctx->exists ? format : "";
  std::string imported;
  if (ctx->exists && out->db->Get(rocksdb::ReadOptions(), kImportedKey, &imported).ok()) {
    out->recovery.imported = imported;
  }
  return absl::OkStatus();
}

// 3. Replay: the pinned entries, the newest snapshot, then the tail of records of consecutive
// updates.
absl::Status RocksLog::ReplayInto(OpenContext* ctx, Opened* out, const Replay& replay) {
  const std::string& dir = options_.dir;
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  {
    std::unique_ptr<rocksdb::Iterator> it(out->db->NewIterator(ro));
    for (it->Seek("p"); it->Valid() && it->key().size() > 1 && it->key()[0] == 'p'; it->Next()) {
      const std::string key(it->key().data() + 1, it->key().size() - 1);
      out->pinned.insert(key);
      if (!replay.on_pinned) continue;
      if (auto s = replay.on_pinned(key, it->value().ToString()); !s.ok()) {
        return absl::DataLossError(absl::StrCat("journal: pinned entry '", key, "' in '", dir,
                                                "' does not load: ", s.message(), kAcceptHint));
      }
    }
    if (!it->status().ok()) return FromRocks(it->status(), "journal: reading pinned entries in '" + dir + "'");
  }
  uint64_t snapshot_seq = 0;
  {
    std::unique_ptr<rocksdb::Iterator> it(out->db->NewIterator(ro));
    it->SeekForPrev(Key('s', ~uint64_t{0}));
    if (it->Valid() && it->key().size() == 9 && it->key()[0] == 's') {
      snapshot_seq = SeqOf(it->key());
      if (auto s = replay.on_snapshot(snapshot_seq, it->value().ToString()); !s.ok()) {
        if (s.code() == absl::StatusCode::kDataLoss) {
          return absl::DataLossError(absl::StrCat("journal: snapshot at seq ", snapshot_seq, " in '",
                                                  dir, "' is corrupt (", s.message(), ")",
                                                  kAcceptHint));
        }
        return absl::DataLossError(absl::StrCat("journal: snapshot at seq ", snapshot_seq,
                                                " in '", dir, "' does not load: ", s.message()));
      }
    }
    if (!it->status().ok()) return FromRocks(it->status(), "journal: reading snapshots in '" + dir + "'");
  }
  uint64_t expected = snapshot_seq + 1;
  {
    absl::Status s = ReadRecords(*out->db, expected, /*exact=*/true, [&](uint64_t seq, const std::string& bytes) {
      if (absl::Status a = replay.on_update(seq, bytes); !a.ok()) return a;
      expected = seq + 1;
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
  }
  out->last_seq = expected - 1;
  out->snapshot_seq = snapshot_seq;
  out->recovery.recovered_seq = out->last_seq;
  return absl::OkStatus();
}

// 4. Never less than acknowledged; then the mark follows what was recovered.
absl::Status RocksLog::CheckAcknowledged(OpenContext* ctx, Opened* out, uint64_t min_seq) {
  const std::string& dir = options_.dir;
  const bool accept = options_.accept_data_loss;
  const uint64_t floor = std::max<uint64_t>(ctx->hwm.value_or(0), min_seq);
  if (out->last_seq < floor) {
    const std::string what = absl::StrCat(
        "journal: '", dir, "' recovered updates up to ", out->last_seq, " but ",
        min_seq > ctx->hwm.value_or(0) ? std::string("this process") : "'" + hwm_path_ + "'",
        " records that updates up to ", floor, " were acknowledged: ", floor - out->last_seq,
        " acknowledged updates are missing (files: ", ListFiles(fs_.get(), dir), ")");
    if (!accept) return absl::DataLossError(what + kAcceptHint);
    ctx->accepted.push_back(what);
  }
  if (!ctx->hwm && options_.must_exist && ctx->exists && out->recovery.imported.empty()) {
    const std::string what = "the high-water mark '" + hwm_path_ + "' is missing";
    if (!accept) {
      return absl::DataLossError("journal: " + what +
                                 ", but the data dir's IDENTITY says the journal was created" +
                                 kAcceptHint);
    }
    ctx->accepted.push_back(what);
  }
  out->recovery.adopted = !ctx->hwm && ctx->exists && ctx->accepted.empty();
  out->recovery.accepted_loss = absl::StrJoin(ctx->accepted, "; ");
  // The mark follows what was recovered (down, when a loss was accepted), written whole: a v1
  // mark becomes v2 here.
  auto mark = HighWaterMark::Create(fs_.get(), hwm_path_, out->last_seq);
  if (!mark.ok()) return mark.status();
  out->hwm = std::move(*mark);
  if (out->recovery.hwm_format == kHwmFormatV1) {
    PACER_LOG(INFO) << "journal: the high-water mark '" << hwm_path_ << "' upgraded from "
                    << kHwmFormatV1 << " to " << kHwmFormatV2;
  }
  if (!out->recovery.imported.empty()) {  // the mark holds the import now
    rocksdb::WriteOptions wo;
    wo.sync = true;
    if (auto s = FromRocks(out->db->Delete(wo, kImportedKey), "journal: cannot finish the import in '" + dir + "'"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void RocksLog::Install(Opened opened) {
  db_ = std::move(opened.db);
  last_seq_ = written_seq_ = durable_seq_ = opened.last_seq;
  ++epoch_;
  {
    absl::MutexLock h(&hwm_mu_);
    hwm_ = std::move(opened.hwm);
    hwm_seq_.store(hwm_->seq());
  }
  last_snapshot_seq_ = opened.snapshot_seq;
  pinned_ = std::move(opened.pinned);
  upgrade_format_ = opened.upgrade_format;
  recovery_ = std::move(opened.recovery);
  stats_.durable_seq = durable_seq_;
  health_ = absl::OkStatus();
}

RocksLog::~RocksLog() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  hwm_cv_.SignalAll();
  mark_cv_.SignalAll();
  if (writer_.joinable()) writer_.join();  // then the marker marks what it wrote, and exits
  if (hwm_thread_.joinable()) hwm_thread_.join();
  if (!db_) return;
  bool healthy;
  uint64_t durable;
  {
    absl::MutexLock l(&mu_);
    healthy = health_.ok();
    durable = durable_seq_;
  }
  if (healthy) {
    // A clean close: the mark is exact (with marks_ack_ it already is: the marker has marked
    // everything written before it exited). Without per-group fsync, sync the WAL first.
    rocksdb::Status st = options_.sync ? rocksdb::Status::OK() : db_->SyncWAL();
    absl::MutexLock h(&hwm_mu_);
    if (st.ok() && hwm_ && hwm_->seq() != durable) {
      if (auto s = hwm_->Advance(durable); !s.ok()) {
        PACER_LOG(WARNING) << s;
      }
      hwm_seq_.store(hwm_->seq());
    }
  }
  db_->Close().PermitUncheckedError();
  db_.reset();
}

void RocksLog::Append(uint64_t seq, std::string bytes) {
  absl::MutexLock l(&mu_);
  PACER_CHECK(seq == last_seq_ + 1) << "journal append out of order: " << seq << " after " << last_seq_;
  last_seq_ = seq;
  queue_.push_back(Entry{seq, std::move(bytes), nullptr, {}});
  stats_.appends++;
  cv_.Signal();
}

void RocksLog::AppendAll(std::vector<std::pair<uint64_t, std::string>> updates) {
  absl::MutexLock l(&mu_);
  for (auto& [seq, bytes] : updates) {
    PACER_CHECK(seq == last_seq_ + 1) << "journal append out of order: " << seq << " after " << last_seq_;
    last_seq_ = seq;
    queue_.push_back(Entry{seq, std::move(bytes), nullptr, {}});
    stats_.appends++;
  }
  if (!updates.empty()) cv_.Signal();  // one wake-up: the writer takes them as one group
}

void RocksLog::WriteSnapshot(uint64_t seq,
                             std::shared_ptr<const google::protobuf::MessageLite> snapshot,
                             std::vector<PinnedEntry> pinned) {
  // Serialized by the writer: the caller (the owner, under its lock) only moves it here.
  absl::MutexLock l(&mu_);
  // A group's record is deleted whole with the snapshot that covers its first update: a
  // snapshot must cover every update appended before it, or the later ones would go with it.
  PACER_CHECK(seq == last_seq_) << "snapshot at " << seq << " with updates appended up to " << last_seq_;
  queue_.push_back(Entry{seq, std::string(), std::move(snapshot), std::move(pinned)});
  cv_.Signal();
}

absl::Status RocksLog::ReadFrom(uint64_t seq, const EntryFn& on_update) const {
  absl::MutexLock l(&mu_);  // db_ is replaced by Recover()
  if (!db_) return health_;
  if (seq <= last_snapshot_seq_) {
    return absl::FailedPreconditionError(
        absl::StrCat("journal: '", options_.dir, "' holds updates after its snapshot at seq ",
                     last_snapshot_seq_, " only; read from the snapshot instead of seq ", seq));
  }
  return ReadRecords(*db_, seq, /*exact=*/false, on_update);
}

absl::Status RocksLog::ReadRecords(rocksdb::DB& db, uint64_t from, bool exact,
                                   const EntryFn& fn) const {
  const std::string& dir = options_.dir;
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  std::unique_ptr<rocksdb::Iterator> it(db.NewIterator(ro));
  // `from` may lie inside a record (ReadFrom): start at the record holding it.
  if (!exact) it->SeekForPrev(Key('j', from));
  if (exact || !it->Valid() || it->key().size() != 9 || it->key()[0] != 'j') it->Seek(Key('j', from));
  uint64_t expected = from;
  bool first_record = true;
  std::vector<std::string> updates;
  for (; it->Valid(); it->Next()) {
    const rocksdb::Slice key = it->key();
    if (key.size() != 9 || key[0] != 'j') break;
    const uint64_t first = SeqOf(key);
    if (first_record && first < from) expected = first;
    first_record = false;
    if (first != expected) {
      return absl::DataLossError(absl::StrCat("journal: gap in '", dir, "': expected update ",
                                              expected, ", found ", first));
    }
    if (!SplitRecord(it->value(), &updates) || updates.empty()) {
      return absl::DataLossError(
          absl::StrCat("journal: record of update ", first, " in '", dir, "' is corrupt"));
    }
    for (const std::string& bytes : updates) {
      if (expected >= from) {
        if (absl::Status s = fn(expected, bytes); !s.ok()) {
          if (s.code() == absl::StatusCode::kDataLoss) {
            return absl::DataLossError(absl::StrCat("journal: update ", expected, " in '", dir,
                                                    "' is corrupt (", s.message(), ")"));
          }
          return absl::DataLossError(
              absl::StrCat("journal: update ", expected, " does not apply: ", s.message()));
        }
      }
      ++expected;
    }
  }
  if (!it->status().ok()) return FromRocks(it->status(), "journal: reading updates in '" + dir + "'");
  return absl::OkStatus();
}

void RocksLog::WhenDurable(uint64_t seq, Done done) {
  absl::Status status;
  {
    absl::MutexLock l(&mu_);
    if (health_.ok() && durable_seq_ < seq) {
      waiters_.emplace(seq, std::move(done));
      return;
    }
    status = health_;
  }
  done(status);
}

absl::Status RocksLog::Flush() {
  absl::MutexLock l(&mu_);
  const uint64_t target = last_seq_;
  CvWait(durable_cv_, mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return durable_seq_ >= target || !health_.ok(); });
  return health_;
}

absl::Status RocksLog::health() const {
  absl::MutexLock l(&mu_);
  return health_;
}

uint64_t RocksLog::last_seq() const {
  absl::MutexLock l(&mu_);
  return last_seq_;
}

JournalStats RocksLog::stats() const {
  absl::MutexLock l(&mu_);
  JournalStats s = stats_;
  s.hwm_seq = hwm_seq_.load();
  return s;
}

JournalRecovery RocksLog::recovery() const {
  absl::MutexLock l(&mu_);
  return recovery_;
}

absl::Status RocksLog::Recover(const Replay& replay) {
  absl::MutexLock l(&mu_);
  if (health_.ok()) return absl::OkStatus();
  // The writer is idle: it never writes past a failure, it only discards what is queued.
  // Updates queued after the failure were applied in memory but never acknowledged: dropped.
  queue_.clear();
  const uint64_t durable = durable_seq_;
  if (db_) {
    // The failed writer must not be used again: close the database and open it afresh.
    db_->Close().PermitUncheckedError();
    db_.reset();
  }
  auto opened = OpenAndReplay(replay, durable);
  if (!opened.ok()) {
    // Still refused; health keeps the first cause (a full disk) and says why reopening failed.
    if (failure_.ok()) failure_ = health_;
    health_ = opened.status().code() == absl::StatusCode::kDataLoss
                  ? opened.status()
                  : absl::UnavailableError(absl::StrCat(failure_.message(), " (reopening failed: ",
                                                        opened.status().message(), ")"));
    return health_;
  }
  failure_ = absl::OkStatus();
  Install(std::move(*opened));
  stats_.recoveries++;
  PACER_LOG(WARNING) << "journal: reopened '" << options_.dir << "' after a failed write; resumed at update "
                     << last_seq_;
  return absl::OkStatus();
}

void RocksLog::TakeWaiters(uint64_t up_to, std::vector<Done>* ready) {
  while (!waiters_.empty() && waiters_.begin()->first <= up_to) {
    ready->push_back(std::move(waiters_.begin()->second));
    waiters_.erase(waiters_.begin());
  }
}

void RocksLog::MarkLoop() {
  absl::MutexLock l(&mu_);
  for (;;) {
    // Steps 2 and 3 of "Acknowledging a group" (rocks_log.h).
    CvWait(mark_cv_, mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return (health_.ok() && written_seq_ > durable_seq_) || writer_done_; });
    if (!health_.ok() || written_seq_ <= durable_seq_) break;  // the writer is done: all marked
    const uint64_t target = written_seq_;  // every group written so far, in one mark
    const uint64_t epoch = epoch_;
    mu_.Unlock();
    absl::Status st;
    {
      absl::MutexLock h(&hwm_mu_);
      // (Never lowered: after a Recover() the new mark already holds at least this.)
      if (target > hwm_->seq()) st = hwm_->Advance(target);
      hwm_seq_.store(hwm_->seq());
    }
    std::vector<Done> ready;
    absl::Status status;
    mu_.Lock();
    if (epoch != epoch_) continue;  // Recover() reopened the log meanwhile, with its own mark
    if (!st.ok()) {
      // Not acknowledged: the same as a failed WAL write (rocks_log.h, DurableLog's step 5).
      if (health_.ok()) {
        health_ = absl::UnavailableError(absl::StrCat(
            st.message(), ": updates are refused until the journal is reopened; nothing "
                          "acknowledged is lost"));
        stats_.failed_writes++;
        PACER_LOG(ERROR) << health_.message();
      }
      TakeWaiters(~uint64_t{0}, &ready);  // all of them: none is acknowledged
      status = health_;
    } else {
      // Marked: acknowledged (even if a later group failed meanwhile; its waiters have failed).
      durable_seq_ = std::max(durable_seq_, target);
      stats_.durable_seq = durable_seq_;
      stats_.hwm_writes++;
      TakeWaiters(durable_seq_, &ready);
    }
    mu_.Unlock();
    durable_cv_.SignalAll();
    for (auto& done : ready) done(status);
    mu_.Lock();
  }
}

void RocksLog::HwmLoop() {
  const auto period = std::chrono::milliseconds(std::max<int64_t>(1, options_.hwm_interval_ms));
  absl::MutexLock l(&mu_);
  while (!stopping_) {
    CvWaitFor(hwm_cv_, mu_, period, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; });  // a timer; wakes early on stop
    if (stopping_) break;
    const uint64_t durable = durable_seq_;
    const bool healthy = health_.ok();
    mu_.Unlock();
    if (healthy) {
      absl::MutexLock h(&hwm_mu_);
      if (durable > hwm_->seq()) {
        // A failure (a full disk) keeps the older, lower mark: always safe, only less exact.
        if (auto s = hwm_->Advance(durable); !s.ok()) {
          PACER_LOG(WARNING) << s;
        }
        hwm_seq_.store(hwm_->seq());
      }
    }
    mu_.Lock();
  }
}

void RocksLog::WriterLoop() {
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync;
  std::vector<Entry> batch_entries;
  for (;;) {
    bool upgrade = false;
    uint64_t previous_snapshot = 0;
    std::set<std::string> pinned;  // on disk once this batch is written
    {
      absl::MutexLock l(&mu_);
      CvWait(cv_, mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); });
      if (queue_.empty() && stopping_) {
        writer_done_ = true;  // the marker marks what was written, then exits
        mark_cv_.Signal();
        break;
      }
      batch_entries.swap(queue_);
      if (!health_.ok()) {  // never write past a failed batch: the log would have a hole
        batch_entries.clear();
        continue;
      }
      upgrade = upgrade_format_;
      previous_snapshot = last_snapshot_seq_;
      pinned = pinned_;
    }
    rocksdb::WriteBatch batch;
    uint64_t max_seq = 0, snapshot_seq = 0, bytes = 0, pinned_written = 0;
    if (upgrade) batch.Put(kFormatKey, options_.format.written);  // atomically with the first group
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
      if (e.snapshot == nullptr) {
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
      // Its pinned entries: the new ones written, the ones it no longer lists deleted.
      std::set<std::string> listed;
      for (const PinnedEntry& p : e.pinned) {
        listed.insert(p.key);
        if (pinned.count(p.key) > 0) continue;
        const std::string value = p.value->SerializeAsString();
        bytes += value.size();
        batch.Put("p" + p.key, value);
        ++pinned_written;
      }
      for (const std::string& key : pinned) {
        if (listed.count(key) == 0) batch.Delete("p" + key);
      }
      pinned.swap(listed);
      const std::string snapshot_bytes = e.snapshot->SerializeAsString();
      bytes += snapshot_bytes.size();
      batch.Put(Key('s', e.seq), snapshot_bytes);
      batch.DeleteRange(Key('j', 0), Key('j', e.seq + 1));
      if (previous_snapshot != 0 && previous_snapshot != e.seq) {
        batch.Delete(Key('s', previous_snapshot));
      }
      previous_snapshot = snapshot_seq = e.seq;
    }
    close_record();
    const int64_t write_start_ns = RealClock::Get()->MonotonicNs();
    const rocksdb::Status st = db_->Write(wo, &batch);
    const double write_s = static_cast<double>(RealClock::Get()->MonotonicNs() - write_start_ns) / 1e9;
    std::vector<Done> ready;
    absl::Status status;
    {
      absl::MutexLock l(&mu_);
      if (!st.ok()) {
        if (health_.ok()) health_ = WriteFailure(st, options_.dir);  // (or the mark failed first)
        stats_.failed_writes++;
        PACER_LOG(ERROR) << health_.message();
        TakeWaiters(~uint64_t{0}, &ready);  // all of them: none is acknowledged
      } else {
        stats_.batches++;
        stats_.bytes += bytes;
        {
          const std::vector<double>& bounds = LatencySecondsBuckets();
          stats_.write_latency_counts.resize(bounds.size() + 1);
          const size_t bucket = std::lower_bound(bounds.begin(), bounds.end(), write_s) - bounds.begin();
          stats_.write_latency_counts[bucket]++;
          stats_.write_latency_sum_s += write_s;
        }
        if (upgrade) {
          upgrade_format_ = false;
          PACER_LOG(INFO) << "journal: '" << options_.dir << "' upgraded to " << options_.format.written;
        }
        if (snapshot_seq != 0) {
          last_snapshot_seq_ = snapshot_seq;
          pinned_.swap(pinned);
          stats_.snapshots++;
          stats_.pinned_written += pinned_written;
        }
        if (max_seq > written_seq_) written_seq_ = max_seq;
        if (marks_ack_) {
          mark_cv_.Signal();  // acknowledged once the mark holds it (MarkLoop)
        } else {
          durable_seq_ = written_seq_;
          stats_.durable_seq = durable_seq_;
          TakeWaiters(durable_seq_, &ready);
        }
      }
      status = health_;
    }
    durable_cv_.SignalAll();
    batch_entries.clear();
    for (auto& done : ready) done(status);
  }
}

}  // namespace pacer
