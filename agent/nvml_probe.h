// NvmlProbe: GPU utilisation through NVML, loaded at run time with dlopen so the agent has no
// link-time dependency on the NVIDIA driver. When libnvidia-ml.so.1 is missing, nvmlInit fails
// or there is no GPU, available() is false and Sample() returns an empty vector: the node simply
// reports no GPUs. Not thread-safe (the agent's event loop owns it).
#pragma once

#include <string>
#include <vector>

namespace pacer {

class NvmlProbe {
 public:
  NvmlProbe();  // tries to load and initialise NVML; never fails
  ~NvmlProbe();
  NvmlProbe(const NvmlProbe&) = delete;
  NvmlProbe& operator=(const NvmlProbe&) = delete;

  bool available() const { return device_count_ > 0; }
  // Why NVML is not available ("libnvidia-ml.so.1 not found", ...); empty when it is.
  const std::string& why_unavailable() const { return why_; }
  // GPU utilisation per device, 0..1, over the driver's last sample period.
  std::vector<double> Sample();

 private:
  void* lib_ = nullptr;
  unsigned device_count_ = 0;
  std::string why_;
  // Resolved entry points (NVML's C ABI: handles are opaque pointers, results ints).
  int (*shutdown_)() = nullptr;
  int (*get_handle_)(unsigned, void**) = nullptr;
  int (*get_utilization_)(void*, unsigned*) = nullptr;  // nvmlUtilization_t {gpu, memory}
};

}  // namespace pacer
