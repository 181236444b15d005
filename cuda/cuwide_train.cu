// cuWide flow-based training kernel (LR, multinomial LR, order-2 FM).
//
// One persistent kernel runs one pass over a list of mini-batches of the
// tiled, feature-major layout (sklearn_cuwide/_layout.py).  A worker (a
// thread block, or a cluster of them) takes a mini-batch (dynamically,
// through an atomic work counter, or round-robin) and walks its sample
// blocks.  For each sample block:
//
//   init       per-sample accumulators <- 0 (shared memory); the hot
//              features' parameters (ids < n_hot) are cached in shared memory
//   aggregate  feature -> sample: every nonzero adds its feature's weight
//              (and factors) times its value to its sample's accumulators
//   loss       per sample: loss, and the derivative scaled by
//              sample_weight / W_batch, kept in the same shared-memory slot
//              (cross-stage accumulation caching: the per-sample state never
//              goes through global memory inside a tile)
//   apply      sample -> feature.  Hot tile: per-nonzero gradients are
//              summed per feature (LR: a segmented scan across the lanes of a
//              warp over the sorted feature ids; FM: a group of lanes sums a
//              contiguous run of nonzeros in registers) and added into
//              replicated shared accumulators, flushed once per sample block.
//              Cold tile: one lane (LR: several segments of a warp's window
//              at once) or one group of lanes (FM: the segment heads
//              compacted per chunk) per feature segment sums the segment and
//              updates the parameter in global memory directly.
//   update     sgd / adagrad, L2 on the present features, L1 proximal step,
//              fused into the flush and the cold apply; with pscale the
//              penalties are scaled per feature (_layout.penalty_scale), and
//              every step t is damped to the L2 term's proximal t / (1 + t l2).
//              Feature f's Adagrad sums are gw[f * gstride + o] and its penalty
//              factor pscale[f * pstride]: the backend packs both in one buffer
//              (gstride = pstride = NOUT + 1, pscale = gw + NOUT), so that the
//              cold apply reads them from one 32-byte sector, not two.
//
// Semantics: with one worker and round-robin order the mini-batches are
// applied strictly in order, exactly as the CPU backend does.  With many
// workers they run concurrently and lock-free (Hogwild): every update is an
// atomic add (or CAS for the L1 prox), so no update is lost, but a worker may
// read weights that another is about to change.
//
// Kernels: cuwide_train (one block per worker) and cuwide_train_cluster (a
// thread block cluster per worker) are what the estimators run.  The
// benchmarks' paper-style ablation runs cuwide_train_ablation[_cluster], the
// same body with one optimisation off (Variant); sklearn_cuwide/_backends/
// _cuda/_ablation.py launches them, the estimators never do.  (The third
// ablation, no hot-feature cache, is a layout with n_hot = 0.)
#include "cuwide_common.cuh"

using namespace cuwide;

// The scalar arguments of one launch of the training kernel, passed by value
// (kernel parameters live in the constant bank, as separate ones would).  The
// CUDA backend builds it as a one-element numpy array of a structured dtype
// with the same field order, offsets and size (sklearn_cuwide/_backends/
// _tiles.py, STEP_ARGS; tests/test_cuda_sources.py checks the two agree).
namespace cuwide {
struct StepArgs {
  long long nnz_base;  // layout index of feat[0] (a streamed chunk's first nonzero)
  int n_work;          // mini-batches in order
  int sample_block;    // most rows of a sample block (rows of the per-sample accumulators)
  int n_hot;           // hot features: ids [0, n_hot), cached in shared memory
  int n_scaled;        // features [0, n_scaled) have a step scale in fscale
  int gstride;         // floats from one feature's Adagrad sums in gw to the next's
  int pstride;         // floats from one feature's penalty factor in pscale to the next's
  float lr;            // learning rate
  float l2w;           // L2 penalty of w (b is not penalized)
  float l2v;           // L2 penalty of V
  float l1;            // L1 penalty of w (proximal step)
  float eps;           // Adagrad's epsilon
  float bscale;        // the intercepts' step scale under concurrency
  int fit_intercept;   // 0 / 1
  int fit_linear;      // FM: 0 / 1, train the linear weights
};

// The kernel's variants: what the estimators run, and the ablations that
// each leave one optimisation out
enum Variant {
  PRODUCTION = 0,
  NO_REPLICAS = 1,          // one copy of the hot gradient accumulators
  GLOBAL_ACCUMULATORS = 2,  // per-sample accumulators in global memory, not shared
};
}  // namespace cuwide

// Copies of each hot gradient accumulator: fewer atomic conflicts on the
// frequent features, as many as the shared memory of narrow models allows
// (sklearn_cuwide/_backends/_tiles.py, replicas_of_width, sizes the shared
// memory with the same rule)
__host__ __device__ constexpr int hot_replicas(int hw) {
  return hw == 1 ? 4 : hw <= 17 ? 2 : 1;
}

// FM aggregate, a lane holding at most two factors: nonzeros a group of
// lanes loads at once, so that their gathers overlap
constexpr int FM_AGG_UNROLL = 8;

// FM hot apply, a lane holding at most two factors: nonzeros of a group's
// run loaded at once, so that their loads overlap
constexpr int FM_HOT_RUN_UNROLL = 4;

// Cold LR feature segments a lane sums at once (their gathers in flight
// together): as many as 64 registers hold, fewer with more outputs
__host__ __device__ constexpr int lr_cold_segments(int nout) {
  return nout <= 2 ? 3 : nout <= 4 ? 2 : 1;
}

template <int MODEL, int NOUT, int NF>
struct Shape {
  static constexpr int HW = MODEL == FM ? NF + 1 : NOUT;   // model floats per feature
  static constexpr int RW = MODEL == FM ? NF + 1 : NOUT;   // per-sample floats
  static constexpr int RS = OddStride<RW>::v;              // per-sample stride
  static constexpr int G = MODEL == FM ? GroupSize<NF>::v : 1;  // lanes per nonzero
  static constexpr int KPL = MODEL == FM ? (NF + G - 1) / G : 1;  // factors per lane
};

// Feature f's step scale under concurrency: fscale[f] for the features
// [0, n_scaled) that the policy damps, 1 for the others (no gather: the cold
// features of a cap policy are rarely damped)
__device__ __forceinline__ float step_scale(const float* __restrict__ fscale, int n_scaled,
                                            long long f) {
  return (fscale && f < n_scaled) ? fscale[f] : 1.f;
}

template <int LOSS>
__device__ __forceinline__ void loss1(float z, float y, float& lo, float& d) {
  if (LOSS == SQUARED) {
    d = z - y;
    lo = 0.5f * d * d;
  } else {
    lo = log1pexp(z) - y * z;
    d = sigmoid(z) - y;
  }
}

