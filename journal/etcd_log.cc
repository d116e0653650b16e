#include "journal/etcd_log.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cond_wait.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/status.h"
#include "pacer/etcd_journal.pb.h"

namespace pacer {
namespace {

using journal::EtcdJournalRecord;

int64_t NowMs() { return RealClock::Get()->MonotonicNs() / 1'000'000; }

// A key's pieces are "<key>.0001".. : '.' sorts before '/' and every hex digit, so
// [key, key + "/") holds the record and its pieces and nothing else.
std::string RecordEnd(const std::string& key) { return key + "/"; }
bool IsPiece(const std::string& key) {
  const size_t slash = key.rfind('/');
  return key.find('.', slash == std::string::npos ? 0 : slash) != std::string::npos;
}

absl::Status CallbackFailure(const absl::Status& s, const std::string& key) {
  if (s.code() == absl::StatusCode::kDataLoss) {
    return absl::DataLossError(absl::StrCat("etcd journal: entry '", key, "' is corrupt: ", s.message()));
  }
  return absl::DataLossError(absl::StrCat("etcd journal: entry '", key, "' does not apply: ", s.message()));
}

}  // namespace

EtcdLog::EtcdLog(EtcdLogOptions options) : options_(std::move(options)) {}

std::string EtcdLog::UpdateKey(uint64_t seq) const { return absl::StrFormat("%su/%016x", options_.prefix, seq); }
std::string EtcdLog::SnapshotKey(uint64_t seq) const { return absl::StrFormat("%ss/%016x", options_.prefix, seq); }
std::string EtcdLog::PinnedKey(const std::string& key) const {
  return absl::StrCat(options_.prefix, "p/", absl::BytesToHexString(key));
}

absl::StatusOr<std::unique_ptr<EtcdLog>> EtcdLog::Open(EtcdLogOptions options, const Replay& replay) {
  if (options.client == nullptr) return absl::InvalidArgumentError("etcd journal: no client");
  if (options.prefix.empty() || options.prefix.back() != '/') {
    return absl::InvalidArgumentError("etcd journal: the prefix must end in '/'");
  }
  if (options.piece_bytes == 0 || options.piece_bytes * 2 > options.max_txn_bytes) {
    return absl::InvalidArgumentError("etcd journal: piece_bytes must be > 0 and <= max_txn_bytes / 2");
  }
  std::unique_ptr<EtcdLog> log(new EtcdLog(std::move(options)));
  ASSIGN_OR_RETURN(Opened opened, log->options_.wait_promoted ? log->Follow(replay)
                                                              : log->OpenAndReplay(replay, /*may_write=*/true));
  {
    absl::MutexLock l(&log->mu_);  // no other thread yet: for the annotations
    log->last_seq_ = log->durable_seq_ = opened.last_seq;
    log->stats_.durable_seq = opened.last_seq;
    log->last_snapshot_seq_ = opened.snapshot_seq;
    log->pinned_ = std::move(opened.pinned);
    log->recovery_ = opened.recovery;
  }
  log->writer_ = std::thread([l = log.get()] { l->WriterLoop(); });
  return log;
}

EtcdLog::~EtcdLog() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  if (writer_.joinable()) writer_.join();
}

