// A research artifact, not compiled by the crate (see docs/research/amx.md): the throughput of
// back-to-back AMX `tdpbsud` for 1-16 activation rows. Build: gcc -O2 -mamx-tile -mamx-int8.
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
typedef struct { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((packed)) cfg_t;
static int8_t A[16*64] __attribute__((aligned(64))), B[16*64] __attribute__((aligned(64)));
static int32_t C[16*16] __attribute__((aligned(64)));
__attribute__((target("amx-tile,amx-int8")))
double run(int arows, int kbytes, int ccols, long n){
  cfg_t cfg; memset(&cfg,0,sizeof cfg); cfg.palette=1;
  // tmm0..3: C accumulators (arows x ccols*4), tmm4: A (arows x kbytes), tmm5: B (kbytes/4 x ccols*4)
  for(int t=0;t<4;t++){cfg.rows[t]=arows; cfg.colsb[t]=ccols*4;}
  cfg.rows[4]=arows; cfg.colsb[4]=kbytes; cfg.rows[5]=kbytes/4; cfg.colsb[5]=ccols*4;
  cfg.rows[6]=kbytes/4; cfg.colsb[6]=ccols*4;
  _tile_loadconfig(&cfg);
  _tile_zero(0);_tile_zero(1);_tile_zero(2);_tile_zero(3);
  _tile_loadd(4,A,64); _tile_loadd(5,B,64); _tile_loadd(6,B,64);
  double t=now();
  for(long j=0;j<n;j++){
    _tile_dpbsud(0,4,5); _tile_dpbsud(1,4,6); _tile_dpbsud(2,4,5); _tile_dpbsud(3,4,6);
  }
  t=now()-t;
  _tile_stored(0,C,64); _tile_release();
  return t/(n*4.0);
}
int main(){
  if(syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)){perror("prctl");return 1;}
  long n=20000000;
  int rows[]={1,2,5,9,16};
  for(int k=32;k<=64;k+=32) for(int i=0;i<5;i++){
    double s=run(rows[i],k,16,n);
    printf("A rows %2d, K %d, 16 cols: %.2f ns per tdpbsud (%.1f GMAC/s)\n",rows[i],k,s*1e9, rows[i]*k*16/s*1e-9);
  }
  double s=run(16,64,5,n); printf("A rows 16, K 64, 5 cols: %.2f ns\n",s*1e9);
}
