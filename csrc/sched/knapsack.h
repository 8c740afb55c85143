// The knapsack over jobs x GPUs that Saxena et al.'s policy solves on every arrival and completion, compiled: in
// numpy each job is a (GPUs x counts) table of temporaries, hundreds of jobs on thousands of GPUs a call.
#pragma once

#include <cstdint>
#include <vector>

namespace easyscale::sched {

// GPU counts c_j maximising sum_j values[j][c_j] subject to sum_j c_j <= gpus, values[j][0] being a job's worth on
// none. best[c], the best total of the jobs so far on at most c GPUs, is best[c - k] + values[j][k] at the smallest
// k of the largest total: the same additions and ties as the numpy program, so the same picks to the bit. Two
// shortcuts change no pick: a count worth no more than a smaller one is never picked (best is non-decreasing in
// c), so a job's values end at their last record; and the jobs so far use at most `reach` GPUs, so rows past it
// are not computed.
std::vector<int64_t> knapsack(const std::vector<std::vector<double>>& values, int64_t gpus);

}  // namespace easyscale::sched
