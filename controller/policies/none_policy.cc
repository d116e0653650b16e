// Baseline "none": no mitigation. The reference every other policy is compared with.
#include "controller/policies/policy.h"

namespace pacer {

std::vector<Action> DecideNone(const ClusterView&, const History&, const PolicyConfig&) {
  return {};
}

}  // namespace pacer
