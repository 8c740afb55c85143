// CUDA kernels of the ops declared in ../ops.cpp, enqueued on the current
// stream. Compiled only into CUDA builds.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstring>

#include "../tensor_list.h"

namespace es {
namespace {

// Kernel tables travel through pinned memory and the caching allocators, so
// the upload is asynchronous and stays valid until the kernels have run.
struct Uploader {
  at::Device device;
  std::vector<at::Tensor> keep;

  static void* upload(const void* host, int64_t bytes, void* self) {
    auto* u = static_cast<Uploader*>(self);
    at::Tensor pinned = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    if (bytes) std::memcpy(pinned.data_ptr(), host, bytes);
    u->keep.push_back(pinned.to(u->device, /*non_blocking=*/true));
    return u->keep.back().data_ptr();
  }
  CudaLaunch launch() {
    return {c10::cuda::getCurrentCUDAStream(device.index()).stream(), &Uploader::upload, this};
  }
};

std::vector<at::Tensor> canonical_sum_cuda_op(at::TensorList inputs, int64_t k, std::optional<at::ScalarType> out_dtype) {
  std::vector<at::Tensor> outputs;
  const at::ScalarType out_type = sum_out_type(inputs, out_dtype);
  TensorList list = sum_list(inputs, k, outputs, out_type);
  c10::cuda::CUDAGuard guard(inputs[0].device());
  Uploader up{inputs[0].device(), {}};
  canonical_sum_cuda(to_dtype(inputs[0].scalar_type()), to_dtype(out_type), list, up.launch());
  return outputs;
}

void fold_cuda_op(at::TensorList acc, at::TensorList src, double scale, bool accumulate,
                  const std::optional<c10::List<bool>>& frozen) {
  TensorList list = fold_list(acc, src, frozen);
  c10::cuda::CUDAGuard guard(src[0].device());
  Uploader up{src[0].device(), {}};
  fold_cuda(to_dtype(src[0].scalar_type()), list, scale, accumulate, up.launch());
}

void fold_plan_cuda_op(at::Tensor& out, at::TensorList pushed, at::IntArrayRef plan, int64_t result, double scale) {
  std::vector<const void*> pointers;
  std::vector<PlanOp> ops = plan_operands(out, pushed, plan, pointers);
  c10::cuda::CUDAGuard guard(out.device());
  Uploader up{out.device(), {}};
  fold_plan_cuda(to_dtype(out.scalar_type()), pointers, out.data_ptr(), out.numel(), ops, static_cast<int>(result),
                 scale, up.launch());
}

at::Tensor group_norms_cuda_op(at::TensorList tensors, at::IntArrayRef group_of, int64_t num_groups) {
  std::vector<int32_t> groups;
  TensorList list = norms_list(tensors, group_of, num_groups, groups);
  c10::cuda::CUDAGuard guard(tensors[0].device());
  const DType in = to_dtype(tensors[0].scalar_type());
  at::Tensor norms = at::empty({num_groups}, tensors[0].options().dtype(acc_scalar_type(tensors[0].scalar_type())));
  at::Tensor scratch = at::empty({group_norms_scratch_bytes(in, list)}, tensors[0].options().dtype(at::kByte));
  Uploader up{tensors[0].device(), {}};
  group_norms_cuda(in, list, groups, num_groups, norms.data_ptr(), scratch.data_ptr(), up.launch());
  return norms;
}

}  // namespace

TORCH_LIBRARY_IMPL(easyscale, CUDA, m) {
  m.impl("canonical_sum", &canonical_sum_cuda_op);
  m.impl("fold_", &fold_cuda_op);
  m.impl("fold_plan_", &fold_plan_cuda_op);
  m.impl("group_norms", &group_norms_cuda_op);
}

}  // namespace es
