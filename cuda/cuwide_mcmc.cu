// Gibbs sampling of an order-2 factorization machine (solver="mcmc"): one
// block of features that share no row, each feature's weight and factors
// theta = (w_j, V_j) drawn jointly from their Gaussian conditional given the
// other features (sklearn_cuwide/_mcmc.py, _draw_block, is the same draw in
// array operations and the reference of the tests).
//
// A warp per feature.  Its parameters enter each of its rows' predictions
// linearly, h_i . theta with h_i = (x_ij, x_ij (q_i - V_j x_ij)), so
//   P = alpha sum_i s_i h_i h_i' + diag(lam)  (the diagonal's sums times
//       1 + jitter first),
//   b = alpha sum_i s_i h_i r_i + lam * mu,   r_i = e_i + h_i . theta,
// and the draw is U^-1 (U^-T b + z) with P = U'U: N(P^-1 b, P^-1).  Then the
// rows' residuals e and factor sums q are moved to the new parameters.
//
// Rules:
// * each sum runs over the feature's nonzeros in their order, one lane per
//   entry of P or b: no atomics, so a draw's bits do not depend on the
//   threads' timing (two fits with one seed are equal);
// * a pivot that is not positive gives NaN parameters, not an error here:
//   the sweep's loss check names the divergence on the host;
// * the block's features share no row and a feature holds a row once, so the
//   rows' updates of different warps never meet.
//
// Shared memory per warp: P (p x p, the upper triangle used), BATCH rows of h
// with their r and s, and the old theta, b and the solution (p each), in
// float64 (cuwide_mcmc_shared_doubles below; the launcher sizes the blocks).

// nonzeros whose h a warp holds at once
constexpr int CUWIDE_MCMC_BATCH = 32;

__host__ __device__ inline long long cuwide_mcmc_shared_doubles(int p) {
  return (long long)p * p + (long long)CUWIDE_MCMC_BATCH * (p + 2) + 3LL * p;
}

