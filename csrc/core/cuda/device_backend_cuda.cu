// CUDA runtime services for the context store (see device_backend.h).
#include <cuda_runtime.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "../device_backend.h"
#include "batched_copy.cuh"

namespace es {
namespace device {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// Restores the caller's current device on scope exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (device >= 0 && device != previous_) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

std::mutex streams_mutex;
std::unordered_map<int, cudaStream_t> streams;

}  // namespace

bool built() { return true; }

bool available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

void* alloc(Location where, int64_t bytes, int device) {
  DeviceGuard guard(device);
  void* ptr = nullptr;
  if (where == Location::Pinned)
    check(cudaHostAlloc(&ptr, bytes, cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc");
  else
    check(cudaMalloc(&ptr, bytes), "cudaMalloc");
  return ptr;
}

void release(Location where, void* ptr, int device) {
  DeviceGuard guard(device);
  if (where == Location::Pinned) cudaFreeHost(ptr);
  else cudaFree(ptr);
}

void copy_async(const std::vector<CopyJob>& jobs, bool device_to_device, int device, void* stream) {
  DeviceGuard guard(device);
  auto s = static_cast<cudaStream_t>(stream);
  BatchedCopies<kBlockBytes> batched(s);  // the rest: launches of the batched copy kernel
  for (const CopyJob& job : jobs) {
    if (!device_to_device && job.bytes >= kEngineCopyBytes)
      check(cudaMemcpyAsync(job.dst, job.src, job.bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
    else
      check(batched.add(job), "batched copy launch");
  }
  check(batched.flush(), "batched copy launch");
}

void copy_sync(void* dst, const void* src, int64_t bytes, int device) {
  DeviceGuard guard(device);
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
}

void* side_stream(int device) {
  std::lock_guard<std::mutex> lock(streams_mutex);
  auto it = streams.find(device);
  if (it != streams.end()) return it->second;
  DeviceGuard guard(device);
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  streams[device] = s;
  return s;
}

void* new_event(int device) {
  DeviceGuard guard(device);
  cudaEvent_t e;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  return e;
}

void destroy_event(void* event) { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }
void record(void* event, void* stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)), "cudaEventRecord");
}
void stream_wait(void* stream, void* event) {
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
        "cudaStreamWaitEvent");
}
void event_sync(void* event) { check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize"); }

}  // namespace device
}  // namespace es
