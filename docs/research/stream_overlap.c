// A research artifact, not compiled by the crate (see docs/research/amx.md §7): how much of a
// loop's arithmetic hides under its streaming of memory on this machine. Two threads each read
// half of 1 GiB, 256 bytes an iteration, and run WORK rounds of four `vpdpbusd` on what they
// read (16 independent accumulators, so the arithmetic is bound by throughput, as in the
// crate's kernels). With a last argument (KiB) each thread rereads that much from its cache
// instead: the arithmetic alone.
//
// Build: for w in 0 8 16 20; do gcc -O3 -march=native -fopenmp -DWORK=$w stream_overlap.c -o so_$w; done
// Run:   ./so_16 PREFETCH DISTANCE [CACHED_KIB]
//        PREFETCH 0: none, 1: prefetcht1 of every line DISTANCE bytes ahead, 2: prefetcht0.
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef WORK
#define WORK 16
#endif

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s PREFETCH DISTANCE [CACHED_KIB]\n", argv[0]);
    return 2;
  }
  size_t n = (size_t)1 << 30;
  int mode = atoi(argv[1]);
  size_t dist = (size_t)atol(argv[2]);
  size_t cached = argc > 3 ? (size_t)atol(argv[3]) << 10 : 0;
  char *buf = aligned_alloc(64, n + 8192);
  memset(buf, 1, n + 8192);
  omp_set_num_threads(2);
  double best = 0;
  for (int rep = 0; rep < 5; rep++) {
    double t0 = now();
    long long total = 0;
#pragma omp parallel reduction(+ : total)
    {
      size_t per = n / 2;
      const char *p = buf + omp_get_thread_num() * per;
      size_t mask = cached ? cached - 1 : ~(size_t)0;
      __m512i w = _mm512_set1_epi8(3), acc[16];
      for (int q = 0; q < 16; q++) acc[q] = _mm512_setzero_si512();
      for (size_t i = 0; i < per; i += 256) {
        size_t o = i & mask;
        if (mode == 1)
          for (int l = 0; l < 4; l++) _mm_prefetch(p + o + dist + 64 * l, _MM_HINT_T1);
        if (mode == 2)
          for (int l = 0; l < 4; l++) _mm_prefetch(p + o + dist + 64 * l, _MM_HINT_T0);
        __m512i x[4];
        for (int l = 0; l < 4; l++) x[l] = _mm512_load_si512(p + o + 64 * l);
        _Pragma("GCC unroll 64") for (int k = 0; k < WORK; k++)
          for (int l = 0; l < 4; l++) acc[(4 * k + l) % 16] = _mm512_dpbusd_epi32(acc[(4 * k + l) % 16], x[l], w);
        acc[0] = _mm512_add_epi32(acc[0], x[0]);
      }
      __m512i s = acc[0];
      for (int q = 1; q < 16; q++) s = _mm512_add_epi32(s, acc[q]);
      total += _mm512_reduce_add_epi32(s);
    }
    double gbs = n / (now() - t0) / 1e9;
    if (gbs > best) best = gbs;
    if (total == 42) printf(" ");
  }
  printf("WORK %d prefetch %d distance %zu%s: %.1f GB/s, %.1f ms per GiB\n", WORK, mode, dist,
         cached ? " (cached)" : "", best, 1e3 * n / best / 1e9);
  return 0;
}
