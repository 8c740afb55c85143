// Pollux's allocation search, compiled: the artifact's problem (objectives, repair, mutation, crossover), pymoo's
// NSGA-II as the artifact runs it, and an elitist (mu + lambda) search. In numpy a generation is ~150 calls on
// small arrays (tens of milliseconds a round); here it is a few hundred microseconds. No libtorch, no Python.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace easyscale::sched {

inline constexpr double kCrossoverShare = 0.9;  // pymoo's share of matings that cross over; the others copy parents

// xoshiro256** seeded through splitmix64: the same draws on every platform and compiler, so a simulation is
// reproducible from its seed.
// Inline: the search draws hundreds of numbers per child.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9, t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  int64_t below(int64_t n) {  // [0, n)
    return std::min(static_cast<int64_t>(uniform() * static_cast<double>(n)), n - 1);
  }
  void shuffle(int64_t* first, int64_t* last);  // Fisher-Yates
  std::vector<int64_t> permutation(int64_t n);

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

using Cell = int16_t;  // a job's GPUs on a node: small, so that states are compact to copy, hash and compare
using State = std::vector<Cell>;  // jobs x nodes, row-major: each job's GPUs on each node
using Goals = std::array<double, 2>;  // pymoo's F: both objectives negated, to minimise

struct Problem {
  // The speedup table is jobs x node_axis x gpu_axis (nodes used, GPUs): a job uses at most as many nodes as it
  // has GPUs, so node_axis need not pass min(nodes + 1, gpu_axis).
  int64_t jobs, nodes, node_axis, gpu_axis;
  State base;
  std::vector<int64_t> capacity, max_gpus;
  std::vector<double> speedup, factor;
  double p, scale;

  Problem(int64_t jobs, int64_t nodes, int64_t node_axis, int64_t gpu_axis, std::vector<Cell> base,
          std::vector<int64_t> capacity, std::vector<int64_t> max_gpus, std::vector<double> speedup,
          std::vector<double> factor, double p, double scale);

  // Negated, to minimise: the power mean of the restart-discounted speedups, and the cluster utility (the
  // speedups over the GPUs of the nodes in use).
  Goals goals(const Cell* state) const;
  double objective(const Cell* state) const { return -goals(state)[0]; }
  double utility(const Cell* state) const { return -goals(state)[1]; }
  void repair(Cell* state, Rng& rng) const;
  void mutate(Cell* state, Rng& rng) const;
  void crossover(const Cell* a, const Cell* b, Cell* first, Cell* second, Rng& rng) const;

  // Both return their final population best first: the elitist search's by power mean; NSGA-II's Pareto set
  // (power mean, cluster utility) by power mean.
  std::vector<State> elitist(std::vector<State> seeds, int64_t size, int64_t generations, Rng& rng) const;
  std::vector<State> nsga2(std::vector<State> seeds, int64_t size, int64_t generations, Rng& rng) const;
};

// pymoo's RankAndCrowding survival: every point's front (unranked: -1) and crowding distance, and the survivors.
struct Survival {
  std::vector<int64_t> rank;
  std::vector<double> crowding;
  std::vector<int64_t> survivors;
};
Survival rank_and_crowding(const std::vector<Goals>& goals, int64_t survivors, Rng& rng);

}  // namespace easyscale::sched
