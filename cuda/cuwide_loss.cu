// The weighted mean of a pointwise loss (sklearn_cuwide/_loss.py has the
// formulas): early stopping's validation loss, from the decision values.
//
// partial[2 b], partial[2 b + 1]: block b's sums of w[i] loss(z[i], y[i])
// and of w[i], float64 throughout, each in a fixed order (a thread's
// grid-stride items, then a warp's lanes, then the block's warps): the
// caller adds the blocks' sums in order, so a loss does not change from
// run to run (early stopping compares them).
#include "cuwide_common.cuh"

using namespace cuwide;

template <int LOSS>
__global__ void cuwide_weighted_loss(const double* __restrict__ z,
                                     const double* __restrict__ y,
                                     const double* __restrict__ w, long long n,
                                     double* __restrict__ partial) {
  __shared__ double warp_sums[2][32];
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
  const int warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
  if ((threadIdx.x & 31) == 0) {
    warp_sums[0][warp] = s;
    warp_sums[1][warp] = sw;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double a = 0.0, b = 0.0;
    for (int k = 0; k < n_warps; ++k) {
      a += warp_sums[0][k];
      b += warp_sums[1][k];
    }
    partial[2 * blockIdx.x] = a;
    partial[2 * blockIdx.x + 1] = b;
  }
}

#ifdef CUWIDE_NVCC_CHECK
template __global__ void cuwide_weighted_loss<LOGISTIC>(const double*, const double*,
                                                        const double*, long long, double*);
template __global__ void cuwide_weighted_loss<SQUARED>(const double*, const double*,
                                                       const double*, long long, double*);
#endif