// CL blocks (a thread block cluster when CL > 1) form one worker: they train
// the same sample block together.  Each aggregates a CL-th of its nonzeros
// into its own per-sample accumulators; the partial sums are reduced across
// the cluster through distributed shared memory (block r sums rows r*m/CL..
// (r+1)*m/CL and computes their loss), gathered back, and each block applies
// the gradients of a CL-th of the features (the tile split at feature
// boundaries, so every feature is updated by exactly one block).  A worker
// applies its sample blocks in order, as one block does: with one worker the
// semantics are the sequential order's, whatever CL; CL > 1 only shortens
// the time one sample block takes, so fewer workers (less staleness) fill
// the GPU.
template <int MODEL, int NOUT, int NF, int SOLVER, int LOSS, int CL, int VARIANT>
__device__ __forceinline__ void train_body(
    // the layout, in layout order (sklearn_cuwide/_layout.py)
    const int* __restrict__ feat,            // per nonzero: feature id (sorted within a tile)
    const unsigned short* __restrict__ row,  // per nonzero: row within its sample block
    const float* __restrict__ val,           // per nonzero: value
    const long long* __restrict__ tile_ptr,  // sample block g: hot nonzeros from tile_ptr[2g],
                                             // cold from [2g + 1], to [2g + 2]
    const long long* __restrict__ sblock_row_ptr,    // sample block g: rows from [g] to [g + 1]
    const long long* __restrict__ batch_sblock_ptr,  // mini-batch t: sample blocks [t] to [t + 1]
    const float* __restrict__ y,        // per row: label (the class index for multinomial)
    const float* __restrict__ sw,       // per row: sample weight
    const float* __restrict__ batch_w,  // per mini-batch: sum of sample weights (0: skipped)
    // this launch's work
    const int* __restrict__ order,  // the mini-batches to train, in the order they are taken
    int* work_counter,              // next position in order, taken atomically by the workers;
                                    // null: worker q takes positions q, q + P, q + 2P, ...
    // the model and its Adagrad sums, updated in place
    float* w,   // (n_features, NOUT) linear weights
    float* V,   // (n_features, NF) factors; null for LR
    float* b,   // (NOUT,) intercepts
    float* gw,  // sums of w, feature f's at gw[f * gstride + o]; null for sgd
    float* gV,  // (n_features, NF) sums of V; null for sgd or LR
    float* gb,  // (NOUT,) sums of b; null for sgd
    // per-feature factors, the loss
    const float* __restrict__ fscale,  // step scale of features [0, n_scaled); null: all 1
    const float* __restrict__ pscale,  // penalty factor of f at pscale[f * pstride]; null: all 1
    double* loss_out,                  // += the launch's sum of sample_weight * loss
    const StepArgs& args,              // the scalars
    float* acc_global) {  // GLOBAL_ACCUMULATORS: sample_block * RS floats per block of the grid
  using S = Shape<MODEL, NOUT, NF>;
  constexpr int HW = S::HW, RS = S::RS, G = S::G, KPL = S::KPL;
  // nonzeros a thread (LR) or group of lanes (FM) aggregates at once, their
  // gathers in flight together: fewer as a nonzero's floats per lane grow
  constexpr int UNROLL = MODEL == FM ? (KPL > 2 ? 2 : KPL == 2 ? 4 : FM_AGG_UNROLL)
                                    : (NOUT > 4 ? 1 : 4);
  constexpr int REP = VARIANT == NO_REPLICAS ? 1 : hot_replicas(HW);
  // a template argument, not a test of acc_global: with the per-sample
  // accumulators known to be in shared memory, their atomics compile to
  // shared-memory ones, without a generic atomic's address-space test
  constexpr bool ACCG = VARIANT == GLOBAL_ACCUMULATORS;
  const int sample_block = args.sample_block, n_hot = args.n_hot, n_scaled = args.n_scaled;
  const int gstride = args.gstride, pstride = args.pstride;
  const float lr = args.lr, l2w = args.l2w, l2v = args.l2v, l1 = args.l1, eps = args.eps;
  const int fit_intercept = args.fit_intercept, fit_linear = args.fit_linear;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ int s_item[2];
  __shared__ long long s_split[4];
  const int tid = threadIdx.x, bd = blockDim.x;
  // the worker (one block, or one cluster of CL blocks) and this block's rank in it
  const int crank = CL > 1 ? (int)cluster_rank() : 0;
  const int worker = CL > 1 ? (int)cluster_id() : (int)blockIdx.x;
  const int n_workers = CL > 1 ? (int)cluster_count() : (int)gridDim.x;
  const int lane = tid & 31, warp = tid >> 5, n_warps = bd >> 5;

  // shared memory (sklearn_cuwide/_backends/_tiles.py, smem_bytes, sizes it):
  // per-sample accumulators, hot cache, REP hot gradient copies, segment
  // heads, per-warp counts, intercept gradient, hot features touched
  float* acc_s = reinterpret_cast<float*>(smem_raw);
  float* hcache = acc_s + (ACCG ? 0 : sample_block * RS);
  const long long hsize = (long long)n_hot * HW;
  float* hgrad = hcache + hsize;
  int* heads = reinterpret_cast<int*>(hgrad + (long long)REP * hsize);
  int* wcount = heads + bd;                                  // 33 ints
  float* bgrad = reinterpret_cast<float*>(wcount + 33);      // NOUT floats
  int* touched = reinterpret_cast<int*>(bgrad + NOUT);  // hot feature present?
  float* acc = ACCG ? acc_global + (long long)blockIdx.x * sample_block * RS : acc_s;
  // block q's per-sample accumulators (q in this cluster)
  auto peer_acc = [&](int q) -> float* {
    return ACCG ? acc_global + (long long)(blockIdx.x - crank + q) * sample_block * RS
                      : cluster_map(acc_s, (unsigned)q);
  };

  // group of G lanes per nonzero / per segment
  const int gl = tid % G, gid = tid / G, ng = bd / G;

  for (long long i = tid; i < (long long)REP * hsize; i += bd) hgrad[i] = 0.f;
  for (int i = tid; i < n_hot; i += bd) touched[i] = 0;
  double my_loss = 0.0;
  int step = 0;

  for (;;) {
    int item;
    if (work_counter && CL > 1) {
      // the cluster's first block takes the item; two slots, so that it
      // never overwrites one a peer has not read yet (a cluster barrier
      // lies between a slot's read and its next write)
      __syncthreads();
      if (crank == 0 && tid == 0) s_item[step & 1] = atomicAdd(work_counter, 1);
      cluster_sync();
      item = *cluster_map(&s_item[step & 1], 0u);
    } else if (work_counter) {
      __syncthreads();
      if (tid == 0) s_item[0] = atomicAdd(work_counter, 1);
      __syncthreads();
      item = s_item[0];
    } else {
      item = worker + step * n_workers;
    }
    ++step;
    if (item >= args.n_work) break;
    const int bt = order[item];
    const float wb = batch_w[bt];
    if (!(wb > 0.f)) continue;
    const float inv_wb = 1.f / wb;

    for (long long g = batch_sblock_ptr[bt]; g < batch_sblock_ptr[bt + 1]; ++g) {
      const long long r0 = sblock_row_ptr[g];
      const int m = (int)(sblock_row_ptr[g + 1] - r0);
      const long long t0 = tile_ptr[2 * g] - args.nnz_base;
      const long long t1 = tile_ptr[2 * g + 1] - args.nnz_base;
      const long long t2 = tile_ptr[2 * g + 2] - args.nnz_base;
      // this block's share: nonzeros a0..a1 to aggregate, rows s0..s1 to
      // reduce and take the loss of, hot nonzeros h0..h1 and cold c0..c1 to
      // apply (split at feature boundaries)
      long long a0 = t0, a1 = t2, h0 = t0, h1 = t1, c0 = t1, c1 = t2;
      const int s0 = m * crank / CL, s1 = m * (crank + 1) / CL;
      if constexpr (CL > 1) {
        a0 = t0 + (t2 - t0) * crank / CL;
        a1 = t0 + (t2 - t0) * (crank + 1) / CL;
        if (warp < 4) {
          const long long lo = warp < 2 ? t0 : t1, hi = warp < 2 ? t1 : t2;
          const long long v = feature_split(feat, lo, hi, crank + (warp & 1), CL, lane);
          if (lane == 0) s_split[warp] = v;
        }
      }

      // ---------------- init ----------------
      for (int i = tid; i < m * RS; i += bd) acc[i] = 0.f;
      for (long long i = tid; i < hsize; i += bd) {
        const int f = (int)(i / HW), j = (int)(i - (long long)f * HW);
        float v;
        if (MODEL == FM)
          v = j < NF ? V[(long long)f * NF + j] : (fit_linear ? w[f] : 0.f);
        else
          v = w[(long long)f * NOUT + j];
        hcache[i] = v;
      }
      if (tid < NOUT) bgrad[tid] = 0.f;
      __syncthreads();
      if constexpr (CL > 1) {
        h0 = s_split[0];
        h1 = s_split[1];
        c0 = s_split[2];
        c1 = s_split[3];
      }

      // ---------------- aggregate: feature -> sample ----------------
      // UNROLL nonzeros per thread (group) per step: their loads are all
      // issued before the first use, so the gathers overlap.
      if constexpr (MODEL == LINEAR) {
        for (long long base = a0 + tid; base < a1; base += UNROLL * bd) {
          int f[UNROLL], r[UNROLL];
          float x[UNROLL];
#pragma unroll
          for (int u = 0; u < UNROLL; ++u) {
            const long long i = base + (long long)u * bd;
            f[u] = -1;
            if (i < a1) {
              f[u] = feat[i];
              r[u] = row[i];
              x[u] = val[i];
            }
          }
          float wv[UNROLL][NOUT];
#pragma unroll
          for (int u = 0; u < UNROLL; ++u) {
            const long long i = base + (long long)u * bd;
#pragma unroll
            for (int o = 0; o < NOUT; ++o)
              wv[u][o] = f[u] < 0 ? 0.f
                         : i < t1 ? hcache[f[u] * NOUT + o]
                                  : w[(long long)f[u] * NOUT + o];
          }
#pragma unroll
          for (int u = 0; u < UNROLL; ++u) {
            if (f[u] < 0) continue;
#pragma unroll
            for (int o = 0; o < NOUT; ++o) atomicAdd(&acc[r[u] * RS + o], wv[u][o] * x[u]);
          }
        }
      } else {
        for (long long b0 = a0; b0 < a1; b0 += (long long)UNROLL * ng) {
          // b0 is the same for all lanes: the shuffles below are warp-uniform
          const long long base = b0 + gid;
          int f[UNROLL], r[UNROLL];
          float x[UNROLL];
#pragma unroll
          for (int u = 0; u < UNROLL; ++u) {
            const long long i = base + (long long)u * ng;
            f[u] = -1;
            r[u] = 0;
            x[u] = 0.f;
            if (i < a1) {
              f[u] = feat[i];
              r[u] = row[i];
              x[u] = val[i];
            }
          }
          float v[UNROLL][KPL];
          float lin[UNROLL];
#pragma unroll
          for (int u = 0; u < UNROLL; ++u) {
            const bool hot = base + (long long)u * ng < t1;
#pragma unroll
            for (int kk = 0; kk < KPL; ++kk) {
              const int k = gl + kk * G;
              v[u][kk] = (f[u] < 0 || k >= NF) ? 0.f
                         : hot ? hcache[f[u] * HW + k]
                               : V[(long long)f[u] * NF + k];
            }
            // nonzero u's linear term and its NF accumulator are lane
            // gl == u % G's (one atomic instruction for G nonzeros)
            lin[u] = (f[u] < 0 || gl != u % G || !fit_linear) ? 0.f
                     : hot ? hcache[f[u] * HW + NF]
                           : w[f[u]];
          }
          float sq[UNROLL];
#pragma unroll
          for (int u = 0; u < UNROLL; ++u) {
            sq[u] = 0.f;
            if (f[u] < 0) continue;
#pragma unroll
            for (int kk = 0; kk < KPL; ++kk) {
              const int k = gl + kk * G;
              if (k < NF) {
                const float vx = v[u][kk] * x[u];
                atomicAdd(&acc[r[u] * RS + k], vx);
                sq[u] += vx * vx;
              }
            }
          }
#pragma unroll
          for (int off = G / 2; off > 0; off >>= 1)
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) sq[u] += __shfl_xor_sync(CUWIDE_FULL_MASK, sq[u], off);
#pragma unroll
          for (int u0 = 0; u0 < UNROLL; u0 += G) {
            int rr = -1;
            float nv = 0.f;
#pragma unroll
            for (int u = u0; u < UNROLL && u < u0 + G; ++u) {
              if (gl == u - u0 && f[u] >= 0) {
                rr = r[u];
                nv = lin[u] * x[u] - 0.5f * sq[u];
              }
            }
            if (rr >= 0) atomicAdd(&acc[rr * RS + NF], nv);
          }
        }
      }
      __syncthreads();
      if constexpr (CL > 1) {
        // reduce: this block sums the cluster's partial accumulators of its rows
        cluster_sync();  // every block's partial sums are complete
        for (int i = s0 * RS + tid; i < s1 * RS; i += bd) {
          float sum = acc[i];
#pragma unroll
          for (int q = 1; q < CL; ++q) sum += peer_acc((crank + q) % CL)[i];
          acc[i] = sum;
        }
        __syncthreads();
      }

      // ---------------- loss: per sample ----------------
      {
        float bsum[NOUT];
#pragma unroll
        for (int o = 0; o < NOUT; ++o) bsum[o] = 0.f;
        for (int i = s0 + tid; i < s1; i += bd) {
          float* a = acc + i * RS;
          const float yi = y[r0 + i];
          const float si = sw[r0 + i];
          const float scale = si * inv_wb;
          if (MODEL == FM) {
            float s2 = 0.f;
            for (int k = 0; k < NF; ++k) s2 += a[k] * a[k];
            const float z = a[NF] + 0.5f * s2 + (fit_intercept ? b[0] : 0.f);
            float lo, d;
            loss1<LOSS>(z, yi, lo, d);
            my_loss += (double)(si * lo);
            a[NF] = d * scale;
            bsum[0] += d * scale;
          } else if (LOSS == MULTINOMIAL) {
            float z[NOUT];
            float zmax = -3.0e38f;
#pragma unroll
            for (int o = 0; o < NOUT; ++o) {
              z[o] = a[o] + (fit_intercept ? b[o] : 0.f);
              zmax = fmaxf(zmax, z[o]);
            }
            float se = 0.f;
#pragma unroll
            for (int o = 0; o < NOUT; ++o) se += expf(z[o] - zmax);
            const float lse = zmax + logf(se);
            const int yc = (int)yi;
            float zy = 0.f;
#pragma unroll
            for (int o = 0; o < NOUT; ++o) {
              if (o == yc) zy = z[o];
              const float e = (expf(z[o] - lse) - (o == yc ? 1.f : 0.f)) * scale;
              a[o] = e;
              bsum[o] += e;
            }
            my_loss += (double)(si * (lse - zy));
          } else {
            const float z = a[0] + (fit_intercept ? b[0] : 0.f);
            float lo, d;
            loss1<LOSS>(z, yi, lo, d);
            my_loss += (double)(si * lo);
            a[0] = d * scale;
            bsum[0] += d * scale;
          }
        }
        if (fit_intercept) {
#pragma unroll
          for (int o = 0; o < NOUT; ++o) {
            float v = bsum[o];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(CUWIDE_FULL_MASK, v, off);
            if (lane == 0 && v != 0.f) atomicAdd(&bgrad[o], v);
          }
        }
      }
      __syncthreads();
      if constexpr (CL > 1) {
        // gather: every block copies the others' rows (sums and derivatives)
        cluster_sync();
#pragma unroll
        for (int q = 1; q < CL; ++q) {
          const int pr = (crank + q) % CL;
          const int q0 = m * pr / CL, q1 = m * (pr + 1) / CL;
          const float* src = peer_acc(pr);
          for (int i = q0 * RS + tid; i < q1 * RS; i += bd) acc[i] = src[i];
        }
        __syncthreads();
      }

      // ---------------- apply, hot tile: replicated shared accumulators ----------------
      float* hg = hgrad + (long long)(warp % REP) * hsize;
      if constexpr (MODEL == FM) {
        // a group takes one contiguous run of the hot nonzeros (sorted by
        // feature) and sums a feature's gradient in registers until the
        // feature changes: one atomic per feature and group, not per nonzero,
        // and the feature's factors read from the cache once
        const long long per = (h1 - h0 + ng - 1) / ng;
        const long long i0 = h0 + per * gid;
        const long long iend = i0 + per < h1 ? i0 + per : h1;
        constexpr int U = KPL > 2 ? 2 : FM_HOT_RUN_UNROLL;
        int fc = -1;
        float vc[KPL], c[KPL + 1];
#pragma unroll
        for (int kk = 0; kk < KPL; ++kk) vc[kk] = 0.f;
#pragma unroll
        for (int kk = 0; kk <= KPL; ++kk) c[kk] = 0.f;
        auto flush = [&]() {
          if (gl == 0) atomicExch(&touched[fc], 1);
#pragma unroll
          for (int kk = 0; kk < KPL; ++kk) {
            const int k = gl + kk * G;
            if (k < NF) atomicAdd(&hg[fc * HW + k], c[kk]);
          }
          if (gl == 0) atomicAdd(&hg[fc * HW + NF], c[KPL]);
        };
        for (long long i = i0; i < iend; i += U) {
          int fq[U], rq[U];
          float xq[U];
#pragma unroll
          for (int u = 0; u < U; ++u) {
            fq[u] = -1;
            rq[u] = 0;
            xq[u] = 0.f;
            if (i + u < iend) {
              fq[u] = last_read(feat + i + u);
              rq[u] = last_read(row + i + u);
              xq[u] = last_read(val + i + u);
            }
          }
#pragma unroll
          for (int u = 0; u < U; ++u) {
            if (fq[u] < 0) continue;
            if (fq[u] != fc) {
              if (fc >= 0) flush();
              fc = fq[u];
#pragma unroll
              for (int kk = 0; kk < KPL; ++kk) {
                const int k = gl + kk * G;
                vc[kk] = k < NF ? hcache[fc * HW + k] : 0.f;
              }
#pragma unroll
              for (int kk = 0; kk <= KPL; ++kk) c[kk] = 0.f;
            }
            const int r = rq[u];
            const float x = xq[u];
            const float ex = acc[r * RS + NF] * x;
#pragma unroll
            for (int kk = 0; kk < KPL; ++kk) {
              const int k = gl + kk * G;
              if (k < NF) c[kk] += ex * (acc[r * RS + k] - vc[kk] * x);
            }
            c[KPL] += ex;
          }
        }
        if (fc >= 0) flush();
      } else {
        // LR: one nonzero per lane; the lanes of a feature combine their
        // gradients by a segmented scan (ids sorted), the last adds them.
        // The next nonzero's loads are issued while this one is reduced.
        int f_n = -1, r_n = 0;
        float x_n = 0.f;
        if (h0 + tid < h1) {
          f_n = last_read(feat + h0 + tid);
          r_n = last_read(row + h0 + tid);
          x_n = last_read(val + h0 + tid);
        }
        for (long long base = h0; base < h1; base += bd) {
          const bool active = base + tid < h1;
          const int fa = f_n, r = r_n;
          const float x = x_n;
          const long long inext = base + bd + tid;
          if (inext < h1) {
            f_n = last_read(feat + inext);
            r_n = last_read(row + inext);
            x_n = last_read(val + inext);
          }
          int f = active ? fa : -1;
          float c[NOUT];
#pragma unroll
          for (int o = 0; o < NOUT; ++o) c[o] = active ? acc[r * RS + o] * x : 0.f;
          // segmented inclusive scan over the lanes of the warp
#pragma unroll
          for (int off = 1; off < 32; off <<= 1) {
            const int fo = __shfl_up_sync(CUWIDE_FULL_MASK, f, off);
#pragma unroll
            for (int q = 0; q < NOUT; ++q) {
              const float co = __shfl_up_sync(CUWIDE_FULL_MASK, c[q], off);
              if (lane >= off && fo == f) c[q] += co;
            }
          }
          const int fnext = __shfl_down_sync(CUWIDE_FULL_MASK, f, 1);
          const bool tail = lane == 31 || fnext != f;
          if (active && tail) {
            atomicExch(&touched[f], 1);
#pragma unroll
            for (int o = 0; o < NOUT; ++o) atomicAdd(&hg[f * NOUT + o], c[o]);
          }
        }
      }

      // ---------------- apply, cold tile, LR: warp windows ----------------
      // A warp takes windows of WIN = 32 * CU consecutive nonzeros.  The
      // segments whose first nonzero (head) lies in a window are the window's:
      // their heads are dealt to the warp's lanes, up to CU each, and a lane
      // issues the loads of all its segments before it uses the first, so CU
      // chains of dependent gathers are in flight per lane.  Every segment
      // belongs to exactly one window and windows need no block barrier.  A
      // segment is summed in the order of its nonzeros, as the CPU backend does.
      if constexpr (MODEL == LINEAR) {
        constexpr int CU = lr_cold_segments(NOUT);
        constexpr int WIN = 32 * CU;
        for (long long wb = c0 + (long long)warp * WIN; wb < c1; wb += (long long)n_warps * WIN) {
          int fr[CU], cnt[CU];
          unsigned bal[CU];
#pragma unroll
          for (int u = 0; u < CU; ++u) {
            const long long i = wb + u * 32 + lane;
            fr[u] = i < c1 ? feat[i] : -1;
          }
          // lane 0's predecessor: the feature before the window (ids are >= 0;
          // -2: none, so c0 is a head), then lane 31's of the sub-window before
          int last = (lane == 0 && wb > c0) ? feat[wb - 1] : -2;
          int total = 0;
#pragma unroll
          for (int u = 0; u < CU; ++u) {
            int up = __shfl_up_sync(CUWIDE_FULL_MASK, fr[u], 1);
            const int carry = __shfl_sync(CUWIDE_FULL_MASK, last, u > 0 ? 31 : 0);
            if (lane == 0) up = carry;
            last = fr[u];
            const long long i = wb + u * 32 + lane;
            bal[u] = __ballot_sync(CUWIDE_FULL_MASK, i < c1 && fr[u] != up);
            cnt[u] = __popc(bal[u]);
            total += cnt[u];
          }
          const long long wend = wb + WIN < c1 ? wb + WIN : c1;
          // head h = lane + 32 kk of the window: its feature, first nonzero and
          // nonzeros inside the window (one that reaches the window's end may
          // run past it: the sum below follows it there)
          int hf[CU], hn[CU];
          long long hp[CU];
#pragma unroll
          for (int kk = 0; kk < CU; ++kk) {
            const int h = lane + 32 * kk;
            int s = 0, r = h;  // sub-window (32 nonzeros) and rank in it
#pragma unroll
            for (int u = 0; u < CU - 1; ++u)
              if (s == u && r >= cnt[u]) {
                s = u + 1;
                r -= cnt[u];
              }
            unsigned bs = 0u;
#pragma unroll
            for (int u = 0; u < CU; ++u)
              if (s == u) bs = bal[u];
            // position of the r-th set bit of bs
            int bit = 0;
            if (h < total) {
#pragma unroll
              for (int half = 16; half > 0; half >>= 1) {
                const int c = __popc(bs & ((1u << half) - 1u));
                if (r >= c) {
                  r -= c;
                  bs >>= half;
                  bit += half;
                }
              }
            }
            int f = -1;
#pragma unroll
            for (int u = 0; u < CU; ++u) {
              const int t = __shfl_sync(CUWIDE_FULL_MASK, fr[u], bit);
              if (s == u) f = t;
            }
            // the next head of the window after this one, or the window's end
            int end = WIN;
#pragma unroll
            for (int u = CU - 1; u >= 0; --u) {
              const unsigned above = u > s ? bal[u]
                                     : (u == s && bit < 31) ? (bal[u] & (~0u << (bit + 1)))
                                                            : 0u;
              if (above) end = u * 32 + __ffs(above) - 1;
            }
            hp[kk] = wb + s * 32 + bit;
            hn[kk] = (int)((end < WIN ? wb + end : wend) - hp[kk]);
            hf[kk] = h < total ? f : -1;
          }
          // every gather of the lane's segments first: the model, then the rows
          float ps[CU], w_old[CU][NOUT], G_old[CU][NOUT], gs[CU][NOUT];
          int r1[CU];
          float x1[CU];
#pragma unroll
          for (int kk = 0; kk < CU; ++kk) {
            const int f = hf[kk] < 0 ? 0 : hf[kk];
            const bool ok = hf[kk] >= 0;
            ps[kk] = (ok && pscale) ? pscale[(long long)f * pstride] : 1.f;
#pragma unroll
            for (int o = 0; o < NOUT; ++o) {
              w_old[kk][o] = (ok && l2w != 0.f) ? w[(long long)f * NOUT + o] : 0.f;
              G_old[kk][o] = ok ? load_acc<SOLVER>(gw + (long long)f * gstride + o) : 0.f;
            }
            r1[kk] = ok ? (int)last_read(row + hp[kk]) : 0;
            x1[kk] = ok ? last_read(val + hp[kk]) : 0.f;
          }
#pragma unroll
          for (int kk = 0; kk < CU; ++kk) {
#pragma unroll
            for (int o = 0; o < NOUT; ++o) gs[kk][o] = acc[r1[kk] * RS + o] * x1[kk];
          }
          // the segments' other nonzeros (a cold feature is in few rows of a tile)
#pragma unroll
          for (int kk = 0; kk < CU; ++kk) {
            if (hf[kk] < 0) continue;
            long long q = hp[kk] + 1;
            for (const long long qe = hp[kk] + hn[kk]; q < qe; ++q) {
              const int r = last_read(row + q);
              const float x = last_read(val + q);
#pragma unroll
              for (int o = 0; o < NOUT; ++o) gs[kk][o] += acc[r * RS + o] * x;
            }
            if (q == wend && wend < c1) {  // the segment runs past the window
              for (; q < c1 && feat[q] == hf[kk]; ++q) {
                const int r = last_read(row + q);
                const float x = last_read(val + q);
#pragma unroll
                for (int o = 0; o < NOUT; ++o) gs[kk][o] += acc[r * RS + o] * x;
              }
            }
          }
#pragma unroll
          for (int kk = 0; kk < CU; ++kk) {
            if (hf[kk] < 0) continue;
            const long long f = hf[kk];
            const float sc = step_scale(fscale, n_scaled, f);
            const float l2wf = l2w * ps[kk], l1f = l1 * ps[kk];
#pragma unroll
            for (int o = 0; o < NOUT; ++o)
              update_param<SOLVER>(w + f * NOUT + o, gw + f * gstride + o,
                                   gs[kk][o] + l2wf * w_old[kk][o], lr, eps, l1f, l2wf, sc,
                                   G_old[kk][o]);
          }
        }
      }

      // ---------------- apply, cold tile, FM: one group per feature segment ----------------
      if constexpr (MODEL == FM) {
        for (long long base = c0; base < c1; base += bd) {
          const long long i = base + tid;
          const bool head = i < c1 && (i == c0 || feat[i] != feat[i - 1]);
          const unsigned bal = __ballot_sync(CUWIDE_FULL_MASK, head);
          const int wpos = __popc(bal & ((1u << lane) - 1u));
          if (lane == 0) wcount[warp] = __popc(bal);
          __syncthreads();
          if (warp == 0) {
            const int v = lane < n_warps ? wcount[lane] : 0;
            int incl = v;
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
              const int o = __shfl_up_sync(CUWIDE_FULL_MASK, incl, off);
              if (lane >= off) incl += o;
            }
            if (lane < n_warps) wcount[lane] = incl - v;
            if (lane == 31) wcount[32] = incl;
          }
          __syncthreads();
          if (head) heads[wcount[warp] + wpos] = (int)(i - base);
          __syncthreads();
          const int nh = wcount[32];
          for (int j = gid; j < nh; j += ng) {
            const long long p = base + heads[j];
            const int f = feat[p];
            const float sc = step_scale(fscale, n_scaled, f);
            // the feature's penalties (scaled to the full objective's per epoch)
            const float ps = pscale ? pscale[(long long)f * pstride] : 1.f;
            const float l2wf = l2w * ps, l2vf = l2v * ps, l1f = l1 * ps;
            float vk[KPL], gk[KPL], Gk[KPL];
            float gwv = 0.f;
#pragma unroll
            for (int kk = 0; kk < KPL; ++kk) {
              const int k = gl + kk * G;
              const long long pi = (long long)f * NF + k;
              vk[kk] = k < NF ? V[pi] : 0.f;
              Gk[kk] = k < NF ? load_acc<SOLVER>(gV + pi) : 0.f;
              gk[kk] = 0.f;
            }
            const bool lin = gl == 0 && fit_linear;
            const float w_old = lin ? w[f] : 0.f;
            const float Gw_old = lin ? load_acc<SOLVER>(gw + (long long)f * gstride) : 0.f;
            for (long long q = p; q < c1 && feat[q] == f; ++q) {
              const int r = last_read(row + q);
              const float x = last_read(val + q);
              const float ex = acc[r * RS + NF] * x;
              gwv += ex;
#pragma unroll
              for (int kk = 0; kk < KPL; ++kk) {
                const int k = gl + kk * G;
                if (k < NF) gk[kk] += ex * (acc[r * RS + k] - vk[kk] * x);
              }
            }
#pragma unroll
            for (int kk = 0; kk < KPL; ++kk) {
              const int k = gl + kk * G;
              if (k < NF) {
                const long long pi = (long long)f * NF + k;
                update_param<SOLVER>(V + pi, gV + pi, gk[kk] + l2vf * vk[kk], lr, eps, 0.f,
                                     l2vf, sc, Gk[kk]);
              }
            }
            if (lin)
              update_param<SOLVER>(w + f, gw + (long long)f * gstride, gwv + l2wf * w_old, lr,
                                   eps, l1f, l2wf, sc, Gw_old);
          }
          __syncthreads();
        }
      }

      // ---------------- flush the hot accumulators; intercept ----------------
      __syncthreads();  // the hot apply's adds are done (the cold loop may be empty)
      for (long long i = tid; i < hsize; i += bd) {
        const int f = (int)(i / HW);
        if (!touched[f]) continue;
        const int j = (int)(i - (long long)f * HW);
        float gsum = 0.f;
#pragma unroll
        for (int rp = 0; rp < REP; ++rp) {
          gsum += hgrad[rp * hsize + i];
          hgrad[rp * hsize + i] = 0.f;
        }
        const float sc = step_scale(fscale, n_scaled, f);
        const float ps = pscale ? pscale[(long long)f * pstride] : 1.f;
        const float l2wf = l2w * ps, l2vf = l2v * ps, l1f = l1 * ps;
        if (MODEL == FM) {
          if (j < NF) {
            const long long pi = (long long)f * NF + j;
            update_param<SOLVER>(V + pi, gV + pi, gsum + l2vf * hcache[i], lr, eps, 0.f, l2vf,
                                 sc, load_acc<SOLVER>(gV + pi));
          } else if (fit_linear) {
            const long long gi = (long long)f * gstride;
            update_param<SOLVER>(w + f, gw + gi, gsum + l2wf * hcache[i], lr, eps, l1f, l2wf,
                                 sc, load_acc<SOLVER>(gw + gi));
          }
        } else {
          const long long pi = (long long)f * NOUT + j;
          const long long gi = (long long)f * gstride + j;
          update_param<SOLVER>(w + pi, gw + gi, gsum + l2wf * hcache[i], lr, eps, l1f, l2wf, sc,
                               load_acc<SOLVER>(gw + gi));
        }
      }
      if (fit_intercept && tid < NOUT && crank == 0) {
        // the intercept's gradient: the sum over the cluster's blocks
        float gsum = bgrad[tid];
#pragma unroll
        for (int q = 1; q < CL; ++q) gsum += *cluster_map(&bgrad[tid], (unsigned)q);
        update_param<SOLVER>(b + tid, gb + tid, gsum, lr, eps, 0.f, 0.f, args.bscale,
                             load_acc<SOLVER>(gb + tid));
      }
      __syncthreads();
      for (int i = tid; i < n_hot; i += bd) touched[i] = 0;
      // the worker's next sample block reads the model after every block's
      // updates (and no block reuses its shared memory while a peer reads it)
      if constexpr (CL > 1) cluster_sync();
      // the next sample block's init only writes acc/hcache/bgrad, none of
      // which is read after the barrier above
    }
  }
  if constexpr (CL > 1) cluster_sync();  // no block leaves while a peer may read its shared memory
  // one double atomic per warp for the loss
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) my_loss += __shfl_xor_sync(CUWIDE_FULL_MASK, my_loss, off);
  if (lane == 0 && my_loss != 0.0) atomicAdd(loss_out, my_loss);
}

