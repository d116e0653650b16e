// LeaseFacts: what the sharding state says of the leases workers hold, for the controller's view
// (controller/view_builder.h). A plain value shared by the sharding service, which computes it,
// and the controller, which reads it (controller/sources.h), so neither includes the other.
#pragma once

#include <map>
#include <string>

namespace pacer {

struct LeaseFacts {
  std::map<std::string, double> oldest_lease_age_s;  // by worker, over the leases it holds
  double typical_shard_time_s = 0;  // median of the last completed leases; 0 = none yet
};

}  // namespace pacer
