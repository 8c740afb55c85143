// The context store's copy kernel: many copies between device (or mapped
// pinned) buffers in one launch, each cut into slices of BlockBytes, a block
// per slice. Templated on the slice size so that bench_copy.cu measures the
// sizes against each other with the kernel the store runs.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <stdexcept>

#include "../device_backend.h"

namespace es {
namespace device {

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
template <int64_t BlockBytes>
__global__ void batched_copy_kernel(CopyBatch batch) {
  int lo = 0, hi = batch.count;  // first_block[lo] <= blockIdx.x < first_block[hi]
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (batch.first_block[mid] <= blockIdx.x) lo = mid;
    else hi = mid;
  }
  const int64_t begin = (blockIdx.x - batch.first_block[lo]) * BlockBytes;
  const int64_t end = min(batch.bytes[lo], begin + BlockBytes);
  char* dst = static_cast<char*>(batch.dst[lo]);
  const char* src = static_cast<const char*>(batch.src[lo]);
  const uintptr_t offset = reinterpret_cast<uintptr_t>(dst) ^ reinterpret_cast<uintptr_t>(src);
  if ((offset & 15) == 0) copy_slice<uint4>(dst, src, begin, end);
  else if ((offset & 7) == 0) copy_slice<uint2>(dst, src, begin, end);
  else if ((offset & 3) == 0) copy_slice<uint32_t>(dst, src, begin, end);
  else if ((offset & 1) == 0) copy_slice<uint16_t>(dst, src, begin, end);
  else copy_slice<char>(dst, src, begin, end);
}

// Enqueues copies on a stream, kBatch copies a launch: add() each, then
// flush() the rest. Each returns the launch's error, if it launched.
template <int64_t BlockBytes>
class BatchedCopies {
 public:
  explicit BatchedCopies(cudaStream_t stream) : stream_(stream) {}

  cudaError_t add(const CopyJob& job) {
    if (job.bytes == 0) return cudaSuccess;
    const int j = batch_.count++;
    batch_.dst[j] = job.dst;
    batch_.src[j] = job.src;
    batch_.bytes[j] = job.bytes;
    batch_.first_block[j + 1] = batch_.first_block[j] + (job.bytes + BlockBytes - 1) / BlockBytes;
    return batch_.count == kBatch ? flush() : cudaSuccess;
  }

  cudaError_t flush() {
    if (batch_.count == 0) return cudaSuccess;
    if (batch_.first_block[batch_.count] > std::numeric_limits<int>::max())
      throw std::invalid_argument("context copy: a buffer of over 32 TiB");
    batched_copy_kernel<BlockBytes><<<batch_.first_block[batch_.count], kCopyThreads, 0, stream_>>>(batch_);
    batch_.count = 0;
    return cudaGetLastError();
  }

 private:
  cudaStream_t stream_;
  CopyBatch batch_{};
};

}  // namespace device
}  // namespace es
