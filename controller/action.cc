#include "controller/action.h"

namespace pacer {

const char* ActionKindName(ActionKind kind) {
  switch (kind) {
    case ActionKind::kAdjustBatch: return "ADJUST_BS";
    case ActionKind::kReallocate: return "REALLOCATE";
    case ActionKind::kRestart: return "RESTART";
    case ActionKind::kMigrate: return "MIGRATE";
    case ActionKind::kRestartServer: return "RESTART_SERVER";
    case ActionKind::kRelieveServer: return "RELIEVE_SERVER";
    case ActionKind::kExcludeWorkers: return "EXCLUDE_WORKERS";
  }
  return "?";
}

}  // namespace pacer
