#include "pollux_search.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <utility>

namespace easyscale::sched {
namespace {

constexpr double kFloor = 1e-3;      // added to every speedup: the power mean stays finite when a job gets nothing
constexpr int kMatingRounds = 100;   // pymoo's most rounds of mating a generation, to find children new to it
constexpr double kInf = std::numeric_limits<double>::infinity();

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

bool dominates(const Goals& f, const Goals& g) {
  return f[0] <= g[0] && f[1] <= g[1] && (f[0] < g[0] || f[1] < g[1]);
}

// The cells at [first, last) (indices, through `at`) cut so that their running total stays within `limit`: the
// excess comes off the last ones.
template <typename At>
void trim(const int64_t* first, const int64_t* last, int64_t limit, At at) {
  int64_t total = 0;
  for (const int64_t* i = first; i != last; ++i) {
    Cell& v = at(*i);
    v = static_cast<Cell>(std::max<int64_t>(std::min(total + v, limit) - total, 0));
    total += v;
  }
}

// A call's scratch space: on the stack up to `Inline` entries (the usual cluster), else on the heap. Cheaper
// than thread_local buffers, whose every access from a shared library is a call.
template <typename T, size_t Inline = 256>
class Scratch {
 public:
  explicit Scratch(size_t size) {
    if (size > Inline) heap_.resize(size);
    data_ = size > Inline ? heap_.data() : stack_;
    std::fill(data_, data_ + size, T{});
  }
  T* data() { return data_; }
  T& operator[](size_t i) { return data_[i]; }

 private:
  T stack_[Inline];
  std::vector<T> heap_;
  T* data_;
};

// States seen in a generation, hashed and compared where they lie (no copies): each must stay where it is (a
// State moved keeps its buffer) while the set is in use.
class Seen {
 public:
  explicit Seen(size_t size) : set_(0, Hash{size}, Equal{size}) {}
  bool insert(const State& s) { return set_.insert(s.data()).second; }
  void clear() { set_.clear(); }

 private:
  struct Hash {
    size_t size;
    size_t operator()(const Cell* s) const {  // 64 bits at a time, four independent lanes
      uint64_t h[4] = {1, 2, 3, 4}, word;
      const size_t words = size * sizeof(Cell) / sizeof(word), rest = size * sizeof(Cell) % sizeof(word);
      const char* bytes = reinterpret_cast<const char*>(s);
      for (size_t i = 0; i < words; ++i) {
        std::memcpy(&word, bytes + i * sizeof(word), sizeof(word));
        h[i % 4] = (h[i % 4] ^ word) * 0x100000001b3ULL;
      }
      word = 0;
      std::memcpy(&word, bytes + words * sizeof(word), rest);
      const uint64_t all = ((h[0] * 31 + h[1]) * 31 + h[2]) * 31 + (h[3] ^ word);
      return static_cast<size_t>(all ^ (all >> 29));
    }
  };
  struct Equal {
    size_t size;
    bool operator()(const Cell* a, const Cell* b) const { return std::equal(a, a + size, b); }
  };
  std::unordered_set<const Cell*, Hash, Equal> set_;
};

// pymoo's crowding distance ("cd") of each point within its front: per objective, the gap between its neighbours
// over the front's range (the front's ends: inf; a range of 0: 0), averaged; fronts of one or two points: inf.
void crowd(const std::vector<Goals>& goals, const std::vector<int64_t>& front, std::vector<double>& distance) {
  if (front.size() <= 2) {
    for (int64_t i : front) distance[i] = kInf;
    return;
  }
  for (int m = 0; m < 2; ++m) {
    std::vector<int64_t> order = front;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return goals[a][m] < goals[b][m]; });
    const double span = goals[order.back()][m] - goals[order.front()][m];
    if (span <= 0) continue;
    const size_t last = order.size() - 1;
    for (size_t k = 0; k <= last; ++k) {
      const double before = k == 0 ? kInf : goals[order[k]][m] - goals[order[k - 1]][m];
      const double after = k == last ? kInf : goals[order[k + 1]][m] - goals[order[k]][m];
      distance[order[k]] += (before + after) / span;
    }
  }
  for (int64_t i : front) distance[i] /= 2;
}

}  // namespace

