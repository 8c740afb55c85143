#include "knapsack.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace easyscale::sched {

std::vector<int64_t> knapsack(const std::vector<std::vector<double>>& values, int64_t gpus) {
  if (gpus < 0) throw std::invalid_argument("expected a non-negative number of GPUs");
  std::vector<double> best(gpus + 1, 0.0), next(gpus + 1);
  std::vector<std::vector<int64_t>> picks;  // per job, its count on each row it computed
  picks.reserve(values.size());
  int64_t reach = 0;
  for (const auto& all : values) {
    if (all.empty()) throw std::invalid_argument("expected each job's values to start with its worth on 0 GPUs");
    int64_t length = std::min<int64_t>(all.size(), gpus + 1);
    for (int64_t k = 0; k < length; ++k)
      if (!std::isfinite(all[k])) throw std::invalid_argument("expected finite values");
    // up to the last count worth more than every smaller one
    int64_t last = 0;
    double record = all[0];
    for (int64_t k = 1; k < length; ++k)
      if (all[k] > record) record = all[k], last = k;
    length = last + 1;
    const int64_t rows = std::min(gpus, reach + length - 1) + 1;
    std::vector<int64_t>& pick = picks.emplace_back(rows);
    for (int64_t c = 0; c < rows; ++c) {
      double top = best[c] + all[0];
      int64_t at = 0;
      for (int64_t k = 1, end = std::min(c + 1, length); k < end; ++k) {
        const double total = best[c - k] + all[k];
        if (total > top) top = total, at = k;
      }
      next[c] = top;
      pick[c] = at;
    }
    std::copy(next.begin(), next.begin() + rows, best.begin());
    std::fill(best.begin() + rows, best.end(), best[rows - 1]);
    reach = rows - 1;
  }
  std::vector<int64_t> counts(values.size());
  int64_t left = gpus;
  for (size_t j = values.size(); j-- > 0;) {
    const auto& pick = picks[j];
    counts[j] = pick[std::min<int64_t>(left, pick.size() - 1)];
    left -= counts[j];
  }
  return counts;
}

}  // namespace easyscale::sched
