#include "agent/nvml_probe.h"

#include <dlfcn.h>

namespace pacer {

NvmlProbe::NvmlProbe() {
  lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib_ == nullptr) {
    why_ = "libnvidia-ml.so.1 not loadable";
    return;
  }
  auto init = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlInit_v2"));
  auto count = reinterpret_cast<int (*)(unsigned*)>(dlsym(lib_, "nvmlDeviceGetCount_v2"));
  shutdown_ = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlShutdown"));
  get_handle_ = reinterpret_cast<int (*)(unsigned, void**)>(
      dlsym(lib_, "nvmlDeviceGetHandleByIndex_v2"));
  get_utilization_ = reinterpret_cast<int (*)(void*, unsigned*)>(
      dlsym(lib_, "nvmlDeviceGetUtilizationRates"));
  if (!init || !count || !shutdown_ || !get_handle_ || !get_utilization_) {
    why_ = "NVML symbols missing";
    dlclose(lib_);
    lib_ = nullptr;
    return;
  }
  if (int rc = init(); rc != 0) {
    why_ = "nvmlInit failed (" + std::to_string(rc) + ")";
    dlclose(lib_);
    lib_ = nullptr;
    return;
  }
  unsigned n = 0;
  if (count(&n) != 0 || n == 0) {
    why_ = "no GPU";
    return;
  }
  device_count_ = n;
}

NvmlProbe::~NvmlProbe() {
  if (lib_ != nullptr) {
    shutdown_();
    dlclose(lib_);
  }
}

std::vector<double> NvmlProbe::Sample() {
  std::vector<double> out;
  for (unsigned i = 0; i < device_count_; ++i) {
    void* dev = nullptr;
    unsigned util[2] = {0, 0};  // nvmlUtilization_t: gpu %, memory %
    if (get_handle_(i, &dev) != 0 || get_utilization_(dev, util) != 0) {
      out.push_back(0.0);
      continue;
    }
    out.push_back(util[0] / 100.0);
  }
  return out;
}

}  // namespace pacer
