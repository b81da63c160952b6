/* plateau's heap-dump trigger for a native server in a profiled replay.
 *
 * Preloaded after Debian's libjemalloc (built with profiling), it starts one thread that waits
 * for plateau to ask for a dump: plateau writes "PID PATH" into $PLATEAU_DUMP_REQUEST, and the
 * thread of the process PID (the server; the shell that started it and any program it runs
 * load this library too) calls jemalloc's `prof.dump` with PATH, outside any signal handler, so
 * the allocator's locks are taken as in any other thread, then removes the request file. plateau
 * asks at the replay's quiescent points, where nothing is in flight, so every dump is the live
 * heap of an idle server, exactly like the in-process replay's.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);

static void *watch(void *arg) {
    const char *request = arg;
    mallctl_fn mallctl = (mallctl_fn)dlsym(RTLD_DEFAULT, "mallctl");
    char line[4200];
    for (;;) {
        FILE *f = fopen(request, "r");
        if (f != NULL) {
            size_t n = fread(line, 1, sizeof line - 1, f);
            fclose(f);
            line[n] = '\0';
            while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == ' ')) line[--n] = '\0';
            char *path = strchr(line, ' ');
            if (path == NULL || atol(line) != (long)getpid()) {
                usleep(5000);
                continue;
            }
            path++;
            if (mallctl != NULL) {
                const char *p = path;
                int err = mallctl("prof.dump", NULL, NULL, (void *)&p, sizeof p);
                if (err != 0) {
                    char failed[4200];
                    snprintf(failed, sizeof failed, "%s.failed", path);
                    FILE *e = fopen(failed, "w");
                    if (e != NULL) {
                        fprintf(e, "prof.dump: error %d\n", err);
                        fclose(e);
                    }
                }
            }
            unlink(request);
        }
        usleep(5000);
    }
    return NULL;
}

__attribute__((constructor)) static void plateau_dumper_start(void) {
    const char *request = getenv("PLATEAU_DUMP_REQUEST");
    if (request == NULL || request[0] == '\0') return;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_create(&t, &attr, watch, strdup(request));
    pthread_attr_destroy(&attr);
}
