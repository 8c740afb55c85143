#include "canonical_tree.h"

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>

namespace es {

namespace {
int64_t largest_pow2_below(int64_t size) {  // size >= 2
  int64_t p = 1;
  while (p * 2 < size) p *= 2;
  return p;
}

std::string show(Range r) {
  return "[" + std::to_string(r.lo) + ", " + std::to_string(r.hi) + ")";
}

void collect_roots(Range node, int64_t a, int64_t b, std::vector<Range>& out) {
  if (node.hi <= a || node.lo >= b) return;
  if (a <= node.lo && node.hi <= b) {
    out.push_back(node);
    return;
  }
  int64_t mid = canonical_split(node.lo, node.hi);
  collect_roots({node.lo, mid}, a, b, out);
  collect_roots({mid, node.hi}, a, b, out);
}
}  // namespace

int64_t canonical_split(int64_t lo, int64_t hi) {
  return lo + largest_pow2_below(hi - lo);
}

bool is_canonical_node(int64_t lo, int64_t hi, int64_t n) {
  if (lo < 0 || hi > n || lo >= hi) return false;
  Range cur{0, n};
  while (!(cur.lo == lo && cur.hi == hi)) {
    if (cur.hi - cur.lo < 2) return false;
    int64_t mid = canonical_split(cur.lo, cur.hi);
    if (hi <= mid) cur = {cur.lo, mid};
    else if (lo >= mid) cur = {mid, cur.hi};
    else return false;
  }
  return true;
}

std::vector<Range> local_roots(int64_t a, int64_t b, int64_t n) {
  if (n < 1 || a < 0 || b > n || a >= b)
    throw std::invalid_argument("local_roots: need 0 <= a < b <= n, got a=" + std::to_string(a) +
                                " b=" + std::to_string(b) + " n=" + std::to_string(n));
  std::vector<Range> out;
  collect_roots({0, n}, a, b, out);
  return out;
}

FoldStack::FoldStack(int64_t n) : n_(n) {
  if (n < 1) throw std::invalid_argument("FoldStack: n must be >= 1, got " + std::to_string(n));
}

void FoldStack::reset() {
  stack_.clear();
  free_slots_.clear();
  next_slot_ = 0;
}

int FoldStack::take_slot() {
  if (!free_slots_.empty()) {
    int s = free_slots_.back();
    free_slots_.pop_back();
    return s;
  }
  int s = next_slot_++;
  max_slots_ = std::max(max_slots_, next_slot_);
  return s;
}

std::vector<FoldOp> FoldStack::push(Range node) {
  if (!is_canonical_node(node.lo, node.hi, n_))
    throw std::invalid_argument("FoldStack.push: " + show(node) + " is not a node of the canonical tree over " +
                                std::to_string(n_) + " workers");
  if (!stack_.empty() && stack_.back().node.hi != node.lo)
    throw std::invalid_argument("FoldStack.push: " + show(node) + " out of order; the next node must start at " +
                                std::to_string(stack_.back().node.hi));
  std::vector<FoldOp> ops;
  if (!stack_.empty() && is_canonical_node(stack_.back().node.lo, node.hi, n_)) {
    ops.push_back({stack_.back().slot, FoldOp::kPushed, true});  // right child lands on its left sibling
    stack_.back().node.hi = node.hi;
  } else {
    int s = take_slot();
    ops.push_back({s, FoldOp::kPushed, false});
    stack_.push_back({node, s});
  }
  while (stack_.size() >= 2) {
    Entry& right = stack_[stack_.size() - 1];
    Entry& left = stack_[stack_.size() - 2];
    if (!is_canonical_node(left.node.lo, right.node.hi, n_)) break;
    ops.push_back({left.slot, right.slot, true});
    left.node.hi = right.node.hi;
    free_slots_.push_back(right.slot);
    std::sort(free_slots_.begin(), free_slots_.end(), std::greater<int>());
    stack_.pop_back();
  }
  return ops;
}

std::vector<Range> FoldStack::nodes() const {
  std::vector<Range> out;
  for (const Entry& e : stack_) out.push_back(e.node);
  return out;
}

std::vector<int> FoldStack::slots() const {
  std::vector<int> out;
  for (const Entry& e : stack_) out.push_back(e.slot);
  return out;
}

}  // namespace es
