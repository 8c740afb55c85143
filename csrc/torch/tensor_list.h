// Turns torch tensor lists into the core's raw TensorList, with the checks
// both backends share. Header-only glue; the core never sees a Tensor.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "../core/reduce.h"

namespace es {

inline DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::F32;
    case at::kDouble: return DType::F64;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    default:
      TORCH_CHECK_TYPE(false, "easyscale reductions take float32, float64, float16 or bfloat16 tensors, got ", t);
  }
}

inline at::ScalarType acc_scalar_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// All tensors share dtype and device and are contiguous (we never copy to fix
// that silently: a hidden copy would defeat the in-place fold).
inline void check_uniform(at::TensorList tensors, const char* op) {
  TORCH_CHECK(!tensors.empty(), op, ": needs at least one tensor");
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), op, ": all tensors must share a dtype, got ",
                tensors[0].scalar_type(), " and ", t.scalar_type());
    TORCH_CHECK(t.device() == tensors[0].device(), op, ": all tensors must be on one device, got ",
                tensors[0].device(), " and ", t.device());
    TORCH_CHECK(t.is_contiguous(), op, ": tensors must be contiguous; call .contiguous() first");
  }
  to_dtype(tensors[0].scalar_type());
}

// inputs are worker-major: inputs[w * T + t]. Outputs are allocated here.
inline TensorList sum_list(at::TensorList inputs, int64_t k, std::vector<at::Tensor>& outputs,
                           at::ScalarType out_type) {
  check_uniform(inputs, "canonical_sum");
  TORCH_CHECK(k >= 1 && static_cast<int64_t>(inputs.size()) % k == 0, "canonical_sum: ", inputs.size(),
              " tensors do not split into k=", k, " equal lists");
  const int64_t n = static_cast<int64_t>(inputs.size()) / k;
  TensorList list;
  list.k = k;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t w = 0; w < k; ++w) {
      const at::Tensor& x = inputs[w * n + t];
      TORCH_CHECK(x.sizes() == inputs[t].sizes(), "canonical_sum: tensor ", t, " of list ", w, " has shape ",
                  x.sizes(), ", list 0 has ", inputs[t].sizes());
      list.inputs.push_back(x.data_ptr());
    }
    outputs.push_back(at::empty(inputs[t].sizes(), inputs[t].options().dtype(out_type)));
    list.outputs.push_back(outputs.back().data_ptr());
    list.numels.push_back(inputs[t].numel());
  }
  return list;
}

inline at::ScalarType sum_out_type(at::TensorList inputs, std::optional<at::ScalarType> out_dtype) {
  return out_dtype.value_or(inputs.empty() ? at::kFloat : inputs[0].scalar_type());
}

// acc[t] (+)= src[t] * scale for the tensors not marked frozen.
inline TensorList fold_list(at::TensorList acc, at::TensorList src, const std::optional<c10::List<bool>>& frozen) {
  check_uniform(src, "fold_");
  check_uniform(acc, "fold_");
  TORCH_CHECK(acc.size() == src.size(), "fold_: ", acc.size(), " accumulators for ", src.size(), " sources");
  TORCH_CHECK(!frozen || frozen->size() == src.size(), "fold_: frozen mask has ", frozen ? frozen->size() : 0,
              " entries for ", src.size(), " tensors");
  TORCH_CHECK(acc[0].scalar_type() == acc_scalar_type(src[0].scalar_type()), "fold_: accumulators for ",
              src[0].scalar_type(), " gradients must be ", acc_scalar_type(src[0].scalar_type()), ", got ",
              acc[0].scalar_type());
  TORCH_CHECK(acc[0].device() == src[0].device(), "fold_: accumulators on ", acc[0].device(), ", sources on ",
              src[0].device());
  TensorList list;
  for (size_t t = 0; t < src.size(); ++t) {
    if (frozen && frozen->get(t)) continue;  // frozen: no copy, no reduction
    TORCH_CHECK(acc[t].sizes() == src[t].sizes(), "fold_: tensor ", t, " has shape ", src[t].sizes(),
                " but its accumulator ", acc[t].sizes());
    list.inputs.push_back(src[t].data_ptr());
    list.outputs.push_back(acc[t].data_ptr());
    list.numels.push_back(src[t].numel());
  }
  return list;
}

// Tensors with group -1 are frozen and skipped.
inline TensorList norms_list(at::TensorList tensors, at::IntArrayRef group_of, int64_t num_groups,
                             std::vector<int32_t>& groups) {
  check_uniform(tensors, "group_norms");
  TORCH_CHECK(group_of.size() == tensors.size(), "group_norms: ", group_of.size(), " group indices for ",
              tensors.size(), " tensors");
  TORCH_CHECK(num_groups >= 0, "group_norms: num_groups must be >= 0");
  TensorList list;
  for (size_t t = 0; t < tensors.size(); ++t) {
    TORCH_CHECK(group_of[t] >= -1 && group_of[t] < num_groups, "group_norms: group index ", group_of[t],
                " outside [-1, ", num_groups, ")");
    if (group_of[t] < 0) continue;
    list.inputs.push_back(tensors[t].data_ptr());
    list.numels.push_back(tensors[t].numel());
    groups.push_back(static_cast<int32_t>(group_of[t]));
  }
  return list;
}

// A fold plan's operands: `pushed` and `out` of one float type, device and size; `plan` flat (push, dst, src,
// accumulate) quadruples. Checked here for shapes, by the core for the plan itself.
inline std::vector<PlanOp> plan_operands(const at::Tensor& out, at::TensorList pushed, at::IntArrayRef plan,
                                         std::vector<const void*>& pointers) {
  check_uniform(pushed, "fold_plan_");
  TORCH_CHECK(out.scalar_type() == pushed[0].scalar_type() && out.device() == pushed[0].device() &&
                  out.is_contiguous(),
              "fold_plan_: out must be a contiguous tensor of the pushed tensors' dtype and device");
  for (const at::Tensor& t : pushed) {
    TORCH_CHECK(t.numel() == out.numel(), "fold_plan_: a pushed tensor has ", t.numel(), " elements, out ",
                out.numel());
    pointers.push_back(t.data_ptr());
  }
  TORCH_CHECK(plan.size() % 4 == 0, "fold_plan_: the plan is (push, dst, src, accumulate) quadruples");
  std::vector<PlanOp> ops;
  for (size_t j = 0; j < plan.size(); j += 4)
    ops.push_back({static_cast<int32_t>(plan[j]), static_cast<int32_t>(plan[j + 1]), static_cast<int32_t>(plan[j + 2]),
                   static_cast<int32_t>(plan[j + 3])});
  return ops;
}

}  // namespace es
