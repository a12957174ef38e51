/* Drives the simulated library's MIG calls, for valgrind: profiles, placements, creating and
 * destroying instances, MIG device handles, across re-inits, with good and bad arguments.
 * usage: nvml_mig_exercise LIBRARY HARDWARE_FILE (GPU 0 in MIG mode without instances). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*fn0)(void);
typedef int (*fn_handle)(unsigned, void **);
typedef int (*fn_profile)(void *, unsigned, void *);
typedef int (*fn_placements)(void *, unsigned, void *, unsigned *);
typedef int (*fn_create_gi)(void *, unsigned, const void *, void **);
typedef int (*fn_create_ci)(void *, unsigned, void **);
typedef int (*fn_one)(void *);
typedef int (*fn_ptr)(void *, void *);
typedef int (*fn_index)(void *, unsigned, void **);
typedef int (*fn_text)(void *, char *, unsigned);
typedef int (*fn_capacity)(void *, unsigned, unsigned *);

#define SYM(type, name) type name = (type)dlsym(lib, #name); if (!name) return fail(#name)
#define EXPECT(call, want) do { int got_ = (call); if (got_ != (want)) { \
    fprintf(stderr, "%s = %d, want %d\n", #call, got_, (want)); return 1; } } while (0)

static int fail(const char *what) { fprintf(stderr, "missing %s\n", what); return 1; }

struct placement { unsigned start, size; };

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) return fail(dlerror());
    SYM(fn0, nvmlInit_v2); SYM(fn0, nvmlShutdown);
    SYM(fn_handle, nvmlDeviceGetHandleByIndex_v2);
    SYM(fn_profile, nvmlDeviceGetGpuInstanceProfileInfoV);
    SYM(fn_placements, nvmlDeviceGetGpuInstancePossiblePlacements_v2);
    SYM(fn_create_gi, nvmlDeviceCreateGpuInstanceWithPlacement);
    SYM(fn_create_ci, nvmlGpuInstanceCreateComputeInstance);
    SYM(fn_one, nvmlGpuInstanceDestroy); SYM(fn_one, nvmlComputeInstanceDestroy);
    SYM(fn_ptr, nvmlGpuInstanceGetInfo); SYM(fn_ptr, nvmlComputeInstanceGetInfo_v2);
    SYM(fn_index, nvmlDeviceGetMigDeviceHandleByIndex); SYM(fn_text, nvmlDeviceGetUUID);
    SYM(fn_ptr, nvmlDeviceGetMemoryInfo);
    SYM(fn_capacity, nvmlDeviceGetGpuInstanceRemainingCapacity);
    unsigned char info[256];
    struct placement places[8], at = {4, 4}, bad = {2, 4};
    unsigned count = 0, left = 0;
    void *gpu = NULL, *gi = NULL, *ci = NULL, *mig = NULL;
    char uuid[96];
    unsigned long long memory[3];

    setenv("GPU_DRA_SIM_NVML", argv[2], 1);
    EXPECT(nvmlInit_v2(), 0);
    EXPECT(nvmlDeviceGetHandleByIndex_v2(0, &gpu), 0);
    memset(info, 0, sizeof info);
    EXPECT(nvmlDeviceGetGpuInstanceProfileInfoV(gpu, 2, info), 25);  /* no struct version */
    *(unsigned *)info = 0x02000098;
    EXPECT(nvmlDeviceGetGpuInstanceProfileInfoV(gpu, 2, info), 0);
    EXPECT(nvmlDeviceGetGpuInstanceProfileInfoV(gpu, 0x12, info), 2);
    EXPECT(nvmlDeviceGetGpuInstancePossiblePlacements_v2(gpu, 9, NULL, &count), 0);
    count = 1;
    EXPECT(nvmlDeviceGetGpuInstancePossiblePlacements_v2(gpu, 9, places, &count), 7);
    count = 8;
    EXPECT(nvmlDeviceGetGpuInstancePossiblePlacements_v2(gpu, 9, places, &count), 0);
    EXPECT(nvmlDeviceGetGpuInstancePossiblePlacements_v2(gpu, 9, places, NULL), 2);
    EXPECT(nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 19, &left), 0);
    EXPECT(left, 7);
    EXPECT(nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 19, NULL), 2);
    EXPECT(nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 99, &left), 2);  /* no such ID */
    EXPECT(nvmlDeviceGetGpuInstanceRemainingCapacity(NULL, 19, &left), 2);
    EXPECT(nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, &bad, &gi), 2);
    EXPECT(nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, NULL, &gi), 2);
    for (int round = 0; round < 3; round++) {
        EXPECT(nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, &at, &gi), 0);
        EXPECT(nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, &at, &gi), 23);  /* taken */
        EXPECT(nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 0, &left), 0);
        EXPECT(left, 0);  /* the 7g's memory slices are taken */
        EXPECT(nvmlGpuInstanceGetInfo(gi, info), 0);
        EXPECT(nvmlGpuInstanceCreateComputeInstance(gi, 2, &ci), 0);
        EXPECT(nvmlGpuInstanceCreateComputeInstance(gi, 2, &ci), 23);
        EXPECT(nvmlComputeInstanceGetInfo_v2(ci, info), 0);
        EXPECT(nvmlShutdown(), 0);  /* a re-init keeps what was created */
        EXPECT(nvmlInit_v2(), 0);
        EXPECT(nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0, &mig), 0);
        EXPECT(nvmlDeviceGetUUID(mig, uuid, sizeof uuid), 0);
        EXPECT(nvmlDeviceGetUUID(mig, uuid, 4), 7);
        EXPECT(nvmlDeviceGetMemoryInfo(mig, memory), 0);
        EXPECT(nvmlGpuInstanceDestroy(gi), 19);  /* the CI goes first */
        EXPECT(nvmlComputeInstanceDestroy(ci), 0);
        EXPECT(nvmlComputeInstanceDestroy(ci), 2);
        EXPECT(nvmlDeviceGetUUID(mig, uuid, sizeof uuid), 2);  /* its MIG device is gone */
        EXPECT(nvmlGpuInstanceDestroy(gi), 0);
        EXPECT(nvmlGpuInstanceDestroy(gi), 2);
        EXPECT(nvmlGpuInstanceGetInfo(gi, info), 2);
    }
    EXPECT(nvmlGpuInstanceGetInfo(uuid, info), 2);  /* not a handle */
    EXPECT(nvmlComputeInstanceDestroy(NULL), 2);
    EXPECT(nvmlShutdown(), 0);
    dlclose(lib);
    return 0;
}
