/* cache.c: compiled objects and cubins on disk.
 *
 * An entry is one file, KIND-HASH, where HASH is 128 bits of the key text:
 *
 *   "OPTCACHE" | u32 version | u32 key length | u64 payload length |
 *   u64 payload checksum | key text | payload
 *
 * Reading checks all of it, the key text included, so a truncated or
 * corrupted entry, or two keys with one hash, read as a miss and get
 * rebuilt. Entries are written to a temporary name and renamed. */
#include "codegen.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { CACHE_VERSION = 1 };

bool cache_enabled(void) {
  const char *v = getenv("OPTC_CACHE");
  return !(v && (!strcmp(v, "0") || !strcmp(v, "off") || !strcmp(v, "false")));
}

/* splitmix64's finaliser: spreads an FNV hash over all 64 bits. */
static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint64_t checksum(const void *p, size_t n) { return mix64(fnv1a(p, n, FNV1A_BASIS)); }

static char *cache_dir(void) {
  const char *xdg = getenv("XDG_CACHE_HOME");
  const char *home = getenv("HOME");
  char *dir = malloc(4096);
  ASSERT(dir);
  if (xdg && *xdg)
    snprintf(dir, 4096, "%s/optc", xdg);
  else if (home && *home)
    snprintf(dir, 4096, "%s/.cache/optc", home);
  else
    snprintf(dir, 4096, "/tmp/optc-cache");
  return dir;
}

void cache_mkdir(void) {
  char *dir = cache_dir();
  mkdir_p(dir);
  free(dir);
}

char *cache_path(const char *kind, const char *key) {
  char *dir = cache_dir();
  size_t n = strlen(key);
  uint64_t a = mix64(fnv1a(key, n, FNV1A_BASIS));
  uint64_t b = mix64(fnv1a(key, n, 0x84222325cbf29ce4ull) ^ n);
  char *path = malloc(strlen(dir) + 64 + strlen(kind));
  ASSERT(path);
  sprintf(path, "%s/%s-%016llx%016llx", dir, kind, (unsigned long long)a, (unsigned long long)b);
  free(dir);
  return path;
}

typedef struct {
  char magic[8];
  uint32_t version, key_len;
  uint64_t payload_len, payload_sum;
} Header;

int cache_get(const char *kind, const char *key, void **data, size_t *len) {
  if (!cache_enabled())
    return 0;
  char *path = cache_path(kind, key);
  FILE *f = fopen(path, "rb");
  free(path);
  if (!f)
    return 0;
  Header h;
  size_t klen = strlen(key);
  int hit = 0;
  char *k = NULL;
  void *p = NULL;
  if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, "OPTCACHE", 8) || h.version != CACHE_VERSION ||
      h.key_len != klen || h.payload_len > ((size_t)1 << 32))
    goto out;
  k = malloc(klen + 1);
  p = malloc(h.payload_len + 1);
  ASSERT(k && p);
  if (fread(k, 1, klen, f) != klen || memcmp(k, key, klen) != 0)
    goto out;
  if (fread(p, 1, h.payload_len, f) != h.payload_len || fgetc(f) != EOF)
    goto out;
  if (checksum(p, h.payload_len) != h.payload_sum)
    goto out;
  *data = p;
  *len = h.payload_len;
  p = NULL;
  hit = 1;
out:
  free(k);
  free(p);
  fclose(f);
  return hit;
}

typedef struct {
  const char *key;
  const void *data;
  size_t len;
} Entry;

static int write_entry(FILE *f, void *ctx) {
  Entry *e = ctx;
  Header h = {.version = CACHE_VERSION, .key_len = (uint32_t)strlen(e->key), .payload_len = e->len,
              .payload_sum = checksum(e->data, e->len)};
  memcpy(h.magic, "OPTCACHE", 8);
  if (fwrite(&h, sizeof h, 1, f) != 1 || fwrite(e->key, 1, h.key_len, f) != h.key_len ||
      fwrite(e->data, 1, e->len, f) != e->len)
    return -1;
  return 0;
}

void cache_put(const char *kind, const char *key, const void *data, size_t len) {
  if (!cache_enabled())
    return;
  char *dir = cache_dir();
  mkdir_p(dir);
  /* A cache that cannot be written costs a compile next time, no more. */
  bool writable = access(dir, W_OK) == 0;
  free(dir);
  if (!writable)
    return;
  char *path = cache_path(kind, key);
  Entry e = {key, data, len};
  file_write_atomic_with(path, write_entry, &e);
  free(path);
}
