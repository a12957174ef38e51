/* Drives the simulated libnvidia-ml.so.1 through good and bad input, for valgrind.
 * usage: nvml_exercise LIBRARY GOOD_FILE BAD_FILE...; exits non-zero on a wrong answer. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*fn0)(void);
typedef int (*fn_u)(unsigned *);
typedef int (*fn_handle)(unsigned, void **);
typedef int (*fn_text)(void *, char *, unsigned);
typedef int (*fn_ptr)(void *, void *);
typedef int (*fn_link)(void *, unsigned, void *);
typedef int (*fn_set)(void **);
typedef int (*fn_reg)(void *, unsigned long long, void *);
typedef int (*fn_wait)(void *, void *, unsigned);
typedef int (*fn_free)(void *);

#define SYM(type, name) type name = (type)dlsym(lib, #name); if (!name) return fail(#name)
#define EXPECT(call, want) do { int got_ = (call); if (got_ != (want)) { \
    fprintf(stderr, "%s = %d, want %d\n", #call, got_, (want)); return 1; } } while (0)

static int fail(const char *what) { fprintf(stderr, "missing %s\n", what); return 1; }

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) return fail(dlerror());
    SYM(fn0, nvmlInit_v2); SYM(fn0, nvmlShutdown); SYM(fn_u, nvmlDeviceGetCount_v2);
    SYM(fn_handle, nvmlDeviceGetHandleByIndex_v2); SYM(fn_text, nvmlDeviceGetUUID);
    SYM(fn_ptr, nvmlDeviceGetPciInfo_v3); SYM(fn_link, nvmlDeviceGetNvLinkRemotePciInfo_v2);
    SYM(fn_ptr, nvmlDeviceGetGpuFabricInfoV); SYM(fn_set, nvmlEventSetCreate);
    SYM(fn_reg, nvmlDeviceRegisterEvents); SYM(fn_wait, nvmlEventSetWait_v2);
    SYM(fn_free, nvmlEventSetFree);
    char buf[96], pci[64], fabric[64], event[40];
    unsigned count = 0;
    void *gpu = NULL, *set = NULL;

    EXPECT(nvmlDeviceGetCount_v2(&count), 1);       /* before init */
    for (int bad = 3; bad < argc; bad++) {          /* malformed files */
        setenv("GPU_DRA_SIM_NVML", argv[bad], 1);
        EXPECT(nvmlInit_v2(), 999);
    }
    char missing[4096];                              /* a file that is not there */
    snprintf(missing, sizeof missing, "%s.missing", argv[2]);
    setenv("GPU_DRA_SIM_NVML", missing, 1);
    EXPECT(nvmlInit_v2(), 999);
    setenv("GPU_DRA_SIM_NVML", argv[2], 1);
    for (int round = 0; round < 3; round++) {       /* re-inits keep handles valid */
        EXPECT(nvmlInit_v2(), 0);
        EXPECT(nvmlDeviceGetCount_v2(&count), 0);
        EXPECT(nvmlDeviceGetCount_v2(NULL), 2);
        for (unsigned i = 0; i < count; i++) {
            EXPECT(nvmlDeviceGetHandleByIndex_v2(i, &gpu), 0);
            EXPECT(nvmlDeviceGetUUID(gpu, buf, sizeof buf), 0);
            EXPECT(nvmlDeviceGetUUID(gpu, buf, 3), 7);
            EXPECT(nvmlDeviceGetUUID(gpu, NULL, 0), 2);
            EXPECT(nvmlDeviceGetPciInfo_v3(gpu, pci), 0);
            nvmlDeviceGetNvLinkRemotePciInfo_v2(gpu, 0, pci);
            nvmlDeviceGetNvLinkRemotePciInfo_v2(gpu, 99, pci);
            memset(fabric, 0, sizeof fabric);
            EXPECT(nvmlDeviceGetGpuFabricInfoV(gpu, fabric), 25);  /* no struct version */
        }
        EXPECT(nvmlDeviceGetHandleByIndex_v2(count, &gpu), 2);
        EXPECT(nvmlDeviceGetUUID((char *)gpu + 1, buf, sizeof buf), 2);  /* not a handle */
        EXPECT(nvmlDeviceGetUUID(buf, buf, sizeof buf), 2);
    }
    EXPECT(nvmlEventSetCreate(&set), 0);
    EXPECT(nvmlDeviceRegisterEvents(gpu, 8, set), 0);
    EXPECT(nvmlEventSetWait_v2(set, event, 20), 0);  /* the XID in the file */
    EXPECT(nvmlEventSetWait_v2(set, event, 20), 10); /* then a timeout */
    EXPECT(nvmlEventSetWait_v2(buf, event, 0), 2);
    EXPECT(nvmlEventSetFree(set), 0);
    EXPECT(nvmlEventSetFree(set), 2);
    for (int round = 0; round < 3; round++) EXPECT(nvmlShutdown(), 0);
    EXPECT(nvmlShutdown(), 1);
    dlclose(lib);
    return 0;
}
