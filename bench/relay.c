/* The hot-path row's floor: `relay CMD ARGS...` runs CMD with its stdin and stdout on pipes
 * and copies bytes between them and this process's own stdio, one thread per direction, one
 * write(2) per read(2), with no parsing and no buffering beyond one read. Scheduled as acpd is
 * (SCHED_BATCH when started under the default policy, its child given the default back), so
 * the two differ only in what they do per byte. The bench compiles it with `cc -O2` into
 * target/ at run time (bench/hotpath.rs). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

struct hop { int from, to; };

static void *copy(void *arg) {
    struct hop *h = arg;
    static __thread char buf[64 * 1024];
    for (;;) {
        ssize_t n = read(h->from, buf, sizeof buf);
        if (n <= 0) break;
        for (ssize_t off = 0; off < n;) {
            ssize_t w = write(h->to, buf + off, (size_t)(n - off));
            if (w <= 0) return NULL;
            off += w;
        }
    }
    close(h->to);
    return NULL;
}

int main(int argc, char **argv) {
    int in[2], out[2];
    if (argc < 2 || pipe(in) || pipe(out)) return 2;
    struct sched_param zero = {0};
    int batch = sched_getscheduler(0) == SCHED_OTHER && sched_setscheduler(0, SCHED_BATCH, &zero) == 0;
    pid_t pid = fork();
    if (pid < 0) return 2;
    if (pid == 0) {
        if (batch) sched_setscheduler(0, SCHED_OTHER, &zero);
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]); close(in[1]); close(out[0]); close(out[1]);
        execvp(argv[1], argv + 1);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    signal(SIGPIPE, SIG_IGN);
    struct hop down = {0, in[1]}, up = {out[0], 1};
    pthread_t t;
    if (pthread_create(&t, NULL, copy, &down)) return 2;
    copy(&up);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    return 0;
}
