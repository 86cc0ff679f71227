/* test_ref_optim.c: self-test of the reference optimizers in ref_optim.c.
 *
 * Build and run:
 *   gcc -std=c11 -D_GNU_SOURCE -O2 -ffp-contract=off -Wall -Wextra -Werror \
 *       tests/test_ref_optim.c tests/ref_optim.c -lm -o /tmp/t && /tmp/t
 *
 * The expected values below are f32 bit patterns (bf16 results are given
 * widened to f32) and were produced with torch 2.15.0 on the CPU by a
 * throwaway script (not kept), as follows. The reference semantics (see
 * ref_optim.h) were emulated op by op with torch f32 tensor ops, one
 * rounding per op: every multiply, add and divide a separate tensor
 * operation with the scalar as a 0-dim f32 tensor, sqrt computed as
 * t.double().sqrt().float() (correctly rounded), bf16 stores as
 * t.to(torch.bfloat16).float(), Python floats for the scalar math, and the
 * clip norm summed in f64 element by element. The same inputs were then run
 * through the real optimizer (torch.optim.X(foreach=False, fused=False), or
 * lion_pytorch 0.2.5's Lion) for every all-f32 case; the comment above each
 * case says whether that gave the same bits. Where it does not, re-running
 * the emulation with an FMA in add(alpha=), addcmul and lerp and with torch's
 * own f32 sqrt (both what torch's vectorized CPU kernels do) reproduced
 * torch's bits exactly, so the difference is only that.
 *
 * Every result must match to the bit (NaN matches any NaN). On a mismatch
 * the largest difference in ulps and where it is are printed. */
#include "ref_optim.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXN 8     /* elements per case, all tensors together */
#define MAXT 2     /* tensors per case */
#define MAXSTEP 3  /* steps per case */

typedef struct {
  const char *name;
  RefHyper h;
  RefDType pdt, gdt, sdt;
  int ntensors;
  int sizes[MAXT];
  double num_tokens, world_size, max_norm;
  int nsteps;
  int has_s0;                               /* states start from s0, not ref_state_init */
  uint32_t s0[REF_MAX_STATES][MAXN];
  uint32_t p0[MAXN];                        /* initial params (f32 bits; rounded to pdt) */
  uint32_t g[MAXSTEP][MAXN];                /* grads of each step (f32 bits; rounded to gdt) */
  uint32_t p[MAXSTEP][MAXN];                /* expected params after each step */
  uint32_t s[MAXSTEP][REF_MAX_STATES][MAXN]; /* expected states after each step */
  uint64_t norm[MAXSTEP];                   /* expected ref_step result (f64 bits) */
} Case;