absl::StatusOr<std::string> EtcdLog::ReadRecord(const std::string& key, int64_t revision) const {
  std::string assembled;
  uint32_t parts = 0;
  uint32_t next_part = 1;
  std::string start = key;
  const std::string end = RecordEnd(key);
  for (;;) {
    etcdserverpb::RangeRequest req;
    req.set_key(start);
    req.set_range_end(end);
    req.set_revision(revision);
    req.set_limit(16);
    ASSIGN_OR_RETURN(etcdserverpb::RangeResponse resp, options_.client->Range(req));
    for (const mvccpb::KeyValue& kv : resp.kvs()) {
      if (parts == 0) {
        if (kv.key() != key) return absl::NotFoundError(absl::StrCat("etcd journal: no record '", key, "'"));
        EtcdJournalRecord head;
        if (!head.ParseFromString(kv.value())) {
          return absl::DataLossError(absl::StrCat("etcd journal: record '", key, "' does not parse"));
        }
        if (head.parts() <= 1) return kv.value();
        parts = head.parts();
        assembled = head.piece();
        continue;
      }
      const std::string want = absl::StrFormat("%s.%04x", key, next_part);
      if (kv.key() != want) {
        return absl::DataLossError(
            absl::StrCat("etcd journal: record '", key, "' misses its piece '", want, "'"));
      }
      assembled += kv.value();
      if (++next_part == parts) {
        EtcdJournalRecord check;
        if (!check.ParseFromString(assembled)) {
          return absl::DataLossError(absl::StrCat("etcd journal: record '", key, "' does not parse"));
        }
        return assembled;
      }
    }
    if (resp.kvs().empty() || !resp.more()) break;
    start = resp.kvs().rbegin()->key() + std::string(1, '\0');
  }
  if (parts == 0) return absl::NotFoundError(absl::StrCat("etcd journal: no record '", key, "'"));
  return absl::DataLossError(absl::StrFormat("etcd journal: record '%s' has %u of its %u pieces", key,
                                             next_part, parts));
}

absl::StatusOr<uint64_t> EtcdLog::ReadUpdates(uint64_t from, int64_t revision, const EntryFn& fn) const {
  // The chunk holding `from` may start before it (a follower reading from the middle of a group):
  // find the last record key at or before UpdateKey(from).
  std::string start = UpdateKey(from);
  {
    etcdserverpb::RangeRequest req;
    req.set_key(options_.prefix + "u/");
    req.set_range_end(UpdateKey(from) + std::string(1, '\0'));
    req.set_revision(revision);
    req.set_keys_only(true);
    req.set_sort_order(etcdserverpb::RangeRequest::DESCEND);
    req.set_sort_target(etcdserverpb::RangeRequest::KEY);
    req.set_limit(1);
    ASSIGN_OR_RETURN(etcdserverpb::RangeResponse resp, options_.client->Range(req));
    if (!resp.kvs().empty()) {
      const std::string& key = resp.kvs(0).key();
      start = IsPiece(key) ? key.substr(0, key.rfind('.')) : key;  // a piece: start at its head
    }
  }
  const std::string end = options_.prefix + "u0";  // '0' follows '/'
  uint64_t expected = from;  // the next seq to deliver
  bool first = true;
  for (;;) {
    etcdserverpb::RangeRequest req;
    req.set_key(start);
    req.set_range_end(end);
    req.set_revision(revision);
    req.set_limit(options_.read_page_keys);
    ASSIGN_OR_RETURN(etcdserverpb::RangeResponse page, options_.client->Range(req));
    if (revision == 0) revision = page.header().revision();  // every page at the first one's
    for (const mvccpb::KeyValue& kv : page.kvs()) {
      if (IsPiece(kv.key())) continue;  // read with its record (or a tail a crash cut: no head)
      EtcdJournalRecord rec;
      if (!rec.ParseFromString(kv.value())) {
        return absl::DataLossError(absl::StrCat("etcd journal: record '", kv.key(), "' does not parse"));
      }
      if (rec.parts() > 1) {  // split: its pieces follow it
        ASSIGN_OR_RETURN(std::string bytes, ReadRecord(kv.key(), revision));
        if (!rec.ParseFromString(bytes)) {
          return absl::DataLossError(absl::StrCat("etcd journal: record '", kv.key(), "' does not parse"));
        }
      }
      const uint64_t last = rec.seq() + rec.entries_size() - 1;
      if (rec.entries_size() == 0 || kv.key() != UpdateKey(rec.seq())) {
        return absl::DataLossError(absl::StrCat("etcd journal: record '", kv.key(), "' holds seq ", rec.seq(),
                                                " with ", rec.entries_size(), " updates"));
      }
      if (last < expected) continue;
      if (rec.seq() > expected || (first && rec.seq() > from)) {
        return absl::DataLossError(absl::StrCat("etcd journal at '", options_.prefix, "': updates ", expected,
                                                "..", rec.seq() - 1, " are missing (next record '", kv.key(),
                                                "')"));
      }
      first = false;
      for (int i = 0; i < rec.entries_size(); ++i) {
        const uint64_t seq = rec.seq() + i;
        if (seq < expected) continue;
        absl::Status s = fn(seq, rec.entries(i));
        if (!s.ok()) return CallbackFailure(s, absl::StrCat(kv.key(), " #", seq));
        expected = seq + 1;
      }
    }
    if (page.kvs().empty() || !page.more()) break;
    start = page.kvs().rbegin()->key() + std::string(1, '\0');
  }
  return expected - 1;
}

