#include "reduce.h"

#include <functional>
#include <random>

#include "canonical_tree.h"
#include "check.h"

using namespace es;

// Reference: the tree written as recursion over canonical_split.
template <typename A>
static A tree_ref(int64_t lo, int64_t hi, const std::function<A(int64_t)>& leaf) {
  if (hi - lo == 1) return leaf(lo);
  int64_t mid = canonical_split(lo, hi);
  return tree_ref<A>(lo, mid, leaf) + tree_ref<A>(mid, hi, leaf);
}

// Values with wide dynamic range so any change of association changes bits.
static std::vector<float> spiky(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng) * (rng() % 7 == 0 ? 1e6f : 1.0f);
  return v;
}

template <typename U>
static bool same_bits(const U& a, const U& b) { return memcmp(&a, &b, sizeof(U)) == 0; }

TEST(half_roundtrip_exhaustive) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = half_to_float(static_cast<uint16_t>(h));
    bool nan = (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu);
    if (!nan) CHECK(float_to_half(f) == h);
  }
}

TEST(float_to_half_rounds_like_the_compiler) {
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t bits = rng();
    float f = bit_cast<float>(bits);
    if (f != f) continue;
    _Float16 ref = static_cast<_Float16>(f);
    CHECK(float_to_half(f) == bit_cast<uint16_t>(ref));
  }
}

TEST(bfloat16_rounds_to_nearest_even) {
  CHECK(float_to_bf16(1.0f) == 0x3F80);
  CHECK(float_to_bf16(bit_cast<float>(0x3F808000u)) == 0x3F80);  // tie -> even
  CHECK(float_to_bf16(bit_cast<float>(0x3F818000u)) == 0x3F82);  // tie -> even (up)
  CHECK(float_to_bf16(bit_cast<float>(0x3F808001u)) == 0x3F81);
  CHECK(bf16_to_float(0x3F80) == 1.0f);
}

TEST(canonical_sum_matches_reference_and_ignores_threads) {
  for (int64_t k : {1, 2, 3, 5, 8, 13}) {
    const int64_t n = 40000;  // several chunks
    std::vector<std::vector<float>> in;
    for (int64_t j = 0; j < k; ++j) in.push_back(spiky(n, 100 + j));
    TensorList list;
    list.k = k;
    for (auto& v : in) list.inputs.push_back(v.data());
    list.numels = {n};
    std::vector<float> base;
    for (int threads : {1, 2, 3, 7}) {
      std::vector<float> out(n);
      list.outputs = {out.data()};
      canonical_sum_cpu(DType::F32, DType::F32, list, threads);
      if (base.empty()) {
        base = out;
        for (int64_t i = 0; i < n; i += 97)
          CHECK(same_bits(out[i], tree_ref<float>(0, k, [&](int64_t j) { return in[j][i]; })));
      } else {
        CHECK(memcmp(out.data(), base.data(), n * sizeof(float)) == 0);
      }
    }
  }
}

TEST(canonical_sum_half_accumulates_in_float) {
  const int64_t k = 6, n = 1000;
  std::vector<std::vector<uint16_t>> in(k, std::vector<uint16_t>(n));
  for (int64_t j = 0; j < k; ++j) {
    auto v = spiky(n, j);
    for (int64_t i = 0; i < n; ++i) in[j][i] = float_to_half(v[i] * 1e-3f);
  }
  TensorList list;
  list.k = k;
  for (auto& v : in) list.inputs.push_back(v.data());
  list.numels = {n};
  std::vector<float> out(n);
  list.outputs = {out.data()};
  canonical_sum_cpu(DType::F16, DType::F32, list, 2);
  for (int64_t i = 0; i < n; ++i)
    CHECK(same_bits(out[i], tree_ref<float>(0, k, [&](int64_t j) { return half_to_float(in[j][i]); })));
  CHECK(throws<std::invalid_argument>([&] { canonical_sum_cpu(DType::F16, DType::F64, list, 1); }));
}

TEST(fold_start_and_accumulate) {
  std::vector<float> x{1.5f, -0.0f, 3.0f}, acc(3, 99.0f);
  TensorList list;
  list.inputs = {x.data()};
  list.outputs = {acc.data()};
  list.numels = {3};
  fold_cpu(DType::F32, list, 0.5, false, 1);
  CHECK(acc[0] == 0.75f && std::signbit(acc[1]) && acc[2] == 1.5f);  // -0 survives a start
  fold_cpu(DType::F32, list, 0.5, true, 1);
  CHECK(acc[0] == 1.5f && acc[2] == 3.0f);
}

