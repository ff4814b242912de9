/* A probe, not part of the build (docs/benchmarks.md, session 29): plain
 * loopback TCP from one page-aligned 256 MiB source, sender pinned to CPU 0
 * and receiver to CPU 1, no UCX and no kvbridge. Each message is an
 * optional header of H bytes and a 1 MiB payload at source offset A, sent
 * with one sendmsg; 2 GiB in all; with a third argument "huge" the source
 * is under MADV_HUGEPAGE. Prints GB/s.
 *
 *   cc -O2 -o /tmp/socket_copy bench/probes/socket_copy.c
 *   for i in $(seq 14); do perf record -q -a -F 999 -o /tmp/s$i.data -- /tmp/socket_copy 0 0; done
 *
 * Run it many times: the same command lands in a slow group now and then,
 * with the sender's kernel copy (_copy_from_iter) costing about twice the
 * samples for the same bytes. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  sched_setaffinity(0, sizeof s, &s);
}

/* Sends the whole message, advancing the iovecs over partial sends. */
static int send_all(int s, struct iovec* iov, int n) {
  while (n > 0) {
    struct msghdr m = {0};
    m.msg_iov = iov;
    m.msg_iovlen = n;
    ssize_t sent = sendmsg(s, &m, 0);
    if (sent <= 0) return -1;
    while (n > 0 && (size_t)sent >= iov->iov_len) {
      sent -= iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0) {
      iov->iov_base = (char*)iov->iov_base + sent;
      iov->iov_len -= sent;
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  const size_t header = argc > 1 ? (size_t)atoi(argv[1]) : 0, offset = argc > 2 ? (size_t)atoi(argv[2]) : 0;
  const size_t region = 256u << 20, message = 1u << 20, total = (size_t)2 << 30;
  if (header > 4096 || offset > 4096) return 2;
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(ls, (void*)&a, sizeof a) || listen(ls, 1) || getsockname(ls, (void*)&a, &len)) return 1;
  pid_t receiver = fork();
  if (receiver == 0) {
    pin(1);
    int c = accept(ls, 0, 0);
    char* b = malloc(message);
    if (c < 0 || b == NULL) _exit(1);
    while (read(c, b, message) > 0) {
    }
    _exit(0);
  }
  if (receiver < 0) return 1;
  pin(0);
  int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  if (connect(s, (void*)&a, sizeof a)) {
    kill(receiver, SIGKILL);
    return 1;
  }
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  /* A third argument "huge": the source under MADV_HUGEPAGE (2 MiB pages). */
  char* src = aligned_alloc(2u << 20, region + (2u << 20));
  if (src == NULL) return 1;
  if (argc > 3 && strcmp(argv[3], "huge") == 0) madvise(src, region + (2u << 20), MADV_HUGEPAGE);
  static char head[4096];
  memset(src, 7, region + 4096);
  memset(head, 1, sizeof head);
  double t = now();
  for (size_t sent = 0; sent < total; sent += message) {
    struct iovec iov[2] = {{head, header}, {src + sent % region + offset, message}};
    if (send_all(s, header ? iov : iov + 1, header ? 2 : 1)) return 1;
  }
  t = now() - t;
  close(s);
  wait(0);
  printf("header %zu, source offset %zu: %.2f GB/s\n", header, offset, total / t / 1e9);
  return 0;
}