absl::StatusOr<EtcdLog::Opened> EtcdLog::OpenAndReplay(const Replay& replay, bool may_write) {
  Opened out;
  const std::string& p = options_.prefix;
  etcdserverpb::RangeRequest meta;
  meta.set_key(p + "format");
  meta.set_range_end(p + "layout" + std::string(1, '\0'));  // "format" .. "layout"
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse m, options_.client->Range(meta));
  std::string layout, format;
  for (const mvccpb::KeyValue& kv : m.kvs()) {
    if (kv.key() == p + "layout") layout = kv.value();
    if (kv.key() == p + "format") format = kv.value();
  }
  if (layout.empty()) {
    etcdserverpb::RangeRequest any;
    any.set_key(p);
    any.set_range_end(EtcdPrefixEnd(p));
    any.set_keys_only(true);
    any.set_limit(1);
    ASSIGN_OR_RETURN(etcdserverpb::RangeResponse a, options_.client->Range(any));
    if (!a.kvs().empty()) {
      return absl::DataLossError(absl::StrCat("etcd journal at '", p, "': keys (e.g. '", a.kvs(0).key(),
                                              "') but no layout key: not a Pacer journal, or damaged"));
    }
    if (options_.must_exist) {
      return absl::DataLossError(absl::StrCat("etcd journal at '", p, "' is missing (it must exist)"));
    }
    if (!may_write) return absl::NotFoundError(absl::StrCat("no etcd journal at '", p, "' yet"));
    std::vector<Op> ops = {{p + "layout", kEtcdLogLayout}, {p + "format", options_.format.written}};
    size_t txns = 0;
    RETURN_IF_ERROR(WriteOps(ops, &txns));
    out.recovery.created = true;
    PACER_LOG(INFO) << "etcd journal: created at '" << p << "' (" << options_.format.written << ")";
    return out;
  }
  if (layout != kEtcdLogLayout) {
    return absl::FailedPreconditionError(absl::StrCat("etcd journal at '", p, "' is laid out as '", layout,
                                                      "'; this pacerd reads ", kEtcdLogLayout));
  }
  const auto& readable = options_.format.readable;
  if (format != options_.format.written &&
      std::find(readable.begin(), readable.end(), format) == readable.end()) {
    return absl::FailedPreconditionError(absl::StrCat("etcd journal at '", p, "' is in format '", format,
                                                      "'; this pacerd writes ", options_.format.written));
  }
  out.recovery.format = format;
  if (may_write) RETURN_IF_ERROR(UpgradeFormat(format));
  RETURN_IF_ERROR(CatchUp(replay, &out));
  out.recovery.recovered_seq = out.last_seq;
  return out;
}

absl::Status EtcdLog::UpgradeFormat(const std::string& found) {
  if (found == options_.format.written) return absl::OkStatus();
  size_t txns = 0;
  return WriteOps({{options_.prefix + "format", options_.format.written}}, &txns);
}

