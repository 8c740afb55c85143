// easyscale_ext._search: the scheduler's compiled searches on numpy arrays. Pollux's: states are (count, jobs,
// nodes) int64 arrays; every random operation takes a seed (the policy draws it from its numpy generator). Saxena
// et al.'s knapsack.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <limits>
#include <string>

#include "knapsack.h"
#include "pollux_search.h"

namespace py = pybind11;
using easyscale::sched::Cell;
using easyscale::sched::Goals;
using easyscale::sched::Problem;
using easyscale::sched::Rng;
using easyscale::sched::State;

namespace {

using Ints = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using Doubles = py::array_t<double, py::array::c_style | py::array::forcecast>;

template <typename T>
std::vector<T> flat(const py::array_t<T, py::array::c_style | py::array::forcecast>& a) {
  return std::vector<T>(a.data(), a.data() + a.size());
}

void expect_states(const Ints& states, const Problem& p) {
  if (states.ndim() != 3 || states.shape(1) != p.jobs || states.shape(2) != p.nodes)
    throw std::invalid_argument("expected states of shape (count, " + std::to_string(p.jobs) + ", " +
                                std::to_string(p.nodes) + ")");
}

State cells(const int64_t* first, const int64_t* last) {
  for (const int64_t* v = first; v != last; ++v)
    if (*v < 0 || *v > std::numeric_limits<Cell>::max())
      throw std::invalid_argument("a state holds " + std::to_string(*v) + " GPUs on a node: expected 0 to " +
                                  std::to_string(std::numeric_limits<Cell>::max()));
  return State(first, last);
}

std::vector<State> states_of(const Ints& states, const Problem& p) {
  expect_states(states, p);
  const int64_t size = p.jobs * p.nodes;
  std::vector<State> out;
  for (py::ssize_t k = 0; k < states.shape(0); ++k)
    out.push_back(cells(states.data() + k * size, states.data() + (k + 1) * size));
  return out;
}

Ints array_of(const std::vector<State>& states, const Problem& p) {
  Ints out({static_cast<py::ssize_t>(states.size()), static_cast<py::ssize_t>(p.jobs),
            static_cast<py::ssize_t>(p.nodes)});
  int64_t* data = out.mutable_data();
  for (const State& s : states) data = std::copy(s.begin(), s.end(), data);
  return out;
}

// Each state through `op` (a per-state operation in place), on a copy.
template <typename Op>
Ints each(const Problem& p, const Ints& states, uint64_t seed, Op op) {
  auto all = states_of(states, p);
  Rng rng(seed);
  for (State& s : all) op(s.data(), rng);
  return array_of(all, p);
}

template <typename Score>
Doubles scores(const Problem& p, const Ints& states, Score score) {
  auto all = states_of(states, p);
  Doubles out(static_cast<py::ssize_t>(all.size()));
  for (size_t k = 0; k < all.size(); ++k) out.mutable_data()[k] = score(all[k].data());
  return out;
}

}  // namespace

PYBIND11_MODULE(_search, m) {
  m.doc() =
      "The scheduler's searches, compiled: Pollux's allocation search (the artifact's problem, pymoo's NSGA-II, an "
      "elitist search) and Saxena et al.'s knapsack";
  m.def(
      "knapsack",
      [](const std::vector<Doubles>& values, int64_t gpus) {
        std::vector<std::vector<double>> rows;
        rows.reserve(values.size());
        for (const auto& v : values) {
          if (v.ndim() != 1) throw std::invalid_argument("expected each job's values as a 1-D array");
          rows.push_back(flat(v));
        }
        py::gil_scoped_release release;
        return easyscale::sched::knapsack(rows, gpus);
      },
      py::arg("values"), py::arg("gpus"),
      "GPU counts maximising the sum of each job's value at its count, at most `gpus` in all (values[j][0]: on none)");
  m.attr("CROSSOVER_SHARE") = easyscale::sched::kCrossoverShare;
  py::class_<Problem>(m, "Problem")
      .def(py::init([](const Ints& base, const Ints& capacity, const Ints& max_gpus, const Doubles& speedup,
                       const Doubles& factor, double p, double scale) {
             if (base.ndim() != 2 || speedup.ndim() != 3)
               throw std::invalid_argument(
                   "expected base (jobs, nodes) and speedup (jobs, nodes used + 1, GPUs + 1)");
             return Problem(base.shape(0), base.shape(1), speedup.shape(1), speedup.shape(2),
                            cells(base.data(), base.data() + base.size()), flat(capacity), flat(max_gpus),
                            flat(speedup), flat(factor), p, scale);
           }),
           py::arg("base"), py::arg("capacity"), py::arg("max_gpus"), py::arg("speedup"), py::arg("factor"),
           py::arg("p"), py::arg("scale"))
      .def("objective",
           [](const Problem& p, const Ints& s) { return scores(p, s, [&](auto x) { return p.objective(x); }); })
      .def("utility",
           [](const Problem& p, const Ints& s) { return scores(p, s, [&](auto x) { return p.utility(x); }); })
      .def("repair", [](const Problem& p, const Ints& s, uint64_t seed) {
        return each(p, s, seed, [&](Cell* x, Rng& rng) { p.repair(x, rng); });
      })
      .def("mutate", [](const Problem& p, const Ints& s, uint64_t seed) {
        return each(p, s, seed, [&](Cell* x, Rng& rng) { p.mutate(x, rng); });
      })
      .def("crossover",
           [](const Problem& p, const Ints& a, const Ints& b, uint64_t seed) {
             // the first children of every pair, then the second ones (pymoo's order)
             auto first = states_of(a, p), second = states_of(b, p);
             if (first.size() != second.size()) throw std::invalid_argument("expected as many parents on each side");
             std::vector<State> children(2 * first.size(), State(p.jobs * p.nodes));
             Rng rng(seed);
             for (size_t m = 0; m < first.size(); ++m)
               p.crossover(first[m].data(), second[m].data(), children[m].data(), children[first.size() + m].data(),
                           rng);
             return array_of(children, p);
           })
      .def("elitist",
           [](const Problem& p, const Ints& seeds, int64_t size, int64_t generations, uint64_t seed) {
             auto population = states_of(seeds, p);
             {
               py::gil_scoped_release release;
               Rng rng(seed);
               population = p.elitist(std::move(population), size, generations, rng);
             }
             return array_of(population, p);
           })
      .def("nsga2", [](const Problem& p, const Ints& seeds, int64_t size, int64_t generations, uint64_t seed) {
        auto population = states_of(seeds, p);
        {
          py::gil_scoped_release release;
          Rng rng(seed);
          population = p.nsga2(std::move(population), size, generations, rng);
        }
        return array_of(population, p);
      });
  m.def(
      "rank_and_crowding",
      [](const Doubles& goals, int64_t survivors, uint64_t seed) {
        if (goals.ndim() != 2 || goals.shape(1) != 2) throw std::invalid_argument("expected goals of shape (n, 2)");
        std::vector<Goals> points(goals.shape(0));
        for (size_t i = 0; i < points.size(); ++i) points[i] = {goals.data()[2 * i], goals.data()[2 * i + 1]};
        Rng rng(seed);
        auto s = easyscale::sched::rank_and_crowding(points, survivors, rng);
        return py::make_tuple(Ints(s.rank.size(), s.rank.data()), Doubles(s.crowding.size(), s.crowding.data()),
                              Ints(s.survivors.size(), s.survivors.data()));
      },
      "pymoo's RankAndCrowding: every point's front (-1: unranked), crowding distance, and the survivors' indices");
}