Rng::Rng(uint64_t seed) {
  for (auto& s : s_) s = splitmix64(seed);
}

void Rng::shuffle(int64_t* first, int64_t* last) {
  for (int64_t i = last - first - 1; i > 0; --i) std::swap(first[i], first[below(i + 1)]);
}

std::vector<int64_t> Rng::permutation(int64_t n) {
  std::vector<int64_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  shuffle(p.data(), p.data() + n);
  return p;
}

Problem::Problem(int64_t jobs, int64_t nodes, int64_t node_axis, int64_t gpu_axis, std::vector<Cell> base,
                 std::vector<int64_t> capacity, std::vector<int64_t> max_gpus, std::vector<double> speedup,
                 std::vector<double> factor, double p, double scale)
    : jobs(jobs), nodes(nodes), node_axis(node_axis), gpu_axis(gpu_axis), base(std::move(base)),
      capacity(std::move(capacity)), max_gpus(std::move(max_gpus)), speedup(std::move(speedup)),
      factor(std::move(factor)), p(p), scale(scale) {
  if (jobs < 1 || nodes < 1 || gpu_axis < 1 || node_axis < std::min(nodes + 1, gpu_axis) ||
      this->base.size() != static_cast<size_t>(jobs * nodes) ||
      this->capacity.size() != static_cast<size_t>(nodes) || this->max_gpus.size() != static_cast<size_t>(jobs) ||
      this->factor.size() != static_cast<size_t>(jobs) ||
      this->speedup.size() != static_cast<size_t>(jobs * node_axis * gpu_axis))
    throw std::invalid_argument(
        "Pollux search: the arrays' shapes disagree with (jobs, nodes, node axis of at least min(nodes + 1, GPU "
        "axis), GPU axis)");
  for (int64_t c : this->capacity)
    if (c < 0 || c > std::numeric_limits<Cell>::max())
      throw std::invalid_argument("Pollux search: a node's GPUs must number 0 to " +
                                  std::to_string(std::numeric_limits<Cell>::max()));
}

Goals Problem::goals(const Cell* state) const {
  // Both objectives in one pass, each job's speedup looked up once. Locals, not members, in the loops: the
  // compiler cannot tell the writes from the members and would reload them.
  const int64_t J = jobs, N = nodes;  // a job's GPUs bound its nodes used: both within the table's axes
  Scratch<char> in_use(N);
  double power_sum = 0, speedups = 0;
  for (int64_t j = 0; j < J; ++j) {
    const Cell* row = state + j * N;
    int64_t used = 0, gpus = 0;
    for (int64_t n = 0; n < N; ++n) {
      used += row[n] != 0;
      gpus += row[n];
      in_use[n] |= row[n] > 0;
    }
    if (gpus < 0 || gpus >= gpu_axis)
      throw std::out_of_range("Pollux search: job " + std::to_string(j) + " holds " + std::to_string(gpus) +
                              " GPUs, beyond its speedup table");
    const double s = speedup[(j * node_axis + used) * gpu_axis + gpus];
    speedups += s;
    // the restart-discounted speedup, in the power mean (p = -1, Pollux's, without a pow)
    const double x = (std::equal(row, row + N, base.data() + j * N) ? s : s * factor[j]) * scale + kFloor;
    power_sum += p == -1.0 ? 1.0 / x : std::pow(x, p);
  }
  int64_t gpus_in_use = 0;
  for (int64_t n = 0; n < N; ++n) gpus_in_use += in_use[n] ? capacity[n] : 0;
  const double mean =
      p == -1.0 ? static_cast<double>(J) / power_sum : std::pow(power_sum / static_cast<double>(J), 1 / p);
  return {-mean, gpus_in_use > 0 ? -speedups / static_cast<double>(gpus_in_use) : 0.0};
}

