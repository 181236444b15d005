// The layout build's passes over the nonzeros, fused (sklearn_cuwide/_layout.py
// holds the plan and the tiling's rules, and the numpy code every kernel here
// must equal, bit for bit).
//
// * cuwide_count_rows: each feature's nonzero entries (stored zeros not
//   counted) in some rows of a CSR, added to (or taken from) 64-bit counts.
// * cuwide_rank_keys / cuwide_rank_order: the frequency ranking, a sort of the
//   unique keys (top - count) * n + feature between the two; the second also
//   finds how many features reach the hot threshold (the ranked counts fall).
// * cuwide_keyed_permutation: the layout's row order (a keyed bijection with
//   cycle walking: the rows of a shuffled fit's layout), each position alone.
// * cuwide_batch_nnz: the input nonzeros of each mini-batch, rows in layout
//   order.
// * cuwide_chunk_keys: a chunk's rows gathered in layout order, each nonzero
//   written as its sort key (sample block, ranked feature, row in block) and
//   its value in the layout's dtype.
// * cuwide_chunk_runs / cuwide_chunk_store: after the sort, the runs of equal
//   keys (duplicate entries) summed in float64, the sums that are 0 dropped,
//   the rest decoded into the layout's arrays, and each tile's nonzeros
//   counted.
// * cuwide_copy_rows: some rows of a CSR copied as they are into the CSR of
//   those rows (early stopping's held-out rows, gathered where the input lies).
// * cuwide_penalty_held / cuwide_penalty_scale: how many sample blocks hold
//   each feature (the starts of its runs in the tiles), and the penalty
//   factor n_batches / held.
//
// Rows are handled a warp each (their nonzeros are contiguous); the rest a
// thread per item.  Counts are atomic adds: their sum does not depend on
// the order.
#include "cuwide_common.cuh"

// The source row of local row i: users[i], or i where there is no users.
__device__ __forceinline__ long long source_row(const long long* users, long long i) {
  return users != nullptr ? users[i] : i;
}

template <typename IDX, typename T>
__global__ void cuwide_count_rows(const long long* __restrict__ indptr,
                                  const IDX* __restrict__ indices,
                                  const T* __restrict__ data,
                                  const long long* __restrict__ users, long long n_rows,
                                  unsigned long long delta,
                                  unsigned long long* __restrict__ counts) {
  const int lane = threadIdx.x & 31;
  const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
  for (long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; i < n_rows;
       i += warps) {
    const long long s = source_row(users, i);
    const long long p1 = indptr[s + 1];
    for (long long p = indptr[s] + lane; p < p1; p += 32)
      if (data[p] != T(0)) atomicAdd(&counts[(long long)indices[p]], delta);
  }
}

__global__ void cuwide_rank_keys(const long long* __restrict__ counts, long long n,
                                 long long top, long long* __restrict__ keys) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride)
    keys[j] = (top - counts[j]) * n + j;
}

// n_hot[0] (zeroed by the caller): the features of count >= hot_min.
__global__ void cuwide_rank_order(const long long* __restrict__ sorted_keys, long long n,
                                  long long top, double hot_min,
                                  long long* __restrict__ order, long long* __restrict__ rank,
                                  long long* __restrict__ n_hot) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const long long k = sorted_keys[i];
    const long long j = k % n;
    order[i] = j;
    rank[j] = i;
    const bool hot = (double)(top - k / n) >= hot_min;
    if (hot && (i + 1 == n || (double)(top - sorted_keys[i + 1] / n) < hot_min))
      n_hot[0] = i + 1;
  }
}

// out[i] for i < count: position i of the keyed permutation of [0, n)
// (sklearn_cuwide/_layout.py, keyed_permutation): each of the n_rounds rounds
// xors keys[2r], multiplies by the odd keys[2r + 1] and xor-shifts right, all
// modulo mask + 1 (a bijection of [0, mask + 1)); a value n or more goes
// through the rounds again (cycle walking: the values left are a permutation).
__global__ void cuwide_keyed_permutation(long long n, long long count,
                                         const unsigned long long* __restrict__ keys,
                                         int n_rounds, unsigned long long mask, int shift,
                                         long long* __restrict__ out) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    unsigned long long x = (unsigned long long)i;
    do {
      for (int r = 0; r < n_rounds; ++r) {
        x ^= keys[2 * r];
        x *= keys[2 * r + 1];
        x &= mask;
        x ^= x >> shift;
      }
    } while (x >= (unsigned long long)n);
    out[i] = (long long)x;
  }
}

