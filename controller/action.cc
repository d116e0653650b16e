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

bool ParseActionKind(const std::string& name, ActionKind* kind) {
  for (ActionKind k : {ActionKind::kAdjustBatch, ActionKind::kReallocate, ActionKind::kRestart,
                       ActionKind::kMigrate, ActionKind::kRestartServer, ActionKind::kRelieveServer,
                       ActionKind::kExcludeWorkers}) {
    if (name == ActionKindName(k)) {
      *kind = k;
      return true;
    }
  }
  return false;
}

}  // namespace pacer