static const Case cases[] = {
  /* torch.optim.AdamW(foreach=False) gives the same bits. */
  {"adamw_step1_defaults", {REF_ADAMW, 0.001, 0.9, 0.999, 1e-08, 0.01, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, 0},
   REF_F32, REF_F32, REF_F32, 1, {5}, 1.0, 1.0, 0.0, 1,
   0, {{0}},
   {0x3f800000, 0xc0000000, 0x3f000000, 0x00000000, 0x40400000},
   {{0x3dcccccd, 0xbe4ccccd, 0x40400000, 0x00000000, 0xba83126f}},
   {{0x3f7fbdcf, 0xbfffde93, 0x3eff7c46, 0x00000000, 0x40400fe4}},
   {{{0x3c23d70b, 0xbca3d70b, 0x3e99999a, 0x00000000, 0xb8d1b718}, {0x3727c5ad, 0x3827c5ad, 0x3c1374bc, 0x00000000, 0x30897061}}},
   {0x0000000000000000}},
  /* torch.optim.AdamW(foreach=False) differs by up to 4 ulp: its CPU kernels fuse add(alpha=)/addcmul/lerp into FMAs and its f32 sqrt is not correctly rounded; the emulation with those gives its bits. */
  {"adamw_amsgrad_nan", {REF_ADAMW, 0.01, 0.9, 0.999, 1e-08, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 1, 0, 0, 0},
   REF_F32, REF_F32, REF_F32, 1, {5}, 1.0, 1.0, 0.0, 3,
   0, {{0}},
   {0x3f000000, 0xbf800000, 0x40000000, 0xbe800000, 0x3f800000},
   {{0x3f800000, 0xbf000000, 0x3e800000, 0x40000000, 0x7fc00000}, {0x3dcccccd, 0xbf800000, 0x3e800000, 0xc0400000, 0x3f800000}, {0x3f000000, 0x3f000000, 0xbf000000, 0x3f000000, 0x3f000000}},
   {{0x3efa9fbf, 0xbf7d2f1b, 0x3ffe76c9, 0xbe84fdf4, 0x7fc00000}, {0x3ef69497, 0xbf7a75c0, 0x3ffcedf7, 0xbe83973d, 0x7fc00000}, {0x3ef24054, 0xbf792253, 0x3ffcc601, 0xbe82f00d, 0x7fc00000}},
   {{{0x3dcccccd, 0xbd4ccccd, 0x3ccccccd, 0x3e4ccccd, 0x7fc00000}, {0x3a83126f, 0x3983126f, 0x3883126f, 0x3b83126f, 0x7fc00000}, {0x3a83126f, 0x3983126f, 0x3883126f, 0x3b83126f, 0x7fc00000}}, {{0x3dcccccd, 0xbe147ae1, 0x3d428f5c, 0xbdf5c292, 0x7fc00000}, {0x3a84406c, 0x3aa3cea7, 0x390301a8, 0x3c54ed2c, 0x7fc00000}, {0x3a84406c, 0x3aa3cea7, 0x390301a8, 0x3c54ed2c, 0x7fc00000}}, {{0x3e0f5c29, 0xbda4dd2f, 0xbbed9170, 0xbd6d916d, 0x7fc00000}, {0x3aa4e32d, 0x3ac46954, 0x39c4827e, 0x3c58cf3d, 0x7fc00000}, {0x3aa4e32d, 0x3ac46954, 0x39c4827e, 0x3c58cf3d, 0x7fc00000}}},
   {0x0000000000000000, 0x0000000000000000, 0x0000000000000000}},
  /* torch.optim.Adam(foreach=False) differs by up to 1 ulp: its CPU kernels fuse add(alpha=)/addcmul/lerp into FMAs and its f32 sqrt is not correctly rounded; the emulation with those gives its bits. */
  {"adam_l2_maximize_amsgrad", {REF_ADAM, 0.01, 0.9, 0.999, 1e-08, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 1, 1, 0, 0},
   REF_F32, REF_F32, REF_F32, 1, {4}, 1.0, 1.0, 0.0, 2,
   0, {{0}},
   {0x3f000000, 0xbf800000, 0x40000000, 0xbe800000},
   {{0x3f800000, 0xbf000000, 0x3e800000, 0x40000000}, {0x3dcccccd, 0xbf800000, 0x3e800000, 0xc0400000}},
   {{0x3f028f5c, 0xbf8147ae, 0x4000a3d7, 0xbe75c28f}, {0x3f045f0a, 0xbf827fb3, 0x40014796, 0xbe7833c4}},
   {{{0xbdc28f5c, 0x3d23d70b, 0xbba3d70a, 0xbe4f5c2a}, {0x3a6c95c0, 0x3927c5ad, 0x3627c5ab, 0x3b865e8b}, {0x3a6c95c0, 0x3927c5ad, 0x3627c5ab, 0x3b865e8b}}, {{0xbdb923a2, 0x3e00ebee, 0xbc1a0274, 0x3dec3ca0}, {0x3a6cfa50, 0x3a7dc422, 0x36a45dca, 0x3c543940}, {0x3a6cfa50, 0x3a7dc422, 0x36a45dca, 0x3c543940}}},
   {0x0000000000000000, 0x0000000000000000}},
  /* torch.optim.SGD(foreach=False) gives the same bits. */
  {"sgd_plain", {REF_SGD, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, 0},
   REF_F32, REF_F32, REF_F32, 1, {3}, 1.0, 1.0, 0.0, 1,
   0, {{0}},
   {0x3f800000, 0xc0000000, 0x3f000000},
   {{0x3f000000, 0x3e800000, 0xbf800000}},
   {{0x3f733333, 0xc001999a, 0x3f19999a}},
   {{{0}}},
   {0x0000000000000000}},
  /* torch.optim.SGD(foreach=False) differs by up to 3 ulp: its CPU kernels fuse add(alpha=)/addcmul/lerp into FMAs; the emulation with FMAs gives its bits. */
  {"sgd_momentum_dampening_wd", {REF_SGD, 0.1, 0.0, 0.0, 0.0, 0.1, 0.9, 0.1, 0.0, 0.0, 0.0, 0, 0, 0, 0},
   REF_F32, REF_F32, REF_F32, 1, {4}, 1.0, 1.0, 0.0, 3,
   0, {{0}},
   {0x3f800000, 0xc0000000, 0x3f000000, 0x00000000},
   {{0x3f000000, 0x3e800000, 0xbf800000, 0x00000000}, {0x3e800000, 0xbf000000, 0x3f800000, 0x40000000}, {0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000}},
   {{0x3f70a3d7, 0xc00051ec, 0x3f1851ec, 0x00000000}, {0x3f5ae3e7, 0xbff92571, 0x3f15cc10, 0xbe3851eb}, {0x3f2e4e32, 0xbffbadf7, 0x3ef646d6, 0xbedc5ac4}},
   {{{0x3f19999a, 0x3d4ccccc, 0xbf733333, 0x00000000}}, {{0x3f597f63, 0xbf15e00d, 0x3dc9d498, 0x3fe66666}}, {{0x3fdeec8a, 0x3e4aa9f8, 0x3f854b38, 0x40203e42}}},
   {0x0000000000000000, 0x0000000000000000, 0x0000000000000000}},
  /* torch.optim.SGD(foreach=False) gives the same bits. */
  {"sgd_nesterov_maximize", {REF_SGD, 0.1, 0.0, 0.0, 0.0, 0.0, 0.9, 0.0, 0.0, 0.0, 0.0, 0, 1, 1, 0},
   REF_F32, REF_F32, REF_F32, 1, {4}, 1.0, 1.0, 0.0, 2,
   0, {{0}},
   {0x3f800000, 0xc0000000, 0x3f000000, 0x00000000},
   {{0x3f000000, 0x3e800000, 0xbf800000, 0x00000000}, {0x3e800000, 0xbf000000, 0x3f800000, 0x40000000}},
   {{0x3f8c28f6, 0xbff9eb85, 0x3e9eb852, 0x00000000}, {0x3f976c8c, 0xc001be77, 0x3ed6872b, 0x3ec28f5c}},
   {{{0xbf000000, 0xbe800000, 0x3f800000, 0x80000000}}, {{0xbf333333, 0x3e8ccccd, 0xbdccccd0, 0xc0000000}}},
   {0x0000000000000000, 0x0000000000000000}},
  /* torch.optim.Adagrad(foreach=False) differs by up to 1 ulp: its CPU kernels fuse add(alpha=)/addcmul/lerp into FMAs and its f32 sqrt is not correctly rounded; the emulation with those gives its bits. */
  {"adagrad_lr_decay_iav_wd", {REF_ADAGRAD, 0.1, 0.0, 0.0, 1e-10, 0.1, 0.0, 0.0, 0.0, 0.1, 0.1, 0, 0, 0, 0},
   REF_F32, REF_F32, REF_F32, 1, {4}, 1.0, 1.0, 0.0, 3,
   0, {{0}},
   {0x3f800000, 0xc0000000, 0x3f000000, 0x00000000},
   {{0x3f000000, 0x3e800000, 0xbf800000, 0x00000000}, {0x3e800000, 0xbf000000, 0x3f800000, 0x40000000}, {0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000}},
   {{0x3f695a59, 0xc000ffe0, 0x3f184a27, 0x00000000}, {0x3f5ee526, 0xbff769b2, 0x3f076002, 0xbdb7e5b6}, {0x3f4d67ac, 0xbfff1f91, 0x3ef5c4a2, 0xbe01761e}},
   {{{0x3eeb851f, 0x3dd1eb85, 0x3f8051eb, 0x3dcccccd}}, {{0x3f138e04, 0x3f183d88, 0x40080040, 0x40833333}}, {{0x3fe10989, 0x3f9f6b7d, 0x404ef2de, 0x40a2a0be}}},
   {0x0000000000000000, 0x0000000000000000, 0x0000000000000000}},
  /* torch.optim.RMSprop(foreach=False) gives the same bits. */
  {"rmsprop_plain", {REF_RMSPROP, 0.01, 0.0, 0.0, 1e-08, 0.0, 0.0, 0.0, 0.99, 0.0, 0.0, 0, 0, 0, 0},
   REF_F32, REF_F32, REF_F32, 1, {4}, 1.0, 1.0, 0.0, 2,
   0, {{0}},
   {0x3f800000, 0xc0000000, 0x3f000000, 0x00000000},
   {{0x3f000000, 0x3e800000, 0xbf800000, 0x00000000}, {0x3e800000, 0xbf000000, 0x3f800000, 0x40000000}},
   {{0x3f666667, 0xc0066666, 0x3f199999, 0x00000000}, {0x3f5ae7c0, 0xc000ab80, 0x3f0773e0, 0xbdcccccb}},
   {{{0x3b23d70a, 0x3a23d70a, 0x3c23d70a, 0x00000000}}, {{0x3b4b295e, 0x3b4c63f1, 0x3ca30553, 0x3d23d70a}}},
   {0x0000000000000000, 0x0000000000000000}},
  /* torch.optim.RMSprop(foreach=False) differs by up to 8 ulp: its CPU kernels fuse add(alpha=)/addcmul/lerp into FMAs and its f32 sqrt is not correctly rounded; the emulation with those gives its bits. */
  {"rmsprop_centered_momentum_wd", {REF_RMSPROP, 0.01, 0.0, 0.0, 1e-08, 0.1, 0.9, 0.0, 0.99, 0.0, 0.0, 0, 1, 0, 1},
   REF_F32, REF_F32, REF_F32, 1, {4}, 1.0, 1.0, 0.0, 3,
   0, {{0}},
   {0x3f800000, 0xc0000000, 0x3f000000, 0x00000000},
   {{0x3f000000, 0x3e800000, 0xbf800000, 0x00000000}, {0x3e800000, 0xbf000000, 0x3f800000, 0x40000000}, {0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000}},
   {{0x3f8cdd4f, 0xbff322b1, 0x3ecc8ac5, 0x00000000}, {0x3f9cb929, 0xbfeed8c7, 0x3ec0dfc6, 0x3dcdd4ec}, {0x3fb6aa85, 0xbfdf4890, 0x3ed33ff2, 0x3e718fcf}},
   {{{0x3ad1b718, 0x3b04b5dc, 0x3c34a232, 0x00000000}, {0xc120ce57, 0xc120ce57, 0x4120ce59, 0x00000000}, {0xbb83126f, 0xbb9374bc, 0x3c2c0830, 0x00000000}}, {{0x3ae94a29, 0x3b426244, 0x3ca4eb44, 0x3d23d70a}, {0xc1463c2a, 0xc0566fa8, 0x4011d970, 0xc120ce59}, {0xbbaf9eb7, 0xbab1895a, 0x3a5045a0, 0xbca3d70a}}, {{0x3c1b0b6f, 0x3c8b6658, 0x3cef2254, 0x3d4a57a8}, {0xc1a2247e, 0xc1428aab, 0xc065b229, 0xc158a25b}, {0xbc66b618, 0xbc5861ed, 0xbc10c7fc, 0xbcf34c5c}}},
   {0x0000000000000000, 0x0000000000000000, 0x0000000000000000}},
  /* lion_pytorch.Lion gives the same bits. */
  {"lion_signs", {REF_LION, 0.5, 0.9, 0.99, 0.0, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, 0},
   REF_F32, REF_F32, REF_F32, 1, {6}, 1.0, 1.0, 0.0, 2,
   1, {{0x00000000, 0x80000000, 0x3f000000, 0xc0000000, 0x00000000, 0x00000000}},
   {0x3f800000, 0x80000000, 0x40000000, 0xbf800000, 0x3e800000, 0x3f800000},
   {{0x7fc00000, 0x80000000, 0xc0400000, 0x3f800000, 0x00000000, 0x0da24260}, {0x3f800000, 0x80000000, 0x3f000000, 0xbf000000, 0xbf800000, 0x00000000}},
   {{0x3f733333, 0x80000000, 0x3fb33333, 0xbee66666, 0x3e733333, 0x3ee66666}, {0x3f670a3d, 0x80000000, 0x3f547ae0, 0x3d947ae4, 0x3f39c28f, 0xbd947ae4}},
   {{{0x7fc00000, 0x80000000, 0x3eee147b, 0xbffc28f6, 0x00000000, 0x0a4fb11e}}, {{0x7fc00000, 0x80000000, 0x3eee425b, 0xbffa4746, 0xbc23d70a, 0x0a4d9d6d}}},
   {0x0000000000000000, 0x0000000000000000}},
  /* torch.optim.SGD(foreach=False) gives the same bits. */
  {"clip_sgd_two_tensors", {REF_SGD, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, 0},
   REF_F32, REF_F32, REF_F32, 2, {2, 1}, 2.0, 1.0, 1.0, 1,
   0, {{0}},
   {0x00000000, 0x00000000, 0x00000000},
   {{0x40400000, 0x40800000, 0x41400000}},
   {{0xbe6c4ec2, 0xbe9d89d7, 0xbf6c4ec2}},
   {{{0}}},
   {0x401a000000000000}},
  /* torch.optim.SGD(foreach=False) gives the same bits. */
  {"clip_not_needed", {REF_SGD, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, 0},
   REF_F32, REF_F32, REF_F32, 2, {2, 1}, 2.0, 1.0, 100.0, 1,
   0, {{0}},
   {0x00000000, 0x00000000, 0x00000000},
   {{0x40400000, 0x40800000, 0x41400000}},
   {{0xbfc00000, 0xc0000000, 0xc0c00000}},
   {{{0}}},
   {0x401a000000000000}},
  /* torch.optim.AdamW(foreach=False) differs by up to 2 ulp: its CPU kernels fuse add(alpha=)/addcmul/lerp into FMAs and its f32 sqrt is not correctly rounded; the emulation with those gives its bits. */
  {"adamw_scale_clip", {REF_ADAMW, 0.01, 0.9, 0.999, 1e-08, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, 0},
   REF_F32, REF_F32, REF_F32, 2, {3, 2}, 7.0, 3.0, 0.5, 2,
   0, {{0}},
   {0x3f800000, 0xc0000000, 0x3f000000, 0x00000000, 0x40400000},
   {{0x3dcccccd, 0xbe4ccccd, 0x40400000, 0x00000000, 0xba83126f}, {0x3f800000, 0x40000000, 0xc0400000, 0x40800000, 0x3f000000}},
   {{0x3f7d2f1b, 0xbffe76c9, 0x3efa9fbf, 0x00000000, 0x404072ae}, {0x3f7abf9f, 0xbffefe0b, 0x3ef93160, 0xbbf3d6b9, 0x403fc7e6}},
   {{{0x3ad9d94f, 0xbb59d94f, 0x3d4c3bb9, 0x00000000, 0xb78b6c5b}, {0x34944e80, 0x35944e80, 0x398258fd, 0x00000000, 0x2df2fc51}}, {{0x3c2d7411, 0x3c78dff2, 0x3c9033ac, 0x3d14f205, 0x3b94748b}, {0x370f48d5, 0x380f48d5, 0x39a936c0, 0x390aa791, 0x360aa80a}}},
   {0x3ff4a0e4ed675c8f, 0x4002db6db7d1745d}},
  /* bf16 storage: op-by-op emulation only (torch would round every intermediate to bf16). */
  {"adamw_bf16", {REF_ADAMW, 0.01, 0.9, 0.999, 1e-08, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, 0},
   REF_BF16, REF_BF16, REF_BF16, 1, {5}, 1.0, 1.0, 0.0, 2,
   0, {{0}},
   {0x3f800000, 0xc0000000, 0x3f000000, 0x00000000, 0x40400000},
   {{0x3dcccccd, 0xbe4ccccd, 0x40400000, 0x00000000, 0xba83126f}, {0x3f800000, 0x40000000, 0xc0400000, 0x40800000, 0x3f000000}},
   {{0x3f7d0000, 0xbffe0000, 0x3efb0000, 0x00000000, 0x40400000}, {0x3f7b0000, 0xbfff0000, 0x3efb0000, 0xbbf40000, 0x403f0000}},
   {{{0x3c240000, 0xbca40000, 0x3e9a0000, 0x00000000, 0xb8d20000}, {0x37280000, 0x38280000, 0x3c130000, 0x00000000, 0x30890000}}, {{0x3ddf0000, 0x3e3a0000, 0xbcf00000, 0x3ecd0000, 0x3d4c0000}, {0x3a840000, 0x3b840000, 0x3c930000, 0x3c830000, 0x39830000}}},
   {0x0000000000000000, 0x0000000000000000}},
  /* bf16 storage: op-by-op emulation only (torch would round every intermediate to bf16). */
  {"adamw_bf16_f32_states", {REF_ADAMW, 0.01, 0.9, 0.999, 1e-08, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, 0},
   REF_BF16, REF_BF16, REF_F32, 1, {5}, 1.0, 1.0, 0.0, 2,
   0, {{0}},
   {0x3f800000, 0xc0000000, 0x3f000000, 0x00000000, 0x40400000},
   {{0x3dcccccd, 0xbe4ccccd, 0x40400000, 0x00000000, 0xba83126f}, {0x3f800000, 0x40000000, 0xc0400000, 0x40800000, 0x3f000000}},
   {{0x3f7d0000, 0xbffe0000, 0x3efb0000, 0x00000000, 0x40400000}, {0x3f7b0000, 0xbfff0000, 0x3efb0000, 0xbbf40000, 0x403f0000}},
   {{{0x3c240000, 0xbca40000, 0x3e99999a, 0x00000000, 0xb8d1999a}, {0x3728199a, 0x3828199a, 0x3c1374bc, 0x00000000, 0x308949bb}}, {{0x3ddf4000, 0x3e3a599a, 0xbcf5c290, 0x3ecccccd, 0x3d4c6e7b}, {0x3a84624c, 0x3b84624c, 0x3c9361dc, 0x3c83126f, 0x39831291}}},
   {0x0000000000000000, 0x0000000000000000}},
  /* bf16 storage: op-by-op emulation only (torch would round every intermediate to bf16). */
  {"sgd_bf16_scale_clip", {REF_SGD, 0.1, 0.0, 0.0, 0.0, 0.0, 0.9, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, 0},
   REF_BF16, REF_BF16, REF_BF16, 2, {3, 2}, 7.0, 3.0, 0.5, 2,
   0, {{0}},
   {0x3f800000, 0xc0000000, 0x3f000000, 0x00000000, 0x40400000},
   {{0x3dcccccd, 0xbe4ccccd, 0x40400000, 0x00000000, 0xba83126f}, {0x3f800000, 0x40000000, 0xc0400000, 0x40800000, 0x3f000000}},
   {{0x3f800000, 0xc0000000, 0x3ee60000, 0x00000000, 0x40400000}, {0x3f7d0000, 0xc0010000, 0x3edd0000, 0xbd150000, 0x40400000}},
   {{{0x3c880000, 0xbd080000, 0x3eff0000, 0x00000000, 0xb92e0000}}, {{0x3dd90000, 0x3e1b0000, 0x3e330000, 0x3eba0000, 0x3d390000}}},
   {0x3ff4aea58a7e1e55, 0x4002d88e51f5d636}},
  /* bf16 storage: op-by-op emulation only (torch would round every intermediate to bf16). */
  {"rmsprop_centered_bf16_f32_states", {REF_RMSPROP, 0.01, 0.0, 0.0, 1e-08, 0.0, 0.9, 0.0, 0.99, 0.0, 0.0, 0, 0, 0, 1},
   REF_BF16, REF_BF16, REF_F32, 1, {4}, 1.0, 1.0, 0.0, 2,
   0, {{0}},
   {0x3f800000, 0xc0000000, 0x3f000000, 0x00000000},
   {{0x3f000000, 0x3e800000, 0xbf800000, 0x00000000}, {0x3e800000, 0xbf000000, 0x3f800000, 0x40000000}},
   {{0x3f660000, 0xc0060000, 0x3f1a0000, 0x00000000}, {0x3f430000, 0xc0060000, 0x3f1f0000, 0xbdce0000}},
   {{{0x3b23d70a, 0x3a23d70a, 0x3c23d70a, 0x00000000}, {0x4120ce57, 0x4120ce56, 0xc120ce59, 0x00000000}, {0x3ba3d70a, 0x3b23d70a, 0xbc23d70a, 0x00000000}}, {{0x3b4b295e, 0x3b4c63f1, 0x3ca30553, 0x3d23d70a}, {0x4159382b, 0x3da9de80, 0xbffa6f78, 0x4120ce59}, {0x3bf41f21, 0xbb257a78, 0x38d1b700, 0x3ca3d70a}}},
   {0x0000000000000000, 0x0000000000000000}},
  /* bf16 storage: op-by-op emulation only (torch would round every intermediate to bf16). */
  {"sgd_bf16_f32_states_scale_clip", {REF_SGD, 0.1, 0.0, 0.0, 0.0, 0.0, 0.9, 0.0, 0.0, 0.0, 0.0, 0, 0, 1, 0},
   REF_BF16, REF_BF16, REF_F32, 2, {3, 2}, 7.0, 3.0, 0.5, 2,
   0, {{0}},
   {0x3f800000, 0xc0000000, 0x3f000000, 0x00000000, 0x40400000},
   {{0x3dcccccd, 0xbe4ccccd, 0x40400000, 0x00000000, 0xba83126f}, {0x3f800000, 0x40000000, 0xc0400000, 0x40800000, 0x3f000000}},
   {{0x3f7f0000, 0xbfff0000, 0x3ed00000, 0x00000000, 0x40400000}, {0x3f7a0000, 0xc0020000, 0x3ed60000, 0xbd8d0000, 0x403f0000}},
   {{{0x3c880000, 0xbd080000, 0x3eff0000, 0x00000000, 0xb92e0000}}, {{0x3dd8999a, 0x3e1b6666, 0x3e330000, 0x3eba0000, 0x3d396366}}},
   {0x3ff4aea58a7e1e55, 0x4002d88e51f5d636}},
  /* bf16 storage: op-by-op emulation only (torch would round every intermediate to bf16). */
  {"adamw_bf16_f32_states_scale_clip", {REF_ADAMW, 0.01, 0.9, 0.999, 1e-08, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 1, 0, 0, 0},
   REF_BF16, REF_BF16, REF_F32, 2, {3, 2}, 7.0, 3.0, 0.5, 2,
   0, {{0}},
   {0x3f800000, 0xc0000000, 0x3f000000, 0x00000000, 0x40400000},
   {{0x3dcccccd, 0xbe4ccccd, 0x40400000, 0x00000000, 0xba83126f}, {0x3f800000, 0x40000000, 0xc0400000, 0x40800000, 0x3f000000}},
   {{0x3f7d0000, 0xbffe0000, 0x3efb0000, 0x00000000, 0x40400000}, {0x3f7b0000, 0xbfff0000, 0x3efa0000, 0xbbf40000, 0x403f0000}},
   {{{0x3ad9999a, 0xbb59999a, 0x3d4c0000, 0x00000000, 0xb78b3333}, {0x3493f7cf, 0x3593f7cf, 0x39820cce, 0x00000000, 0x2df23540}, {0x3493f7cf, 0x3593f7cf, 0x39820cce, 0x00000000, 0x2df23540}}, {{0x3c2d47ae, 0x3c78a3d8, 0x3c8f3332, 0x3d14cccd, 0x3b944f85}, {0x370f00dd, 0x380f00dd, 0x39a91eb6, 0x390a624e, 0x360a62c7}, {0x370f00dd, 0x380f00dd, 0x39a91eb6, 0x390a624e, 0x360a62c7}}},
   {0x3ff4aea58a7e1e55, 0x4002d88e51f5d636}},
};