// out[b]: the nonzeros of mini-batch b (local rows b * batch_size on).
__global__ void cuwide_batch_nnz(const long long* __restrict__ indptr,
                                 const long long* __restrict__ users, long long n_rows,
                                 long long batch_size, long long n_batches,
                                 long long* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
  for (long long b = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; b < n_batches;
       b += warps) {
    const long long r1 = min(n_rows, (b + 1) * batch_size);
    long long sum = 0;
    for (long long i = b * batch_size + lane; i < r1; i += 32) {
      const long long s = source_row(users, i);
      sum += indptr[s + 1] - indptr[s];
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(CUWIDE_FULL_MASK, sum, off);
    if (lane == 0) out[b] = sum;
  }
}

// Local row i is layout row r0 + i; its nonzeros go to out_ptr[i] -
// out_ptr[0] on (out_ptr: the rows' own indptr, or their lengths summed).
template <typename IDX, typename T, typename V>
__global__ void cuwide_chunk_keys(const long long* __restrict__ indptr,
                                  const IDX* __restrict__ indices, const T* __restrict__ data,
                                  const long long* __restrict__ users,
                                  const long long* __restrict__ out_ptr, long long n_rows,
                                  long long r0, long long batch_size, long long sample_block,
                                  long long n_features,
                                  const long long* __restrict__ batch_sblock_ptr,
                                  const long long* __restrict__ rank,
                                  long long* __restrict__ key, V* __restrict__ val) {
  const int lane = threadIdx.x & 31;
  const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
  for (long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; i < n_rows;
       i += warps) {
    const long long s = source_row(users, i);
    const long long p0 = indptr[s], len = indptr[s + 1] - p0, o = out_ptr[i] - out_ptr[0];
    const long long lrow = r0 + i, bt = lrow / batch_size, pos = lrow - bt * batch_size;
    const long long g = batch_sblock_ptr[bt] + pos / sample_block;
    const long long local = pos % sample_block;
    for (long long j = lane; j < len; j += 32) {
      const long long p = p0 + j;
      key[o + j] = (g * n_features + rank[(long long)indices[p]]) * sample_block + local;
      val[o + j] = (V)data[p];
    }
  }
}

// Row i of the output is source row users[i]: its nonzeros written from
// out_ptr[i] on, in their order.
template <typename IDX, typename T>
__global__ void cuwide_copy_rows(const long long* __restrict__ indptr,
                                 const IDX* __restrict__ indices, const T* __restrict__ data,
                                 const long long* __restrict__ users,
                                 const long long* __restrict__ out_ptr, long long n_rows,
                                 IDX* __restrict__ out_indices, T* __restrict__ out_data) {
  const int lane = threadIdx.x & 31;
  const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
  for (long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; i < n_rows;
       i += warps) {
    const long long s = users[i];
    const long long p0 = indptr[s], len = indptr[s + 1] - p0, o = out_ptr[i];
    for (long long j = lane; j < len; j += 32) {
      out_indices[o + j] = indices[p0 + j];
      out_data[o + j] = data[p0 + j];
    }
  }
}

// keep[i]: 1 where sorted entry i starts a run of equal keys whose float64
// sum is not 0 (sum[i] then holds it), else 0.
template <typename V>
__global__ void cuwide_chunk_runs(const long long* __restrict__ key,
                                  const long long* __restrict__ perm,
                                  const V* __restrict__ val, long long n,
                                  long long* __restrict__ keep, V* __restrict__ sum) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const long long k = key[perm[i]];
    if (i > 0 && key[perm[i - 1]] == k) {
      keep[i] = 0;
      continue;
    }
    double s = (double)val[perm[i]];
    for (long long t = i + 1; t < n && key[perm[t]] == k; ++t) s += (double)val[perm[t]];
    keep[i] = s != 0.0;
    sum[i] = (V)s;
  }
}

