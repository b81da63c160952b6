/* plateau's heap-dump trigger for a native server in a profiled replay.
 *
 * Preloaded after Debian's libjemalloc (built with profiling), it starts one thread that waits
 * for plateau to ask for a dump: plateau writes the dump's path into $PLATEAU_DUMP_REQUEST, the
 * thread calls jemalloc's `prof.dump` with that path (outside any signal handler, so the
 * allocator's locks are taken as in any other thread), then removes the request file. plateau
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
    char path[4096];
    for (;;) {
        FILE *f = fopen(request, "r");
        if (f != NULL) {
            size_t n = fread(path, 1, sizeof path - 1, f);
            fclose(f);
            path[n] = '\0';
            while (n > 0 && (path[n - 1] == '\n' || path[n - 1] == ' ')) path[--n] = '\0';
            if (n > 0 && mallctl != NULL) {
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
    /* Only the server itself: a process it starts inherits the environment but not the request. */
    unsetenv("PLATEAU_DUMP_REQUEST");
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_create(&t, &attr, watch, strdup(request));
    pthread_attr_destroy(&attr);
}