static int checks, failures;

static float f32_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* Distance in ulps between two non-NaN floats (on the ordered integer line). */
static int64_t ulp_diff(float a, float b) {
  int64_t ia = (int32_t)bits_of(a), ib = (int32_t)bits_of(b);
  if (ia < 0)
    ia = -(ia & 0x7fffffff);
  if (ib < 0)
    ib = -(ib & 0x7fffffff);
  return ia > ib ? ia - ib : ib - ia;
}

/* Compares n stored values against expected f32 bit patterns; reports the worst. */
static void check_values(const char *cname, int step, const char *what, RefDType dt, const void *got,
                         const uint32_t *want, int n) {
  checks++;
  int64_t worst = -1;
  int at = -1;
  for (int i = 0; i < n; i++) {
    float g = ref_load(dt, got, i), w = f32_of(want[i]);
    int64_t d;
    if (isnan(g) || isnan(w))
      d = (isnan(g) && isnan(w)) ? 0 : INT64_MAX;
    else
      d = bits_of(g) == bits_of(w) ? 0 : (ulp_diff(g, w) == 0 ? 1 : ulp_diff(g, w)); /* +0 vs -0: 1 */
    if (d > worst) {
      worst = d;
      at = i;
    }
  }
  if (worst > 0) {
    failures++;
    float g = ref_load(dt, got, at), w = f32_of(want[at]);
    printf("FAIL %s step %d %s: largest difference %s%" PRId64 " ulp at [%d]: got %.9g (0x%08" PRIx32
           "), want %.9g (0x%08" PRIx32 ")\n",
           cname, step, what, worst == INT64_MAX ? "(NaN vs number) " : "",
           worst == INT64_MAX ? (int64_t)0 : worst, at, g, bits_of(g), w, want[at]);
  }
}

