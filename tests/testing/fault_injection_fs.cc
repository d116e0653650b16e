#include "tests/testing/fault_injection_fs.h"

#include <unistd.h>

#include <algorithm>

namespace pacer::testing {
namespace {

using rocksdb::DataVerificationInfo;
using rocksdb::IODebugContext;
using rocksdb::IOOptions;
using rocksdb::IOStatus;
using rocksdb::Slice;

// A writable file that reports its size and syncs to the file system, and refuses under a fault.
class TrackedFile : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  TrackedFile(std::unique_ptr<rocksdb::FSWritableFile> f, FaultInjectionFs* fs, std::string path,
              uint64_t size)
      : FSWritableFileOwnerWrapper(std::move(f)), fs_(fs), path_(std::move(path)), size_(size) {}

  IOStatus Append(const Slice& data, const IOOptions& o, IODebugContext* dbg) override {
    if (auto st = fs_->Check("append"); !st.ok()) return st;
    IOStatus st = target()->Append(data, o, dbg);
    if (st.ok()) Grew(size_ + data.size());
    return st;
  }
  IOStatus Append(const Slice& data, const IOOptions& o, const DataVerificationInfo& v,
                  IODebugContext* dbg) override {
    if (auto st = fs_->Check("append"); !st.ok()) return st;
    IOStatus st = target()->Append(data, o, v, dbg);
    if (st.ok()) Grew(size_ + data.size());
    return st;
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& o,
                            IODebugContext* dbg) override {
    if (auto st = fs_->Check("append"); !st.ok()) return st;
    IOStatus st = target()->PositionedAppend(data, offset, o, dbg);
    if (st.ok()) Grew(std::max(size_, offset + data.size()));
    return st;
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& o,
                            const DataVerificationInfo& v, IODebugContext* dbg) override {
    if (auto st = fs_->Check("append"); !st.ok()) return st;
    IOStatus st = target()->PositionedAppend(data, offset, o, v, dbg);
    if (st.ok()) Grew(std::max(size_, offset + data.size()));
    return st;
  }
  IOStatus Truncate(uint64_t size, const IOOptions& o, IODebugContext* dbg) override {
    if (auto st = fs_->Check("truncate"); !st.ok()) return st;
    IOStatus st = target()->Truncate(size, o, dbg);
    if (st.ok()) Grew(size);
    return st;
  }
  IOStatus Flush(const IOOptions& o, IODebugContext* dbg) override {
    if (auto st = fs_->Check("flush"); !st.ok()) return st;
    return target()->Flush(o, dbg);
  }
  IOStatus Sync(const IOOptions& o, IODebugContext* dbg) override {
    if (auto st = fs_->Check("sync", true); !st.ok()) return st;
    IOStatus st = target()->Sync(o, dbg);
    if (st.ok()) fs_->OnSync(path_);
    return st;
  }
  IOStatus Fsync(const IOOptions& o, IODebugContext* dbg) override {
    if (auto st = fs_->Check("fsync", true); !st.ok()) return st;
    IOStatus st = target()->Fsync(o, dbg);
    if (st.ok()) fs_->OnSync(path_);
    return st;
  }
  IOStatus RangeSync(uint64_t offset, uint64_t n, const IOOptions& o,
                     IODebugContext* dbg) override {
    // A write-back hint, not a durability point: what it covers still counts as unsynced.
    if (auto st = fs_->Check("range sync"); !st.ok()) return st;
    return target()->RangeSync(offset, n, o, dbg);
  }
  IOStatus Allocate(uint64_t offset, uint64_t len, const IOOptions& o,
                    IODebugContext* dbg) override {
    if (auto st = fs_->Check("allocate"); !st.ok()) return st;
    return target()->Allocate(offset, len, o, dbg);
  }
  IOStatus Close(const IOOptions& o, IODebugContext* dbg) override {
    // Always release the descriptor; a fault still makes the close fail (as a full disk does
    // when buffered data cannot be written).
    IOStatus st = target()->Close(o, dbg);
    if (auto f = fs_->Check("close"); !f.ok()) return f;
    return st;
  }

 private:
  void Grew(uint64_t end) {
    size_ = end;
    fs_->OnAppend(path_, end);
  }
  FaultInjectionFs* fs_;
  std::string path_;
  uint64_t size_;
};

}  // namespace

FaultInjectionFs::FaultInjectionFs(std::shared_ptr<rocksdb::FileSystem> base)
    : FileSystemWrapper(std::move(base)) {}

IOStatus FaultInjectionFs::Check(const char* what, bool sync) {
  switch (fault_.load()) {
    case Fault::kNone:
      return IOStatus::OK();
    case Fault::kSyncFails:
      if (!sync) return IOStatus::OK();
      refused_++;
      return IOStatus::IOError(std::string("injected ") + what + ": Input/output error");
    case Fault::kNoSpace: {
      refused_++;
      IOStatus st = IOStatus::NoSpace(std::string("injected ") + what + ": No space left on device");
      st.SetRetryable(false);
      return st;
    }
    case Fault::kIoError:
      refused_++;
      return IOStatus::IOError(std::string("injected ") + what + ": Input/output error");
  }
  return IOStatus::OK();
}

