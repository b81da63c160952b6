// The CUDA built-ins the kernels use, as plain C++ on the host: a block's threads are fibers
// (ucontext) on one OS thread, switched at barriers: __syncthreads is the block's barrier, a
// warp's lanes meet at their own for each shuffle and tensor-core product. Blocks run one after
// another. A fiber that reaches a barrier hands over to the next; the scheduler resumes the
// fibers in thread order, so every interleaving the kernels allow between barriers is one the
// emulation can take only in that order (what a GPU could do otherwise is the device checks' job).
// The warp size is the harness's choice: the largest power of two up to 32 that divides the
// block, so the kernels' warp code runs at every block size the tests use (on a device it is 32).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <functional>
#include <csetjmp>
#include <ucontext.h>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
using std::min;
struct Dim { unsigned int x, y, z; };
static Dim threadIdx{0, 0, 0}, blockIdx{0, 0, 0};
static Dim blockDim{1, 1, 1}, gridDim{1, 1, 1};
static unsigned warpSize = 1;
// The block's fibers: each with its stack and its count of tensor-core products. A fiber starts
// through ucontext (its own stack) and is switched with _setjmp/_longjmp afterwards, which do not
// touch the signal mask (a system call each time through swapcontext); it never returns from its
// entry but jumps back to the scheduler, whose frame stays live below every switch.
struct Fiber {
  ucontext_t ctx;
  jmp_buf at;
  std::vector<char> stack;
  unsigned mma_calls = 0;
  bool started = false, done = false;
};
static std::vector<Fiber> fibers;
static ucontext_t scheduler_ctx;
static jmp_buf scheduler_at;
static unsigned current_fiber = 0;
static std::function<void()> fiber_kernel;
inline void fiber_yield() {
  if (!_setjmp(fibers[current_fiber].at)) _longjmp(scheduler_at, 1);
}
inline void fiber_entry() {
  fiber_kernel();
  fibers[current_fiber].done = true;
  _longjmp(scheduler_at, 1);
}
// A barrier of n fibers: the last to arrive opens the next phase; the others hand over until it does.
class Barrier {
  const unsigned n_;
  unsigned waiting_ = 0, phase_ = 0;
 public:
  explicit Barrier(unsigned n) : n_(n) {}
  void arrive_and_wait() {
    if (n_ == 1) return;
    const unsigned phase = phase_;
    if (++waiting_ == n_) { waiting_ = 0; ++phase_; return; }
    while (phase_ == phase) fiber_yield();
  }
};
static std::unique_ptr<Barrier> block_barrier;
static std::vector<std::unique_ptr<Barrier>> warp_barriers;
static float shuffle_slots[1024];
inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
inline void __syncthreads() { if (blockDim.x > 1) block_barrier->arrive_and_wait(); }
inline void sincosf(float x, float* s, float* c) { *s = std::sin(x); *c = std::cos(x); }
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  if (warpSize == 1) return v;
  const unsigned t = threadIdx.x, lane = t % warpSize;
  if ((unsigned)lane_mask >= warpSize) { fprintf(stderr, "shuffle past the warp: %d\n", lane_mask); std::abort(); }
  auto& b = *warp_barriers[t / warpSize];
  shuffle_slots[t] = v;
  b.arrive_and_wait();
  const float r = shuffle_slots[t - lane + (lane ^ (unsigned)lane_mask)];
  b.arrive_and_wait();
  return r;
}
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }
inline int atomicOr(int* a, int v) { return __atomic_fetch_or(a, v, __ATOMIC_RELAXED); }
inline unsigned long long atomicMin(unsigned long long* a, unsigned long long v) {
  unsigned long long old = __atomic_load_n(a, __ATOMIC_RELAXED);
  while (v < old && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
  return old;
}
// mma.sync m16n8k16 (bf16 in, f32 accumulators) for one warp of 32 lanes: every lane hands in its
// fragments as the PTX ISA lays them out, each lane rebuilds A (16 x 16) and B (16 x 8) whole and
// adds its own four elements of A . B (lane = 4 * groupID + t: rows groupID and groupID + 8,
// columns 2t and 2t + 1). Two exchange buffers used in turn: one barrier a call (a lane writes a
// buffer again only after every lane passed the next call's barrier, so after it read this one).
static unsigned mma_a[2][1024][4], mma_b[2][1024][2];
inline void plateau_emulated_mma_bf16(float* d, const unsigned* a, const unsigned* b) {
  if (warpSize != 32) { fprintf(stderr, "mma needs warps of 32 lanes, not %u\n", warpSize); std::abort(); }
  const unsigned t = threadIdx.x, base = t - t % 32, lane = t % 32, buf = fibers[current_fiber].mma_calls++ % 2;
  for (int i = 0; i < 4; ++i) mma_a[buf][t][i] = a[i];
  for (int i = 0; i < 2; ++i) mma_b[buf][t][i] = b[i];
  warp_barriers[t / 32]->arrive_and_wait();
  float A[16][16], B[16][8];
  auto value = [](unsigned reg, int half) { return __uint_as_float(((reg >> (16 * half)) & 0xffffu) << 16); };
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, tt = l % 4;
    for (int i = 0; i < 8; ++i)
      A[(i / 2) % 2 ? g + 8 : g][2 * tt + (i & 1) + (i >= 4 ? 8 : 0)] = value(mma_a[buf][base + l][i / 2], i % 2);
    for (int i = 0; i < 4; ++i) B[2 * tt + (i & 1) + (i >= 2 ? 8 : 0)][g] = value(mma_b[buf][base + l][i / 2], i % 2);
  }
  const int g = lane / 4, tt = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = i < 2 ? g : g + 8, col = 2 * tt + (i & 1);
    float acc = 0;
    for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
    d[i] += acc;
  }
}
static float plateau_emulated_smem[1 << 17];
#define PLATEAU_EMULATED