absl::Status EtcdLog::CatchUp(const Replay& replay, Opened* out) const {
  const std::string& p = options_.prefix;
  // The newest snapshot (keys only: pieces sort after their head); everything below is read at
  // this listing's revision, so a snapshot the leader writes meanwhile cannot cut a hole.
  etcdserverpb::RangeRequest snaps;
  snaps.set_key(p + "s/");
  snaps.set_range_end(p + "s0");
  snaps.set_keys_only(true);
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse s, options_.client->Range(snaps));
  const int64_t revision = s.header().revision();
  std::string newest;
  for (const mvccpb::KeyValue& kv : s.kvs()) {
    if (!IsPiece(kv.key())) newest = kv.key();
  }
  // A snapshot past what was applied (the first open, or a follower that fell behind one):
  // start over from it.
  if (!newest.empty() && newest > SnapshotKey(out->last_seq)) {
    ASSIGN_OR_RETURN(std::string bytes, ReadRecord(newest, revision));
    EtcdJournalRecord rec;
    if (!rec.ParseFromString(bytes) || rec.entries_size() != 1 || SnapshotKey(rec.seq()) != newest) {
      return absl::DataLossError(absl::StrCat("etcd journal: snapshot '", newest, "' is damaged"));
    }
    std::vector<std::string> pinned(rec.pinned().begin(), rec.pinned().end());
    std::sort(pinned.begin(), pinned.end());
    out->pinned.clear();
    for (const std::string& key : pinned) {
      absl::StatusOr<std::string> pb = ReadRecord(PinnedKey(key), revision);
      if (absl::IsNotFound(pb.status())) {
        return absl::DataLossError(absl::StrCat("etcd journal: snapshot '", newest, "' refers to pinned entry '",
                                                key, "', which is missing"));
      }
      if (!pb.ok()) return pb.status();
      EtcdJournalRecord prec;
      if (!prec.ParseFromString(*pb) || prec.entries_size() != 1) {
        return absl::DataLossError(absl::StrCat("etcd journal: pinned entry '", PinnedKey(key), "' is damaged"));
      }
      if (replay.on_pinned) {
        absl::Status st = replay.on_pinned(key, prec.entries(0));
        if (!st.ok()) return CallbackFailure(st, PinnedKey(key));
      }
      out->pinned.insert(key);
    }
    absl::Status st = replay.on_snapshot(rec.seq(), rec.entries(0));
    if (!st.ok()) return CallbackFailure(st, newest);
    out->snapshot_seq = rec.seq();
    out->last_seq = rec.seq();
  }
  ASSIGN_OR_RETURN(uint64_t last, ReadUpdates(out->last_seq + 1, revision, replay.on_update));
  out->last_seq = std::max(last, out->last_seq);
  return absl::OkStatus();
}

namespace {

// How often a follower checks for promotion and for watch events.
constexpr int64_t kFollowTickMs = 20;

// A watch on every key under `prefix` whose only output is "something changed" (TakeEvent). Its
// own thread; a stream that fails is opened again (on the next member) a second later.
class JournalWatch {
 public:
  JournalWatch(EtcdClient* client, std::string prefix)
      : client_(client), prefix_(std::move(prefix)), thread_([this] { Run(); }) {}
  ~JournalWatch() {
    {
      absl::MutexLock l(&mu_);
      stopping_ = true;
      if (ctx_) ctx_->TryCancel();
    }
    cv_.SignalAll();
    thread_.join();
  }
  bool TakeEvent() { return event_.exchange(false); }

 private:
  void Run() {
    for (;;) {
      std::unique_ptr<grpc::ClientContext> ctx = client_->StreamContext(0);
      {
        absl::MutexLock l(&mu_);
        if (stopping_) return;
        ctx_ = ctx.get();
      }
      auto stream = client_->watch_stub()->Watch(ctx.get());
      etcdserverpb::WatchRequest req;
      req.mutable_create_request()->set_key(prefix_);
      req.mutable_create_request()->set_range_end(EtcdPrefixEnd(prefix_));
      etcdserverpb::WatchResponse resp;
      if (stream->Write(req)) {
        while (stream->Read(&resp)) {
          if (!resp.events().empty() || resp.compact_revision() != 0) event_ = true;
          if (resp.canceled()) break;
        }
      }
      stream->WritesDone();
      ctx->TryCancel();
      const grpc::Status s = stream->Finish();
      absl::MutexLock l(&mu_);
      ctx_ = nullptr;
      if (stopping_) return;
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE) client_->Rotate();
      event_ = true;  // something may have been missed while the stream was down
      CvWaitFor(cv_, mu_, std::chrono::seconds(1), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; });
    }
  }

  EtcdClient* const client_;
  const std::string prefix_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;  // the stream open now (to cancel it)
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> event_{false};
  std::thread thread_;  // last: started once the rest is set
};

}  // namespace

