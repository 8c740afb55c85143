// Per-element arithmetic shared by the CPU and CUDA kernels. Written once so
// the CPU tests exercise exactly the code the GPU runs.
//
// Bitwise agreement between g++ and nvcc needs: no FMA contraction (we call
// mul_rn/add_rn explicitly; the build also passes -ffp-contract=off and
// --fmad=false), no fast-math, and no flush-to-zero of subnormals.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ES_HD __host__ __device__ __forceinline__
#else
#define ES_HD inline
#endif

namespace es {

enum class DType : int32_t { F32 = 0, F64 = 1, F16 = 2, BF16 = 3 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
  }
  return "unknown";
}

inline int64_t dtype_size(DType t) {
  return t == DType::F64 ? 8 : t == DType::F32 ? 4 : 2;
}

// Half types stored as raw bits: the conversions below are exact and
// identical on host and device, with no dependency on cuda_fp16.h.
struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

template <typename To, typename From>
ES_HD To bit_cast(From v) {
  To out;
  memcpy(&out, &v, sizeof(To));
  return out;
}

ES_HD float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;  // signed zero
  } else {  // subnormal half: normalise into a float
    int shift = 0;
    while ((man & 0x400u) == 0) { man <<= 1; ++shift; }
    bits = sign | ((113u - shift) << 23) | ((man & 0x3FFu) << 13);
  }
  return bit_cast<float>(bits);
}

// Round to nearest even, as a hardware cvt.rn.f16.f32 does.
ES_HD uint16_t float_to_half(float f) {
  uint32_t x = bit_cast<uint32_t>(f);
  uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  uint32_t absx = x & 0x7FFFFFFFu;
  if (absx > 0x7F800000u) return uint16_t(sign | 0x7E00u);  // nan
  if (absx >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // rounds to inf
  if (absx < 0x38800000u) {  // result is subnormal or zero
    if (absx < 0x33000000u) return sign;  // below half the smallest subnormal
    uint32_t e = absx >> 23;
    uint32_t man = (absx & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126u - e;  // value / 2^-24 == man >> shift
    uint32_t half_man = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_man & 1u))) ++half_man;
    return uint16_t(sign | half_man);
  }
  uint32_t rounded = absx + 0xFFFu + ((absx >> 13) & 1u);
  return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
}

ES_HD float bf16_to_float(uint16_t b) { return bit_cast<float>(uint32_t(b) << 16); }

