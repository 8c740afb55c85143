// CUDA versions of reduce_cpu.cpp: the per-element math is the same header,
// so fp32/fp64 results match the CPU bit for bit. One launch covers every
// tensor of a list: blocks map to (tensor, chunk) through a small table
// uploaded per call.
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "../canonical_tree.h"
#include "../reduce.h"

namespace es {
namespace {

constexpr int kThreads = 256;
constexpr int kTileItemsPerThread = static_cast<int>(kNormTile / kThreads);  // 8

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// Device view of an uploaded TensorList: [numel T][first_block T+1][inputs T*k][outputs T].
struct ListView {
  int64_t tensors;
  int64_t k;
  const int64_t* numel;
  const int64_t* first_block;
  const void* const* inputs;
  void* const* outputs;
};

class TableBuilder {
 public:
  template <typename V>
  int64_t add(const std::vector<V>& values) {
    int64_t offset = static_cast<int64_t>(bytes_.size());
    bytes_.resize(bytes_.size() + values.size() * sizeof(V));
    if (!values.empty()) memcpy(bytes_.data() + offset, values.data(), values.size() * sizeof(V));
    return offset;
  }
  const char* upload(const CudaLaunch& launch) const {
    return static_cast<const char*>(launch.upload(bytes_.data(), static_cast<int64_t>(bytes_.size()), launch.upload_ctx));
  }

