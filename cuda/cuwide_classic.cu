// The classic schema, kept as the ablation baseline of the benchmarks.
//
// One warp trains one sample at a time, straight from CSR (no layout):
// pull the sample's weights (and factors) from global memory, reduce the
// margin across the warp, compute the loss derivative, then push every
// nonzero's gradient back with global atomics (sgd or adagrad), Hogwild
// across warps.  This is the per-sample pull/push the flow-based kernel of
// cuwide_train.cu replaces.
#include "cuwide_common.cuh"

using namespace cuwide;

template <int MODEL, int NF, int SOLVER, int LOSS>
__global__ void cuwide_classic(const int* __restrict__ indptr, const int* __restrict__ indices,
                               const float* __restrict__ data, const int* __restrict__ rows,
                               long long n_rows, const float* __restrict__ y,
                               const float* __restrict__ sw, float* w, float* V, float* b,
                               float* gw, float* gV, float* gb, float lr, float l2w, float l2v,
                               float eps, double* loss_out) {
  const int lane = threadIdx.x & 31;
  const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
  double my_loss = 0.0;
  for (long long t = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; t < n_rows;
       t += warps) {
    const int r = rows[t];
    const int p0 = indptr[r], p1 = indptr[r + 1];
    // ---- pull ----
    float z = 0.f;
    constexpr int KPL = MODEL == FM ? (NF + 31) / 32 : 1;
    float s[KPL];
    float q = 0.f;
#pragma unroll
    for (int kk = 0; kk < KPL; ++kk) s[kk] = 0.f;
    if (MODEL == LINEAR) {
      for (int p = p0 + lane; p < p1; p += 32) z += w[indices[p]] * data[p];
    } else {
      for (int p = p0; p < p1; ++p) {
        const int f = indices[p];
        const float x = data[p];
        if (lane == 0) z += w[f] * x;
#pragma unroll
        for (int kk = 0; kk < KPL; ++kk) {
          const int k = lane + 32 * kk;
          if (k < NF) {
            const float vx = V[(long long)f * NF + k] * x;
            s[kk] += vx;
            q += vx * vx;
          }
        }
      }
#pragma unroll
      for (int kk = 0; kk < KPL; ++kk) z += 0.5f * s[kk] * s[kk];
      z -= 0.5f * q;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) z += __shfl_xor_sync(CUWIDE_FULL_MASK, z, off);
    z += b[0];
    const float yi = y[r], si = sw[r];
    float d, lo;
    if (LOSS == SQUARED) {
      d = z - yi;
      lo = 0.5f * d * d;
    } else {
      lo = log1pexp(z) - yi * z;
      d = sigmoid(z) - yi;
    }
    d *= si;
    if (lane == 0) my_loss += (double)(si * lo);
    // ---- push ----
    if (MODEL == LINEAR) {
      for (int p = p0 + lane; p < p1; p += 32) {
        const int f = indices[p];
        update_param<SOLVER>(w + f, gw + f, d * data[p] + l2w * w[f], lr, eps, 0.f, 0.f,
                             1.f, load_acc<SOLVER>(gw + f));
      }
    } else {
      for (int p = p0; p < p1; ++p) {
        const int f = indices[p];
        const float x = data[p];
#pragma unroll
        for (int kk = 0; kk < KPL; ++kk) {
          const int k = lane + 32 * kk;
          if (k < NF) {
            const long long pi = (long long)f * NF + k;
            const float v = V[pi];
            update_param<SOLVER>(V + pi, gV + pi, d * x * (s[kk] - v * x) + l2v * v, lr, eps,
                                 0.f, 0.f, 1.f, load_acc<SOLVER>(gV + pi));
          }
        }
        if (lane == 0)
          update_param<SOLVER>(w + f, gw + f, d * x + l2w * w[f], lr, eps, 0.f, 0.f,
                               1.f, load_acc<SOLVER>(gw + f));
      }
    }
    if (lane == 0) update_param<SOLVER>(b, gb, d, lr, eps, 0.f, 0.f, 1.f, load_acc<SOLVER>(gb));
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) my_loss += __shfl_xor_sync(CUWIDE_FULL_MASK, my_loss, off);
  if (lane == 0 && my_loss != 0.0) atomicAdd(loss_out, my_loss);
}

#ifdef CUWIDE_NVCC_CHECK
template __global__ void cuwide_classic<LINEAR, 0, ADAGRAD, LOGISTIC>(
    const int*, const int*, const float*, const int*, long long, const float*, const float*,
    float*, float*, float*, float*, float*, float*, float, float, float, float, double*);
template __global__ void cuwide_classic<FM, 16, SGD, SQUARED>(
    const int*, const int*, const float*, const int*, long long, const float*, const float*,
    float*, float*, float*, float*, float*, float*, float, float, float, float, double*);
#endif
