// The store's device-to-device copy kernel at each slice size, against one
// cudaMemcpyAsync of the same bytes: kernel time only (CUDA events around the
// launches), no host-side preparation. Tensor sizes in bytes come on stdin,
// one per line (bench/gpu_checks.sh passes ResNet-50's parameters).
//   make core && build/core/bench_copy < sizes
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "cuda/batched_copy.cuh"

namespace {

void check(cudaError_t err) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(err));
    std::exit(1);
  }
}

template <typename F>
float median_ms(F run) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start));
  check(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int i = 0; i < 53; ++i) {  // three warm-up runs
    check(cudaEventRecord(start));
    run();
    check(cudaEventRecord(stop));
    check(cudaEventSynchronize(stop));
    float t = 0;
    check(cudaEventElapsedTime(&t, start, stop));
    if (i >= 3) ms.push_back(t);
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

template <int64_t BlockBytes>
void row(const std::vector<es::device::CopyJob>& jobs, int64_t total, float memcpy_ms) {
  const float ms = median_ms([&] {
    es::device::BatchedCopies<BlockBytes> batched(nullptr);
    for (const auto& job : jobs) check(batched.add(job));
    check(batched.flush());
  });
  std::printf("%9lld KiB %9.3f ms %9.1f GB/s %6.1f %%\n", static_cast<long long>(BlockBytes / 1024), ms,
              total / ms / 1e6, 100.0 * memcpy_ms / ms);
}

}  // namespace

int main() {
  std::vector<int64_t> sizes;
  for (int64_t bytes; std::cin >> bytes;) sizes.push_back(bytes);
  int count = 0;
  if (sizes.empty() || cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "bench_copy needs a CUDA device and tensor sizes in bytes on stdin\n");
    return 1;
  }
  int64_t total = 0;
  std::vector<int64_t> offsets;
  for (int64_t bytes : sizes) {
    offsets.push_back(total);
    total += (bytes + 511) / 512 * 512;  // the caching allocator's alignment
  }
  char *src = nullptr, *dst = nullptr;
  check(cudaMalloc(&src, total));
  check(cudaMalloc(&dst, total));
  check(cudaMemset(src, 1, total));
  std::vector<es::device::CopyJob> jobs;
  int64_t bytes_total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    jobs.push_back({dst + offsets[i], src + offsets[i], sizes[i]});
    bytes_total += sizes[i];
  }
  const float memcpy_ms =
      median_ms([&] { check(cudaMemcpyAsync(dst, src, bytes_total, cudaMemcpyDeviceToDevice, nullptr)); });
  std::printf("%zu copies, %.1f MB; one cudaMemcpyAsync: %.3f ms, %.1f GB/s\n", sizes.size(), bytes_total / 1e6,
              memcpy_ms, bytes_total / memcpy_ms / 1e6);
  std::printf("    slice        kernel      bytes/s  of memcpy\n");
  row<16 * 1024>(jobs, bytes_total, memcpy_ms);
  row<32 * 1024>(jobs, bytes_total, memcpy_ms);
  row<64 * 1024>(jobs, bytes_total, memcpy_ms);
  row<128 * 1024>(jobs, bytes_total, memcpy_ms);
  row<256 * 1024>(jobs, bytes_total, memcpy_ms);
  return 0;
}
