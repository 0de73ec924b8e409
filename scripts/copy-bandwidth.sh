#!/usr/bin/env bash
# copy-bandwidth.sh [THREADS] [MIB]: the machine's memory copy bandwidth, the yardstick for decode
# (issue 19: bytes a token reads ÷ its time, against this). THREADS threads (default: all cores)
# each memcpy their share of a MIB-MiB buffer (default 1024) into another, 8 times after one
# warm-up; prints the best GB/s counted as bytes copied (read) per second. Needs a C compiler.
set -euo pipefail
threads=${1:-$(nproc)}
mib=${2:-1024}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/copy.c" <<'C'
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static size_t share; static char *src, *dst;
static void *run(void *a) { size_t i = (size_t)a; memcpy(dst + i * share, src + i * share, share); return 0; }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
  int n = atoi(argv[1]); size_t bytes = (size_t)atol(argv[2]) << 20; share = bytes / n;
  src = malloc(bytes); dst = malloc(bytes); memset(src, 1, bytes); memset(dst, 2, bytes);
  double best = 0; pthread_t t[256];
  for (int rep = 0; rep < 9; rep++) {
    double t0 = now();
    for (int i = 0; i < n; i++) pthread_create(&t[i], 0, run, (void *)(size_t)i);
    for (int i = 0; i < n; i++) pthread_join(t[i], 0);
    double gbs = share * n / (now() - t0) / 1e9;
    if (rep > 0 && gbs > best) best = gbs;
  }
  printf("copy bandwidth, %d threads, %zu MiB: %.1f GB/s (bytes copied a second; twice that moved)\n", n, bytes >> 20, best);
  return 0;
}
C
cc -O2 -pthread -o "$dir/copy" "$dir/copy.c"
"$dir/copy" "$threads" "$mib"