// CL blocks per worker, as a thread block cluster (the grid a multiple of CL;
// sm_90 and later: before, the cluster kernels exist but are never instantiated)
#if CUWIDE_HAS_CLUSTERS
#define CUWIDE_CLUSTER_DIMS(CL) __cluster_dims__(CL, 1, 1)
#else
#define CUWIDE_CLUSTER_DIMS(CL)
#endif

// The kernels take train_body's arrays as __restrict__ kernel parameters
// (the compiler reads the read-only ones through the read-only data path and
// keeps their addresses in registers; as struct fields they are neither)
// and the scalars as one StepArgs.

// ---- what the estimators run (sklearn_cuwide/_backends/_cuda/_train.py) ----
// 512 threads, 2 blocks per multiprocessor: _tiles.THREADS and BLOCKS_PER_SM
template <int MODEL, int NOUT, int NF, int SOLVER, int LOSS>
__global__ void __launch_bounds__(512, 2) cuwide_train(
    const int* __restrict__ feat, const unsigned short* __restrict__ row,
    const float* __restrict__ val, const long long* __restrict__ tile_ptr,
    const long long* __restrict__ sblock_row_ptr, const long long* __restrict__ batch_sblock_ptr,
    const float* __restrict__ y, const float* __restrict__ sw, const float* __restrict__ batch_w,
    const int* __restrict__ order, int* work_counter, float* w, float* V, float* b, float* gw,
    float* gV, float* gb, const float* __restrict__ fscale, const float* __restrict__ pscale,
    double* loss_out, const StepArgs args) {
  train_body<MODEL, NOUT, NF, SOLVER, LOSS, 1, PRODUCTION>(
      feat, row, val, tile_ptr, sblock_row_ptr, batch_sblock_ptr, y, sw, batch_w, order,
      work_counter, w, V, b, gw, gV, gb, fscale, pscale, loss_out, args, nullptr);
}

