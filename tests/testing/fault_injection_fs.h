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
// Not modelled: directory entries (a rename or a new file survives a power loss here even
// without a directory fsync), partial (torn) sectors, read errors.
//
// Thread-safe (RocksDB's background threads write concurrently).
#pragma once

#include <rocksdb/file_system.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>

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
  // Returns how many bytes were dropped.
  uint64_t DropUnsyncedData();
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

 private:
  rocksdb::IOStatus Wrap(const std::string& path, bool truncated, rocksdb::IOStatus st,
                         std::unique_ptr<rocksdb::FSWritableFile>* r);

  std::atomic<Fault> fault_{Fault::kNone};
  std::atomic<uint64_t> refused_{0};
  std::mutex mu_;
  std::map<std::string, FileState> files_;  // guarded by mu_
};

}  // namespace pacer::testing