absl::StatusOr<EtcdLog::Opened> EtcdLog::Follow(const Replay& replay) {
  // Until the journal exists (a new job's leader creates it) or this pacerd is promoted.
  absl::StatusOr<Opened> opened;
  bool promoted = false;
  for (;;) {
    opened = OpenAndReplay(replay, promoted);
    if (opened.ok() || !absl::IsNotFound(opened.status())) break;
    ASSIGN_OR_RETURN(promoted, options_.wait_promoted(options_.follow_poll_ms));
  }
  if (!opened.ok()) return opened.status();
  if (!promoted) {
    ASSIGN_OR_RETURN(promoted, options_.wait_promoted(0));
  }
  if (!promoted) {
    PACER_LOG(INFO) << "etcd journal at '" << options_.prefix << "': following as a standby from update "
                    << opened->last_seq;
  }
  // A watch on the journal's keys is the wake-up: a catch-up starts as soon as the leader writes
  // (what was written is read by range, never from the events: etcd 3.4 can repeat them, or skip
  // them around a compaction). Without events, a catch-up every follow_poll_ms all the same.
  std::unique_ptr<JournalWatch> watch;
  if (!promoted) watch = std::make_unique<JournalWatch>(options_.client, options_.prefix);
  int64_t last_round_ms = NowMs();
  while (!promoted) {
    ASSIGN_OR_RETURN(promoted, options_.wait_promoted(kFollowTickMs));
    const int64_t now = NowMs();
    if (!promoted && !watch->TakeEvent() && now - last_round_ms < options_.follow_poll_ms) continue;
    last_round_ms = now;
    const uint64_t before = opened->last_seq;
    absl::Status st = CatchUp(replay, &*opened);
    if (!st.ok()) {
      // A revision compacted between two reads, or etcd unreachable: the next poll tries again.
      // Damage is not retried.
      if (st.code() == absl::StatusCode::kDataLoss || st.code() == absl::StatusCode::kInvalidArgument ||
          st.code() == absl::StatusCode::kFailedPrecondition) {
        return st;
      }
      PACER_LOG(WARNING) << "etcd journal: following: " << st.message();
      if (promoted) return st;  // the final catch-up must succeed
      continue;
    }
    if (options_.on_follow) options_.on_follow(opened->last_seq, opened->last_seq - before);
  }
  // Promoted: everything a former leader wrote is in etcd before our election key was (its key
  // was gone first), so the last catch-up above read it all.
  const std::string format = opened->recovery.format;
  RETURN_IF_ERROR(UpgradeFormat(format.empty() ? options_.format.written : format));
  opened->recovery.recovered_seq = opened->last_seq;
  return opened;
}

void EtcdLog::Append(uint64_t seq, std::string bytes) {
  {
    absl::MutexLock l(&mu_);
    last_seq_ = seq;
    stats_.appends++;
    queue_.push_back(Entry{seq, std::move(bytes), nullptr, {}});
  }
  cv_.Signal();
}

void EtcdLog::AppendAll(std::vector<std::pair<uint64_t, std::string>> updates) {
  if (updates.empty()) return;
  {
    absl::MutexLock l(&mu_);
    for (auto& [seq, bytes] : updates) {
      last_seq_ = seq;
      stats_.appends++;
      queue_.push_back(Entry{seq, std::move(bytes), nullptr, {}});
    }
  }
  cv_.Signal();
}

void EtcdLog::WriteSnapshot(uint64_t seq, std::shared_ptr<const google::protobuf::MessageLite> snapshot,
                            std::vector<PinnedEntry> pinned) {
  {
    absl::MutexLock l(&mu_);
    queue_.push_back(Entry{seq, {}, std::move(snapshot), std::move(pinned)});
  }
  cv_.Signal();
}