void Problem::repair(Cell* state, Rng& rng) const {
  const int64_t J = jobs, N = nodes;  // locals: see goals()
  Scratch<int64_t> scratch(3 * N);  // per node: taken by a multi-node job, then GPUs held; a node order
  int64_t *taken = scratch.data(), *held = taken + N, *order = held + N;
  for (int64_t j = 0; j < J; ++j) {
    Cell* row = state + j * N;
    // One multi-node job per node: later multi-node jobs leave a node an earlier one uses.
    if (std::count_if(row, row + N, [](Cell v) { return v != 0; }) > 1)
      for (int64_t n = 0; n < N; ++n)
        if (row[n] > 0 && taken[n]++) row[n] = 0;
    // No job beyond its GPU limit: the excess comes off randomly ordered nodes.
    if (std::accumulate(row, row + N, int64_t{0}) > max_gpus[j]) {
      std::iota(order, order + N, 0);
      rng.shuffle(order, order + N);
      trim(order, order + N, max_gpus[j], [row](int64_t n) -> Cell& { return row[n]; });
    }
    for (int64_t n = 0; n < N; ++n) held[n] += row[n];
  }
  // Node capacities: earlier jobs first.
  for (int64_t n = 0; n < N; ++n)
    if (held[n] > capacity[n]) {
      int64_t total = 0;
      for (int64_t j = 0; j < J; ++j) {
        Cell& v = state[j * N + n];
        v = static_cast<Cell>(std::max<int64_t>(std::min(total + v, capacity[n]) - total, 0));
        total += v;
      }
    }
}

void Problem::mutate(Cell* state, Rng& rng) const {
  const int64_t J = jobs, N = nodes;  // locals: see goals()
  for (int64_t j = 0; j < J; ++j)  // back to the current allocation
    if (rng.uniform() < 0.1) std::copy(base.begin() + j * N, base.begin() + (j + 1) * N, state + j * N);
  for (int64_t j = 0; j < J; ++j)  // some nodes of some jobs zeroed
    if (rng.uniform() < 0.1)
      for (int64_t n = 0; n < N; ++n)
        if (rng.uniform() < 0.1) state[j * N + n] = 0;
  // Growth on nodes with free GPUs, as the artifact does: on each such node, on average one of all jobs and one of
  // the jobs already there (the artifact sums its probabilities over jobs, not over nodes). A job there grows with
  // p_all + p_own - p_all * p_own, that is when either of two independent draws hits; the p_all hits are drawn as
  // the gaps between them (geometric), a few draws per node rather than one per job. Growth into full nodes would
  // only be undone by the repair. Decided on the state before any growth: a cell's growth changes only that cell.
  // Per node: GPUs held, jobs there; then, on a node with room, the jobs that grow (a job may hit twice).
  Scratch<int64_t> scratch(2 * N), grown(2 * J);
  int64_t *held = scratch.data(), *owners = held + N, count = 0;
  for (int64_t j = 0; j < J; ++j)
    for (int64_t n = 0; n < N; ++n) {
      held[n] += state[j * N + n];
      owners[n] += state[j * N + n] > 0;
    }
  const double p_all = 1.0 / static_cast<double>(J), log_miss = std::log1p(-p_all);
  for (int64_t n = 0; n < N; ++n) {
    if (held[n] >= capacity[n]) continue;
    count = 0;
    const double p_own = 1.0 / static_cast<double>(std::max<int64_t>(owners[n], 1));
    for (int64_t j = 0; owners[n] && j < J; ++j)
      if (state[j * N + n] > 0 && rng.uniform() < p_own) grown[count++] = j;
    for (int64_t j = -1;;) {  // the next p_all hit after job j
      j += J == 1 ? 1 : 1 + static_cast<int64_t>(std::log(1.0 - rng.uniform()) / log_miss);
      if (j >= J) break;
      grown[count++] = j;
    }
    std::sort(grown.data(), grown.data() + count);
    for (int64_t k = 0; k < count; ++k) {
      if (k > 0 && grown[k] == grown[k - 1]) continue;
      Cell& cell = state[grown[k] * N + n];
      cell += static_cast<Cell>(rng.uniform() * static_cast<double>(capacity[n] + 1 - cell));
    }
  }
}

