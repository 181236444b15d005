// The initial factors of a factorization machine, drawn where the fit runs.
//
// V[i, k] = scale * normal(seed, features[i] * n_factors + k), the counter-
// based normal of sklearn_cuwide/_state.py (counter_normal): splitmix64 of
// the counter, whose top 16 bits pick a cell of the normal's quantile table
// and the next 37 a point inside it, interpolated between the cell's edges.
// Rule: integer operations and exactly rounded float64 ones (the _rn
// intrinsics: no contraction into fused multiply-adds).  Why: numpy's draw
// gives the same bits, so a layout's factors do not depend on the device.
#include "cuwide_common.cuh"

template <typename T>
__global__ void cuwide_draw_factors(const long long* __restrict__ features, long long n_rows,
                                    int n_factors, unsigned long long seed_mix,
                                    const double* __restrict__ table, double scale,
                                    T* __restrict__ V) {
  const long long total = n_rows * n_factors;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
       t += stride) {
    const long long i = t / n_factors;
    const unsigned long long counter =
        (unsigned long long)(features[i] * n_factors + (t - i * n_factors));
    unsigned long long z = (counter + 1ULL) * 0x9E3779B97F4A7C15ULL + seed_mix;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    const long long cell = (long long)(z >> 48);
    const double frac = __dmul_rn((double)((z >> 11) & ((1ULL << 37) - 1)), 0x1p-37);
    const double lo = table[cell];
    const double x = __dadd_rn(__dmul_rn(__dsub_rn(table[cell + 1], lo), frac), lo);
    V[t] = (T)__dmul_rn(x, scale);
  }
}

#ifdef CUWIDE_NVCC_CHECK
template __global__ void cuwide_draw_factors<float>(const long long*, long long, int,
                                                    unsigned long long, const double*, double,
                                                    float*);
template __global__ void cuwide_draw_factors<double>(const long long*, long long, int,
                                                     unsigned long long, const double*,
                                                     double, double*);
#endif