static unsigned THREADS = 1;
inline unsigned warp_for(unsigned threads) {
  unsigned w = 32;
  while (threads % w) w /= 2;
  return w;
}
// Runs f as a launch of gx * gy * gz blocks of THREADS threads.
template <class F> void launch(unsigned gx, unsigned gy, unsigned gz, F f) {
  gridDim = {gx, gy, gz};
  blockDim = {THREADS, 1, 1};
  warpSize = warp_for(THREADS);
  block_barrier = std::make_unique<Barrier>(THREADS);
  warp_barriers.clear();
  for (unsigned w = 0; w < THREADS / warpSize; ++w) warp_barriers.push_back(std::make_unique<Barrier>(warpSize));
  fiber_kernel = f;
  fibers.resize(THREADS);
  for (auto& fb : fibers) { fb.stack.resize(1 << 17); fb.mma_calls = 0; }
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
      for (unsigned x = 0; x < gx; ++x) {
        blockIdx = {x, y, z};
        if (THREADS == 1) { threadIdx = {0, 0, 0}; f(); continue; }
        for (auto& fb : fibers) {
          getcontext(&fb.ctx);
          fb.ctx.uc_stack.ss_sp = fb.stack.data();
          fb.ctx.uc_stack.ss_size = fb.stack.size();
          fb.ctx.uc_link = &scheduler_ctx;
          makecontext(&fb.ctx, fiber_entry, 0);
          fb.started = fb.done = false;
        }
        for (unsigned left = THREADS; left > 0;)
          for (unsigned t = 0; t < THREADS; ++t) {
            if (fibers[t].done) continue;
            current_fiber = t;
            threadIdx = {t, 0, 0};
            if (!_setjmp(scheduler_at)) {
              if (fibers[t].started) _longjmp(fibers[t].at, 1);
              fibers[t].started = true;
              swapcontext(&scheduler_ctx, &fibers[t].ctx);
            }
            left -= fibers[t].done;
          }
      }
}
template <class F> void launch(unsigned gx, unsigned gy, F f) { launch(gx, gy, 1, f); }