static size_t dt_size(RefDType dt) { return dt == REF_BF16 ? 2 : 4; }

static void run_case(const Case *c) {
  const int ns = ref_state_count(&c->h);
  int n = 0;
  for (int k = 0; k < c->ntensors; k++)
    n += c->sizes[k];
  unsigned char p[MAXN * 4], g[MAXN * 4], gcopy[MAXN * 4], s[REF_MAX_STATES][MAXN * 4];
  for (int i = 0; i < n; i++) {
    ref_store(c->pdt, p, i, f32_of(c->p0[i]));
    for (int j = 0; j < ns; j++)
      ref_store(c->sdt, s[j], i, c->has_s0 ? f32_of(c->s0[j][i]) : ref_state_init(&c->h, j));
  }
  for (int step = 1; step <= c->nsteps; step++) {
    for (int i = 0; i < n; i++)
      ref_store(c->gdt, g, i, f32_of(c->g[step - 1][i]));
    memcpy(gcopy, g, (size_t)n * dt_size(c->gdt));
    RefTensor t[MAXT];
    int off = 0;
    for (int k = 0; k < c->ntensors; k++) {
      memset(&t[k], 0, sizeof t[k]);
      t[k].n = c->sizes[k];
      t[k].p = p + (size_t)off * dt_size(c->pdt);
      t[k].g = g + (size_t)off * dt_size(c->gdt);
      for (int j = 0; j < ns; j++)
        t[k].s[j] = s[j] + (size_t)off * dt_size(c->sdt);
      off += c->sizes[k];
    }
    double norm = ref_step(&c->h, c->pdt, c->gdt, c->sdt, t, c->ntensors, (double)step, c->num_tokens,
                           c->world_size, c->max_norm);
    checks++;
    if (memcmp(g, gcopy, (size_t)n * dt_size(c->gdt)) != 0) {
      failures++;
      printf("FAIL %s step %d: ref_step modified the grads\n", c->name, step);
    }
    checks++;
    uint64_t nb;
    memcpy(&nb, &norm, sizeof nb);
    if (nb != c->norm[step - 1]) {
      double w;
      memcpy(&w, &c->norm[step - 1], sizeof w);
      failures++;
      printf("FAIL %s step %d: returned norm %.17g, want %.17g\n", c->name, step, norm, w);
    }
    check_values(c->name, step, "param", c->pdt, p, c->p[step - 1], n);
    for (int j = 0; j < ns; j++)
      check_values(c->name, step, ref_state_name(&c->h, j), c->sdt, s[j], c->s[step - 1][j], n);
  }
}

