// Full-batch objective of binary logistic regression for L-BFGS, in two
// fused passes over the data (float64 accumulation; the data may be float32).
//
//   forward  (CSR of X, a group of lanes per row):
//       z_r = x_r . w + b;  E_r = s_r (sigmoid(z_r) - y_r)
//       acc[0] += s_r (log(1 + exp(z_r)) - y_r z_r);  acc[1] += E_r
//   backward (CSR of X^T, one warp per piece of a feature's nonzeros):
//       g_j = sum_r X_rj E_r + lam w_j;  acc[2] += w_j^2;  g_d = acc[1]
//
// so the objective is acc[0] + lam / 2 acc[2] and g its gradient; the caller
// zeroes acc before the forward pass.  Per-block partial sums meet in
// shared memory and are added to acc with one double atomic per block.
#include "cuwide_common.cuh"

namespace cuwide_lbfgs {

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// sum over the block of one value per warp (lane 0's); result valid in thread 0
__device__ __forceinline__ double block_sum_of_warps(double v, double* sh) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  double t = 0.0;
  if (threadIdx.x == 0) {
    for (int i = 0; i < (int)(blockDim.x >> 5); ++i) t += sh[i];
  }
  __syncthreads();
  return t;
}

}  // namespace cuwide_lbfgs

// W lanes per row (a power of two up to 32): the launcher picks W from the
// mean row length, so that a lane sums a few nonzeros and a warp walks
// several short rows at once instead of one
template <typename IDX, typename T, int W>
__global__ void cuwide_lbfgs_logistic_forward(
    const IDX* __restrict__ indptr, const IDX* __restrict__ indices,
    const T* __restrict__ data, long long n_rows, const double* __restrict__ x,
    long long d, int fit_intercept, const double* __restrict__ y,
    const double* __restrict__ sw, double* __restrict__ E, double* __restrict__ acc) {
  static_assert(W >= 1 && W <= 32 && (W & (W - 1)) == 0, "W: a power of two up to 32");
  __shared__ double sh_lo[32], sh_e[32];
  const int sub = threadIdx.x & (W - 1);
  const long long groups = ((long long)gridDim.x * blockDim.x) / W;
  const double b = fit_intercept ? x[d] : 0.0;
  double lo_sum = 0.0, e_sum = 0.0;  // a row's first lane's running sums
  // the warp loops while one of its rows remains: its lanes shuffle together
  for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / W;
       __any_sync(0xffffffffu, r < n_rows); r += groups) {
    const bool ok = r < n_rows;
    double z = 0.0;
    if (ok) {
      const long long p0 = (long long)indptr[r], p1 = (long long)indptr[r + 1];
      for (long long p = p0 + sub; p < p1; p += W) z += (double)data[p] * x[indices[p]];
    }
#pragma unroll
    for (int off = W / 2; off > 0; off >>= 1) z += __shfl_xor_sync(0xffffffffu, z, off, W);
    if (ok && sub == 0) {
      z += b;
      const double yr = y[r], s = sw[r];
      // log(1 + exp(z)) = max(z, 0) + log1p(exp(-|z|)); sigmoid without overflow
      const double ez = exp(-fabs(z));
      const double lo = fmax(z, 0.0) + log1p(ez) - yr * z;
      const double p = z >= 0.0 ? 1.0 / (1.0 + ez) : ez / (1.0 + ez);
      const double e = s * (p - yr);
      E[r] = e;
      lo_sum += s * lo;
      e_sum += e;
    }
  }
  const double a = cuwide_lbfgs::block_sum_of_warps(cuwide_lbfgs::warp_sum(lo_sum), sh_lo);
  const double c = cuwide_lbfgs::block_sum_of_warps(cuwide_lbfgs::warp_sum(e_sum), sh_e);
  if (threadIdx.x == 0) {
    atomicAdd(acc, a);
    atomicAdd(acc + 1, c);
  }
}

