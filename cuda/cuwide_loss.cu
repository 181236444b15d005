// The weighted mean of a pointwise loss (sklearn_cuwide/_loss.py has the
// formulas): early stopping's validation loss, from the decision values.
//
// sums[0] += sum_i w[i] loss(z[i], y[i]); sums[1] += sum_i w[i] (zeroed by
// the caller), float64 throughout: a warp's partial sums, then one atomic
// add per warp.
#include "cuwide_common.cuh"

using namespace cuwide;

template <int LOSS>
__global__ void cuwide_weighted_loss(const double* __restrict__ z,
                                     const double* __restrict__ y,
                                     const double* __restrict__ w, long long n,
                                     double* __restrict__ sums) {
  double s = 0.0, sw = 0.0;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    double lo;
    if (LOSS == LOGISTIC) {  // log(1 + exp(z)) - y z, without overflow
      lo = fmax(z[i], 0.0) + log1p(exp(-fabs(z[i]))) - y[i] * z[i];
    } else {  // SQUARED
      const double d = z[i] - y[i];
      lo = 0.5 * d * d;
    }
    s += w[i] * lo;
    sw += w[i];
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    s += __shfl_xor_sync(CUWIDE_FULL_MASK, s, off);
    sw += __shfl_xor_sync(CUWIDE_FULL_MASK, sw, off);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&sums[0], s);
    atomicAdd(&sums[1], sw);
  }
}

#ifdef CUWIDE_NVCC_CHECK
template __global__ void cuwide_weighted_loss<LOGISTIC>(const double*, const double*,
                                                        const double*, long long, double*);
template __global__ void cuwide_weighted_loss<SQUARED>(const double*, const double*,
                                                       const double*, long long, double*);
#endif