void EtcdLog::AddRecord(const std::string& key, const std::string& record, std::vector<Op>* ops) const {
  const size_t piece = options_.piece_bytes;
  if (record.size() <= piece) {
    ops->push_back(Op{key, record});
    return;
  }
  const uint32_t parts = static_cast<uint32_t>((record.size() + piece - 1) / piece);
  for (uint32_t i = 1; i < parts; ++i) {
    ops->push_back(Op{absl::StrFormat("%s.%04x", key, i), record.substr(i * piece, piece)});
  }
  EtcdJournalRecord head;
  head.set_parts(parts);
  head.set_piece(record.substr(0, piece));
  ops->push_back(Op{key, head.SerializeAsString()});
}

std::vector<EtcdLog::Op> EtcdLog::BuildOps(std::vector<Entry>& group, std::set<std::string>* pinned_after,
                                           uint64_t* snapshot_seq, uint64_t* pinned_written) const {
  std::vector<Op> ops;
  // The group's newest snapshot covers every update and snapshot before it in the group: those
  // are not written at all (etcd refuses a transaction whose puts overlap its deletes, and they
  // would be deleted at once). Nothing of a group is acknowledged before all of it is written.
  size_t first = 0;
  for (size_t i = 0; i < group.size(); ++i) {
    if (group[i].snapshot) first = i;
  }
  EtcdJournalRecord chunk;
  size_t chunk_bytes = 0;
  auto flush = [&] {
    if (chunk.entries_size() == 0) return;
    AddRecord(UpdateKey(chunk.seq()), chunk.SerializeAsString(), &ops);
    chunk.Clear();
    chunk_bytes = 0;
  };
  for (size_t i = first; i < group.size(); ++i) {
    Entry& e = group[i];
    if (!e.snapshot) {
      if (chunk.entries_size() == 0) chunk.set_seq(e.seq);
      chunk_bytes += e.bytes.size();
      chunk.add_entries(std::move(e.bytes));
      if (chunk_bytes >= options_.piece_bytes) flush();
      continue;
    }
    flush();
    std::set<std::string> listed;
    for (const PinnedEntry& p : e.pinned) {
      listed.insert(p.key);
      if (pinned_after->count(p.key)) continue;
      EtcdJournalRecord rec;
      rec.add_entries(p.value->SerializeAsString());
      AddRecord(PinnedKey(p.key), rec.SerializeAsString(), &ops);
      ++*pinned_written;
    }
    EtcdJournalRecord snap;
    snap.set_seq(e.seq);
    snap.add_entries(e.snapshot->SerializeAsString());
    for (const std::string& k : listed) snap.add_pinned(k);
    AddRecord(SnapshotKey(e.seq), snap.SerializeAsString(), &ops);
    const std::string& p = options_.prefix;
    ops.push_back(Op{p + "u/", "", UpdateKey(e.seq + 1), true});
    ops.push_back(Op{p + "s/", "", SnapshotKey(e.seq), true});
    for (const std::string& k : *pinned_after) {
      if (!listed.count(k)) ops.push_back(Op{PinnedKey(k), "", RecordEnd(PinnedKey(k)), true});
    }
    *pinned_after = std::move(listed);
    *snapshot_seq = e.seq;
  }
  flush();
  return ops;
}

