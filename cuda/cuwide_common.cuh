// Shared device helpers of the sklearn-cuwide kernels.
//
// Compiled at run time by NVRTC through cupy.RawModule (no host headers);
// also compiles standalone with nvcc for the CPU test that checks syntax.
#pragma once

#define CUWIDE_FULL_MASK 0xffffffffu

namespace cuwide {

enum Model { LINEAR = 0, FM = 1 };
enum Loss { LOGISTIC = 0, MULTINOMIAL = 1, SQUARED = 2 };
enum Solver { SGD = 0, ADAGRAD = 1 };

// log(1 + exp(z)) without overflow
__device__ __forceinline__ float log1pexp(float z) {
  return z > 0.f ? z + log1pf(expf(-z)) : log1pf(expf(z));
}

__device__ __forceinline__ float sigmoid(float z) {
  // 0.5 * (1 + tanh(z / 2)) is exact at both ends
  return 0.5f * (1.f + tanhf(0.5f * z));
}

// Largest power of two <= min(n, 32): lanes that share one nonzero.
template <int N>
struct GroupSize {
  static constexpr int v = N >= 32 ? 32 : N >= 16 ? 16 : N >= 8 ? 8 : N >= 4 ? 4 : N >= 2 ? 2 : 1;
};

// Row stride of per-sample accumulators in shared memory: odd when > 1, so
// the lanes of a warp that touch different rows hit different banks.
template <int W>
struct OddStride {
  static constexpr int v = (W > 1 && (W % 2) == 0) ? W + 1 : W;
};

// The last read of a stored nonzero in an epoch (the apply's): a streaming
// load (evict first), so that the layout streaming through L2 leaves room for
// the model's gathers.
template <typename T>
__device__ __forceinline__ T last_read(const T* p) {
  return __ldcs(p);
}

// One sgd/adagrad step on one parameter, with the L1 proximal step fused.
// ``G_old`` is Adagrad's accumulator as read (early, to hide its latency) by
// the caller.  Lock-free: the accumulator and the parameter change through
// atomic adds (a CAS loop for the L1 prox), so concurrent thread blocks
// (Hogwild) never lose an update; a concurrent block's contribution to G
// may be missed in this step's scale.  ``scale`` (1 in sequential mode)
// shrinks the step of a parameter that several blocks update at once.
template <int SOLVER>
__device__ __forceinline__ void update_param(float* p, float* G, float g, float lr,
                                             float eps, float l1, float l2, float scale,
                                             float G_old) {
  // g includes the L2 term l2 * p_old; the step t is damped to t / (1 + t l2),
  // the L2 term's proximal form (stable for any t * l2)
  float step;
  if (SOLVER == SGD) {
    step = lr;
  } else {
    const float gg = g * g;
    atomicAdd(G, gg);
    step = lr / (sqrtf(G_old + gg) + eps);
  }
  step *= scale;
  step = step / (1.f + step * l2);
  const float delta = -step * g;
  if (l1 > 0.f) {
    const float thr = step * l1;
    int* pi = reinterpret_cast<int*>(p);
    int old = *pi, assumed;
    do {
      assumed = old;
      float nv = __int_as_float(assumed) + delta;
      nv = copysignf(fmaxf(fabsf(nv) - thr, 0.f), nv);
      old = atomicCAS(pi, assumed, __float_as_int(nv));
    } while (old != assumed);
  } else {
    atomicAdd(p, delta);
  }
}

template <int SOLVER>
__device__ __forceinline__ float load_acc(const float* G) {
  return SOLVER == SGD ? 0.f : *G;
}


// ---- thread block clusters (sm_90): several blocks train one sample block ----
// The cluster's blocks see each other's shared memory (distributed shared
// memory) through addresses mapped with ``mapa``; ``cluster_sync`` is a
// barrier over the cluster with release/acquire semantics (global and
// shared memory), so what one block wrote before it is visible to all after.
// Before sm_90 there are no clusters: the helpers compile to a single block's
// view (rank 0 of 1) and the cluster kernel is never instantiated there (the
// CUDA backend asks for clusters only on devices of compute capability 9+).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define CUWIDE_HAS_CLUSTERS 1
#else
#define CUWIDE_HAS_CLUSTERS 0
#endif

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r = 0;
#if CUWIDE_HAS_CLUSTERS
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
  return r;
}

__device__ __forceinline__ unsigned cluster_id() {
  unsigned r = blockIdx.x;
#if CUWIDE_HAS_CLUSTERS
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
#endif
  return r;
}

__device__ __forceinline__ unsigned cluster_count() {
  unsigned r = gridDim.x;
#if CUWIDE_HAS_CLUSTERS
  asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
#endif
  return r;
}

__device__ __forceinline__ void cluster_sync() {
#if CUWIDE_HAS_CLUSTERS
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n\t"
      "barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __syncthreads();
#endif
}

// The address of ``*p`` (in this block's shared memory) in block ``rank``
// of the cluster, as a generic pointer.
template <typename T>
__device__ __forceinline__ T* cluster_map(T* p, unsigned rank) {
#if CUWIDE_HAS_CLUSTERS
  unsigned long long out;
  asm volatile("mapa.u64 %0, %1, %2;"
               : "=l"(out)
               : "l"(reinterpret_cast<unsigned long long>(p)), "r"(rank));
  return reinterpret_cast<T*>(out);
#else
  return p;
#endif
}

// First index in [lo, hi) whose feature id is above ``f`` (``feat`` sorted
// ascending there), or ``hi``.  One warp, all lanes, 32 probes per round.
__device__ __forceinline__ long long warp_upper_bound(const int* __restrict__ feat, long long lo,
                                                      long long hi, int f, int lane) {
  while (hi - lo > 32) {
    const long long stride = (hi - lo + 31) / 32;
    const long long q = lo + lane * stride;
    const bool gt = q < hi && feat[q] > f;
    const unsigned m = __ballot_sync(CUWIDE_FULL_MASK, gt);
    if (m == 0u) {
      // past the last probe inside [lo, hi)
      const long long jmax = (hi - lo - 1) / stride < 31 ? (hi - lo - 1) / stride : 31;
      lo = lo + jmax * stride + 1;
    } else {
      const int j = __ffs(m) - 1;           // first probe above f
      if (j == 0) return lo;                // feat[lo] > f already
      const long long nhi = lo + j * stride;
      lo = lo + (j - 1) * stride + 1;
      hi = nhi;
    }
  }
  const long long q = lo + lane;
  const unsigned m = __ballot_sync(CUWIDE_FULL_MASK, q < hi && feat[q] > f);
  return m ? lo + (__ffs(m) - 1) : hi;
}

// Start of part ``r`` of ``C`` of [a, b), moved forward to the next change
// of feature so that no feature's nonzeros are split between two parts
// (every lane of the calling warp gets it).
__device__ __forceinline__ long long feature_split(const int* __restrict__ feat, long long a,
                                                   long long b, int r, int C, int lane) {
  if (r <= 0) return a;
  if (r >= C) return b;
  const long long p = a + (b - a) * r / C;
  if (p <= a) return a;
  if (p >= b) return b;
  return warp_upper_bound(feat, p, b, feat[p - 1], lane);
}

}  // namespace cuwide