ES_HD uint16_t float_to_bf16(float f) {
  uint32_t x = bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;  // canonical nan, as c10
  return uint16_t((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// Accumulation type: fp16/bf16 accumulate in fp32, fp32 in fp32, fp64 in fp64.
template <typename T> struct Acc { using type = T; };
template <> struct Acc<Half> { using type = float; };
template <> struct Acc<BFloat16> { using type = float; };

ES_HD float to_acc(float v) { return v; }
ES_HD double to_acc(double v) { return v; }
ES_HD float to_acc(Half v) { return half_to_float(v.bits); }
ES_HD float to_acc(BFloat16 v) { return bf16_to_float(v.bits); }

template <typename T> ES_HD T from_acc(typename Acc<T>::type v);
template <> ES_HD float from_acc<float>(float v) { return v; }
template <> ES_HD double from_acc<double>(double v) { return v; }
template <> ES_HD Half from_acc<Half>(float v) { return Half{float_to_half(v)}; }
template <> ES_HD BFloat16 from_acc<BFloat16>(float v) { return BFloat16{float_to_bf16(v)}; }

// Correctly rounded, never contracted into an FMA.
#if defined(__CUDA_ARCH__)
ES_HD float add_rn(float a, float b) { return __fadd_rn(a, b); }
ES_HD float mul_rn(float a, float b) { return __fmul_rn(a, b); }
ES_HD double add_rn(double a, double b) { return __dadd_rn(a, b); }
ES_HD double mul_rn(double a, double b) { return __dmul_rn(a, b); }
ES_HD float sqrt_rn(float a) { return __fsqrt_rn(a); }
ES_HD double sqrt_rn(double a) { return __dsqrt_rn(a); }
#else
ES_HD float sqrt_rn(float a) { return std::sqrt(a); }
ES_HD double sqrt_rn(double a) { return std::sqrt(a); }
ES_HD float add_rn(float a, float b) { return a + b; }
ES_HD float mul_rn(float a, float b) { return a * b; }
ES_HD double add_rn(double a, double b) { return a + b; }
ES_HD double mul_rn(double a, double b) { return a * b; }
#endif

// The canonical association over items 0..n-1: node [lo, hi) splits at
// lo + (largest power of two < hi - lo). Equivalently: a binary counter that
// merges equal-sized neighbours as items arrive, then a right-to-left fold
// of what remains. It depends on n alone, and every aligned power-of-two
// block is a subtree, which is what lets a process pre-reduce its contiguous
// range of virtual workers and a GPU block pre-reduce its tile.
constexpr int kMaxTreeDepth = 64;

template <typename A, typename Load>
ES_HD A canonical_tree_sum(int64_t n, Load load) {
  A stack[kMaxTreeDepth];
  int depth = 0;
  for (int64_t i = 0; i < n; ++i) {
    A v = load(i);
    // Item i completes one block per trailing zero bit of i + 1.
    for (int64_t count = i + 1; (count & 1) == 0; count >>= 1) v = add_rn(stack[--depth], v);
    stack[depth++] = v;
  }
  if (depth == 0) return A(0);
  A acc = stack[--depth];
  while (depth > 0) acc = add_rn(stack[--depth], acc);
  return acc;
}

ES_HD constexpr int largest_power_of_two_below(int n) {
  int p = 1;
  while (2 * p < n) p *= 2;
  return p;
}

// The same tree over N items fixed at compile time, as the recursion itself:
// every index is a constant, so a GPU keeps the partial sums in registers
// (canonical_tree_sum's stack is indexed at run time: local memory).
template <typename A, int N, typename Load>
ES_HD A fixed_tree_sum(Load load, int64_t first) {
  if constexpr (N == 1) {
    return load(first);
  } else {
    constexpr int left = largest_power_of_two_below(N);
    return add_rn(fixed_tree_sum<A, left>(load, first), fixed_tree_sum<A, N - left>(load, first + left));
  }
}

// The same tree again, its leaves taken kLeafBlock at a time through
// fixed_tree_sum: aligned power-of-two blocks are subtrees and the tail
// block is the canonical tree of its own items, so only the blocks go
// through the run-time stack (none when n <= kLeafBlock).
constexpr int kLeafBlock = 8;

template <typename A, typename Load>
ES_HD A canonical_tree_sum_blocked(int64_t n, Load load) {
  auto block = [&](int64_t b) -> A {
    const int64_t first = b * kLeafBlock;
    switch (n - first < kLeafBlock ? n - first : kLeafBlock) {
      case 1: return fixed_tree_sum<A, 1>(load, first);
      case 2: return fixed_tree_sum<A, 2>(load, first);
      case 3: return fixed_tree_sum<A, 3>(load, first);
      case 4: return fixed_tree_sum<A, 4>(load, first);
      case 5: return fixed_tree_sum<A, 5>(load, first);
      case 6: return fixed_tree_sum<A, 6>(load, first);
      case 7: return fixed_tree_sum<A, 7>(load, first);
      default: return fixed_tree_sum<A, kLeafBlock>(load, first);
    }
  };
  if (n <= kLeafBlock) return n > 0 ? block(0) : A(0);
  return canonical_tree_sum<A>((n + kLeafBlock - 1) / kLeafBlock, block);
}

// Streaming fold of one leaf into a partial sum: acc = acc + x * scale, or
// acc = x * scale when starting a partial. Never `0 + x*scale`: that would
// turn a -0 gradient into +0.
template <typename A>
ES_HD A fold_leaf(A acc, A x, A scale, bool accumulate) {
  A scaled = mul_rn(x, scale);
  return accumulate ? add_rn(acc, scaled) : scaled;
}

// Gradient norms are the canonical tree over a tensor's squared elements,
// evaluated in tiles of this many (a power of two, so each full tile is a
// subtree and the tile partials combine by the same tree over tile indices).
constexpr int64_t kNormTile = 2048;

}  // namespace es
