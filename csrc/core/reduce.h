// Deterministic multi-tensor reduction kernels over raw buffers.
//
// Every op works on a TensorList: T tensors, each with K same-sized inputs
// and one output. Frozen tensors are simply left out of the list by the
// caller: no copy, no reduction. Results depend only on the values and K,
// never on thread count, block size or where the buffers live.
#pragma once
#include <cstdint>
#include <vector>

#include "reduce_math.h"

namespace es {

struct TensorList {
  std::vector<const void*> inputs;  // T * k entries, tensor-major
  std::vector<void*> outputs;       // T entries
  std::vector<int64_t> numels;      // T entries
  int64_t k = 1;
  int64_t size() const { return static_cast<int64_t>(numels.size()); }
};

// outputs[t] = canonical tree sum over k of inputs[t*k + k'], accumulated in
// Acc<in> and stored as `out` (either `in` or its accumulation type).
void canonical_sum_cpu(DType in, DType out, const TensorList& list, int num_threads);

// outputs[t] = (accumulate ? outputs[t] : nothing) + inputs[t] * scale, with
// outputs in Acc<in>. k must be 1. The streaming step of a FoldStack.
void fold_cpu(DType in, const TensorList& list, double scale, bool accumulate, int num_threads);

// One operation of a fold plan (a FoldStack's operations over several pushes, in order): slot[dst] =
// (accumulate ? slot[dst] + v : v), where v is pushed buffer `push` times the plan's scale (src ==
// FoldOp::kPushed) or slot[src].
struct PlanOp {
  int32_t push, dst, src, accumulate;
};
constexpr int kMaxPlanSlots = 64;  // a FoldStack over n leaves holds at most log2(n) + 1

// out = slot[result] after applying `plan` to every element: what the plan's fold launches compute one by
// one (pushes at `scale`, merges of slots at 1), bit for bit, reading each pushed buffer once and writing
// `out` once (no slot buffers). pushed[j] and out hold `numel` elements of `acc` (F32 or F64); out may be
// one of the pushed buffers (each element is read before it is written).
void fold_plan_cpu(DType acc, const std::vector<const void*>& pushed, void* out, int64_t numel,
                   const std::vector<PlanOp>& plan, int result, double scale, int num_threads);

// norms[g] = sqrt(canonical tree over the tensors of group g, in list order,
// of each tensor's canonical tree over its squared elements), in Acc<in>.
// group_of[t] in [0, num_groups); inputs only (k == 1, outputs unused).
void group_norms_cpu(DType in, const TensorList& list, const std::vector<int32_t>& group_of,
                     int64_t num_groups, void* norms, int num_threads);

// CUDA versions: same results bit for bit for fp32/fp64 (tested), enqueued on
// `stream` (a cudaStream_t). `upload` copies host bytes into device memory
// that stays valid until the enqueued work is done, and returns its address:
// the torch glue uses pinned memory + the caching allocator, the C++ tests a
// plain cudaMemcpy.
using UploadFn = void* (*)(const void* host, int64_t bytes, void* ctx);
struct CudaLaunch {
  void* stream;
  UploadFn upload;
  void* upload_ctx;
};
void canonical_sum_cuda(DType in, DType out, const TensorList& list, const CudaLaunch& launch);
void fold_cuda(DType in, const TensorList& list, double scale, bool accumulate, const CudaLaunch& launch);
void fold_plan_cuda(DType acc, const std::vector<const void*>& pushed, void* out, int64_t numel,
                    const std::vector<PlanOp>& plan, int result, double scale, const CudaLaunch& launch);
// `scratch` holds group_norms_scratch_bytes(...) bytes of device memory.
int64_t group_norms_scratch_bytes(DType in, const TensorList& list);
void group_norms_cuda(DType in, const TensorList& list, const std::vector<int32_t>& group_of,
                      int64_t num_groups, void* norms, void* scratch, const CudaLaunch& launch);

template <typename F>
void dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); return;
    case DType::F64: f(double{}); return;
    case DType::F16: f(Half{}); return;
    case DType::BF16: f(BFloat16{}); return;
  }
}

// Checks shared by both backends; throws std::invalid_argument.
void check_list(const TensorList& list, const char* op);
void check_plan(DType acc, const std::vector<PlanOp>& plan, int64_t pushes, int result);

// CPU threads take tensors in chunks of this many elements;
// the association never depends on it.
constexpr int64_t kChunk = 1 << 14;

}  // namespace es