absl::Status EtcdLog::WriteTxn(const std::vector<const Op*>& ops) {
  etcdserverpb::TxnRequest txn;
  const EtcdFence fence = options_.fence ? options_.fence() : EtcdFence{};
  if (!fence.key.empty()) {
    etcdserverpb::Compare* c = txn.add_compare();
    c->set_key(fence.key);
    c->set_target(etcdserverpb::Compare::CREATE);
    c->set_result(etcdserverpb::Compare::EQUAL);
    c->set_create_revision(fence.rev);
  }
  for (const Op* op : ops) {
    etcdserverpb::RequestOp* r = txn.add_success();
    if (op->del) {
      r->mutable_request_delete_range()->set_key(op->key);
      r->mutable_request_delete_range()->set_range_end(op->range_end);
    } else {
      r->mutable_request_put()->set_key(op->key);
      r->mutable_request_put()->set_value(op->value);
    }
  }
  const int64_t deadline = NowMs() + options_.write_retry_ms;
  int64_t backoff_ms = 50;
  for (;;) {
    absl::StatusOr<etcdserverpb::TxnResponse> resp = options_.client->Txn(txn, /*retry=*/true);
    if (resp.ok()) {
      if (resp->succeeded()) return absl::OkStatus();
      return absl::FailedPreconditionError(absl::StrCat(
          "etcd journal at '", options_.prefix, "': write refused: this pacerd no longer leads (its election key '",
          fence.key, "' at revision ", fence.rev, " is gone)"));
    }
    const absl::Status& s = resp.status();
    if (IsEtcdNoSpace(s)) {
      // UNAVAILABLE, as a full disk is for the RocksDB journal: clients retry until it resumes.
      return absl::UnavailableError(absl::StrCat(
          "etcd journal at '", options_.prefix, "': etcd's backend quota is exhausted (NOSPACE alarm): ",
          s.message(), ". Compact and defragment etcd, then disarm the alarm (etcdctl alarm disarm); "
          "pacerd resumes by itself"));
    }
    const bool transient = s.code() == absl::StatusCode::kUnavailable ||
                           s.code() == absl::StatusCode::kDeadlineExceeded ||
                           s.code() == absl::StatusCode::kUnknown;
    if (!transient || NowMs() + backoff_ms >= deadline) {
      return absl::UnavailableError(
          absl::StrCat("etcd journal at '", options_.prefix, "': write failed: ", s.message()));
    }
    PACER_LOG(WARNING) << "etcd journal: " << s.message() << "; sending the transaction again";
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min<int64_t>(backoff_ms * 2, 1000);
  }
}

absl::Status EtcdLog::WriteOps(const std::vector<Op>& ops, size_t* txns) {
  std::vector<const Op*> batch;
  size_t bytes = 0;
  for (const Op& op : ops) {
    const size_t size = op.key.size() + op.value.size() + op.range_end.size() + 16;
    if (!batch.empty() && (batch.size() + 1 > options_.max_txn_ops || bytes + size > options_.max_txn_bytes)) {
      RETURN_IF_ERROR(WriteTxn(batch));
      ++*txns;
      batch.clear();
      bytes = 0;
    }
    batch.push_back(&op);
    bytes += size;
  }
  if (!batch.empty()) {
    RETURN_IF_ERROR(WriteTxn(batch));
    ++*txns;
  }
  return absl::OkStatus();
}

void EtcdLog::TakeWaiters(uint64_t up_to, std::vector<Done>* ready) {
  auto end = waiters_.upper_bound(up_to);
  for (auto it = waiters_.begin(); it != end; ++it) ready->push_back(std::move(it->second));
  waiters_.erase(waiters_.begin(), end);
}

void EtcdLog::WriterLoop() {
  absl::MutexLock l(&mu_);
  for (;;) {
    CvWait(cv_, mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || (!queue_.empty() && health_.ok()); });
    if (queue_.empty() || !health_.ok()) {
      if (stopping_) return;
      continue;
    }
    std::vector<Entry> group;
    group.swap(queue_);
    std::set<std::string> pinned_after = pinned_;
    writing_ = true;
    mu_.Unlock();

    uint64_t snapshot_seq = 0;
    uint64_t pinned_written = 0;
    uint64_t group_last = 0;
    for (const Entry& e : group) group_last = std::max(group_last, e.seq);
    const int64_t start_ns = RealClock::Get()->MonotonicNs();
    std::vector<Op> ops = BuildOps(group, &pinned_after, &snapshot_seq, &pinned_written);
    uint64_t bytes = 0;
    for (const Op& op : ops) bytes += op.key.size() + op.value.size();
    size_t txns = 0;
    absl::Status st = WriteOps(ops, &txns);
    const double write_s = static_cast<double>(RealClock::Get()->MonotonicNs() - start_ns) / 1e9;

    std::vector<Done> ready;
    std::function<void(const std::string&)> fenced;
    mu_.Lock();
    writing_ = false;
    stats_.batches += txns;
    if (st.ok()) {
      stats_.bytes += bytes;
      const std::vector<double>& bounds = LatencySecondsBuckets();
      stats_.write_latency_counts.resize(bounds.size() + 1);
      stats_.write_latency_counts[std::lower_bound(bounds.begin(), bounds.end(), write_s) - bounds.begin()]++;
      stats_.write_latency_sum_s += write_s;
      if (snapshot_seq != 0) {
        last_snapshot_seq_ = snapshot_seq;
        stats_.snapshots++;
        pinned_ = std::move(pinned_after);
      }
      stats_.pinned_written += pinned_written;
      durable_seq_ = std::max(durable_seq_, group_last);
      stats_.durable_seq = durable_seq_;
      TakeWaiters(durable_seq_, &ready);
    } else {
      health_ = st;
      stats_.failed_writes++;
      PACER_LOG(ERROR) << st.message();
      TakeWaiters(~uint64_t{0}, &ready);
      if (st.code() == absl::StatusCode::kFailedPrecondition && !fenced_) {
        fenced_ = true;
        fenced = options_.on_fenced;
      }
    }
    const absl::Status result = health_;
    mu_.Unlock();
    if (fenced) fenced(std::string(st.message()));  // leadership ends before anyone hears of the failure
    durable_cv_.SignalAll();
    for (Done& d : ready) d(result);
    mu_.Lock();
  }
}