// The kept entries (offset[i] - 1: their place after `start`) decoded into
// the layout's arrays; tile_counts[2 (g - g0) + (feature >= n_hot)] counted.
// The entries are sorted, so a warp's lanes mostly count the same tile: the
// lanes of one tile add their number once (one atomic per tile and warp,
// not per entry: same-address atomics serialise).  Whole warps iterate
// (blockDim is a multiple of 32), so every lane takes part in the match.
template <typename V>
__global__ void cuwide_chunk_store(const long long* __restrict__ key,
                                   const long long* __restrict__ perm,
                                   const long long* __restrict__ keep,
                                   const long long* __restrict__ offset,
                                   const V* __restrict__ sum, long long n, long long start,
                                   long long n_features, long long sample_block,
                                   long long n_hot, long long g0, int* __restrict__ feat,
                                   unsigned short* __restrict__ row, V* __restrict__ val,
                                   unsigned long long* __restrict__ tile_counts) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  const int lane = threadIdx.x & 31;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i - lane < n;
       i += stride) {
    long long tile = -1;
    if (i < n && keep[i]) {
      const long long k = key[perm[i]], o = start + offset[i] - 1;
      const long long t = k / sample_block, f = t % n_features, g = t / n_features;
      feat[o] = (int)f;
      row[o] = (unsigned short)(k - t * sample_block);
      val[o] = sum[i];
      tile = 2 * (g - g0) + (f >= n_hot ? 1 : 0);
    }
    const unsigned peers = __match_any_sync(0xffffffffu, tile);
    if (tile >= 0 && lane == __ffs(peers) - 1)
      atomicAdd(&tile_counts[tile], (unsigned long long)__popc(peers));
  }
}

// A block per tile: a feature's nonzeros are contiguous in a tile, so each
// run's first nonzero counts the tile's sample block once for its feature.
__global__ void cuwide_penalty_held(const int* __restrict__ feat,
                                    const long long* __restrict__ tile_ptr, long long n_tiles,
                                    unsigned long long* __restrict__ held) {
  for (long long t = blockIdx.x; t < n_tiles; t += gridDim.x) {
    const long long a = tile_ptr[t], b = tile_ptr[t + 1];
    for (long long i = a + threadIdx.x; i < b; i += blockDim.x)
      if (i == a || feat[i] != feat[i - 1]) atomicAdd(&held[feat[i]], 1ULL);
  }
}

__global__ void cuwide_penalty_scale(const long long* __restrict__ held, long long n,
                                     double n_batches, float* __restrict__ out) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride)
    out[j] = held[j] > 0 ? (float)(n_batches / (double)held[j]) : 0.f;
}

#ifdef CUWIDE_NVCC_CHECK
template __global__ void cuwide_count_rows<int, float>(const long long*, const int*,
                                                       const float*, const long long*,
                                                       long long, unsigned long long,
                                                       unsigned long long*);
template __global__ void cuwide_count_rows<long long, double>(
    const long long*, const long long*, const double*, const long long*, long long,
    unsigned long long, unsigned long long*);
template __global__ void cuwide_chunk_keys<int, float, float>(
    const long long*, const int*, const float*, const long long*, const long long*,
    long long, long long, long long, long long, long long, const long long*,
    const long long*, long long*, float*);
template __global__ void cuwide_chunk_keys<long long, double, double>(
    const long long*, const long long*, const double*, const long long*, const long long*,
    long long, long long, long long, long long, long long, const long long*,
    const long long*, long long*, double*);
template __global__ void cuwide_copy_rows<int, float>(const long long*, const int*,
                                                      const float*, const long long*,
                                                      const long long*, long long, int*,
                                                      float*);
template __global__ void cuwide_copy_rows<long long, double>(
    const long long*, const long long*, const double*, const long long*, const long long*,
    long long, long long*, double*);
template __global__ void cuwide_chunk_runs<float>(const long long*, const long long*,
                                                  const float*, long long, long long*,
                                                  float*);
template __global__ void cuwide_chunk_runs<double>(const long long*, const long long*,
                                                   const double*, long long, long long*,
                                                   double*);
template __global__ void cuwide_chunk_store<float>(const long long*, const long long*,
                                                   const long long*, const long long*,
                                                   const float*, long long, long long,
                                                   long long, long long, long long, long long,
                                                   int*, unsigned short*, float*,
                                                   unsigned long long*);
#endif
