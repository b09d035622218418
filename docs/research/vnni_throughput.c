// A research artifact, not compiled by the crate (see docs/research/amx.md): the throughput of
// zmm `vpdpbusd` and FMA on one core. Build: gcc -O3 -funroll-loops.
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
__attribute__((target("avx512f,avx512bw,avx512vnni")))
double run_dp(long n){
  __m512i a[12]; __m512i x=_mm512_set1_epi8(3), y=_mm512_set1_epi8(5);
  for(int i=0;i<12;i++) a[i]=_mm512_setzero_si512();
  double t=now();
  for(long j=0;j<n;j++){
    for(int i=0;i<12;i++) a[i]=_mm512_dpbusd_epi32(a[i],x,y);
    __asm__ volatile("" : "+v"(x), "+v"(y));
  }
  t=now()-t; __m512i s=a[0]; for(int i=1;i<12;i++) s=_mm512_add_epi32(s,a[i]);
  volatile int sink=_mm512_reduce_add_epi32(s); (void)sink;
  return t/(n*12.0);
}
__attribute__((target("avx512f")))
double run_fma(long n){
  __m512 a[12]; __m512 x=_mm512_set1_ps(1.0001f), y=_mm512_set1_ps(0.9999f);
  for(int i=0;i<12;i++) a[i]=_mm512_setzero_ps();
  double t=now();
  for(long j=0;j<n;j++){
    for(int i=0;i<12;i++) a[i]=_mm512_fmadd_ps(a[i],x,y);
    __asm__ volatile("" : "+v"(x), "+v"(y));
  }
  t=now()-t; __m512 s=a[0]; for(int i=1;i<12;i++) s=_mm512_add_ps(s,a[i]);
  volatile float sink=_mm512_reduce_add_ps(s); (void)sink;
  return t/(n*12.0);
}
__attribute__((target("avx512f,avx512bw,avx512vnni")))
double run_mix(long n){ /* 12 dpbusd + 12 and (p05) */
  __m512i a[12]; __m512i x=_mm512_set1_epi8(3), y=_mm512_set1_epi8(5), m=_mm512_set1_epi8(15);
  __m512i b[6]; for(int i=0;i<6;i++) b[i]=_mm512_set1_epi8(i);
  for(int i=0;i<12;i++) a[i]=_mm512_setzero_si512();
  double t=now();
  for(long j=0;j<n;j++){
    for(int i=0;i<12;i++) { a[i]=_mm512_dpbusd_epi32(a[i],x,y); b[i%6]=_mm512_and_si512(b[i%6],m);} 
    __asm__ volatile("" : "+v"(x), "+v"(y));
  }
  t=now()-t; __m512i s=a[0]; for(int i=1;i<12;i++) s=_mm512_add_epi32(s,a[i]); for(int i=0;i<6;i++) s=_mm512_add_epi32(s,b[i]);
  volatile int sink=_mm512_reduce_add_epi32(s); (void)sink;
  return t/(n*12.0);
}
int main(){ long n=50000000;
  run_dp(n/10);
  printf("dpbusd zmm: %.3f ns each\n", run_dp(n)*1e9);
  printf("fma zmm:    %.3f ns each\n", run_fma(n)*1e9);
  printf("dpbusd+and: %.3f ns per pair\n", run_mix(n)*1e9);
}
