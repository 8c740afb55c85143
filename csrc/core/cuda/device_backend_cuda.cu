// CUDA runtime services for the context store (see device_backend.h).
#include <cuda_runtime.h>

#include <limits>
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

// Between host and device, copies at or above this size go to the copy
// engines (cudaMemcpyAsync); the smaller ones share kernel launches over the
// mapped memory. Between two device buffers every copy goes through the
// kernel: one launch per kBatch copies runs at bandwidth, where a
// cudaMemcpyAsync per tensor pays a launch each and runs one at a time.
constexpr int64_t kEngineCopyBytes = 1 << 20;
constexpr int kBatch = 96;                  // keeps the kernel argument under 4 KiB
constexpr int kCopyThreads = 256;
constexpr int64_t kBlockBytes = 16 * 1024;  // per block: 4 uint4 per thread

struct CopyBatch {
  int count;
  void* dst[kBatch];
  const void* src[kBatch];
  int64_t bytes[kBatch];
  int64_t first_block[kBatch + 1];  // copy j owns blocks [first_block[j], first_block[j + 1])
};

// Copies bytes [begin, end) of src to dst with this block: single bytes up
// to the first Word-aligned address, Words, then the bytes left. Word must
// divide the distance between the two pointers.
template <typename Word>
__device__ void copy_slice(char* __restrict__ dst, const char* __restrict__ src, int64_t begin, int64_t end) {
  constexpr int64_t W = sizeof(Word);
  const int64_t misaligned = reinterpret_cast<uintptr_t>(dst + begin) & (W - 1);
  const int64_t words_begin = min(end, begin + (W - misaligned) % W);
  const int64_t words_end = words_begin + (end - words_begin) / W * W;
  for (int64_t i = begin + threadIdx.x; i < words_begin; i += kCopyThreads) dst[i] = src[i];
#pragma unroll 4
  for (int64_t i = words_begin + W * threadIdx.x; i < words_end; i += W * kCopyThreads)
    *reinterpret_cast<Word*>(dst + i) = *reinterpret_cast<const Word*>(src + i);
  for (int64_t i = words_end + threadIdx.x; i < end; i += kCopyThreads) dst[i] = src[i];
}

// Block b copies its slice of the copy that owns it, in the widest words the
// two pointers' offset allows.
__global__ void batched_copy_kernel(CopyBatch batch) {
  int lo = 0, hi = batch.count;  // first_block[lo] <= blockIdx.x < first_block[hi]
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (batch.first_block[mid] <= blockIdx.x) lo = mid;
    else hi = mid;
  }
  const int64_t begin = (blockIdx.x - batch.first_block[lo]) * kBlockBytes;
  const int64_t end = min(batch.bytes[lo], begin + kBlockBytes);
  char* dst = static_cast<char*>(batch.dst[lo]);
  const char* src = static_cast<const char*>(batch.src[lo]);
  const uintptr_t offset = reinterpret_cast<uintptr_t>(dst) ^ reinterpret_cast<uintptr_t>(src);
  if ((offset & 15) == 0) copy_slice<uint4>(dst, src, begin, end);
  else if ((offset & 7) == 0) copy_slice<uint2>(dst, src, begin, end);
  else if ((offset & 3) == 0) copy_slice<uint32_t>(dst, src, begin, end);
  else if ((offset & 1) == 0) copy_slice<uint16_t>(dst, src, begin, end);
  else copy_slice<char>(dst, src, begin, end);
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

void copy_async(const std::vector<CopyJob>& jobs, bool device_to_device, int device, void* stream) {
  DeviceGuard guard(device);
  auto s = static_cast<cudaStream_t>(stream);
  CopyBatch batch{};
  auto flush = [&] {
    if (batch.count == 0) return;
    if (batch.first_block[batch.count] > std::numeric_limits<int>::max())
      throw std::invalid_argument("context copy: a buffer of over 32 TiB");
    batched_copy_kernel<<<batch.first_block[batch.count], kCopyThreads, 0, s>>>(batch);
    check(cudaGetLastError(), "batched copy launch");
    batch.count = 0;
  };
  for (const CopyJob& job : jobs) {
    if (job.bytes == 0) continue;
    if (!device_to_device && job.bytes >= kEngineCopyBytes) {
      check(cudaMemcpyAsync(job.dst, job.src, job.bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
      continue;
    }
    const int j = batch.count++;
    batch.dst[j] = job.dst;
    batch.src[j] = job.src;
    batch.bytes[j] = job.bytes;
    batch.first_block[j + 1] = batch.first_block[j] + (job.bytes + kBlockBytes - 1) / kBlockBytes;
    if (batch.count == kBatch) flush();
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
