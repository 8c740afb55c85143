#include "canonical_tree.h"

#include <functional>

#include "check.h"
#include "reduce_math.h"

using namespace es;

// Evaluate the tree symbolically: the string of an evaluation order.
static std::string tree_string(int64_t lo, int64_t hi) {
  if (hi - lo == 1) return std::to_string(lo);
  int64_t mid = canonical_split(lo, hi);
  return "(" + tree_string(lo, mid) + "+" + tree_string(mid, hi) + ")";
}

TEST(split_shapes) {
  CHECK(tree_string(0, 1) == "0");
  CHECK(tree_string(0, 4) == "((0+1)+(2+3))");
  CHECK(tree_string(0, 5) == "(((0+1)+(2+3))+4)");
  CHECK(tree_string(0, 7) == "(((0+1)+(2+3))+((4+5)+6))");
}

TEST(nodes) {
  CHECK(is_canonical_node(0, 8, 8));
  CHECK(is_canonical_node(4, 6, 6));
  CHECK(!is_canonical_node(1, 3, 8));
  CHECK(!is_canonical_node(0, 3, 8));
  CHECK(!is_canonical_node(0, 9, 8));
}

TEST(local_roots_cover_range) {
  for (int64_t n = 1; n <= 33; ++n)
    for (int64_t a = 0; a < n; ++a)
      for (int64_t b = a + 1; b <= n; ++b) {
        auto roots = local_roots(a, b, n);
        int64_t at = a;
        for (Range r : roots) {
          CHECK(r.lo == at && is_canonical_node(r.lo, r.hi, n));
          at = r.hi;
        }
        CHECK(at == b);
      }
  CHECK(throws<std::invalid_argument>([] { local_roots(2, 2, 4); }));
}

// Folding leaves of [a, b) through FoldStack, then the local roots of every
// split of [0, n) through a second FoldStack, reproduces the tree string.
static std::string fold_strings(const std::vector<int64_t>& cuts, int64_t n) {
  std::vector<std::string> roots;
  for (size_t p = 0; p + 1 < cuts.size(); ++p) {
    FoldStack stack(n);
    std::vector<std::string> slots(64);
    for (int64_t i = cuts[p]; i < cuts[p + 1]; ++i)
      for (FoldOp op : stack.push({i, i + 1})) {
        std::string v = op.src == FoldOp::kPushed ? std::to_string(i) : slots[op.src];
        slots[op.dst] = op.accumulate ? "(" + slots[op.dst] + "+" + v + ")" : v;
      }
    for (int s : stack.slots()) roots.push_back(slots[s]);
    CHECK(stack.nodes().size() == local_roots(cuts[p], cuts[p + 1], n).size());
  }
  FoldStack top(n);
  std::vector<std::string> slots(64);
  size_t next = 0;
  for (size_t p = 0; p + 1 < cuts.size(); ++p)
    for (Range r : local_roots(cuts[p], cuts[p + 1], n)) {
      const std::string& v = roots[next++];
      for (FoldOp op : top.push(r)) {
        std::string src = op.src == FoldOp::kPushed ? v : slots[op.src];
        slots[op.dst] = op.accumulate ? "(" + slots[op.dst] + "+" + src + ")" : src;
      }
    }
  CHECK(top.nodes().size() == 1);
  return slots[top.slots()[0]];
}

TEST(fold_matches_tree_for_every_split) {
  for (int64_t n = 1; n <= 12; ++n) {
    // every composition of n into contiguous parts
    for (int64_t mask = 0; mask < (int64_t(1) << (n - 1)); ++mask) {
      std::vector<int64_t> cuts{0};
      for (int64_t i = 1; i < n; ++i)
        if (mask >> (i - 1) & 1) cuts.push_back(i);
      cuts.push_back(n);
      CHECK(fold_strings(cuts, n) == tree_string(0, n));
    }
  }
}

TEST(fold_uses_few_slots) {
  FoldStack stack(1024);
  for (int64_t i = 0; i < 1024; ++i) stack.push({i, i + 1});
  CHECK(stack.max_slots() <= 11);
  CHECK(stack.nodes().size() == 1);
}

TEST(fold_rejects_bad_pushes) {
  FoldStack stack(8);
  CHECK(throws<std::invalid_argument>([&] { stack.push({1, 3}); }));
  stack.push({0, 1});
  CHECK(throws<std::invalid_argument>([&] { stack.push({2, 3}); }));
}

TEST(scalar_tree_matches_planner) {
  // canonical_tree_sum's binary counter and the blocked form the GPU runs
  // evaluate the same tree: check on values where the association is
  // visible in the rounding.
  for (int64_t n = 1; n <= 80; ++n) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = (i % 3 == 0 ? 1e8f : 1.0f) * (i % 2 ? -1.0f : 1.0f) + 0.37f * i;
    std::function<float(int64_t, int64_t)> rec = [&](int64_t lo, int64_t hi) -> float {
      if (hi - lo == 1) return v[lo];
      int64_t mid = canonical_split(lo, hi);
      return rec(lo, mid) + rec(mid, hi);
    };
    float expect = rec(0, n);
    auto leaf = [&](int64_t i) { return v[i]; };
    CHECK(bit_cast<uint32_t>(expect) == bit_cast<uint32_t>(canonical_tree_sum<float>(n, leaf)));
    CHECK(bit_cast<uint32_t>(expect) == bit_cast<uint32_t>(canonical_tree_sum_blocked<float>(n, leaf)));
  }
}

TEST_MAIN()
