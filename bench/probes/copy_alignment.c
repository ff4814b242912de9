/* A probe, not part of the build (docs/benchmarks.md, session 29): `rep
 * movsb`, the instruction the kernel's copy to and from user memory uses on
 * this CPU, copying 32 KiB pieces (a socket page fragment's size) from a
 * page-aligned source to a destination at offset O past a page boundary.
 * Prints GB/s per offset, best of 5.
 *
 *   cc -O2 -o /tmp/copy_alignment bench/probes/copy_alignment.c && taskset -c 0 /tmp/copy_alignment */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void rep_movsb(void* d, const void* s, size_t n) {
  __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}

int main(void) {
  const size_t total = 64u << 20, piece = 32u << 10, window = 8u << 20;
  char* src = aligned_alloc(4096, total + 4096);
  char* dst = aligned_alloc(4096, window + 8192);
  if (src == NULL || dst == NULL) return 1;
  memset(src, 1, total + 4096);
  memset(dst, 0, window + 8192);
  const int offsets[] = {0, 1, 8, 16, 20, 32, 48, 63, 64, 4000};
  for (size_t k = 0; k < sizeof offsets / sizeof offsets[0]; k++) {
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
      double t = now();
      for (size_t i = 0; i + piece <= total; i += piece) rep_movsb(dst + i % window + offsets[k], src + i, piece);
      t = now() - t;
      if (t < best) best = t;
    }
    printf("destination offset %4d: %.2f GB/s\n", offsets[k], total / best / 1e9);
  }
  return 0;
}
