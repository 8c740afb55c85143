// CUDA kernels and the store's CUDA paths against the CPU. Exit 77 (skipped)
// without a device.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include "check.h"
#include "context_store.h"
#include "device_backend.h"
#include "canonical_tree.h"
#include "reduce.h"

using namespace es;

namespace {

void* upload(const void* host, int64_t bytes, void*) {
  void* dev = nullptr;
  cudaMalloc(&dev, bytes > 0 ? bytes : 1);  // leaked on purpose: a test, freed at exit
  cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice);
  return dev;
}

const CudaLaunch kLaunch{nullptr, &upload, nullptr};

struct DeviceBuffer {
  explicit DeviceBuffer(const void* host, int64_t bytes) : bytes(bytes) {
    cudaMalloc(&ptr, bytes > 0 ? bytes : 1);
    if (host) cudaMemcpy(ptr, host, bytes, cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  std::vector<char> to_host() const {
    std::vector<char> out(bytes);
    cudaMemcpy(out.data(), ptr, bytes, cudaMemcpyDeviceToHost);
    return out;
  }
  void* ptr = nullptr;
  int64_t bytes;
};

std::vector<char> random_bytes(DType t, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<char> out(n * dtype_size(t));
  for (int64_t i = 0; i < n; ++i) {
    float v = normal(rng) * (rng() % 5 == 0 ? 1e4f : 1.0f);
    switch (t) {
      case DType::F32: reinterpret_cast<float*>(out.data())[i] = v; break;
      case DType::F64: reinterpret_cast<double*>(out.data())[i] = double(v) * 1.0000001; break;
      case DType::F16: reinterpret_cast<uint16_t*>(out.data())[i] = float_to_half(v * 1e-3f); break;
      case DType::BF16: reinterpret_cast<uint16_t*>(out.data())[i] = float_to_bf16(v); break;
    }
  }
  return out;
}

DType acc_of(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

}  // namespace

TEST(fold_plan_matches_cpu) {
  // The top of the tree over 12 leaves on 5 processes: pushes of uneven nodes, several slots.
  FoldStack top(12);
  std::vector<PlanOp> plan;
  int32_t push = 0;
  for (int64_t p = 0; p < 5; ++p)
    for (const Range& r : local_roots(12 * p / 5, 12 * (p + 1) / 5, 12)) {
      for (const FoldOp& op : top.push(r)) plan.push_back({push, op.dst, op.src, op.accumulate});
      ++push;
    }
  for (DType t : {DType::F32, DType::F64}) {
    const int64_t numel = 70000;
    std::vector<std::vector<char>> host;
    std::vector<std::unique_ptr<DeviceBuffer>> dev;
    std::vector<const void*> cpu_in, gpu_in;
    for (int32_t j = 0; j < push; ++j) {
      host.push_back(random_bytes(t, numel, 31 + j));
      dev.push_back(std::make_unique<DeviceBuffer>(host.back().data(), host.back().size()));
      cpu_in.push_back(host.back().data());
      gpu_in.push_back(dev.back()->ptr);
    }
    std::vector<char> cpu_out(numel * dtype_size(t));
    DeviceBuffer gpu_out(nullptr, cpu_out.size());
    fold_plan_cpu(t, cpu_in, cpu_out.data(), numel, plan, top.slots()[0], 1.0 / 12, 2);
    fold_plan_cuda(t, gpu_in, gpu_out.ptr, numel, plan, top.slots()[0], 1.0 / 12, kLaunch);
    CHECK(gpu_out.to_host() == cpu_out);
  }
}

TEST(canonical_sum_and_fold_match_cpu) {
  // k: one leaf block, a full one, tails after one and two blocks, and a
  // deeper run-time stack of blocks.
  for (int64_t k : {1, 5, 8, 13, 17, 65})
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    const std::vector<int64_t> sizes{1, 1000, 70000};
    std::vector<std::vector<char>> host;
    std::vector<std::unique_ptr<DeviceBuffer>> dev;
    TensorList cpu, gpu;
    cpu.k = gpu.k = k;
    std::vector<std::vector<char>> cpu_out;
    std::vector<std::unique_ptr<DeviceBuffer>> gpu_out;
    for (size_t s = 0; s < sizes.size(); ++s) {
      for (int64_t j = 0; j < k; ++j) {
        host.push_back(random_bytes(t, sizes[s], 17 * s + j));
        dev.push_back(std::make_unique<DeviceBuffer>(host.back().data(), host.back().size()));
        cpu.inputs.push_back(host.back().data());
        gpu.inputs.push_back(dev.back()->ptr);
      }
      cpu_out.emplace_back(sizes[s] * dtype_size(acc_of(t)));
      gpu_out.push_back(std::make_unique<DeviceBuffer>(nullptr, sizes[s] * dtype_size(acc_of(t))));
      cpu.outputs.push_back(cpu_out.back().data());
      gpu.outputs.push_back(gpu_out.back()->ptr);
      cpu.numels.push_back(sizes[s]);
      gpu.numels.push_back(sizes[s]);
    }
    canonical_sum_cpu(t, t, cpu, 2);  // stored in the input dtype (rounded once for 16-bit types)
    canonical_sum_cuda(t, t, gpu, kLaunch);
    for (size_t s = 0; s < sizes.size(); ++s) {
      const size_t bytes = sizes[s] * dtype_size(t);
      CHECK(memcmp(gpu_out[s]->to_host().data(), cpu_out[s].data(), bytes) == 0);
    }
    canonical_sum_cpu(t, acc_of(t), cpu, 2);
    canonical_sum_cuda(t, acc_of(t), gpu, kLaunch);
    for (size_t s = 0; s < sizes.size(); ++s) CHECK(gpu_out[s]->to_host() == cpu_out[s]);

    // fold: first input of each tensor onto the sums, accumulating
    TensorList cpu_fold, gpu_fold;
    for (size_t s = 0; s < sizes.size(); ++s) {
      cpu_fold.inputs.push_back(cpu.inputs[s * k]);
      gpu_fold.inputs.push_back(gpu.inputs[s * k]);
      cpu_fold.outputs.push_back(cpu.outputs[s]);
      gpu_fold.outputs.push_back(gpu.outputs[s]);
      cpu_fold.numels.push_back(sizes[s]);
      gpu_fold.numels.push_back(sizes[s]);
    }
    fold_cpu(t, cpu_fold, 1.0 / 3.0, true, 2);
    fold_cuda(t, gpu_fold, 1.0 / 3.0, true, kLaunch);
    for (size_t s = 0; s < sizes.size(); ++s) CHECK(gpu_out[s]->to_host() == cpu_out[s]);

    // group norms over the inputs, tensor s*k in group s % 2, one frozen
    TensorList cpu_norm, gpu_norm;
    std::vector<int32_t> groups;
    for (size_t i = 0; i + 1 < cpu.inputs.size(); ++i) {
      cpu_norm.inputs.push_back(cpu.inputs[i]);
      gpu_norm.inputs.push_back(gpu.inputs[i]);
      cpu_norm.numels.push_back(sizes[i / k]);
      gpu_norm.numels.push_back(sizes[i / k]);
      groups.push_back(static_cast<int32_t>(i % 3));
    }
    std::vector<char> cpu_norms(3 * dtype_size(acc_of(t)));
    DeviceBuffer gpu_norms(nullptr, cpu_norms.size());
    DeviceBuffer scratch(nullptr, group_norms_scratch_bytes(t, gpu_norm));
    group_norms_cpu(t, cpu_norm, groups, 3, cpu_norms.data(), 2);
    group_norms_cuda(t, gpu_norm, groups, 3, gpu_norms.ptr, scratch.ptr, kLaunch);
    CHECK(gpu_norms.to_host() == cpu_norms);
  }
}

TEST(store_pinned_and_device_roundtrip) {
  for (Location where : {Location::Pinned, Location::Device}) {
    ContextStore store(256 << 20, 1);
    std::vector<float> a(3 << 20), small(7, 1.5f);
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(i);
    DeviceBuffer big(a.data(), a.size() * 4), tiny(small.data(), small.size() * 4);
    std::vector<Buffer> buffers{{big.ptr, big.bytes, 0}, {tiny.ptr, tiny.bytes, 0}};
    store.save(0, "x", "s", buffers, where, nullptr);
    store.order_after_saves(0, nullptr);  // the save copies on the store's side stream
    cudaMemsetAsync(big.ptr, 0, big.bytes, nullptr);
    cudaMemsetAsync(tiny.ptr, 0, tiny.bytes, nullptr);
    store.restore(0, "x", "s", buffers, nullptr);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<char> back = big.to_host(), back_small = tiny.to_host();
    CHECK(memcmp(back.data(), a.data(), big.bytes) == 0);
    CHECK(memcmp(back_small.data(), small.data(), tiny.bytes) == 0);
    std::vector<uint8_t> bytes = store.serialize(0);
    ContextStore other(256 << 20, 1);
    CHECK(other.deserialize(bytes.data(), static_cast<int64_t>(bytes.size())) == 0);
  }
}

TEST(device_store_copies_many_odd_buffers) {
  // More buffers than one kernel launch takes, sizes around the per-block
  // slice, an empty one, and views at every offset class from the store's
  // aligned slots (the 16/8/4/2/1-byte word paths), between guard bytes.
  constexpr int64_t kGuard = 16;
  constexpr int64_t kSkews[] = {0, 1, 2, 4, 8, 3};
  constexpr char kWiped = static_cast<char>(0xEE);
  ContextStore store(256 << 20, 1);
  std::vector<std::unique_ptr<DeviceBuffer>> owners;
  std::vector<std::vector<char>> expect;
  std::vector<Buffer> buffers;
  for (int i = 0; i < 230; ++i) {
    const int64_t bytes = i % 5 == 0   ? (1 << 20) + 3 * i
                          : i % 5 == 1 ? 16 * 1024 * (i % 3 + 1) - i % 2
                          : i == 7     ? 0
                                       : 37 * i + 1;
    const int64_t skew = kSkews[i % 6];
    std::vector<char> host(kGuard + skew + bytes + kGuard, kWiped);
    for (int64_t b = 0; b < bytes; ++b) host[kGuard + skew + b] = static_cast<char>(b * 131 + i);
    owners.push_back(std::make_unique<DeviceBuffer>(host.data(), static_cast<int64_t>(host.size())));
    expect.push_back(host);
    buffers.push_back({static_cast<char*>(owners.back()->ptr) + kGuard + skew, bytes, 0});
  }
  store.save(0, "x", "s", buffers, Location::Device, nullptr);
  store.order_after_saves(0, nullptr);
  for (auto& o : owners) cudaMemsetAsync(o->ptr, kWiped, o->bytes, nullptr);
  store.restore(0, "x", "s", buffers, nullptr);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  for (size_t i = 0; i < owners.size(); ++i) CHECK(owners[i]->to_host() == expect[i]);
}

int main() {
  if (!device::available()) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  return run_all_tests();
}
