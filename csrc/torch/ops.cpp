// Schemas of the stateless ops, registered once, and their CPU kernels.
// CUDA kernels register in cuda/ops_cuda.cpp; fake kernels in ops.py.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "tensor_list.h"

namespace es {
namespace {

std::vector<at::Tensor> canonical_sum_cpu_op(at::TensorList inputs, int64_t k, std::optional<at::ScalarType> out_dtype) {
  std::vector<at::Tensor> outputs;
  const at::ScalarType out_type = sum_out_type(inputs, out_dtype);
  TensorList list = sum_list(inputs, k, outputs, out_type);
  canonical_sum_cpu(to_dtype(inputs[0].scalar_type()), to_dtype(out_type), list, at::get_num_threads());
  return outputs;
}

void fold_cpu_op(at::TensorList acc, at::TensorList src, double scale, bool accumulate,
                 const std::optional<c10::List<bool>>& frozen) {
  TensorList list = fold_list(acc, src, frozen);
  fold_cpu(to_dtype(src[0].scalar_type()), list, scale, accumulate, at::get_num_threads());
}

void fold_plan_cpu_op(at::Tensor& out, at::TensorList pushed, at::IntArrayRef plan, int64_t result, double scale) {
  std::vector<const void*> pointers;
  std::vector<PlanOp> ops = plan_operands(out, pushed, plan, pointers);
  fold_plan_cpu(to_dtype(out.scalar_type()), pointers, out.data_ptr(), out.numel(), ops, static_cast<int>(result),
                scale, at::get_num_threads());
}

at::Tensor group_norms_cpu_op(at::TensorList tensors, at::IntArrayRef group_of, int64_t num_groups) {
  std::vector<int32_t> groups;
  TensorList list = norms_list(tensors, group_of, num_groups, groups);
  at::Tensor norms = at::empty({num_groups}, tensors[0].options().dtype(acc_scalar_type(tensors[0].scalar_type())));
  group_norms_cpu(to_dtype(tensors[0].scalar_type()), list, groups, num_groups, norms.data_ptr(),
                  at::get_num_threads());
  return norms;
}

}  // namespace

TORCH_LIBRARY(easyscale, m) {
  m.def("canonical_sum(Tensor[] inputs, int k, ScalarType? out_dtype=None) -> Tensor[]");
  m.def("fold_(Tensor(a!)[] acc, Tensor[] src, float scale, bool accumulate, bool[]? frozen=None) -> ()");
  m.def("fold_plan_(Tensor(a!) out, Tensor[] pushed, int[] plan, int result, float scale=1.0) -> ()");
  m.def("group_norms(Tensor[] tensors, int[] group_of, int num_groups) -> Tensor");
}

TORCH_LIBRARY_IMPL(easyscale, CPU, m) {
  m.impl("canonical_sum", &canonical_sum_cpu_op);
  m.impl("fold_", &fold_cpu_op);
  m.impl("fold_plan_", &fold_plan_cpu_op);
  m.impl("group_norms", &group_norms_cpu_op);
}

}  // namespace es