static void expect(int ok, const char *what) {
  checks++;
  if (!ok) {
    failures++;
    printf("FAIL %s\n", what);
  }
}

/* bf16 rounding: round to nearest even, overflow to infinity, NaN -> 0x7fc0 | sign. */
static void test_bf16(void) {
  static const struct { uint32_t in; uint16_t out; } t[] = {
      {0x3f800000, 0x3f80}, /* 1.0 */
      {0x3f808000, 0x3f80}, /* 1 + 2^-8: tie, to even (down) */
      {0x3f818000, 0x3f82}, /* 1 + 3*2^-8: tie, to even (up) */
      {0x3f808001, 0x3f81}, /* just above the tie */
      {0x3f807fff, 0x3f80}, /* just below the tie */
      {0xbf818000, 0xbf82}, /* negative tie */
      {0x7f7fffff, 0x7f80}, /* FLT_MAX rounds up to infinity */
      {0x7f7f7fff, 0x7f7f}, /* largest that stays finite */
      {0x7f800000, 0x7f80}, /* +inf */
      {0xff800000, 0xff80}, /* -inf */
      {0x7fc00000, 0x7fc0}, /* NaN */
      {0xffc00001, 0xffc0}, /* -NaN keeps its sign */
      {0x7f800001, 0x7fc0}, /* signalling NaN is quieted */
      {0x7fffffff, 0x7fc0}, /* NaN must not carry into the sign */
      {0x80000000, 0x8000}, /* -0.0 */
      {0x00008000, 0x0000}, /* subnormal tie, to even */
      {0x00018000, 0x0002}, /* subnormal tie, to even (up) */
  };
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    uint16_t got = ref_f32_to_bf16(f32_of(t[i].in));
    checks++;
    if (got != t[i].out) {
      failures++;
      printf("FAIL bf16 rounding of 0x%08" PRIx32 ": got 0x%04x, want 0x%04x\n", t[i].in, got, t[i].out);
    }
  }
  expect(bits_of(ref_bf16_to_f32(0xbf82)) == 0xbf820000u, "bf16 widening");
}

