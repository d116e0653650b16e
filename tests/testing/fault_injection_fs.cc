#include "tests/testing/fault_injection_fs.h"

#include <fcntl.h>
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

// A file written in place (the high-water mark): each write remembers what it overwrote until
// the next sync, and refuses under a fault.
class TrackedRWFile : public rocksdb::FSRandomRWFileOwnerWrapper {
 public:
  TrackedRWFile(std::unique_ptr<rocksdb::FSRandomRWFile> f, FaultInjectionFs* fs, std::string path)
      : FSRandomRWFileOwnerWrapper(std::move(f)), fs_(fs), path_(std::move(path)) {}

  IOStatus Write(uint64_t offset, const Slice& data, const IOOptions& o,
                 IODebugContext* dbg) override {
    if (auto st = fs_->Check("write"); !st.ok()) return st;
    std::string before(data.size(), '\0');
    Slice got;
    IOStatus st = target()->Read(offset, data.size(), o, &got, before.data(), dbg);
    if (!st.ok()) return st;
    before.assign(got.data(), got.size());
    before.resize(data.size(), '\0');  // past the end: the file grows; zeros stand for "none"
    st = target()->Write(offset, data, o, dbg);
    if (st.ok()) fs_->OnWriteInPlace({path_, offset, std::move(before), data.ToString()});
    return st;
  }
  IOStatus Sync(const IOOptions& o, IODebugContext* dbg) override {
    if (auto st = fs_->Check("sync", true); !st.ok()) return st;
    IOStatus st = target()->Sync(o, dbg);
    if (st.ok()) fs_->OnSyncInPlace(path_);
    return st;
  }
  IOStatus Fsync(const IOOptions& o, IODebugContext* dbg) override {
    if (auto st = fs_->Check("fsync", true); !st.ok()) return st;
    IOStatus st = target()->Fsync(o, dbg);
    if (st.ok()) fs_->OnSyncInPlace(path_);
    return st;
  }

 private:
  FaultInjectionFs* fs_;
  std::string path_;
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

void FaultInjectionFs::OnWriteInPlace(WriteInPlace w) {
  std::lock_guard<std::mutex> l(mu_);
  in_place_.push_back(std::move(w));
}

void FaultInjectionFs::OnSyncInPlace(const std::string& path) {
  std::lock_guard<std::mutex> l(mu_);
  in_place_.erase(std::remove_if(in_place_.begin(), in_place_.end(),
                                 [&](const WriteInPlace& w) { return w.path == path; }),
                  in_place_.end());
}

IOStatus FaultInjectionFs::NewRandomRWFile(const std::string& f, const rocksdb::FileOptions& o,
                                           std::unique_ptr<rocksdb::FSRandomRWFile>* r,
                                           IODebugContext* dbg) {
  if (auto st = Check("open for writing"); !st.ok()) return st;
  IOStatus st = target()->NewRandomRWFile(f, o, r, dbg);
  if (st.ok()) *r = std::make_unique<TrackedRWFile>(std::move(*r), this, f);
  return st;
}

IOStatus FaultInjectionFs::RenameFile(const std::string& src, const std::string& dst,
                                      const IOOptions& o, IODebugContext* dbg) {
  if (auto st = Check("rename"); !st.ok()) return st;
  IOStatus st = target()->RenameFile(src, dst, o, dbg);
  if (st.ok()) {
    std::lock_guard<std::mutex> l(mu_);
    // Writes in place into the file `dst` was are moot: that file is gone.
    in_place_.erase(std::remove_if(in_place_.begin(), in_place_.end(),
                                   [&](const WriteInPlace& w) { return w.path == dst || w.path == src; }),
                    in_place_.end());
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
    in_place_.erase(std::remove_if(in_place_.begin(), in_place_.end(),
                                   [&](const WriteInPlace& w) { return w.path == f; }),
                    in_place_.end());
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
  std::vector<WriteInPlace> in_place;
  {
    std::lock_guard<std::mutex> l(mu_);
    files.swap(files_);
    in_place.swap(in_place_);
  }
  uint64_t dropped = 0;
  // Writes in place, newest first: each is undone, but for the prefix `keep` says reached the
  // disk.
  for (auto w = in_place.rbegin(); w != in_place.rend(); ++w) {
    const uint64_t n = w->after.size();
    const uint64_t kept = keep ? std::min(n, keep(w->path, n)) : 0;
    if (kept > 0 && kept < n) torn_files_++;
    dropped += n - kept;
    if (kept == n) continue;
    const std::string bytes = w->after.substr(0, kept) + w->before.substr(kept);
    const int fd = ::open(w->path.c_str(), O_WRONLY);
    if (fd < 0) continue;
    (void)!::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(w->offset));
    ::close(fd);
  }
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