// The top of the tree over n leaves split evenly over `procs` processes: every process's local roots pushed
// in order. Returns the plan; `result` gets the slot holding the root.
static std::vector<PlanOp> top_plan(int64_t n, int64_t procs, int64_t* pushes, int* result) {
  FoldStack top(n);
  std::vector<PlanOp> plan;
  int32_t push = 0;
  for (int64_t p = 0; p < procs; ++p)
    for (const Range& r : local_roots(n * p / procs, n * (p + 1) / procs, n)) {
      for (const FoldOp& op : top.push(r)) plan.push_back({push, op.dst, op.src, op.accumulate});
      ++push;
    }
  *pushes = push;
  *result = top.slots()[0];
  return plan;
}

TEST(fold_plan_equals_its_folds_one_by_one) {
  const double kScale = 1.0 / 3;  // a leaf's weight 1/N, not a power of two: every push rounds
  for (auto [n, procs] : std::vector<std::pair<int64_t, int64_t>>{{3, 3}, {7, 3}, {12, 5}, {64, 64}, {1000, 7}}) {
    int64_t pushes = 0;
    int result = 0;
    const std::vector<PlanOp> plan = top_plan(n, procs, &pushes, &result);
    const int64_t numel = 1000;  // runs of 256 and a tail
    std::vector<std::vector<float>> pushed;
    std::vector<const void*> pointers;
    for (int64_t j = 0; j < pushes; ++j) {
      pushed.push_back(spiky(numel, 100 + j));
      pointers.push_back(pushed.back().data());
    }
    std::vector<std::vector<float>> slots(kMaxPlanSlots, std::vector<float>(numel));
    for (const PlanOp& op : plan) {
      TensorList list;
      list.inputs = {op.src == FoldOp::kPushed ? pushed[op.push].data() : slots[op.src].data()};
      list.outputs = {slots[op.dst].data()};
      list.numels = {numel};
      // pushes at the plan's scale, merges of partial sums at 1
      fold_cpu(DType::F32, list, op.src == FoldOp::kPushed ? kScale : 1.0, op.accumulate, 1);
    }
    std::vector<float> out(numel);
    fold_plan_cpu(DType::F32, pointers, out.data(), numel, plan, result, kScale, 2);
    CHECK(memcmp(out.data(), slots[result].data(), numel * sizeof(float)) == 0);
    // in place: out one of the pushed buffers
    std::vector<float> first = pushed[0];
    pointers[0] = first.data();
    fold_plan_cpu(DType::F32, pointers, first.data(), numel, plan, result, kScale, 2);
    CHECK(memcmp(first.data(), slots[result].data(), numel * sizeof(float)) == 0);
  }
  std::vector<float> x(4), out(4);
  std::vector<const void*> one{x.data()};
  CHECK(throws<std::invalid_argument>([&] {  // reads slot 1 before anything wrote it
    fold_plan_cpu(DType::F32, one, out.data(), 4, {{0, 0, FoldOp::kPushed, 0}, {0, 0, 1, 1}}, 0, 1.0, 1);
  }));
  CHECK(throws<std::invalid_argument>([&] {  // the result slot is never written
    fold_plan_cpu(DType::F32, one, out.data(), 4, {{0, 0, FoldOp::kPushed, 0}}, 1, 1.0, 1);
  }));
  CHECK(throws<std::invalid_argument>([&] {  // partial sums are never half precision
    fold_plan_cpu(DType::F16, one, out.data(), 4, {{0, 0, FoldOp::kPushed, 0}}, 0, 1.0, 1);
  }));
}

TEST(group_norms_are_one_canonical_tree) {
  // Tiles, tensors and groups are all subtrees: the result equals one tree
  // over the concatenation when a group holds a single tensor.
  std::vector<int64_t> sizes{1, 2047, 2048, 2049, 10000};
  std::vector<std::vector<float>> data;
  TensorList list;
  for (size_t t = 0; t < sizes.size(); ++t) {
    data.push_back(spiky(sizes[t], 7 + t));
    list.inputs.push_back(data.back().data());
    list.numels.push_back(sizes[t]);
  }
  std::vector<int32_t> groups{0, 1, 2, 3, 4};
  std::vector<float> norms(5), again(5);
  group_norms_cpu(DType::F32, list, groups, 5, norms.data(), 1);
  group_norms_cpu(DType::F32, list, groups, 5, again.data(), 3);
  for (size_t t = 0; t < sizes.size(); ++t) {
    const auto& v = data[t];
    float sq = canonical_tree_sum<float>(sizes[t], [&](int64_t i) { return v[i] * v[i]; });
    CHECK(same_bits(norms[t], std::sqrt(sq)));
    CHECK(same_bits(norms[t], again[t]));
  }
  CHECK(throws<std::invalid_argument>([&] { group_norms_cpu(DType::F32, list, {0, 0, 0, 0, 9}, 2, norms.data(), 1); }));
}

TEST_MAIN()
