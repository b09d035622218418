// A research prototype, not part of the crate (the package excludes docs/): the layout the
// quantized kernels could move to so that extra activation rows cost less (issue 22). It
// multiplies an 8960 x 1536 Q4_K-like matrix (4-bit codes, per-32 6-bit scale and min, per-256
// float d and dmin: 4.75 bits a weight) by M int8 activation rows, two ways that give the same
// bits:
// - AVX-512 VNNI: weights interleaved 16 rows at a time (each 64-byte line holds 4 consecutive
//   codes of each of 16 rows), activations broadcast 4 at a time (vpdpbusd with an embedded
//   broadcast), so each lane is one weight row and no horizontal sum is needed;
// - AMX: the same codes as the B tile, activations + 128 as the A tile with each 32-value block
//   on a row of its own, the +128 taken back in integers before the float step.
// Both keep one i32 sum per weight row, activation row and 32-value block and scale it in the
// same float order, so a row's value does not depend on M or on the kernel (checked below).
//
// Build and run (Linux, x86-64 with AVX-512 VNNI; AMX for the default mode):
//   gcc -O3 -funroll-loops -march=sapphirerapids -fopenmp -DPF=9216 -DHINT=_MM_HINT_T1 q4k_interleaved_proto.c -o proto -lm
//   OMP_NUM_THREADS=2 OMP_PROC_BIND=true ./proto t      # AMX timings
//   OMP_NUM_THREADS=2 OMP_PROC_BIND=true ./proto t v    # VNNI timings
//   OMP_NUM_THREADS=2 OMP_PROC_BIND=true ./proto t s    # streaming the same bytes, no arithmetic
//
// Measured 2026-12-04 on the Intel Xeon of the README (family 6 model 167, 2 threads, 40
// copies taking turns), medians in microseconds for M = 1 / 5 / 9 rows, two to three runs:
//   VNNI, interleaved: 358-413 / 370-426 / 471-516
//   AMX:               387-394 / 417-438 / 544-591
//   the crate's lane-group VNNI kernel on real Q4_K (4.5 bits; cargo bench -- q4k_up):
//                      324-336 / 437-450 / 618-641
//   streaming alone: 232-298 for M = 1.
// So the interleaved layout costs 5-9 rows far less (9 rows: about 20 % less time) but its one
// row is 7-27 % slower, untuned and with 5.5 % more bytes. AMX did not beat VNNI here: its
// tiles are not renamed, so each 64-value chunk's load, multiply, store and scale run in
// series.
// Prototype: Q4_K-like (4-bit codes, per-32 scale and min) times M int8 activation rows on AMX.
// Weights interleaved 16 rows at a time; activations as the A tile (+128, u8), two 32-value
// blocks kept apart as two A rows per activation row; C rows are (act row, block), lanes n.
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <omp.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <immintrin.h>

#define N 8960
#define K 1536
#define CH (K/64)          // chunks per row
#define RB (N/16)          // row blocks
#define MAXM 16
typedef struct { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((packed)) cfg_t;

// Per row block, per chunk: 512 bytes of nibbles (line L, byte i: low = B[L][i], high = B[L+8][i]),
// sc[2][16], mn[2][16] bytes; per row block per super-block (4 chunks): d[16], dmin[16] floats.
typedef struct { uint8_t q[512]; uint8_t sc[2][16]; uint8_t mn[2][16]; } chunk_t;
typedef struct { chunk_t c[CH]; float d[CH/4][16]; float dmin[CH/4][16]; } block_t;

static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}

// code of weight row n (within block), value k (within chunk)
static inline int code_of(const chunk_t *c, int n, int k){
  int kk = k/4, j = k%4, L = kk % 8, hi = kk / 8; int i = n*4 + j;
  return hi ? (c->q[L*64+i] >> 4) : (c->q[L*64+i] & 15);
}

typedef struct { int m; int8_t x[MAXM][K]; float dx[MAXM][K/32]; float sx[MAXM][K/32];
  uint8_t a[CH][MAXM*2][64]; } acts_t;   // A tiles per chunk: row 2m+s

static void quantize_acts(acts_t *A, int m, const float *xf){
  A->m = m;
  for(int r=0;r<m;r++) for(int b=0;b<K/32;b++){
    float mx=0; for(int i=0;i<32;i++) mx=fmaxf(mx,fabsf(xf[r*K+b*32+i]));
    float d = mx/127.f; float id = d? 1.f/d:0; int s=0;
    for(int i=0;i<32;i++){ int v=(int)lrintf(xf[r*K+b*32+i]*id); A->x[r][b*32+i]=v; s+=v; }
    A->dx[r][b]=d; A->sx[r][b]=d*s;
  }
  memset(A->a,0,sizeof A->a);
  for(int c=0;c<CH;c++) for(int r=0;r<m;r++) for(int s=0;s<2;s++)
    for(int i=0;i<32;i++) A->a[c][2*r+s][s*32+i] = (uint8_t)(A->x[r][c*64+s*32+i] + 128);
}

