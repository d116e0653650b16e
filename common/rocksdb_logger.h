// RocksDbLogger: RocksDB's info log into Pacer's log (stderr) instead of a LOG file in the
// database folder.
//
// Why: a LOG file lives on the data disk. When that disk is full, a failed LOG write leaves
// RocksDB's file writer in an error state, and the next message — from RocksDB's own
// disk-full recovery thread (SstFileManagerImpl::ClearError) — hits an assertion in Debian's
// librocksdb (WritableFileWriter::AssertFalseAndGetStatusForPrevError: `sync_without_flush_
// called_`) and aborts pacerd. Logging elsewhere removes that file writer altogether.
// Header-only: included by the RocksDB stores (the journal, the controller store), which link
// RocksDB; common/ itself does not.
#pragma once

#include <rocksdb/env.h>

#include <cstdarg>
#include <cstdio>
#include <memory>

#include "common/log.h"

namespace pacer {

class RocksDbLogger : public rocksdb::Logger {
 public:
  explicit RocksDbLogger(const char* store) : rocksdb::Logger(rocksdb::WARN_LEVEL), store_(store) {}

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override { Logv(rocksdb::INFO_LEVEL, format, ap); }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < GetInfoLogLevel()) return;
    char buf[1024];
    std::vsnprintf(buf, sizeof buf, format, ap);
    if (level >= rocksdb::ERROR_LEVEL) {
      PACER_LOG(ERROR) << "rocksdb (" << store_ << "): " << buf;
    } else {
      PACER_LOG(WARNING) << "rocksdb (" << store_ << "): " << buf;
    }
  }

 private:
  const char* store_;
};

}  // namespace pacer