// The gradient walks X^T by pieces of at most PIECE nonzeros, one warp per
// piece, so a feature present in every row is shared by many warps instead of
// being walked by one (its warp's dependent loads would bound the pass).
// piece_col[p] is the feature of piece p and piece_ptr[j] the first piece of
// feature j (a feature without nonzeros still has one, empty, piece).  The
// pieces of a feature add into g[j] with double atomics (g zeroed by the
// caller); the first one also adds lam w_j and w_j^2.
template <typename IDX, typename T>
__global__ void cuwide_lbfgs_logistic_backward(
    const IDX* __restrict__ tptr, const IDX* __restrict__ tind, const T* __restrict__ tdata,
    const int* __restrict__ piece_col, const long long* __restrict__ piece_ptr,
    long long n_pieces, int piece, long long d, const double* __restrict__ E,
    const double* __restrict__ x, double lam, int fit_intercept, double* __restrict__ g,
    double* __restrict__ acc) {
  __shared__ double sh_w2[32];
  const int lane = threadIdx.x & 31;
  const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
  double w2 = 0.0;
  for (long long q = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; q < n_pieces;
       q += warps) {
    const long long j = piece_col[q];
    const long long k = q - piece_ptr[j];
    const long long c1 = (long long)tptr[j + 1];
    const long long p0 = (long long)tptr[j] + k * piece;
    const long long p1 = p0 + piece < c1 ? p0 + piece : c1;
    double s = 0.0;
    for (long long p = p0 + lane; p < p1; p += 32) s += (double)tdata[p] * E[tind[p]];
    s = cuwide_lbfgs::warp_sum(s);
    if (lane == 0) {
      if (k == 0) {
        const double wj = x[j];
        s += lam * wj;
        w2 += wj * wj;
      }
      atomicAdd(g + j, s);
    }
  }
  const double t = cuwide_lbfgs::block_sum_of_warps(w2, sh_w2);
  if (threadIdx.x == 0) {
    atomicAdd(acc + 2, t);
    if (fit_intercept && blockIdx.x == 0) g[d] = acc[1];  // forward pass is complete
  }
}


// The L-BFGS memory: NB stored vectors (s_0, y_0, s_1, y_1, ...) as the rows
// of B (NB x n, row-major).
//
//   gram:      out[v * NB + r] = B[r] . V_v for the three vectors V_0..V_2
//              (the new s, the new y and the new gradient): B is read once,
//              each block sums a stretch of columns and adds its 3 NB partial
//              sums with double atomics (out zeroed by the caller);
//   direction: d = -(sum_r c[r] B[r] + c[NB] g), the two-loop recursion's
//              result from its coefficients (computed on the host).
template <int NB>
__global__ void cuwide_lbfgs_gram(const double* __restrict__ B, long long n,
                                  const double* __restrict__ v0, const double* __restrict__ v1,
                                  const double* __restrict__ v2, double* __restrict__ out) {
  __shared__ double sh[3 * NB][8];  // blockDim.x <= 256: 8 warps
  double a0[NB], a1[NB], a2[NB];
#pragma unroll
  for (int r = 0; r < NB; ++r) a0[r] = a1[r] = a2[r] = 0.0;
  for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n;
       j += (long long)gridDim.x * blockDim.x) {
    const double x0 = v0[j], x1 = v1[j], x2 = v2[j];
#pragma unroll
    for (int r = 0; r < NB; ++r) {
      const double b = B[(long long)r * n + j];
      a0[r] += b * x0;
      a1[r] += b * x1;
      a2[r] += b * x2;
    }
  }
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < NB; ++r) {
    const double t0 = cuwide_lbfgs::warp_sum(a0[r]);
    const double t1 = cuwide_lbfgs::warp_sum(a1[r]);
    const double t2 = cuwide_lbfgs::warp_sum(a2[r]);
    if (lane == 0) {
      sh[r][wid] = t0;
      sh[NB + r][wid] = t1;
      sh[2 * NB + r][wid] = t2;
    }
  }
  __syncthreads();
  const int nw = (int)(blockDim.x >> 5);
  for (int i = threadIdx.x; i < 3 * NB; i += blockDim.x) {
    double t = 0.0;
    for (int w = 0; w < nw; ++w) t += sh[i][w];
    atomicAdd(out + i, t);
  }
}

template <int NB>
__global__ void cuwide_lbfgs_direction(const double* __restrict__ B, long long n,
                                       const double* __restrict__ c,
                                       const double* __restrict__ g, double* __restrict__ d) {
  __shared__ double cs[NB + 1];
  for (int i = threadIdx.x; i <= NB; i += blockDim.x) cs[i] = c[i];
  __syncthreads();
  for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n;
       j += (long long)gridDim.x * blockDim.x) {
    double t = cs[NB] * g[j];
#pragma unroll
    for (int r = 0; r < NB; ++r) t += cs[r] * B[(long long)r * n + j];
    d[j] = -t;
  }
}

#ifdef CUWIDE_NVCC_CHECK
template __global__ void cuwide_lbfgs_logistic_forward<int, float, 8>(
    const int*, const int*, const float*, long long, const double*, long long, int,
    const double*, const double*, double*, double*);
template __global__ void cuwide_lbfgs_logistic_forward<long long, double, 32>(
    const long long*, const long long*, const double*, long long, const double*, long long,
    int, const double*, const double*, double*, double*);
template __global__ void cuwide_lbfgs_logistic_backward<int, float>(
    const int*, const int*, const float*, const int*, const long long*, long long, int,
    long long, const double*, const double*, double, int, double*, double*);
template __global__ void cuwide_lbfgs_gram<20>(const double*, long long, const double*,
                                                const double*, const double*, double*);
template __global__ void cuwide_lbfgs_direction<20>(const double*, long long, const double*,
                                                     const double*, double*);
#endif