/* Defaults as inspect.signature(torch.optim.X.__init__) gives in torch 2.15.0, and
 * lion_pytorch.Lion's (lr 1e-4, betas (0.9, 0.99), weight_decay 0). */
static void test_defaults(void) {
  RefHyper h = ref_defaults(REF_ADAMW);
  expect(h.lr == 1e-3 && h.beta1 == 0.9 && h.beta2 == 0.999 && h.eps == 1e-8 && h.weight_decay == 1e-2 &&
             !h.amsgrad && !h.maximize,
         "AdamW defaults");
  h = ref_defaults(REF_ADAM);
  expect(h.lr == 1e-3 && h.beta1 == 0.9 && h.beta2 == 0.999 && h.eps == 1e-8 && h.weight_decay == 0.0,
         "Adam defaults");
  h = ref_defaults(REF_SGD);
  expect(h.lr == 1e-3 && h.momentum == 0.0 && h.dampening == 0.0 && h.weight_decay == 0.0 && !h.nesterov,
         "SGD defaults");
  h = ref_defaults(REF_LION);
  expect(h.lr == 1e-4 && h.beta1 == 0.9 && h.beta2 == 0.99 && h.weight_decay == 0.0, "Lion defaults");
  h = ref_defaults(REF_ADAGRAD);
  expect(h.lr == 1e-2 && h.lr_decay == 0.0 && h.weight_decay == 0.0 && h.initial_accumulator_value == 0.0 &&
             h.eps == 1e-10,
         "Adagrad defaults");
  h = ref_defaults(REF_RMSPROP);
  expect(h.lr == 1e-2 && h.alpha == 0.99 && h.eps == 1e-8 && h.weight_decay == 0.0 && h.momentum == 0.0 &&
             !h.centered,
         "RMSprop defaults");
}