void Problem::crossover(const Cell* a, const Cell* b, Cell* first, Cell* second, Rng& rng) const {
  // Single point over jobs: the first jobs' rows (none to all but the last, as the artifact draws the point) from
  // one parent, the rest from the other.
  const int64_t cut = rng.below(jobs) * nodes, size = jobs * nodes;
  std::copy(a, a + cut, first);
  std::copy(b + cut, b + size, first + cut);
  std::copy(b, b + cut, second);
  std::copy(a + cut, a + size, second + cut);
}

std::vector<State> Problem::elitist(std::vector<State> population, int64_t size, int64_t generations,
                                    Rng& rng) const {
  // Most children copy an elite one, and the population collapses onto a few allocations (BENCHMARKS.md, "Where
  // Pollux's gap is").
  std::vector<double> value;
  for (auto& s : population) {
    repair(s.data(), rng);
    value.push_back(objective(s.data()));
  }
  const int64_t half = size / 2;
  for (int64_t g = 0; g < generations; ++g) {
    const int64_t count = static_cast<int64_t>(population.size());
    std::vector<int64_t> parents(2 * half);
    for (auto& parent : parents) {
      const int64_t a = rng.below(count), b = rng.below(count);
      parent = value[a] >= value[b] ? a : b;
    }
    std::vector<State> children(2 * half, State(jobs * nodes));
    for (int64_t m = 0; m < half; ++m)
      crossover(population[parents[m]].data(), population[parents[half + m]].data(), children[m].data(),
                children[half + m].data(), rng);
    for (auto& child : children) {
      mutate(child.data(), rng);
      repair(child.data(), rng);
      value.push_back(objective(child.data()));
      population.push_back(std::move(child));
    }
    std::vector<int64_t> order(population.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return value[a] > value[b]; });
    order.resize(std::min<size_t>(order.size(), size));
    std::vector<State> kept;
    std::vector<double> kept_value;
    for (int64_t i : order) {
      kept.push_back(std::move(population[i]));
      kept_value.push_back(value[i]);
    }
    population.swap(kept);
    value.swap(kept_value);
  }
  return population;
}