absl::Status EtcdLog::ReadFrom(uint64_t seq, const EntryFn& on_update) const {
  uint64_t snapshot_seq, durable;
  {
    absl::MutexLock l(&mu_);
    snapshot_seq = last_snapshot_seq_;
    durable = durable_seq_;
  }
  if (seq <= snapshot_seq) {
    return absl::FailedPreconditionError(
        absl::StrCat("update ", seq, " is at or before the newest snapshot (", snapshot_seq, ")"));
  }
  // Only what was acknowledged: a group being written may be partly in etcd.
  absl::StatusOr<uint64_t> last = ReadUpdates(seq, 0, [&](uint64_t s, const std::string& bytes) -> absl::Status {
    if (s > durable) return absl::OkStatus();
    return on_update(s, bytes);
  });
  return last.status();
}

void EtcdLog::WhenDurable(uint64_t seq, Done done) {
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

absl::Status EtcdLog::Flush() {
  absl::MutexLock l(&mu_);
  const uint64_t target = last_seq_;
  CvWait(durable_cv_, mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return durable_seq_ >= target || !health_.ok(); });
  return health_;
}

absl::Status EtcdLog::health() const {
  absl::MutexLock l(&mu_);
  return health_;
}

absl::Status EtcdLog::Recover(const Replay& replay) {
  uint64_t acknowledged;
  {
    absl::MutexLock l(&mu_);
    if (health_.ok()) return absl::OkStatus();
    if (fenced_) return health_;  // a deposed leader recovers nothing: it steps down
    CvWait(durable_cv_, mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !writing_; });
    queue_.clear();
    acknowledged = durable_seq_;
  }
  ASSIGN_OR_RETURN(Opened opened, OpenAndReplay(replay, /*may_write=*/true));
  if (opened.last_seq < acknowledged) {
    return absl::DataLossError(absl::StrCat("etcd journal at '", options_.prefix, "' holds updates up to ",
                                            opened.last_seq, ", but ", acknowledged, " were acknowledged"));
  }
  absl::MutexLock l(&mu_);
  last_seq_ = durable_seq_ = opened.last_seq;
  stats_.durable_seq = durable_seq_;
  last_snapshot_seq_ = opened.snapshot_seq;
  pinned_ = std::move(opened.pinned);
  recovery_ = opened.recovery;
  health_ = absl::OkStatus();
  stats_.recoveries++;
  cv_.SignalAll();
  return absl::OkStatus();
}

uint64_t EtcdLog::last_seq() const {
  absl::MutexLock l(&mu_);
  return last_seq_;
}

JournalStats EtcdLog::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

JournalRecovery EtcdLog::recovery() const {
  absl::MutexLock l(&mu_);
  return recovery_;
}

absl::StatusOr<std::unique_ptr<DurableLog>> OpenEtcdLog(EtcdLogOptions options, const DurableLog::Replay& replay) {
  auto log = EtcdLog::Open(std::move(options), replay);
  if (!log.ok()) return log.status();
  return std::unique_ptr<DurableLog>(std::move(*log));
}

}  // namespace pacer