static int names_are(const RefHyper *h, const char *const *want, int n) {
  if (ref_state_count(h) != n || ref_state_name(h, n) != NULL)
    return 0;
  for (int i = 0; i < n; i++)
    if (strcmp(ref_state_name(h, i), want[i]) != 0 || ref_state_index(h, want[i]) != i)
      return 0;
  return 1;
}

/* State names and order: torch's state dict insertion order. */
static void test_state_names(void) {
  RefHyper h = ref_defaults(REF_ADAMW);
  static const char *const adam2[] = {"exp_avg", "exp_avg_sq"};
  static const char *const adam3[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  expect(names_are(&h, adam2, 2), "AdamW state names");
  h.amsgrad = 1;
  expect(names_are(&h, adam3, 3), "AdamW amsgrad state names");
  h = ref_defaults(REF_SGD);
  expect(names_are(&h, NULL, 0), "SGD without momentum has no state");
  h.momentum = 0.9;
  static const char *const sgd[] = {"momentum_buffer"};
  expect(names_are(&h, sgd, 1), "SGD state names");
  h = ref_defaults(REF_LION);
  static const char *const lion[] = {"exp_avg"};
  expect(names_are(&h, lion, 1), "Lion state names");
  h = ref_defaults(REF_ADAGRAD);
  h.initial_accumulator_value = 0.25;
  static const char *const adagrad[] = {"sum"};
  expect(names_are(&h, adagrad, 1) && ref_state_init(&h, 0) == 0.25f, "Adagrad state names and init");
  h = ref_defaults(REF_RMSPROP);
  static const char *const rms1[] = {"square_avg"};
  static const char *const rms3[] = {"square_avg", "momentum_buffer", "grad_avg"};
  static const char *const rms2[] = {"square_avg", "grad_avg"};
  expect(names_are(&h, rms1, 1) && ref_state_init(&h, 0) == 0.0f, "RMSprop state names");
  h.centered = 1;
  expect(names_are(&h, rms2, 2), "RMSprop centered state names");
  h.momentum = 0.9;
  expect(names_are(&h, rms3, 3), "RMSprop centered+momentum state names");
  expect(ref_state_index(&h, "exp_avg") == -1, "absent state index");
}

int main(void) {
  test_bf16();
  test_defaults();
  test_state_names();
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    run_case(&cases[i]);
  printf("test_ref_optim: %d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