std::vector<State> Problem::nsga2(std::vector<State> seeds, int64_t size, int64_t generations, Rng& rng) const {
  // `generations` counts the first population, as pymoo's ("n_gen", 100) does.
  Seen seen(jobs * nodes);
  std::vector<State> population;
  for (auto& s : seeds) {
    repair(s.data(), rng);
    if (seen.insert(s)) population.push_back(std::move(s));
  }
  std::vector<Goals> goals;
  for (auto& s : population) goals.push_back(this->goals(s.data()));
  Survival survival = rank_and_crowding(goals, static_cast<int64_t>(population.size()), rng);
  for (int64_t g = 1; g < generations; ++g) {
    // pymoo's mating: binary tournaments (Pareto dominance, then the larger crowding distance, then chance) on
    // pairs of consecutive entries of random permutations, crossover with probability kCrossoverShare, mutation,
    // repair, and only children new to the population and to each other, in rounds until there are `size`.
    const int64_t count = static_cast<int64_t>(population.size());
    std::vector<State> children;
    seen.clear();  // new to this generation's population and to each other (pymoo's eliminate_duplicates)
    for (const auto& s : population) seen.insert(s);
    for (int round = 0; round < kMatingRounds && static_cast<int64_t>(children.size()) < size; ++round) {
      const int64_t need = size - static_cast<int64_t>(children.size()), matings = (need + 1) / 2;
      std::vector<int64_t> draws;
      while (static_cast<int64_t>(draws.size()) < 4 * matings) {
        auto p = rng.permutation(count);
        draws.insert(draws.end(), p.begin(), p.end());
      }
      auto winner = [&](int64_t a, int64_t b) {
        if (dominates(goals[a], goals[b])) return a;
        if (dominates(goals[b], goals[a])) return b;
        if (survival.crowding[a] == survival.crowding[b]) return rng.uniform() < 0.5 ? a : b;
        return survival.crowding[a] > survival.crowding[b] ? a : b;
      };
      std::vector<State> made(2 * matings, State(jobs * nodes));
      for (int64_t m = 0; m < matings; ++m) {
        const State& a = population[winner(draws[4 * m], draws[4 * m + 1])];
        const State& b = population[winner(draws[4 * m + 2], draws[4 * m + 3])];
        if (rng.uniform() < kCrossoverShare) {
          crossover(a.data(), b.data(), made[m].data(), made[matings + m].data(), rng);
        } else {
          made[m] = a;
          made[matings + m] = b;
        }
      }
      for (auto& child : made) {
        mutate(child.data(), rng);
        repair(child.data(), rng);
      }
      for (auto& child : made)
        if (static_cast<int64_t>(children.size()) < size && seen.insert(child)) children.push_back(std::move(child));
    }
    if (children.empty()) break;  // pymoo ends the search when no mating finds a new individual
    for (auto& child : children) {
      goals.push_back(this->goals(child.data()));
      population.push_back(std::move(child));
    }
    survival = rank_and_crowding(goals, size, rng);
    std::vector<State> kept;
    std::vector<Goals> kept_goals;
    Survival kept_survival;
    for (int64_t i : survival.survivors) {
      kept.push_back(std::move(population[i]));
      kept_goals.push_back(goals[i]);
      kept_survival.rank.push_back(survival.rank[i]);
      kept_survival.crowding.push_back(survival.crowding[i]);
    }
    population.swap(kept);
    goals.swap(kept_goals);
    survival = std::move(kept_survival);
  }
  std::vector<int64_t> front;
  for (size_t i = 0; i < population.size(); ++i)
    if (survival.rank[i] == 0) front.push_back(static_cast<int64_t>(i));
  std::stable_sort(front.begin(), front.end(), [&](int64_t a, int64_t b) { return goals[a][0] < goals[b][0]; });
  std::vector<State> result;
  for (int64_t i : front) result.push_back(std::move(population[i]));
  return result;
}

Survival rank_and_crowding(const std::vector<Goals>& goals, int64_t survivors, Rng& rng) {
  // Fronts of non-dominated sorting until `survivors` are ranked; the last front cut by crowding distance, equal
  // distances in random order. With two objectives the sort is one pass in lexicographic order: each point joins
  // the first front whose latest member (that front's least second objective) does not dominate it.
  const int64_t n = static_cast<int64_t>(goals.size());
  Survival out{std::vector<int64_t>(n, -1), std::vector<double>(n, 0.0), {}};
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return goals[a] < goals[b]; });
  std::vector<std::vector<int64_t>> fronts;
  for (int64_t i : order) {
    auto joins = std::partition_point(fronts.begin(), fronts.end(), [&](const std::vector<int64_t>& f) {
      return dominates(goals[f.back()], goals[i]);
    });
    if (joins == fronts.end()) joins = fronts.emplace(fronts.end());
    joins->push_back(i);
  }
  int64_t ranked = 0;
  for (size_t level = 0; level < fronts.size() && ranked < survivors; ++level) {
    std::vector<int64_t>& front = fronts[level];
    std::sort(front.begin(), front.end());  // index order, as pymoo's fronts: crowding's ties follow it
    for (int64_t i : front) out.rank[i] = static_cast<int64_t>(level);
    crowd(goals, front, out.crowding);
    ranked += static_cast<int64_t>(front.size());
    if (ranked > survivors) {  // the last front: the least crowded first, equal distances in random order
      rng.shuffle(front.data(), front.data() + front.size());
      std::stable_sort(front.begin(), front.end(),
                       [&](int64_t a, int64_t b) { return out.crowding[a] > out.crowding[b]; });
      front.resize(front.size() - (ranked - survivors));
    }
    out.survivors.insert(out.survivors.end(), front.begin(), front.end());
  }
  std::sort(out.survivors.begin(), out.survivors.end());
  return out;
}

}  // namespace easyscale::sched
