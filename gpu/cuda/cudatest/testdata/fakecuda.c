/*
 * A stand-in for libcuda.so.1 on machines without a GPU, for tests only:
 * the driver functions kvstrata calls, with "device memory" in host memory.
 * It checks what the real driver would refuse (unknown pointers, double
 * registration, use without cuInit) so that the Go side's handling of the
 * driver is exercised; it says nothing of the real driver's speed.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;

enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, NO_DEVICE = 100,
       INVALID_DEVICE = 101, ALREADY_REGISTERED = 712, NOT_REGISTERED = 713,
       LAUNCH_FAILED = 719 };

static int inited;
static size_t used;
static size_t total(void) {
    const char *s = getenv("FAKECUDA_MEMORY");
    return s ? (size_t)strtoull(s, 0, 10) : (size_t)1 << 30;
}

#define MAXA 4096
static struct { void *p; size_t n; } allocs[MAXA];
#define MAXR 64
static struct { char *p; size_t n; } regs[MAXR];

CUresult cuInit(unsigned flags) { (void)flags; if (getenv("FAKECUDA_NO_DEVICE")) return NO_DEVICE; inited = 1; return OK; }
CUresult cuDriverGetVersion(int *v) { *v = 12040; return OK; }
CUresult cuGetErrorName(CUresult e, const char **s) {
    switch (e) {
    case OK: *s = "CUDA_SUCCESS"; return OK;
    case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
    case OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
    case NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; return OK;
    case NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; return OK;
    case INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; return OK;
    case ALREADY_REGISTERED: *s = "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"; return OK;
    case NOT_REGISTERED: *s = "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"; return OK;
    case LAUNCH_FAILED: *s = "CUDA_ERROR_LAUNCH_FAILED"; return OK;
    }
    return INVALID_VALUE;
}
CUresult cuDeviceGetCount(int *n) { if (!inited) return NOT_INITIALIZED; *n = 1; return OK; }
CUresult cuDeviceGet(CUdevice *d, int ord) { if (!inited) return NOT_INITIALIZED; if (ord != 0) return INVALID_DEVICE; *d = 0; return OK; }
CUresult cuDeviceGetName(char *name, int len, CUdevice d) { (void)d; strncpy(name, "kvstrata fake GPU", len); name[len - 1] = 0; return OK; }
CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { (void)d; *b = total(); return OK; }
static int ctx_token;
CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice d) { (void)d; if (!inited) return NOT_INITIALIZED; *ctx = &ctx_token; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return OK; }
CUresult cuCtxSetCurrent(void *ctx) { return ctx == &ctx_token ? OK : INVALID_VALUE; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *t = total(); *f = total() - used; return OK; }

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    if (!inited) return NOT_INITIALIZED;
    if (n == 0) return INVALID_VALUE;
    if (used + n > total()) return OUT_OF_MEMORY;
    for (int i = 0; i < MAXA; i++) if (!allocs[i].p) {
        allocs[i].p = calloc(1, n); if (!allocs[i].p) return OUT_OF_MEMORY;
        allocs[i].n = n; used += n; *p = (CUdeviceptr)(uintptr_t)allocs[i].p; return OK;
    }
    return OUT_OF_MEMORY;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    for (int i = 0; i < MAXA; i++) if (allocs[i].p && (CUdeviceptr)(uintptr_t)allocs[i].p == p) {
        free(allocs[i].p); used -= allocs[i].n; allocs[i].p = 0; return OK;
    }
    return INVALID_VALUE;
}
/* inside reports whether [p, p+n) lies within one allocation. */
static int inside(CUdeviceptr p, size_t n) {
    for (int i = 0; i < MAXA; i++) if (allocs[i].p) {
        CUdeviceptr a = (CUdeviceptr)(uintptr_t)allocs[i].p;
        if (p >= a && p + n <= a + allocs[i].n) return 1;
    }
    return 0;
}
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
    (void)flags;
    if (!p || n == 0) return INVALID_VALUE;
    for (int i = 0; i < MAXR; i++) if (regs[i].p && (char *)p < regs[i].p + regs[i].n && regs[i].p < (char *)p + n) return ALREADY_REGISTERED;
    for (int i = 0; i < MAXR; i++) if (!regs[i].p) { regs[i].p = p; regs[i].n = n; return OK; }
    return OUT_OF_MEMORY;
}
CUresult cuMemHostUnregister(void *p) {
    for (int i = 0; i < MAXR; i++) if (regs[i].p == p) { regs[i].p = 0; return OK; }
    return NOT_REGISTERED;
}
/*
 * Streams queue their copies and carry them out at cuStreamSynchronize (or
 * cuStreamDestroy), as a GPU's copy engine does them some time after the
 * call: a caller that reads or commits bytes before synchronizing sees the
 * old ones. A copy whose arguments are wrong fails at once, as the real
 * driver's does; a copy made to fail (fakecuda_fail_copies) carries out
 * half its bytes and fails the synchronization, as an error on the device
 * would.
 */
struct op { char *dst; const char *src; size_t n; int fail; };
struct stream { struct op *ops; int len, cap; };
static int streams, fail_next;
CUresult cuStreamCreate(void **s, unsigned flags) {
    (void)flags;
    struct stream *st = calloc(1, sizeof *st);
    if (!st) return OUT_OF_MEMORY;
    streams++; *s = st; return OK;
}
static CUresult run(struct stream *st) {
    CUresult r = OK;
    for (int i = 0; i < st->len; i++) {
        struct op *o = &st->ops[i];
        memmove(o->dst, o->src, o->fail ? o->n / 2 : o->n);
        if (o->fail) r = LAUNCH_FAILED;
    }
    st->len = 0;
    return r;
}
static CUresult queue(void *s, void *d, const void *src, size_t n) {
    struct stream *st = s;
    if (!st) return INVALID_VALUE;
    if (st->len == st->cap) {
        int c = st->cap ? 2 * st->cap : 8;
        struct op *ops = realloc(st->ops, c * sizeof *ops);
        if (!ops) return OUT_OF_MEMORY;
        st->ops = ops; st->cap = c;
    }
    st->ops[st->len++] = (struct op){ d, src, n, fail_next > 0 };
    if (fail_next > 0) fail_next--;
    return OK;
}
CUresult cuStreamDestroy_v2(void *s) { struct stream *st = s; run(st); free(st->ops); free(st); streams--; return OK; }
CUresult cuStreamSynchronize(void *s) { return run(s); }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) {
    if (!inside(d, n)) return INVALID_VALUE;
    return queue(st, (void *)(uintptr_t)d, s, n);
}
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) {
    if (!inside(s, n)) return INVALID_VALUE;
    return queue(st, d, (const void *)(uintptr_t)s, n);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) {
    if (!inside(d, n) || !inside(s, n)) return INVALID_VALUE;
    return queue(st, (void *)(uintptr_t)d, (const void *)(uintptr_t)s, n);
}
/* Test hook: the next n copies queued fail when their stream is synchronized. */
void fakecuda_fail_copies(int n) { fail_next = n; }
/* Test hook: bytes of "device memory" allocated now. */
size_t fakecuda_used(void) { return used; }