template <int MODEL, int NOUT, int NF, int SOLVER, int LOSS, int CL>
__global__ void CUWIDE_CLUSTER_DIMS(CL) __launch_bounds__(512, 2) cuwide_train_cluster(
    const int* __restrict__ feat, const unsigned short* __restrict__ row,
    const float* __restrict__ val, const long long* __restrict__ tile_ptr,
    const long long* __restrict__ sblock_row_ptr, const long long* __restrict__ batch_sblock_ptr,
    const float* __restrict__ y, const float* __restrict__ sw, const float* __restrict__ batch_w,
    const int* __restrict__ order, int* work_counter, float* w, float* V, float* b, float* gw,
    float* gV, float* gb, const float* __restrict__ fscale, const float* __restrict__ pscale,
    double* loss_out, const StepArgs args) {
  train_body<MODEL, NOUT, NF, SOLVER, LOSS, CL, PRODUCTION>(
      feat, row, val, tile_ptr, sblock_row_ptr, batch_sblock_ptr, y, sw, batch_w, order,
      work_counter, w, V, b, gw, gV, gb, fscale, pscale, loss_out, args, nullptr);
}

// ---- the benchmarks' ablation (sklearn_cuwide/_backends/_cuda/_ablation.py) ----
// VARIANT: a Variant other than PRODUCTION; acc_global: with
// GLOBAL_ACCUMULATORS, sample_block * RS floats per block of the grid
// (unused otherwise)
template <int MODEL, int NOUT, int NF, int SOLVER, int LOSS, int VARIANT>
__global__ void __launch_bounds__(512, 2) cuwide_train_ablation(
    const int* __restrict__ feat, const unsigned short* __restrict__ row,
    const float* __restrict__ val, const long long* __restrict__ tile_ptr,
    const long long* __restrict__ sblock_row_ptr, const long long* __restrict__ batch_sblock_ptr,
    const float* __restrict__ y, const float* __restrict__ sw, const float* __restrict__ batch_w,
    const int* __restrict__ order, int* work_counter, float* w, float* V, float* b, float* gw,
    float* gV, float* gb, const float* __restrict__ fscale, const float* __restrict__ pscale,
    double* loss_out, const StepArgs args, float* acc_global) {
  static_assert(VARIANT != PRODUCTION, "the production variant is cuwide_train");
  train_body<MODEL, NOUT, NF, SOLVER, LOSS, 1, VARIANT>(
      feat, row, val, tile_ptr, sblock_row_ptr, batch_sblock_ptr, y, sw, batch_w, order,
      work_counter, w, V, b, gw, gV, gb, fscale, pscale, loss_out, args, acc_global);
}

