// FaultInjectionFs: a RocksDB FileSystem for power-loss and disk-full tests.
//
// Written here because RocksDB's own FaultInjectionTestFS (utilities/fault_injection_fs.h,
// the one its crash tests use) is not installed with Debian's librocksdb-dev: only the public
// headers in /usr/include/rocksdb are. This one keeps the two abilities our tests need:
//  * DropUnsyncedData(): what a power loss does — every file written through this file system
//    is cut back to its size at its last Sync/Fsync, and a file never synced disappears.
//  * SetFault(kNoSpace | kIoError): from then on every write, sync, file creation, rename and
//    delete fails (NoSpace: "No space left on device", the way a full disk answers; IoError:
//    EIO). Reads still work. Used both as a full disk and, with DropUnsyncedData(), as a
//    machine that stops mid-write: nothing written after the fault reaches the disk.
//  * DropUnsyncedData(keep): a power loss in the middle of a write — of each file's unsynced
//    tail a prefix reached the disk (none, part of it: a torn last record, or all of it).
//  * Writes in place (NewRandomRWFile: the journal's high-water mark) are tracked too: each
//    unsynced one keeps what it overwrote, and DropUnsyncedData() puts that back (with `keep`:
//    keeps a prefix of the new bytes, the rest old — a torn write in place).
// Not modelled: directory entries (a rename or a new file survives a power loss here even
// without a directory fsync), garbage (rather than missing) bytes after a torn write, read
// errors.
//
// Thread-safe (RocksDB's background threads write concurrently).
#pragma once

#include <rocksdb/file_system.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

namespace pacer::testing {

class FaultInjectionFs : public rocksdb::FileSystemWrapper {
 public:
  // kSyncFails: writes still land (in the page cache, as it were) but every Sync/Fsync fails:
  // with DropUnsyncedData() afterwards, the power went after those writes were made.
  enum class Fault { kNone, kNoSpace, kIoError, kSyncFails };

  explicit FaultInjectionFs(
      std::shared_ptr<rocksdb::FileSystem> base = rocksdb::FileSystem::Default());
  static const char* kClassName() { return "PacerFaultInjectionFs"; }
  const char* Name() const override { return kClassName(); }

  void SetFault(Fault fault) { fault_.store(fault); }
  Fault fault() const { return fault_.load(); }
  // Cuts every tracked file back to its last synced size (deleting the never-synced ones) and
  // forgets them. Call once nothing is open for writing (the database is closed or destroyed).
  // Returns how many bytes were dropped. With `keep`, each file instead keeps the first
  // keep(path, tail) bytes (capped at `tail`) of its unsynced tail of `tail` bytes (a file never
  // synced still disappears).
  using KeepFn = std::function<uint64_t(const std::string& path, uint64_t tail)>;
  uint64_t DropUnsyncedData(const KeepFn& keep = nullptr);
  // A KeepFn that keeps a random prefix (0..all) of every unsynced tail.
  static KeepFn KeepRandomPrefix(std::mt19937_64* rng);
  // How many files DropUnsyncedData(keep) left with part (not none, not all) of their unsynced
  // tail: each a torn write, e.g. the last record of a WAL cut short.
  uint64_t torn_files() const { return torn_files_.load(); }
  // How many writes / syncs / other mutations were refused by a fault so far.
  uint64_t refused() const { return refused_.load(); }

  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                       std::unique_ptr<rocksdb::FSWritableFile>* r,
                                       rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReuseWritableFile(const std::string& f, const std::string& old,
                                      const rocksdb::FileOptions& o,
                                      std::unique_ptr<rocksdb::FSWritableFile>* r,
                                      rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus NewRandomRWFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSRandomRWFile>* r,
                                    rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus RenameFile(const std::string& src, const std::string& dst,
                               const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus DeleteFile(const std::string& f, const rocksdb::IOOptions& o,
                               rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus CreateDir(const std::string& d, const rocksdb::IOOptions& o,
                              rocksdb::IODebugContext* dbg) override;

  // What a tracked file holds: bytes written, and bytes known durable.
  struct FileState {
    uint64_t size = 0;
    uint64_t synced = 0;
    bool ever_synced = false;
  };

  // The error a refused call returns, or OK when no fault is set; `sync`: a Sync/Fsync.
  rocksdb::IOStatus Check(const char* what, bool sync = false);
  void OnAppend(const std::string& path, uint64_t end);  // the file now holds `end` bytes
  void OnSync(const std::string& path);
  // A write in place, not synced yet: the bytes it replaced and the bytes it wrote.
  struct WriteInPlace {
    std::string path;
    uint64_t offset = 0;
    std::string before, after;
  };
  void OnWriteInPlace(WriteInPlace w);
  void OnSyncInPlace(const std::string& path);

 private:
  rocksdb::IOStatus Wrap(const std::string& path, bool truncated, rocksdb::IOStatus st,
                         std::unique_ptr<rocksdb::FSWritableFile>* r);

  std::atomic<Fault> fault_{Fault::kNone};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> torn_files_{0};
  std::mutex mu_;
  std::map<std::string, FileState> files_;  // guarded by mu_
  std::vector<WriteInPlace> in_place_;       // guarded by mu_; unsynced, oldest first
};

}  // namespace pacer::testing
