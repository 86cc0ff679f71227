/* fuzz_safetensors.c: the safetensors reader.
 *
 * The input is a file. st_open reads and checks its header; st_read_at
 * then reads every tensor whole and a slice of it (the slice drawn from the
 * data, always inside the tensor: st_read_at asserts its arguments, as a
 * contract with the caller, not a check of the file), and st_find finds
 * every name. st_read reads it whole; what it reads, st_write writes and
 * st_read reads back to the same names, dtypes, shapes, bytes and
 * metadata (the property). Malformed files are errors, never crashes. */
#include "fuzz.h"
#include "tensor.h"

static void check_same(const TensorFile *a, const TensorFile *b) {
  FUZZ_CHECK(a->n == b->n, "%d tensors written, %d read back", a->n, b->n);
  for (int i = 0; i < a->n; i++) {
    const Tensor *x = &a->tensors[i], *y = &b->tensors[i];
    FUZZ_CHECK(strcmp(x->name, y->name) == 0, "tensor %d: '%s' read back as '%s'", i, x->name, y->name);
    FUZZ_CHECK(x->dtype == y->dtype && x->ndim == y->ndim && x->numel == y->numel, "tensor '%s' changed", x->name);
    for (int d = 0; d < x->ndim; d++)
      FUZZ_CHECK(x->shape[d] == y->shape[d], "tensor '%s': dim %d changed", x->name, d);
    FUZZ_CHECK(memcmp(x->data, y->data, (size_t)tensor_nbytes(x)) == 0, "tensor '%s': data changed", x->name);
  }
  FUZZ_CHECK(a->nmeta == b->nmeta, "%d metadata keys written, %d read back", a->nmeta, b->nmeta);
  for (int i = 0; i < a->nmeta; i++) {
    const char *v = tf_get_meta(b, a->meta_keys[i]);
    FUZZ_CHECK(v && strcmp(v, a->meta_vals[i]) == 0, "metadata '%s' changed", a->meta_keys[i]);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_file("in.safetensors", data, size);
  fuzz_quiet_begin();
  StFile sf;
  if (st_open(path, &sf) == 0) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < size && i < 64; i++)
      h = (h ^ data[i]) * 1099511628211ull;
    for (int i = 0; i < sf.n; i++) {
      const StEntry *e = &sf.entries[i];
      FUZZ_CHECK(st_find(&sf, e->name) >= 0, "st_find does not find '%s'", e->name);
      if (e->nbytes > (64 << 20))
        continue;
      char *buf = malloc((size_t)e->nbytes + 1);
      FUZZ_CHECK(st_read_at(&sf, i, 0, e->nbytes, buf) == 0, "st_read_at of '%s' whole failed", e->name);
      if (e->nbytes > 0) {
        int64_t off = (int64_t)(h % (uint64_t)e->nbytes);
        int64_t n = (int64_t)((h >> 32) % (uint64_t)(e->nbytes - off + 1));
        char *part = malloc((size_t)n + 1);
        FUZZ_CHECK(st_read_at(&sf, i, off, n, part) == 0, "st_read_at of '%s' [%lld, +%lld) failed", e->name,
                   (long long)off, (long long)n);
        FUZZ_CHECK(n == 0 || memcmp(part, buf + off, (size_t)n) == 0, "st_read_at of '%s': a slice differs",
                   e->name);
        free(part);
      }
      free(buf);
    }
    st_close(&sf);
  }
  TensorFile tf;
  if (st_read(path, &tf) == 0) {
    const char *out = fuzz_file("out.safetensors", "", 0);
    if (st_write(out, &tf) == 0) {
      TensorFile back;
      FUZZ_CHECK(st_read(out, &back) == 0, "st_read of what st_write wrote failed: %s",
                 fuzz_diag.data ? fuzz_diag.data : "");
      check_same(&tf, &back);
      tf_free(&back);
    }
    tf_free(&tf);
  }
  fuzz_quiet_end();
  return 0;
}
