/* layout.c: a group's flat layout and its chunk table. */
#include "plan.h"

#include <math.h>
#include <string.h>

static int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

int64_t graph_align(const Graph *g) { return MAX(OPTC_TENSOR_ALIGN, g->block); }

int64_t layout_offsets_a(int n, const int64_t *numel, int64_t align, int64_t *offset) {
  ASSERT(align >= OPTC_TENSOR_ALIGN && OPTC_REDUCE_BLOCK % align == 0);
  int64_t at = 0;
  for (int t = 0; t < n; t++) {
    at = align_up(at, align);
    if (offset)
      offset[t] = at;
    at += MAX(numel[t], 0);
  }
  /* padded, so that a whole vector at any tensor's end stays inside (and a
   * per-block buffer has a whole number of elements) */
  return align_up(at, align);
}

int64_t layout_offsets(int n, const int64_t *numel, int64_t *offset) {
  return layout_offsets_a(n, numel, OPTC_TENSOR_ALIGN, offset);
}

void layout_init_a(GroupLayout *l, int n, const int64_t *numel, int64_t align) {
  memset(l, 0, sizeof *l);
  l->ntensors = n;
  l->align = align;
  l->numel = malloc(sizeof(int64_t) * (size_t)(n + 1));
  l->offset = malloc(sizeof(int64_t) * (size_t)(n + 1));
  ASSERT(l->numel && l->offset);
  memcpy(l->numel, numel, sizeof(int64_t) * (size_t)n);
  l->total = layout_offsets_a(n, numel, align, l->offset);
  layout_restrict(l, 0, l->total);
}

void layout_init(GroupLayout *l, int n, const int64_t *numel) { layout_init_a(l, n, numel, OPTC_TENSOR_ALIGN); }

void layout_restrict(GroupLayout *l, int64_t lo, int64_t hi) {
  ASSERT(lo % OPTC_REDUCE_BLOCK == 0 && lo <= hi);
  int64_t r[2] = {lo, hi};
  layout_select(l, 1, r);
}

bool layout_is_cut(const GroupLayout *l, int64_t x) {
  if (x % OPTC_REDUCE_BLOCK == 0)
    return true;
  for (int t = 0; t < l->ntensors; t++) /* inside a tensor, only a block boundary cuts */
    if (l->offset[t] < x && x < l->offset[t] + l->numel[t])
      return false;
  return true;
}

void layout_select(GroupLayout *l, int nranges, const int64_t *ranges) {
  ASSERT(nranges >= 1);
  for (int k = 0; k < nranges; k++)
    ASSERT(ranges[2 * k] <= ranges[2 * k + 1] && (k == 0 || ranges[2 * k - 1] <= ranges[2 * k]));
  free(l->chunks);
  l->lo = ranges[0];
  l->hi = ranges[2 * nranges - 1];
  /* Count first, then fill: a tensor contributes one chunk per block it
   * touches inside a range. */
  int64_t count = 0;
  for (int pass = 0; pass < 2; pass++) {
    int64_t k = 0;
    for (int q = 0; q < nranges; q++) {
      int64_t lo = ranges[2 * q], hi = ranges[2 * q + 1];
      for (int t = 0; t < l->ntensors; t++) {
        int64_t a = MAX(l->offset[t], lo), e = MIN(l->offset[t] + l->numel[t], hi);
        while (a < e) {
          int64_t block_end = (a / OPTC_REDUCE_BLOCK + 1) * OPTC_REDUCE_BLOCK;
          int64_t b = MIN(e, block_end);
          if (pass == 1)
            l->chunks[k] = (Chunk){.tensor = t, .block = (int32_t)(a / OPTC_REDUCE_BLOCK),
                                   .start = a - l->offset[t], .len = b - a, .flat = a,
                                   .numel = l->numel[t]};
          k++;
          a = b;
        }
      }
    }
    if (pass == 0) {
      count = k;
      l->chunks = malloc(sizeof(Chunk) * (size_t)(count + 1));
      ASSERT(l->chunks);
    }
  }
  l->nchunks = count;
}

void layout_free(GroupLayout *l) {
  free(l->numel);
  free(l->offset);
  free(l->chunks);
  memset(l, 0, sizeof *l);
}

double layout_fold(const double *part, int64_t nchunks, int width, int idx, bool is_max) {
  double acc = is_max ? -INFINITY : 0.0;
  for (int64_t c = 0; c < nchunks; c++) {
    double v = part[c * width + idx];
    acc = is_max ? optc_max_nan(acc, v) : acc + v;
  }
  return acc;
}

void layout_fold_tensors(const GroupLayout *l, const double *part, int width, int idx, bool is_max, double *out) {
  for (int t = 0; t < l->ntensors; t++)
    out[t] = is_max ? -INFINITY : 0.0;
  for (int64_t c = 0; c < l->nchunks; c++) {
    double v = part[c * width + idx];
    double *acc = &out[l->chunks[c].tensor];
    *acc = is_max ? optc_max_nan(*acc, v) : *acc + v;
  }
}

void **layout_tensor_bufs(const GroupLayout *l, const Graph *g, void *const *flat) {
  ASSERT(l->align % graph_align(g) == 0);
  size_t n = (size_t)l->ntensors * (size_t)g->nbufs;
  void **t = malloc(sizeof(void *) * (n + 1));
  ASSERT(t);
  for (int i = 0; i < l->ntensors; i++)
    for (int b = 0; b < g->nbufs; b++)
      t[(size_t)i * (size_t)g->nbufs + (size_t)b] =
          flat && flat[b] ? (char *)flat[b] + buffer_offset(g, b, l->offset[i]) : NULL;
  return t;
}

int64_t layout_chunk_at(const GroupLayout *l, int64_t flat) {
  int64_t lo = 0, hi = l->nchunks;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (l->chunks[mid].flat < flat)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}
