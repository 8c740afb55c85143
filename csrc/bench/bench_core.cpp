// Microbenchmarks of the core without Python: memcpy bandwidth (the physical
// limit), context save+restore, and canonical_sum / fold throughput.
// Prints one line per case: median of repeated runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "context_store.h"
#include "reduce.h"

using namespace es;

static double median_seconds(int repeats, const std::function<void()>& body) {
  body();  // warm-up: first-touch and slab allocation happen here
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    auto start = std::chrono::steady_clock::now();
    body();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int repeats = 9;
  // A ResNet-50-sized context: 25.6M floats in 161 tensors.
  const int64_t tensors = 161, total = 25600000;
  std::vector<std::vector<float>> params(tensors, std::vector<float>(total / tensors, 1.0f));
  std::vector<std::vector<float>> scratch = params;
  std::vector<Buffer> src, dst;
  int64_t bytes = 0;
  for (int64_t i = 0; i < tensors; ++i) {
    src.push_back({params[i].data(), static_cast<int64_t>(params[i].size() * 4), -1});
    dst.push_back({scratch[i].data(), static_cast<int64_t>(scratch[i].size() * 4), -1});
    bytes += src.back().bytes;
  }
  double t_memcpy = median_seconds(repeats, [&] {
    for (int64_t i = 0; i < tensors; ++i) memcpy(scratch[i].data(), params[i].data(), src[i].bytes);
  });
  std::printf("memcpy              %8.2f GB/s\n", bytes / t_memcpy / 1e9);
  for (int nt : {1, threads}) {
    ContextStore store(int64_t(1) << 32, nt);
    double t_save = median_seconds(repeats, [&] { store.save(0, "params", "resnet50", src, Location::Host, nullptr); });
    double t_restore = median_seconds(repeats, [&] { store.restore(0, "params", "resnet50", dst, nullptr); });
    std::printf("store save  (%d thr) %8.2f GB/s  (%.2f of memcpy)\n", nt, bytes / t_save / 1e9, t_memcpy / t_save);
    std::printf("store restore(%d thr)%8.2f GB/s  (%.2f of memcpy)\n", nt, bytes / t_restore / 1e9, t_memcpy / t_restore);
  }
  const int64_t n = 1 << 22;
  for (int64_t k : {2, 4, 8}) {
    std::vector<std::vector<float>> in(k, std::vector<float>(n, 0.5f));
    std::vector<float> out(n);
    TensorList list;
    list.k = k;
    for (auto& v : in) list.inputs.push_back(v.data());
    list.outputs = {out.data()};
    list.numels = {n};
    double t = median_seconds(repeats, [&] { canonical_sum_cpu(DType::F32, DType::F32, list, threads); });
    std::printf("canonical_sum k=%-2lld %8.2f GB/s read\n", static_cast<long long>(k), k * n * 4 / t / 1e9);
  }
  return 0;
}
