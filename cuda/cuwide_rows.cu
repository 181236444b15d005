// Model rows moved between the device and page-locked host memory.
//
// A model wider than the device keeps its cold feature rows in host memory
// (sklearn_cuwide/_out_of_core.py).  Before a window of mini-batches trains,
// the rows it touches are gathered into the device's scratch slots; after,
// they are written back.  These kernels read and write the host rows where
// they are: page-locked host memory is in the device's address space
// (unified addressing), so a window's rows cross the bus once, with no
// host-side gather and no staging copy.
//
// A row is `row_words` 32-bit words (its dtype does not matter to a copy).
// Row i of the device array `dev` (rows `dev_stride` words apart: it may be
// a view of a wider buffer) is row ids[i] of the host array `host` (rows
// contiguous).
// The scatter's ids are distinct (a window's cold set), so no two threads
// write one host word.
#include "cuwide_common.cuh"

__global__ void cuwide_gather_rows(const unsigned int* __restrict__ host,
                                   const long long* __restrict__ ids, long long n_ids,
                                   int row_words, long long dev_stride,
                                   unsigned int* __restrict__ dev) {
  const long long total = n_ids * row_words;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
       t += stride) {
    const long long i = t / row_words;
    const long long j = t - i * row_words;
    dev[i * dev_stride + j] = host[ids[i] * row_words + j];
  }
}

__global__ void cuwide_scatter_rows(const unsigned int* __restrict__ dev,
                                    const long long* __restrict__ ids, long long n_ids,
                                    int row_words, long long dev_stride,
                                    unsigned int* __restrict__ host) {
  const long long total = n_ids * row_words;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
       t += stride) {
    const long long i = t / row_words;
    const long long j = t - i * row_words;
    host[ids[i] * row_words + j] = dev[i * dev_stride + j];
  }
}
