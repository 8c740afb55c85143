// CUDA runtime services for the context store (see device_backend.h).
#include <cuda_runtime.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "../device_backend.h"

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

// Copies at or above this size go to the copy engines (cudaMemcpyAsync);
// smaller ones share one kernel launch.
constexpr int64_t kEngineCopyBytes = 1 << 20;
constexpr int kBatch = 96;  // keeps the kernel argument under 4 KiB

struct CopyBatch {
  int count;
  void* dst[kBatch];
  const void* src[kBatch];
  int64_t bytes[kBatch];
};

// Block b copies job b % count, grid-striding over its bytes, 16 bytes at a
// time where both ends are aligned.
__global__ void batched_copy_kernel(CopyBatch batch) {
  const int job = blockIdx.x % batch.count;
  const int64_t lane = (blockIdx.x / batch.count) * int64_t(blockDim.x) + threadIdx.x;
  const int64_t stride = (gridDim.x / batch.count) * int64_t(blockDim.x);
  char* dst = static_cast<char*>(batch.dst[job]);
  const char* src = static_cast<const char*>(batch.src[job]);
  const int64_t n = batch.bytes[job];
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    const int64_t vectors = n / 16;
    for (int64_t i = lane; i < vectors; i += stride)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    for (int64_t i = vectors * 16 + lane; i < n; i += stride) dst[i] = src[i];
  } else {
    for (int64_t i = lane; i < n; i += stride) dst[i] = src[i];
  }
}

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

void copy_async(const std::vector<CopyJob>& jobs, int device, void* stream) {
  DeviceGuard guard(device);
  auto s = static_cast<cudaStream_t>(stream);
  CopyBatch batch{};
  auto flush = [&] {
    if (batch.count == 0) return;
    batched_copy_kernel<<<batch.count * 8, 256, 0, s>>>(batch);
    check(cudaGetLastError(), "batched copy launch");
    batch.count = 0;
  };
  for (const CopyJob& job : jobs) {
    if (job.bytes == 0) continue;
    if (job.bytes >= kEngineCopyBytes) {
      check(cudaMemcpyAsync(job.dst, job.src, job.bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
      continue;
    }
    batch.dst[batch.count] = job.dst;
    batch.src[batch.count] = job.src;
    batch.bytes[batch.count] = job.bytes;
    if (++batch.count == kBatch) flush();
  }
  flush();
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