template <int MODEL, int NOUT, int NF, int SOLVER, int LOSS, int CL, int VARIANT>
__global__ void CUWIDE_CLUSTER_DIMS(CL) __launch_bounds__(512, 2) cuwide_train_ablation_cluster(
    const int* __restrict__ feat, const unsigned short* __restrict__ row,
    const float* __restrict__ val, const long long* __restrict__ tile_ptr,
    const long long* __restrict__ sblock_row_ptr, const long long* __restrict__ batch_sblock_ptr,
    const float* __restrict__ y, const float* __restrict__ sw, const float* __restrict__ batch_w,
    const int* __restrict__ order, int* work_counter, float* w, float* V, float* b, float* gw,
    float* gV, float* gb, const float* __restrict__ fscale, const float* __restrict__ pscale,
    double* loss_out, const StepArgs args, float* acc_global) {
  static_assert(VARIANT != PRODUCTION, "the production variant is cuwide_train_cluster");
  train_body<MODEL, NOUT, NF, SOLVER, LOSS, CL, VARIANT>(
      feat, row, val, tile_ptr, sblock_row_ptr, batch_sblock_ptr, y, sw, batch_w, order,
      work_counter, w, V, b, gw, gV, gb, fscale, pscale, loss_out, args, acc_global);
}

