/* The pod sandbox's "pause" process, built from source for the node tier's pause image (tools/image).
 *
 * It holds the pod's namespaces open and, as PID 1 of a pod that shares its process namespace, reaps
 * orphaned children. It exits 0 on SIGINT or SIGTERM; anything else waits in pause(). Same behaviour
 * as Kubernetes' build/pause/linux/pause.c, written anew: static, no libc beyond signals and waitpid. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION "hubshift-pause-1"

static void stop(int signo) {
  (void)signo;
  _exit(0);
}

static void reap(int signo) {
  (void)signo;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "-v") == 0) {
    printf("%s\n", VERSION);
    return 0;
  }
  if (getpid() != 1) {
    fprintf(stderr, "pause: warning: not PID 1, orphans will not be reaped here\n");
  }
  struct sigaction action;
  memset(&action, 0, sizeof action);
  sigemptyset(&action.sa_mask);
  action.sa_handler = stop;
  if (sigaction(SIGINT, &action, NULL) < 0 || sigaction(SIGTERM, &action, NULL) < 0) {
    perror("sigaction");
    return 1;
  }
  action.sa_handler = reap;
  action.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  if (sigaction(SIGCHLD, &action, NULL) < 0) {
    perror("sigaction");
    return 1;
  }
  for (;;) {
    pause();
  }
}