__global__ void cuwide_mcmc_draw_block(
    const long long* __restrict__ feats,  // the block's features (m)
    const long long* __restrict__ ends,   // each feature's cumulative nonzeros (m, from 1)
    const long long* __restrict__ rows,   // each nonzero's row, in feature order
    const double* __restrict__ x,         // each nonzero's value
    const double* __restrict__ sr,        // each nonzero's row weight
    const double* __restrict__ z,         // standard normal draws (m x p)
    long long m, int lin, int k, double alpha, const double* __restrict__ mu,
    const double* __restrict__ lam, double jitter, double* __restrict__ w,
    double* __restrict__ V, double* __restrict__ q, double* __restrict__ e) {
  extern __shared__ double smem[];
  const int p = lin + k;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  double* A = smem + (long long)warp * cuwide_mcmc_shared_doubles(p);  // P, row-major
  double* H = A + p * p;                                               // BATCH x p
  double* R = H + CUWIDE_MCMC_BATCH * p;                               // BATCH
  double* S = R + CUWIDE_MCMC_BATCH;                                   // BATCH
  double* th = S + CUWIDE_MCMC_BATCH;                                  // old theta
  double* b = th + p;
  double* t = b + p;  // the solves' vector, then the new theta
  const int n_pairs = p * (p + 1) / 2;
  for (long long f = (long long)blockIdx.x * warps + warp; f < m;
       f += (long long)gridDim.x * warps) {
    const long long j = feats[f];
    const long long a0 = f ? ends[f - 1] : 0, a1 = ends[f];
    for (int i = lane; i < p; i += 32) {
      th[i] = (lin && i == 0) ? w[j] : V[j * k + (i - lin)];
      b[i] = 0.0;
    }
    for (int i = lane; i < p * p; i += 32) A[i] = 0.0;
    __syncwarp();
    for (long long base = a0; base < a1; base += CUWIDE_MCMC_BATCH) {
      const int nb = (int)min((long long)CUWIDE_MCMC_BATCH, a1 - base);
      if (lane < nb) {
        const long long u = base + lane;
        const long long r = rows[u];
        const double xv = x[u];
        double* h = H + lane * p;
        double dot = 0.0;
        if (lin) {
          h[0] = xv;
          dot = xv * th[0];
        }
        for (int c = 0; c < k; ++c) {
          const double hv = xv * (q[r * k + c] - th[lin + c] * xv);
          h[lin + c] = hv;
          dot += hv * th[lin + c];
        }
        R[lane] = e[r] + dot;
        S[lane] = sr[u];
      }
      __syncwarp();
      // the lane of pair (i, jj), i <= jj, in row-major order of the upper
      // triangle, then of b's entries
      for (int pi = lane; pi < n_pairs + p; pi += 32) {
        if (pi < n_pairs) {
          int i = 0, left = pi;
          while (left >= p - i) {
            left -= p - i;
            ++i;
          }
          const int jj = i + left;
          double acc = A[i * p + jj];
          for (int v = 0; v < nb; ++v) acc += (H[v * p + i] * S[v]) * H[v * p + jj];
          A[i * p + jj] = acc;
        } else {
          const int i = pi - n_pairs;
          double acc = b[i];
          for (int v = 0; v < nb; ++v) acc += (H[v * p + i] * S[v]) * R[v];
          b[i] = acc;
        }
      }
      __syncwarp();
    }
    for (int pi = lane; pi < p * p; pi += 32) {
      const int i = pi / p, jj = pi - i * p;
      if (i < jj) {
        A[pi] *= alpha;
      } else if (i == jj) {
        A[pi] = (alpha * A[pi]) * (1.0 + jitter) + lam[i];
      }
    }
    for (int i = lane; i < p; i += 32) b[i] = alpha * b[i] + lam[i] * mu[i];
    __syncwarp();
    // P = U'U, U upper triangular, in place of P's upper triangle
    for (int i = 0; i < p; ++i) {
      if (lane == 0) {
        double d = A[i * p + i];
        for (int u = 0; u < i; ++u) d -= A[u * p + i] * A[u * p + i];
        A[i * p + i] = d > 0.0 ? sqrt(d) : nan("");
      }
      __syncwarp();
      const double pivot = A[i * p + i];
      for (int jj = i + 1 + lane; jj < p; jj += 32) {
        double v = A[i * p + jj];
        for (int u = 0; u < i; ++u) v -= A[u * p + i] * A[u * p + jj];
        A[i * p + jj] = v / pivot;
      }
      __syncwarp();
    }
    if (lane == 0) {  // U' y = b, t = y + z, then U theta = t
      for (int i = 0; i < p; ++i) {
        double v = b[i];
        for (int u = 0; u < i; ++u) v -= A[u * p + i] * t[u];
        t[i] = v / A[i * p + i];
      }
      for (int i = 0; i < p; ++i) t[i] += z[f * p + i];
      for (int i = p - 1; i >= 0; --i) {
        double v = t[i];
        for (int u = i + 1; u < p; ++u) v -= A[i * p + u] * t[u];
        t[i] = v / A[i * p + i];
      }
    }
    __syncwarp();
    for (int i = lane; i < p; i += 32) {
      if (lin && i == 0) {
        w[j] = t[0];
      } else {
        V[j * k + (i - lin)] = t[i];
      }
    }
    for (long long u = a0 + lane; u < a1; u += 32) {
      const long long r = rows[u];
      const double xv = x[u];
      double before = 0.0, after = 0.0;
      if (lin) {
        before = xv * th[0];
        after = xv * t[0];
      }
      for (int c = 0; c < k; ++c) {
        const double qc = q[r * k + c];
        const double hv = xv * (qc - th[lin + c] * xv);
        before += hv * th[lin + c];
        after += hv * t[lin + c];
        q[r * k + c] = qc + xv * (t[lin + c] - th[lin + c]);
      }
      e[r] = (e[r] + before) - after;
    }
    __syncwarp();  // th, b and t are the next feature's
  }
}