// ---- in order on the whole grid (the FM's concurrency="auto") ----
// Every block of a co-resident grid (a cooperative launch) takes part in
// every step, and a step is one sample block, taken in the order of the
// mini-batches: the semantics of one worker (and of the CPU backend), at the
// speed of the whole grid.  A step:
//
//   aggregate  feature -> sample: a group of lanes per nonzero adds its
//              factors (and linear weight) times its value to its row's sums
//              with global atomics (the sample block's sums stay in L2);
//              with NF / 4 a power of two up to 32, a lane adds four factors
//              with one vector atomic
//   apply      sample -> feature, each nonzero's loss derivative computed by
//              its group from its row's sums (no stage of its own).  Cold
//              tile: the group at a feature segment's head sums the segment
//              and updates the feature (a cold feature has one segment in a
//              tile: one group updates it).  Hot tile: groups take even runs
//              of its nonzeros and add each feature's partial sums into a
//              global gradient buffer, those of a feature shared with the
//              neighbouring groups first in the block's shared memory.  The
//              rows' losses and the intercept's gradient are summed once per
//              row
//   hot update the hot features' and the intercept's updates from those
//              sums, which are zeroed
//
// with a grid barrier after each.  The per-sample sums, the touched flags
// and the intercept's gradient are double-buffered by the step's parity:
// the next step's copy is zeroed in this step, with no barrier of its own.
// No per-sample state in shared memory, so a sample block may be a whole
// mini-batch (_tiles.tile_shape, in order).
namespace cuwide {
// A barrier of the whole grid (all blocks co-resident: a cooperative launch),
// one atomic per block on one word: each block adds 1 and block 0 adds
// 2^31 - (blocks - 1), so the word's top bit flips when the last block
// arrives (and the low bits are back where they were, for the next barrier)
__device__ __forceinline__ void grid_barrier(unsigned int* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int inc = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
    volatile unsigned int* v = bar;
    __threadfence();
    const unsigned int old = atomicAdd(bar, inc);
    while (((old ^ *v) & 0x80000000u) == 0) {
    }
    __threadfence();
  }
  __syncthreads();
}

// The in-order kernel's per-sample row: NF sums, then the linear part and
// 0.5 * the sum of squares (one float); rows of vectorised factors are
// padded to 16 bytes (_tiles.in_order_row_stride gives the same stride)
template <int NF>
struct InOrderRow {
  static constexpr bool VEC = NF % 4 == 0 && NF / 4 <= 32 && ((NF / 4) & (NF / 4 - 1)) == 0;
  static constexpr int RS = VEC ? NF + 4 : NF + 1;
};

// v += a, four floats in one atomic where the device has them (sm_90)
__device__ __forceinline__ void atomic_add4(float* p, float4 a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(p), a);
#else
  atomicAdd(p, a.x);
  atomicAdd(p + 1, a.y);
  atomicAdd(p + 2, a.z);
  atomicAdd(p + 3, a.w);
#endif
}
}  // namespace cuwide