static __thread int tcfg_rows = -1;
static void config(int rows){
  if (tcfg_rows == rows) return;
  cfg_t c; memset(&c,0,sizeof c); c.palette=1;
  c.colsb[0]=64; c.rows[0]=rows;   // C: rows (m,s), 16 int32
  c.colsb[1]=64; c.rows[1]=rows;   // A
  c.colsb[2]=64; c.rows[2]=16;     // B
  _tile_loadconfig(&c); tcfg_rows = rows;
}

static inline __m512 scale_step(__m512 acc, __m512i iv, __m512 dd, __m512 mv, float dx, float sx){
  __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(iv), dd);
  acc = _mm512_fmadd_ps(t, _mm512_set1_ps(dx), acc);
  return _mm512_fnmadd_ps(mv, _mm512_set1_ps(sx), acc);
}

// The same numbers on AVX-512 VNNI: codes held in registers, activations broadcast 4 at a time.
static void block_vnni(const block_t *w, const acts_t *A, float *y, int rb){
  int M = A->m;
  __m512 acc[MAXM]; for(int r=0;r<M;r++) acc[r]=_mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(15);
  for(int c=0;c<CH;c++){
    const chunk_t *ch = &w->c[c];
    for(int l=0;l<10;l++) _mm_prefetch((const char*)ch + PF + 64*l, HINT);
    __m512i q[16];
    for(int L=0;L<8;L++){
      __m512i v = _mm512_loadu_si512(ch->q + L*64);
      q[L] = _mm512_and_si512(v, low); q[L+8] = _mm512_and_si512(_mm512_srli_epi16(v,4), low);
    }
    int g = c/4;
    __m512 d = _mm512_loadu_ps(w->d[g]), dmin = _mm512_loadu_ps(w->dmin[g]);
    __m512 dd[2], mv[2];
    for(int s=0;s<2;s++){
      dd[s] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)ch->sc[s]))));
      mv[s] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)ch->mn[s]))));
    }
    for(int r=0;r<M;r++){
      const int32_t *xr = (const int32_t*)(A->x[r] + c*64);
      for(int s=0;s<2;s++){
        __m512i iv = _mm512_setzero_si512();
        for(int L=0;L<8;L++) iv = _mm512_dpbusd_epi32(iv, q[8*s+L], _mm512_set1_epi32(xr[8*s+L]));
        acc[r] = scale_step(acc[r], iv, dd[s], mv[s], A->dx[r][c*2+s], A->sx[r][c*2+s]);
      }
    }
  }
  for(int r=0;r<M;r++) _mm512_storeu_ps(y + (size_t)r*N + rb*16, acc[r]);
}

// y[m][n] for one row block
static void block_amx(const block_t *w, const acts_t *A, float *y, int rb){
  int M = A->m;
  config(2*(M < 8 ? M : 8));
  __m512 acc[MAXM]; for(int r=0;r<M;r++) acc[r]=_mm512_setzero_ps();
  __attribute__((aligned(64))) uint8_t bbuf[16*64];
  __attribute__((aligned(64))) int32_t cbuf[16*16];
  const __m512i low = _mm512_set1_epi8(15), ones = _mm512_set1_epi8(1);
  for(int c=0;c<CH;c++){
    const chunk_t *ch = &w->c[c];
    for(int l=0;l<10;l++) _mm_prefetch((const char*)ch + PF + 64*l, HINT);
    __m512i wsum[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    for(int L=0;L<8;L++){
      __m512i v = _mm512_loadu_si512(ch->q + L*64);
      __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v,4), low);
      _mm512_store_si512(bbuf + L*64, lo); _mm512_store_si512(bbuf + (L+8)*64, hi);
      wsum[0] = _mm512_add_epi8(wsum[0], lo); wsum[1] = _mm512_add_epi8(wsum[1], hi);
    }
    int g = c/4;
    __m512 d = _mm512_loadu_ps(w->d[g]), dmin = _mm512_loadu_ps(w->dmin[g]);
    __m512 dd[2], mv[2]; __m512i w128[2];
    for(int s=0;s<2;s++){
      w128[s] = _mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wsum[s], ones), 7);
      dd[s] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)ch->sc[s]))));
      mv[s] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)ch->mn[s]))));
    }
    _tile_loadd(2, bbuf, 64);
    for(int p=0;p<M;p+=8){
      int mp = M-p < 8 ? M-p : 8;
      _tile_loadd(1, A->a[c][2*p], 64);
      _tile_zero(0);
      _tile_dpbusd(0, 1, 2);
      _tile_stored(0, cbuf, 64);
      for(int r=0;r<mp;r++) for(int s=0;s<2;s++){
        __m512i iv = _mm512_sub_epi32(_mm512_load_si512(cbuf + (2*r+s)*16), w128[s]);
        acc[p+r] = scale_step(acc[p+r], iv, dd[s], mv[s], A->dx[p+r][c*2+s], A->sx[p+r][c*2+s]);
      }
    }
  }
  for(int r=0;r<M;r++) _mm512_storeu_ps(y + (size_t)r*N + rb*16, acc[r]);
}

