// Decision function straight from a CSR matrix (user feature order).
//
// One warp per row.  Linear models: the lanes stride over the row's
// nonzeros and reduce.  FM: the lanes stride over the factors and walk the
// row's nonzeros, so each factor row V[f, :] is read coalesced.
// The CSR must be canonical (no duplicate entries): the FM term is not
// linear in the values.
#include "cuwide_common.cuh"

using namespace cuwide;

template <typename IPT, typename IDX, typename T, int MODEL, int NOUT, int NF>
__global__ void cuwide_predict(const IPT* __restrict__ indptr, const IDX* __restrict__ indices,
                               const T* __restrict__ data, long long n_rows,
                               const float* __restrict__ w, const float* __restrict__ V,
                               const float* __restrict__ b, int fit_linear,
                               float* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
  for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < n_rows;
       r += warps) {
    const long long p0 = indptr[r], p1 = indptr[r + 1];
    if (MODEL == LINEAR) {
      float a[NOUT];
#pragma unroll
      for (int o = 0; o < NOUT; ++o) a[o] = 0.f;
      for (long long p = p0 + lane; p < p1; p += 32) {
        const long long f = (long long)indices[p];
        const float x = (float)data[p];
#pragma unroll
        for (int o = 0; o < NOUT; ++o) a[o] += w[f * NOUT + o] * x;
      }
#pragma unroll
      for (int o = 0; o < NOUT; ++o) {
        float v = a[o];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(CUWIDE_FULL_MASK, v, off);
        if (lane == 0) out[r * NOUT + o] = v + b[o];
      }
    } else {
      constexpr int KPL = NF > 32 ? (NF + 31) / 32 : 1;
      float s[KPL], q[KPL];
#pragma unroll
      for (int kk = 0; kk < KPL; ++kk) s[kk] = q[kk] = 0.f;
      float lin = 0.f;
      for (long long p = p0; p < p1; ++p) {
        const long long f = (long long)indices[p];
        const float x = (float)data[p];
        if (lane == 0 && fit_linear) lin += w[f] * x;
#pragma unroll
        for (int kk = 0; kk < KPL; ++kk) {
          const int k = lane + 32 * kk;
          if (k < NF) {
            const float vx = V[f * NF + k] * x;
            s[kk] += vx;
            q[kk] += vx * vx;
          }
        }
      }
      float t = 0.f;
#pragma unroll
      for (int kk = 0; kk < KPL; ++kk) t += s[kk] * s[kk] - q[kk];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) t += __shfl_xor_sync(CUWIDE_FULL_MASK, t, off);
      if (lane == 0) out[r] = b[0] + lin + 0.5f * t;
    }
  }
}

#ifdef CUWIDE_NVCC_CHECK
template __global__ void cuwide_predict<int, int, float, LINEAR, 1, 0>(
    const int*, const int*, const float*, long long, const float*, const float*,
    const float*, int, float*);
template __global__ void cuwide_predict<long long, long long, double, FM, 1, 16>(
    const long long*, const long long*, const double*, long long, const float*,
    const float*, const float*, int, float*);
#endif