void FaultInjectionFs::OnAppend(const std::string& path, uint64_t end) {
  std::lock_guard<std::mutex> l(mu_);
  files_[path].size = end;
}

void FaultInjectionFs::OnSync(const std::string& path) {
  std::lock_guard<std::mutex> l(mu_);
  FileState& s = files_[path];
  s.synced = s.size;
  s.ever_synced = true;
}

IOStatus FaultInjectionFs::Wrap(const std::string& path, bool truncated, IOStatus st,
                                std::unique_ptr<rocksdb::FSWritableFile>* r) {
  if (!st.ok()) return st;
  uint64_t size = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = files_.find(path);
    if (truncated || it == files_.end()) {
      if (!truncated) {
        // Reopened for appending, not written by us before: what it holds is durable.
        uint64_t on_disk = 0;
        if (target()->GetFileSize(path, IOOptions(), &on_disk, nullptr).ok()) size = on_disk;
        files_[path] = FileState{size, size, true};
      } else {
        files_[path] = FileState{};
      }
    } else {
      size = it->second.size;
    }
  }
  *r = std::make_unique<TrackedFile>(std::move(*r), this, path, size);
  return st;
}

IOStatus FaultInjectionFs::NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                           std::unique_ptr<rocksdb::FSWritableFile>* r,
                                           IODebugContext* dbg) {
  if (auto st = Check("create"); !st.ok()) return st;
  return Wrap(f, true, target()->NewWritableFile(f, o, r, dbg), r);
}

IOStatus FaultInjectionFs::ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                              std::unique_ptr<rocksdb::FSWritableFile>* r,
                                              IODebugContext* dbg) {
  if (auto st = Check("reopen"); !st.ok()) return st;
  return Wrap(f, false, target()->ReopenWritableFile(f, o, r, dbg), r);
}

IOStatus FaultInjectionFs::ReuseWritableFile(const std::string& f, const std::string& old,
                                             const rocksdb::FileOptions& o,
                                             std::unique_ptr<rocksdb::FSWritableFile>* r,
                                             IODebugContext* dbg) {
  if (auto st = Check("reuse"); !st.ok()) return st;
  {
    std::lock_guard<std::mutex> l(mu_);
    files_.erase(old);
  }
  return Wrap(f, true, target()->ReuseWritableFile(f, old, o, r, dbg), r);
}

IOStatus FaultInjectionFs::RenameFile(const std::string& src, const std::string& dst,
                                      const IOOptions& o, IODebugContext* dbg) {
  if (auto st = Check("rename"); !st.ok()) return st;
  IOStatus st = target()->RenameFile(src, dst, o, dbg);
  if (st.ok()) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = files_.find(src);
    if (it != files_.end()) {
      files_[dst] = it->second;
      files_.erase(src);
    } else {
      files_.erase(dst);  // a durable file replaced by another durable one
    }
  }
  return st;
}

IOStatus FaultInjectionFs::DeleteFile(const std::string& f, const IOOptions& o,
                                      IODebugContext* dbg) {
  if (auto st = Check("delete"); !st.ok()) return st;
  IOStatus st = target()->DeleteFile(f, o, dbg);
  if (st.ok()) {
    std::lock_guard<std::mutex> l(mu_);
    files_.erase(f);
  }
  return st;
}

IOStatus FaultInjectionFs::CreateDir(const std::string& d, const IOOptions& o,
                                     IODebugContext* dbg) {
  if (auto st = Check("mkdir"); !st.ok()) return st;
  return target()->CreateDir(d, o, dbg);
}

FaultInjectionFs::KeepFn FaultInjectionFs::KeepRandomPrefix(std::mt19937_64* rng) {
  return [rng](const std::string&, uint64_t tail) { return (*rng)() % (tail + 1); };
}

uint64_t FaultInjectionFs::DropUnsyncedData(const KeepFn& keep) {
  std::map<std::string, FileState> files;
  {
    std::lock_guard<std::mutex> l(mu_);
    files.swap(files_);
  }
  uint64_t dropped = 0;
  for (const auto& [path, s] : files) {
    if (!s.ever_synced) {
      dropped += s.size;
      (void)target()->DeleteFile(path, IOOptions(), nullptr);
    } else if (s.size > s.synced) {
      const uint64_t tail = s.size - s.synced;
      const uint64_t kept = keep ? std::min(tail, keep(path, tail)) : 0;
      if (kept > 0 && kept < tail) torn_files_++;
      dropped += tail - kept;
      (void)::truncate(path.c_str(), static_cast<off_t>(s.synced + kept));
    }
  }
  return dropped;
}

}  // namespace pacer::testing