 private:
  std::vector<char> bytes_;
};

// Builds the table with `block_elems` elements per block; returns the view
// and the total block count.
ListView upload_list(const TensorList& list, int64_t block_elems, const CudaLaunch& launch, int64_t* blocks) {
  std::vector<int64_t> first_block(list.size() + 1, 0);
  for (int64_t t = 0; t < list.size(); ++t)
    first_block[t + 1] = first_block[t] + (list.numels[t] + block_elems - 1) / block_elems;
  *blocks = first_block.back();
  TableBuilder table;
  int64_t o_numel = table.add(list.numels);
  int64_t o_first = table.add(first_block);
  int64_t o_in = table.add(list.inputs);
  int64_t o_out = table.add(list.outputs);
  const char* base = table.upload(launch);
  return {list.size(), list.k,
          reinterpret_cast<const int64_t*>(base + o_numel),
          reinterpret_cast<const int64_t*>(base + o_first),
          reinterpret_cast<const void* const*>(base + o_in),
          reinterpret_cast<void* const*>(base + o_out)};
}

__device__ int64_t tensor_of_block(const ListView& v, int64_t block) {
  int64_t lo = 0, hi = v.tensors;  // first_block[lo] <= block < first_block[hi]
  while (hi - lo > 1) {
    int64_t mid = (lo + hi) / 2;
    if (v.first_block[mid] <= block) lo = mid;
    else hi = mid;
  }
  return lo;
}

// Each thread takes kIlp elements a block-width apart (coalesced) and
// evaluates the tree on all of them at once, one vector per tree node as on
// the CPU, so the loads of every lane and leaf of a block are in flight
// together. Past the end a lane reads the tensor's last element and stores
// nothing.
constexpr int kIlp = 4;
constexpr int64_t kBlockElems = kThreads * kIlp;  // one pass per thread: blocks fill the device

struct Elements {
  int64_t first, last;
  __device__ int64_t at(int lane) const { return min(first + lane * kThreads, last); }
  __device__ bool owns(int lane) const { return first + lane * kThreads <= last; }
};

__device__ Elements elements_of(const ListView& v, int64_t t) {
  return {(blockIdx.x - v.first_block[t]) * kBlockElems + threadIdx.x, v.numel[t] - 1};
}

template <typename A>
struct Lanes {
  A lane[kIlp];
  Lanes() = default;
  __device__ explicit Lanes(A fill) {
#pragma unroll
    for (int u = 0; u < kIlp; ++u) lane[u] = fill;
  }
};

// Found by the tree templates through argument-dependent lookup; the using
// keeps the scalar overloads visible beside it in this namespace.
using es::add_rn;
template <typename A>
__device__ Lanes<A> add_rn(const Lanes<A>& a, const Lanes<A>& b) {
  Lanes<A> sum;
#pragma unroll
  for (int u = 0; u < kIlp; ++u) sum.lane[u] = add_rn(a.lane[u], b.lane[u]);
  return sum;
}

template <typename T, typename O>
__global__ void canonical_sum_kernel(ListView v) {
  using A = typename Acc<T>::type;
  const int64_t t = tensor_of_block(v, blockIdx.x);
  const Elements e = elements_of(v, t);
  const T* const* srcs = reinterpret_cast<const T* const*>(v.inputs + t * v.k);
  const Lanes<A> sum = canonical_tree_sum_blocked<Lanes<A>>(v.k, [&](int64_t j) {
    Lanes<A> leaf;
#pragma unroll
    for (int u = 0; u < kIlp; ++u) leaf.lane[u] = to_acc(srcs[j][e.at(u)]);
    return leaf;
  });
  O* dst = static_cast<O*>(v.outputs[t]);
#pragma unroll
  for (int u = 0; u < kIlp; ++u)
    if (e.owns(u)) dst[e.at(u)] = from_acc<O>(sum.lane[u]);
}

template <typename T>
__global__ void fold_kernel(ListView v, typename Acc<T>::type scale, bool accumulate) {
  using A = typename Acc<T>::type;
  const int64_t t = tensor_of_block(v, blockIdx.x);
  const Elements e = elements_of(v, t);
  const T* src = static_cast<const T*>(v.inputs[t]);
  A* acc = static_cast<A*>(v.outputs[t]);
  A partial[kIlp], leaf[kIlp];
#pragma unroll
  for (int u = 0; u < kIlp; ++u) {
    partial[u] = acc[e.at(u)];
    leaf[u] = to_acc(src[e.at(u)]);
  }
#pragma unroll
  for (int u = 0; u < kIlp; ++u)
    if (e.owns(u)) acc[e.at(u)] = fold_leaf<A>(partial[u], leaf[u], scale, accumulate);
}

// One thread per element (grid-stride): the plan's slots are a per-thread array indexed at run time.
template <typename A>
__global__ void fold_plan_kernel(const A* const* pushed, A* out, int64_t numel, const PlanOp* plan, int ops,
                                 int result, A scale) {
  A slot[kMaxPlanSlots];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < numel; i += int64_t(gridDim.x) * blockDim.x) {
    for (int j = 0; j < ops; ++j) {
      const PlanOp op = plan[j];
      const bool is_push = op.src == FoldOp::kPushed;
      const A v = is_push ? pushed[op.push][i] : slot[op.src];
      const A s = is_push ? scale : A(1);
      slot[op.dst] = op.accumulate ? fold_leaf<A>(slot[op.dst], v, s, true) : fold_leaf<A>(v, v, s, false);
    }
    out[i] = slot[result];
  }
}

// One block per kNormTile tile. The tile is zero-padded to full size: its
// padded perfect tree equals the canonical tree of the real elements
// because adding +0 to a square (>= +0) is exact.
template <typename T>
__global__ void tile_square_sums_kernel(ListView v, typename Acc<T>::type* tile_sums) {
  using A = typename Acc<T>::type;
  __shared__ A partial[kThreads];
  const int64_t t = tensor_of_block(v, blockIdx.x);
  const int64_t tile_begin = (blockIdx.x - v.first_block[t]) * kNormTile;
  const int64_t n = v.numel[t];
  const T* x = static_cast<const T*>(v.inputs[t]);
  const int64_t my_begin = tile_begin + threadIdx.x * kTileItemsPerThread;
  partial[threadIdx.x] = fixed_tree_sum<A, kTileItemsPerThread>([&](int64_t j) {
    int64_t i = my_begin + j;
    if (i >= n) return A(0);
    A e = to_acc(x[i]);
    return mul_rn(e, e);
  }, 0);
  __syncthreads();
  for (int width = kThreads; width > 1; width /= 2) {
    A pair = A(0);
    if (threadIdx.x < width / 2) pair = add_rn(partial[2 * threadIdx.x], partial[2 * threadIdx.x + 1]);
    __syncthreads();
    if (threadIdx.x < width / 2) partial[threadIdx.x] = pair;
    __syncthreads();
  }
  if (threadIdx.x == 0) tile_sums[blockIdx.x] = partial[0];
}

template <typename A>
__global__ void group_norms_kernel(const int64_t* first_tile, const A* tile_sums, const int64_t* group_begin,
                                   const int64_t* members, int64_t groups, A* norms) {
  const int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (g >= groups) return;
  A sq = canonical_tree_sum<A>(group_begin[g + 1] - group_begin[g], [&](int64_t m) {
    int64_t t = members[group_begin[g] + m];
    return canonical_tree_sum<A>(first_tile[t + 1] - first_tile[t],
                                 [&](int64_t j) { return tile_sums[first_tile[t] + j]; });
  });
  norms[g] = sqrt_rn(sq);
}

cudaStream_t stream_of(const CudaLaunch& launch) { return static_cast<cudaStream_t>(launch.stream); }

}  // namespace

void canonical_sum_cuda(DType in, DType out, const TensorList& list, const CudaLaunch& launch) {
  check_list(list, "canonical_sum");
  if (list.size() == 0) return;
  int64_t blocks = 0;
  ListView view = upload_list(list, kBlockElems, launch, &blocks);
  if (blocks == 0) return;
  dispatch_dtype(in, [&](auto in_tag) {
    using T = decltype(in_tag);
    using A = typename Acc<T>::type;
    if (out == in) canonical_sum_kernel<T, T><<<blocks, kThreads, 0, stream_of(launch)>>>(view);
    else if (out == (sizeof(A) == 8 ? DType::F64 : DType::F32))
      canonical_sum_kernel<T, A><<<blocks, kThreads, 0, stream_of(launch)>>>(view);
    else throw std::invalid_argument(std::string("canonical_sum: output dtype must be ") + dtype_name(in) +
                                     " or its accumulation type, got " + dtype_name(out));
  });
  check_cuda(cudaGetLastError(), "canonical_sum launch");
}

