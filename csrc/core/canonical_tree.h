// Host-side bookkeeping of the canonical reduction tree over N virtual
// workers (the same tree canonical_tree_sum evaluates per element).
//
// A process that owns virtual ranks [a, b) folds its workers' gradients as
// they finish into the maximal tree nodes inside [a, b) ("local roots"); the
// processes then exchange those partial sums and finish the tree. FoldStack
// says which buffer operations that takes; it does no arithmetic itself, so
// the same plan drives CPU buffers, CUDA buffers and the cross-process step.
#pragma once
#include <cstdint>
#include <vector>

namespace es {

struct Range {
  int64_t lo;
  int64_t hi;
  bool operator==(const Range& o) const { return lo == o.lo && hi == o.hi; }
};

// Split point of a tree node [lo, hi) with hi - lo >= 2.
int64_t canonical_split(int64_t lo, int64_t hi);

// Whether [lo, hi) is a node of the canonical tree over [0, n).
bool is_canonical_node(int64_t lo, int64_t hi, int64_t n);

// The maximal tree nodes contained in [a, b), left to right.
std::vector<Range> local_roots(int64_t a, int64_t b, int64_t n);

// One buffer operation of a streaming fold: slot[dst] = (accumulate ?
// slot[dst] + v : v), where v is the pushed buffer (src == kPushed, scaled
// by the caller's leaf scale) or slot[src] (unscaled).
struct FoldOp {
  static constexpr int kPushed = -1;
  int dst;
  int src;
  bool accumulate;
};

class FoldStack {
 public:
  explicit FoldStack(int64_t n);

  // Pushes the value of tree node `node`, which must start where the
  // previous push ended (or anywhere, for the first push). Returns the
  // operations to apply, in order. Throws std::invalid_argument when the
  // node is not a tree node or out of order.
  std::vector<FoldOp> push(Range node);

  // Nodes currently held and the slot of each, left to right.
  std::vector<Range> nodes() const;
  std::vector<int> slots() const;

  // Most slots ever in use at once: how many partial buffers a caller needs.
  int max_slots() const { return max_slots_; }
  int64_t n() const { return n_; }
  void reset();

 private:
  struct Entry { Range node; int slot; };
  int take_slot();

  int64_t n_;
  std::vector<Entry> stack_;
  std::vector<int> free_slots_;  // kept sorted descending: lowest free slot at the back
  int next_slot_ = 0;
  int max_slots_ = 0;
};

}  // namespace es