static void block_stream(const block_t *w, const acts_t *A, float *y, int rb){
  (void)A;
  __m512i a = _mm512_setzero_si512(); const uint8_t *p = (const uint8_t*)w;
  for(size_t i=0;i+64<=sizeof(block_t);i+=64) a = _mm512_add_epi64(a, _mm512_loadu_si512(p+i));
  _mm512_storeu_si512(y + rb*16, a);
}
static int use_amx = 1;
static void matmul(const block_t *w, const acts_t *A, float *y){
  #pragma omp parallel for schedule(static)
  for(int rb=0;rb<RB;rb++) { if (use_amx == 2) block_stream(&w[rb], A, y, rb); else if (use_amx) block_amx(&w[rb], A, y, rb); else block_vnni(&w[rb], A, y, rb); }
}

int main(int argc, char **argv){
  if (syscall(SYS_arch_prctl, 0x1023, 18)) { printf("no AMX\n"); return 1; }
  int copies = 40;
  size_t bytes = sizeof(block_t)*RB;
  printf("block bytes per 1024 weights: %.1f; matrix %.1f MB; bits/weight %.2f\n",
         (double)sizeof(block_t)/CH, bytes/1e6, bytes*8.0/((double)N*K));
  block_t *W = aligned_alloc(64, bytes*copies);
  srand(1);
  for(size_t i=0;i<bytes;i++) ((uint8_t*)W)[i]=rand();
  for(int rb=0;rb<RB;rb++){ for(int g=0;g<CH/4;g++) for(int n=0;n<16;n++){ W[rb].d[g][n]=0.001f*(1+rand()%7); W[rb].dmin[g][n]=0.0005f*(1+rand()%5);} 
    for(int c=0;c<CH;c++) for(int s=0;s<2;s++) for(int n=0;n<16;n++){W[rb].c[c].sc[s][n]&=63; W[rb].c[c].mn[s][n]&=63;} }
  for(int i=1;i<copies;i++) memcpy((uint8_t*)W + bytes*i, W, bytes);
  static acts_t A; float *xf = malloc(sizeof(float)*MAXM*K); float *y = malloc(sizeof(float)*MAXM*N);
  for(int i=0;i<MAXM*K;i++) xf[i] = sinf(i*0.37f)*(1+(i%13)*0.1f);
  // correctness at M=5 against a scalar reference
  quantize_acts(&A, 5, xf); matmul(W, &A, y);
  double maxerr=0, maxv=0;
  for(int r=0;r<5;r++) for(int n=0;n<N;n+=37){
    int rb=n/16, nn=n%16; double s=0;
    for(int c=0;c<CH;c++) for(int k=0;k<64;k++){
      int b = c*2 + k/32, sb=k/32; const chunk_t *ch=&W[rb].c[c];
      double wv = W[rb].d[c/4][nn]*ch->sc[sb][nn]*code_of(ch,nn,k) - W[rb].dmin[c/4][nn]*ch->mn[sb][nn];
      s += wv * A.dx[r][b]*A.x[r][c*64+k];
    }
    maxerr=fmax(maxerr,fabs(s-y[(size_t)r*N+n])); maxv=fmax(maxv,fabs(s));
  }
  printf("check M=5: max |err| %.3g of max |y| %.3g\n", maxerr, maxv);
  // invariance: row 0 alone vs among 5 / 9
  float *y1 = malloc(sizeof(float)*MAXM*N);
  quantize_acts(&A, 1, xf); matmul(W,&A,y1);
  quantize_acts(&A, 9, xf); matmul(W,&A,y);
  printf("row 0 alone == row 0 among 9: %s\n", memcmp(y1,y,sizeof(float)*N)?"NO":"yes");
  use_amx = 0; float *y2 = malloc(sizeof(float)*MAXM*N); matmul(W,&A,y2);
  printf("VNNI == AMX, 9 rows: %s\n", memcmp(y2,y,sizeof(float)*9*N)?"NO":"yes");
  use_amx = argc > 2 ? (argv[2][0]=='s' ? 2 : 0) : 1; printf("timing %s\n", use_amx ? "AMX" : "VNNI");
  if (argc > 1 && argv[1][0]=='c') return 0;
  int ms[] = {1,2,3,5,9,16};
  double t1=0;
  for(int mi=0;mi<6;mi++){
    int m = ms[mi]; quantize_acts(&A, m, xf);
    double best[101]; int iters=101;
    for(int it=0;it<iters;it++){ const block_t *w = (const block_t*)((uint8_t*)W + bytes*(it%copies));
      double t0=now(); matmul(w,&A,y); best[it]=now()-t0; }
    // median
    for(int i=0;i<iters;i++) for(int j=i+1;j<iters;j++) if(best[j]<best[i]){double t=best[i];best[i]=best[j];best[j]=t;}
    if(m==1) t1=best[iters/2];
    printf("M=%2d: median %.1f us  v=%.2f\n", m, best[iters/2]*1e6, best[iters/2]/t1);
  }
  return 0;
}