template <int NF, int SOLVER, int LOSS>
__global__ void __launch_bounds__(512, 2) cuwide_train_in_order(
    const int* __restrict__ feat, const unsigned short* __restrict__ row,
    const float* __restrict__ val, const long long* __restrict__ tile_ptr,
    const long long* __restrict__ sblock_row_ptr, const long long* __restrict__ batch_sblock_ptr,
    const float* __restrict__ y, const float* __restrict__ sw, const float* __restrict__ batch_w,
    const int* __restrict__ order, float* w, float* V, float* b, float* gw, float* gV, float* gb,
    const float* __restrict__ pscale, double* loss_out,
    // scratch, zeroed before the launch: 2 * sample_block per-sample rows,
    // n_hot * (NF + 1) hot gradients, 2 * n_hot touched flags, 2 intercept
    // gradients, the barrier's word (_tiles.in_order_scratch_sizes)
    float* acc2, float* hgrad, int* touched2, float* bacc, unsigned int* bar,
    const StepArgs args) {
  constexpr bool VEC = InOrderRow<NF>::VEC;
  constexpr int RS = InOrderRow<NF>::RS;  // per-sample floats
  constexpr int HW = NF + 1;              // model floats per feature
  constexpr int G = GroupSize<NF>::v;     // lanes per nonzero in the apply
  constexpr int KPL = (NF + G - 1) / G;   // factors per lane in the apply
  constexpr int GA = VEC ? NF / 4 : G;    // lanes per nonzero in the aggregate
  const int n_hot = args.n_hot, gstride = args.gstride, pstride = args.pstride;
  const float lr = args.lr, l2w = args.l2w, l2v = args.l2v, l1 = args.l1, eps = args.eps;
  const int fit_intercept = args.fit_intercept, fit_linear = args.fit_linear;
  const int tid = threadIdx.x, bd = blockDim.x, lane = tid & 31;
  const long long gtid = (long long)blockIdx.x * bd + tid;
  const long long nthreads = (long long)gridDim.x * bd;
  const long long gg = gtid / G, ng = nthreads / G;      // apply: this group, groups
  const long long gga = gtid / GA, nga = nthreads / GA;  // aggregate: likewise
  const int gl = tid % G, gla = tid % GA;
  // the lanes of this apply group (shuffles inside a group's own loops)
  const unsigned gmask = G == 32 ? CUWIDE_FULL_MASK : (((1u << G) - 1u) << (lane & ~(G - 1)));
  const long long acc_size = (long long)args.sample_block * RS;
  // the hot tile's slots: two per group of the block (its run's first and
  // last features), where the partial sums of a feature that several of the
  // block's groups hold meet before global memory (the hottest features
  // span many groups: their atomics would queue on one address); models too
  // wide for the static shared memory add straight to global memory
  constexpr int GPB = 512 / G, SLOTS = 2 * GPB;
  constexpr bool COMBINE = SLOTS * HW * 4 <= 32768;
  __shared__ int sh_first[GPB], sh_last[GPB];
  __shared__ float sh_sum[COMBINE ? SLOTS * HW : 1];
  const int jg = tid / G;  // this group in the block
  double my_loss = 0.0;
  int step = 0;

  for (int item = 0; item < args.n_work; ++item) {
    const int bt = order[item];
    const float wb = batch_w[bt];
    if (!(wb > 0.f)) continue;
    const float inv_wb = 1.f / wb;
    for (long long g = batch_sblock_ptr[bt]; g < batch_sblock_ptr[bt + 1]; ++g, ++step) {
      const int par = step & 1;
      float* acc = acc2 + par * acc_size;
      float* acc_next = acc2 + (par ^ 1) * acc_size;
      int* touched = touched2 + par * n_hot;
      int* touched_next = touched2 + (par ^ 1) * n_hot;
      const long long r0 = sblock_row_ptr[g];
      const int m = (int)(sblock_row_ptr[g + 1] - r0);
      const long long t0 = tile_ptr[2 * g] - args.nnz_base;
      const long long t1 = tile_ptr[2 * g + 1] - args.nnz_base;
      const long long t2 = tile_ptr[2 * g + 2] - args.nnz_base;
      const float b0 = fit_intercept ? b[0] : 0.f;

      // ---------------- aggregate: feature -> sample ----------------
      // GA lanes per nonzero; the loop's trip count is the same for every
      // lane of a warp (the shuffles below)
      for (long long base = t0; base < t2; base += nga) {
        const long long i = base + gga;
        const bool ok = i < t2;
        const int f = ok ? feat[i] : 0;
        const int r = ok ? (int)row[i] : 0;
        const float x = ok ? val[i] : 0.f;
        float sq = 0.f;
        if constexpr (VEC) {
          if (ok) {
            const float4 v = reinterpret_cast<const float4*>(V + (long long)f * NF)[gla];
            const float4 vx = make_float4(v.x * x, v.y * x, v.z * x, v.w * x);
            atomic_add4(acc + r * RS + 4 * gla, vx);
            sq = vx.x * vx.x + vx.y * vx.y + vx.z * vx.z + vx.w * vx.w;
          }
        } else {
#pragma unroll
          for (int kk = 0; kk < KPL; ++kk) {
            const int k = gla + kk * G;
            if (ok && k < NF) {
              const float vx = V[(long long)f * NF + k] * x;
              atomicAdd(&acc[r * RS + k], vx);
              sq += vx * vx;
            }
          }
        }
#pragma unroll
        for (int off = GA / 2; off > 0; off >>= 1)
          sq += __shfl_xor_sync(CUWIDE_FULL_MASK, sq, off);
        if (ok && gla == 0)
          atomicAdd(&acc[r * RS + NF], (fit_linear ? w[f] * x : 0.f) - 0.5f * sq);
      }
      grid_barrier(bar);

      // ---------------- apply: sample -> feature ----------------
      // the next step's buffers (last read before this step's first barrier)
      for (long long i = gtid; i < acc_size; i += nthreads) acc_next[i] = 0.f;
      for (long long i = gtid; i < n_hot; i += nthreads) touched_next[i] = 0;
      // row r's factor sums held by this lane (its KPL factors) and the
      // derivative of its loss, scaled by sample_weight / W_batch; every
      // lane of the group calls it together (the sum of squares is shuffled)
      auto row_state = [&](int r, float* a) -> float {
        const float* ar = acc + r * RS;
        float part = 0.f;
#pragma unroll
        for (int kk = 0; kk < KPL; ++kk) {
          const int k = gl + kk * G;
          a[kk] = k < NF ? ar[k] : 0.f;
          part += a[kk] * a[kk];
        }
#pragma unroll
        for (int off = G / 2; off > 0; off >>= 1) part += __shfl_xor_sync(gmask, part, off, G);
        const float z = ar[NF] + 0.5f * part + b0;
        float lo, d;
        loss1<LOSS>(z, y[r0 + r], lo, d);
        return d * sw[r0 + r] * inv_wb;
      };
      // the rows' losses and the intercept's gradient, once per row
      {
        float bsum = 0.f;
        for (long long i = gtid; i < m; i += nthreads) {
          const float* a = acc + i * RS;
          float s2 = 0.f;
#pragma unroll
          for (int k = 0; k < NF; ++k) s2 += a[k] * a[k];
          const float z = a[NF] + 0.5f * s2 + b0;
          const float si = sw[r0 + i];
          float lo, d;
          loss1<LOSS>(z, y[r0 + i], lo, d);
          my_loss += (double)(si * lo);
          bsum += d * si * inv_wb;
        }
        if (fit_intercept) {
#pragma unroll
          for (int off = 16; off > 0; off >>= 1) bsum += __shfl_xor_sync(CUWIDE_FULL_MASK, bsum, off);
          if (lane == 0 && bsum != 0.f) atomicAdd(&bacc[par], bsum);
        }
      }
      // hot tile: a group takes an even run of the nonzeros (sorted by
      // feature) and adds each feature's partial sums once; a feature that
      // runs on from a neighbouring group's run (its first or last) adds
      // them in the block's slots, which meet in global memory once
      {
        const long long per = (t1 - t0 + ng - 1) / ng;
        const long long i0 = t0 + per * gg;
        const long long iend = i0 + per < t1 ? i0 + per : t1;
        int f_first = -1, f_last = -1;
        if (COMBINE) {
          if (i0 < iend) {
            f_first = feat[i0];
            f_last = feat[iend - 1];
          }
          if (gl == 0) {
            sh_first[jg] = f_first;
            sh_last[jg] = f_last;
          }
          for (int i = tid; i < SLOTS * HW; i += bd) sh_sum[i] = 0.f;
          __syncthreads();
        }
        int fc = -1;
        float vc[KPL], c[KPL + 1];
        auto flush = [&]() {
          if (gl == 0) touched[fc] = 1;
          auto add = [&](float* dst) {
#pragma unroll
            for (int kk = 0; kk < KPL; ++kk) {
              const int k = gl + kk * G;
              if (k < NF) atomicAdd(dst + k, c[kk]);
            }
            if (gl == 0) atomicAdd(dst + NF, c[KPL]);
          };
          if (COMBINE && (fc == f_first || fc == f_last)) {
            // the slot of the block's first group whose run holds fc
            int o = jg;
            while (o > 0 && sh_first[o] == fc && sh_last[o - 1] == fc) --o;
            add(sh_sum + (2 * o + (sh_first[o] == fc ? 0 : 1)) * HW);
          } else {
            add(hgrad + fc * HW);
          }
        };
        for (long long i = i0; i < iend; ++i) {
          const int f = feat[i];
          if (f != fc) {
            if (fc >= 0) flush();
            fc = f;
#pragma unroll
            for (int kk = 0; kk < KPL; ++kk) {
              const int k = gl + kk * G;
              vc[kk] = k < NF ? V[(long long)fc * NF + k] : 0.f;
            }
#pragma unroll
            for (int kk = 0; kk <= KPL; ++kk) c[kk] = 0.f;
          }
          const float x = val[i];
          float a[KPL];
          const float ex = row_state(row[i], a) * x;
#pragma unroll
          for (int kk = 0; kk < KPL; ++kk) c[kk] += ex * (a[kk] - vc[kk] * x);
          c[KPL] += ex;
        }
        if (fc >= 0) flush();
        if (COMBINE) {
          __syncthreads();
          for (int i = tid; i < SLOTS * HW; i += bd) {
            const float v = sh_sum[i];
            if (v != 0.f) {
              const int sl = i / HW, k = i - sl * HW;
              atomicAdd(&hgrad[((sl & 1) ? sh_last[sl >> 1] : sh_first[sl >> 1]) * HW + k], v);
            }
          }
        }
      }
      // cold tile: the group whose position is a segment's head sums it
      for (long long base = t1; base < t2; base += ng) {
        const long long p = base + gg;
        if (p >= t2) break;
        const int f = feat[p];
        if (p > t1 && feat[p - 1] == f) continue;
        const float ps = pscale ? pscale[(long long)f * pstride] : 1.f;
        const float l2wf = l2w * ps, l2vf = l2v * ps, l1f = l1 * ps;
        float vk[KPL], gk[KPL], Gk[KPL];
#pragma unroll
        for (int kk = 0; kk < KPL; ++kk) {
          const int k = gl + kk * G;
          const long long pi = (long long)f * NF + k;
          vk[kk] = k < NF ? V[pi] : 0.f;
          Gk[kk] = k < NF ? load_acc<SOLVER>(gV + pi) : 0.f;
          gk[kk] = 0.f;
        }
        const bool lin = gl == 0 && fit_linear;
        const float w_old = lin ? w[f] : 0.f;
        const float Gw_old = lin ? load_acc<SOLVER>(gw + (long long)f * gstride) : 0.f;
        float gwv = 0.f;
        for (long long q = p; q < t2 && feat[q] == f; ++q) {
          const float x = val[q];
          float a[KPL];
          const float ex = row_state(row[q], a) * x;
          gwv += ex;
#pragma unroll
          for (int kk = 0; kk < KPL; ++kk) gk[kk] += ex * (a[kk] - vk[kk] * x);
        }
#pragma unroll
        for (int kk = 0; kk < KPL; ++kk) {
          const int k = gl + kk * G;
          if (k < NF) {
            const long long pi = (long long)f * NF + k;
            update_param<SOLVER>(V + pi, gV + pi, gk[kk] + l2vf * vk[kk], lr, eps, 0.f, l2vf,
                                 1.f, Gk[kk]);
          }
        }
        if (lin)
          update_param<SOLVER>(w + f, gw + (long long)f * gstride, gwv + l2wf * w_old, lr, eps,
                               l1f, l2wf, 1.f, Gw_old);
      }
      grid_barrier(bar);

      // ---------------- hot update; intercept ----------------
      if (gtid == 0) {
        if (fit_intercept)
          update_param<SOLVER>(b, gb, bacc[par], lr, eps, 0.f, 0.f, args.bscale,
                               load_acc<SOLVER>(gb));
        bacc[par ^ 1] = 0.f;  // the next step's (this step's is read above)
      }
      for (long long i = gtid; i < (long long)n_hot * HW; i += nthreads) {
        const int f = (int)(i / HW), j = (int)(i - (long long)f * HW);
        if (!touched[f]) continue;
        const float gsum = hgrad[i];
        hgrad[i] = 0.f;
        const float ps = pscale ? pscale[(long long)f * pstride] : 1.f;
        if (j < NF) {
          const long long pi = (long long)f * NF + j;
          const float l2vf = l2v * ps;
          update_param<SOLVER>(V + pi, gV + pi, gsum + l2vf * V[pi], lr, eps, 0.f, l2vf, 1.f,
                               load_acc<SOLVER>(gV + pi));
        } else if (fit_linear) {
          const long long gi = (long long)f * gstride;
          const float l2wf = l2w * ps;
          update_param<SOLVER>(w + f, gw + gi, gsum + l2wf * w[f], lr, eps, l1 * ps, l2wf, 1.f,
                               load_acc<SOLVER>(gw + gi));
        }
      }
      grid_barrier(bar);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) my_loss += __shfl_xor_sync(CUWIDE_FULL_MASK, my_loss, off);
  if (lane == 0 && my_loss != 0.0) atomicAdd(loss_out, my_loss);
}

#ifdef CUWIDE_NVCC_CHECK
// instantiations (their addresses taken) so that `nvcc -DCUWIDE_NVCC_CHECK -c`
// compiles and checks the kernels that NVRTC otherwise compiles at run time
extern void* const cuwide_train_check[];
void* const cuwide_train_check[] = {
    // production: one block per worker
    (void*)&cuwide_train<LINEAR, 1, 0, ADAGRAD, LOGISTIC>,
    (void*)&cuwide_train<LINEAR, 3, 0, SGD, MULTINOMIAL>,
    (void*)&cuwide_train<FM, 1, 16, ADAGRAD, LOGISTIC>,
    (void*)&cuwide_train<FM, 1, 128, SGD, SQUARED>,
    // production: a thread block cluster per worker
    (void*)&cuwide_train_cluster<LINEAR, 1, 0, ADAGRAD, LOGISTIC, 2>,
    (void*)&cuwide_train_cluster<LINEAR, 1, 0, ADAGRAD, LOGISTIC, 8>,
    (void*)&cuwide_train_cluster<LINEAR, 3, 0, SGD, MULTINOMIAL, 4>,
    (void*)&cuwide_train_cluster<FM, 1, 16, ADAGRAD, LOGISTIC, 4>,
    (void*)&cuwide_train_cluster<FM, 1, 1, SGD, SQUARED, 2>,
    // ablation
    (void*)&cuwide_train_ablation<LINEAR, 1, 0, ADAGRAD, LOGISTIC, NO_REPLICAS>,
    (void*)&cuwide_train_ablation<LINEAR, 1, 0, ADAGRAD, LOGISTIC, GLOBAL_ACCUMULATORS>,
    (void*)&cuwide_train_ablation<FM, 1, 16, ADAGRAD, LOGISTIC, NO_REPLICAS>,
    (void*)&cuwide_train_ablation<FM, 1, 16, ADAGRAD, LOGISTIC, GLOBAL_ACCUMULATORS>,
    (void*)&cuwide_train_ablation_cluster<LINEAR, 1, 0, ADAGRAD, LOGISTIC, 2, GLOBAL_ACCUMULATORS>,
    (void*)&cuwide_train_ablation_cluster<FM, 1, 16, ADAGRAD, LOGISTIC, 8, NO_REPLICAS>,
    // in order on the whole grid
    (void*)&cuwide_train_in_order<16, ADAGRAD, LOGISTIC>,
    (void*)&cuwide_train_in_order<1, SGD, SQUARED>,
    (void*)&cuwide_train_in_order<64, ADAGRAD, SQUARED>,
    (void*)&cuwide_train_in_order<12, SGD, LOGISTIC>,
};
#endif