void fold_cuda(DType in, const TensorList& list, double scale, bool accumulate, const CudaLaunch& launch) {
  check_list(list, "fold");
  if (list.k != 1) throw std::invalid_argument("fold: takes one input per tensor");
  if (list.size() == 0) return;
  int64_t blocks = 0;
  ListView view = upload_list(list, kBlockElems, launch, &blocks);
  if (blocks == 0) return;
  dispatch_dtype(in, [&](auto in_tag) {
    using T = decltype(in_tag);
    using A = typename Acc<T>::type;
    fold_kernel<T><<<blocks, kThreads, 0, stream_of(launch)>>>(view, static_cast<A>(scale), accumulate);
  });
  check_cuda(cudaGetLastError(), "fold launch");
}

void fold_plan_cuda(DType acc, const std::vector<const void*>& pushed, void* out, int64_t numel,
                    const std::vector<PlanOp>& plan, int result, double scale, const CudaLaunch& launch) {
  check_plan(acc, plan, static_cast<int64_t>(pushed.size()), result);
  if (numel == 0) return;
  TableBuilder table;
  const int64_t o_pushed = table.add(pushed);
  const int64_t o_plan = table.add(plan);
  const char* device = table.upload(launch);
  const int64_t blocks = std::min<int64_t>((numel + kThreads - 1) / kThreads, 1 << 16);
  auto launch_as = [&](auto tag) {
    using A = decltype(tag);
    fold_plan_kernel<A><<<blocks, kThreads, 0, stream_of(launch)>>>(
        reinterpret_cast<const A* const*>(device + o_pushed), static_cast<A*>(out), numel,
        reinterpret_cast<const PlanOp*>(device + o_plan), static_cast<int>(plan.size()), result, static_cast<A>(scale));
  };
  if (acc == DType::F64) launch_as(double{});
  else launch_as(float{});
  check_cuda(cudaGetLastError(), "fold_plan launch");
}

int64_t group_norms_scratch_bytes(DType in, const TensorList& list) {
  int64_t tiles = 0;
  for (int64_t n : list.numels) tiles += (n + kNormTile - 1) / kNormTile;
  return tiles * (in == DType::F64 ? 8 : 4);
}

void group_norms_cuda(DType in, const TensorList& list, const std::vector<int32_t>& group_of,
                      int64_t num_groups, void* norms, void* scratch, const CudaLaunch& launch) {
  check_list(list, "group_norms");
  if (static_cast<int64_t>(group_of.size()) != list.size())
    throw std::invalid_argument("group_norms: need one group index per tensor");
  std::vector<int64_t> group_begin(num_groups + 1, 0);
  for (int32_t g : group_of) {
    if (g < 0 || g >= num_groups)
      throw std::invalid_argument("group_norms: group index " + std::to_string(g) + " outside [0, " +
                                  std::to_string(num_groups) + ")");
    ++group_begin[g + 1];
  }
  for (int64_t g = 0; g < num_groups; ++g) group_begin[g + 1] += group_begin[g];
  std::vector<int64_t> members(list.size()), fill(group_begin.begin(), group_begin.end() - 1);
  for (int64_t t = 0; t < list.size(); ++t) members[fill[group_of[t]]++] = t;  // stable: list order
  if (num_groups == 0) return;

  int64_t tiles = 0;
  ListView view = upload_list(list, kNormTile, launch, &tiles);
  TableBuilder groups;
  int64_t o_begin = groups.add(group_begin);
  int64_t o_members = groups.add(members);
  const char* base = groups.upload(launch);
  dispatch_dtype(in, [&](auto in_tag) {
    using T = decltype(in_tag);
    using A = typename Acc<T>::type;
    A* tile_sums = static_cast<A*>(scratch);
    if (tiles > 0) tile_square_sums_kernel<T><<<tiles, kThreads, 0, stream_of(launch)>>>(view, tile_sums);
    const int group_threads = 128;
    group_norms_kernel<A><<<(num_groups + group_threads - 1) / group_threads, group_threads, 0, stream_of(launch)>>>(
        view.first_block, tile_sums, reinterpret_cast<const int64_t*>(base + o_begin),
        reinterpret_cast<const int64_t*>(base + o_members), num_groups, static_cast<A*>(norms));
  });
  check_cuda(cudaGetLastError(), "group_norms launch");
}

}  // namespace es
