#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "canonical_tree.h"
#include "reduce.h"

namespace es {

void check_list(const TensorList& list, const char* op) {
  const auto t = static_cast<size_t>(list.size());
  if (list.k < 1 || list.inputs.size() != t * static_cast<size_t>(list.k))
    throw std::invalid_argument(std::string(op) + ": expected " + std::to_string(t) + " x " +
                                std::to_string(list.k) + " inputs, got " + std::to_string(list.inputs.size()));
  if (!list.outputs.empty() && list.outputs.size() != t)
    throw std::invalid_argument(std::string(op) + ": expected " + std::to_string(t) + " outputs, got " +
                                std::to_string(list.outputs.size()));
  if (list.k > (int64_t(1) << 32))
    throw std::invalid_argument(std::string(op) + ": at most 2^32 inputs per tensor");
}

void check_plan(DType acc, const std::vector<PlanOp>& plan, int64_t pushes, int result) {
  if (acc != DType::F32 && acc != DType::F64)
    throw std::invalid_argument(std::string("fold_plan: partial sums are float32 or float64, got ") + dtype_name(acc));
  bool written[kMaxPlanSlots] = {};
  auto slot_ok = [](int s) { return s >= 0 && s < kMaxPlanSlots; };
  for (const PlanOp& op : plan) {
    const bool pushed = op.src == FoldOp::kPushed;
    if (!slot_ok(op.dst) || (!pushed && !slot_ok(op.src)) || (pushed && (op.push < 0 || op.push >= pushes)))
      throw std::invalid_argument("fold_plan: an operation names a slot outside [0, " + std::to_string(kMaxPlanSlots) +
                                  ") or a push outside [0, " + std::to_string(pushes) + ")");
    if ((op.accumulate && !written[op.dst]) || (!pushed && !written[op.src]))
      throw std::invalid_argument("fold_plan: an operation reads slot " + std::to_string(op.accumulate ? op.dst : op.src) +
                                  " before any operation wrote it");
    written[op.dst] = true;
  }
  if (!slot_ok(result) || !written[result])
    throw std::invalid_argument("fold_plan: no operation writes the result slot " + std::to_string(result));
}

namespace {

struct Chunk { int64_t tensor, begin, end; };

std::vector<Chunk> chunks_of(const std::vector<int64_t>& numels, int64_t chunk) {
  std::vector<Chunk> out;
  for (int64_t t = 0; t < static_cast<int64_t>(numels.size()); ++t)
    for (int64_t b = 0; b < numels[t]; b += chunk) out.push_back({t, b, std::min(numels[t], b + chunk)});
  return out;
}

// Runs body(chunk) over every chunk; each element is written by exactly one
// chunk, so the thread count changes speed only.
template <typename Body>
void parallel_chunks(const std::vector<Chunk>& chunks, int num_threads, Body body) {
  const int64_t n = static_cast<int64_t>(chunks.size());
#pragma omp parallel for schedule(static) num_threads(num_threads > 0 ? num_threads : 1)
  for (int64_t i = 0; i < n; ++i) body(chunks[i]);
}

}  // namespace

constexpr int64_t kRunWidth = 256;

// canonical_tree_sum evaluated for a run of elements at once: the same
// binary counter, each stack entry a vector of `width` partial sums, so the
// inner loops vectorise. Bitwise equal to the scalar form (tested).
template <typename A, typename T>
void canonical_tree_sum_run(const T* const* srcs, int64_t k, int64_t begin, int64_t width, A* out) {
  constexpr int kRows = 34;  // binary-counter depth for k <= 2^32 (check_list)
  A stack[kRows][kRunWidth];
  int64_t sizes[kRows];
  int depth = 0;
  for (int64_t j = 0; j < k; ++j) {
    A* v = stack[depth];
    for (int64_t i = 0; i < width; ++i) v[i] = to_acc(srcs[j][begin + i]);
    int64_t size = 1;
    while (depth > 0 && sizes[depth - 1] == size) {
      A* left = stack[depth - 1];
      const A* right = stack[depth];
      for (int64_t i = 0; i < width; ++i) left[i] = add_rn(left[i], right[i]);
      size *= 2;
      --depth;
    }
    sizes[depth++] = size;
  }
  A* acc = stack[--depth];
  while (depth > 0) {
    const A* left = stack[--depth];
    for (int64_t i = 0; i < width; ++i) acc[i] = add_rn(left[i], acc[i]);
  }
  for (int64_t i = 0; i < width; ++i) out[i] = acc[i];
}

void canonical_sum_cpu(DType in, DType out, const TensorList& list, int num_threads) {
  check_list(list, "canonical_sum");
  dispatch_dtype(in, [&](auto in_tag) {
    using T = decltype(in_tag);
    using A = typename Acc<T>::type;
    auto run = [&](auto out_tag) {
      using O = decltype(out_tag);
      const int64_t k = list.k;
      parallel_chunks(chunks_of(list.numels, kChunk), num_threads, [&](const Chunk& c) {
        const T* const* srcs = reinterpret_cast<const T* const*>(list.inputs.data() + c.tensor * k);
        O* dst = static_cast<O*>(list.outputs[c.tensor]);
        A sums[kRunWidth];
        for (int64_t at = c.begin; at < c.end; at += kRunWidth) {
          const int64_t width = std::min<int64_t>(kRunWidth, c.end - at);
          canonical_tree_sum_run<A, T>(srcs, k, at, width, sums);
          for (int64_t i = 0; i < width; ++i) dst[at + i] = from_acc<O>(sums[i]);
        }
      });
    };
    if (out == in) run(T{});
    else if (out == (sizeof(A) == 8 ? DType::F64 : DType::F32)) run(A{});
    else throw std::invalid_argument(std::string("canonical_sum: output dtype must be ") + dtype_name(in) +
                                     " or its accumulation type, got " + dtype_name(out));
  });
}

void fold_cpu(DType in, const TensorList& list, double scale, bool accumulate, int num_threads) {
  check_list(list, "fold");
  if (list.k != 1) throw std::invalid_argument("fold: takes one input per tensor");
  dispatch_dtype(in, [&](auto in_tag) {
    using T = decltype(in_tag);
    using A = typename Acc<T>::type;
    const A s = static_cast<A>(scale);
    parallel_chunks(chunks_of(list.numels, kChunk), num_threads, [&](const Chunk& c) {
      const T* src = static_cast<const T*>(list.inputs[c.tensor]);
      A* acc = static_cast<A*>(list.outputs[c.tensor]);
      for (int64_t i = c.begin; i < c.end; ++i) acc[i] = fold_leaf<A>(acc[i], to_acc(src[i]), s, accumulate);
    });
  });
}

void fold_plan_cpu(DType acc, const std::vector<const void*>& pushed, void* out, int64_t numel,
                   const std::vector<PlanOp>& plan, int result, double scale, int num_threads) {
  check_plan(acc, plan, static_cast<int64_t>(pushed.size()), result);
  dispatch_dtype(acc, [&](auto tag) {
    using A = decltype(tag);
    if constexpr (std::is_same_v<A, float> || std::is_same_v<A, double>) {
      int slots = result + 1;
      for (const PlanOp& op : plan) slots = std::max({slots, op.dst + 1, op.src + 1});
      const A pushed_scale = static_cast<A>(scale);
      A* dst = static_cast<A*>(out);
      // Runs of kRunWidth elements, their slots a small tile that stays in cache: each op a vector loop.
      parallel_chunks(chunks_of({numel}, kChunk), num_threads, [&](const Chunk& c) {
        std::vector<A> tile(static_cast<size_t>(slots) * kRunWidth);
        for (int64_t at = c.begin; at < c.end; at += kRunWidth) {
          const int64_t width = std::min<int64_t>(kRunWidth, c.end - at);
          for (const PlanOp& op : plan) {
            A* d = tile.data() + op.dst * kRunWidth;
            const bool is_push = op.src == FoldOp::kPushed;
            const A* v = is_push ? static_cast<const A*>(pushed[op.push]) + at : tile.data() + op.src * kRunWidth;
            const A s = is_push ? pushed_scale : A(1);
            if (op.accumulate)
              for (int64_t i = 0; i < width; ++i) d[i] = fold_leaf<A>(d[i], v[i], s, true);
            else
              for (int64_t i = 0; i < width; ++i) d[i] = fold_leaf<A>(A(0), v[i], s, false);
          }
          std::copy_n(tile.data() + result * kRunWidth, width, dst + at);
        }
      });
    }
  });
}

void group_norms_cpu(DType in, const TensorList& list, const std::vector<int32_t>& group_of,
                     int64_t num_groups, void* norms, int num_threads) {
  check_list(list, "group_norms");
  if (static_cast<int64_t>(group_of.size()) != list.size())
    throw std::invalid_argument("group_norms: need one group index per tensor");
  for (int32_t g : group_of)
    if (g < 0 || g >= num_groups)
      throw std::invalid_argument("group_norms: group index " + std::to_string(g) + " outside [0, " +
                                  std::to_string(num_groups) + ")");
  dispatch_dtype(in, [&](auto in_tag) {
    using T = decltype(in_tag);
    using A = typename Acc<T>::type;
    // Tile partials first (parallel), then the tree over tiles, tensors, groups.
    std::vector<Chunk> tiles = chunks_of(list.numels, kNormTile);
    std::vector<A> tile_sums(tiles.size());
    std::vector<int64_t> first_tile(list.size() + 1, 0);
    for (int64_t t = 0; t < list.size(); ++t)
      first_tile[t + 1] = first_tile[t] + (list.numels[t] + kNormTile - 1) / kNormTile;
    const int64_t n_tiles = static_cast<int64_t>(tiles.size());
#pragma omp parallel for schedule(static) num_threads(num_threads > 0 ? num_threads : 1)
    for (int64_t i = 0; i < n_tiles; ++i) {
      const Chunk& c = tiles[i];
      const T* x = static_cast<const T*>(list.inputs[c.tensor]);
      tile_sums[i] = canonical_tree_sum<A>(c.end - c.begin, [&](int64_t j) {
        A v = to_acc(x[c.begin + j]);
        return mul_rn(v, v);
      });
    }
    A* out = static_cast<A*>(norms);
    for (int64_t g = 0; g < num_groups; ++g) {
      std::vector<int64_t> members;
      for (int64_t t = 0; t < list.size(); ++t)
        if (group_of[t] == g) members.push_back(t);
      A sq = canonical_tree_sum<A>(static_cast<int64_t>(members.size()), [&](int64_t m) {
        int64_t t = members[m];
        return canonical_tree_sum<A>(first_tile[t + 1] - first_tile[t],
                                     [&](int64_t j) { return tile_sums[first_tile[t] + j]; });
      });
      out[g] = sqrt_rn(sq);
    }
  });
}

}  // namespace es
