/*
 * libnvidia-ml.so.1 of simulated hardware.
 *
 * The real pynvml (and go-nvml, for nvidia-ctk) drive this library exactly as they drive
 * NVIDIA's: same C symbols, same structs, same return codes. What the hardware is comes from
 * a plain-text file rendered by driver.nvml.sim from a hardware profile and its faults; its
 * path is in $GPU_DRA_SIM_NVML. The file is re-read at every nvmlInit, because the bindings
 * never unload the library: a re-init is how the simulated bus changes.
 *
 * Installed (the plugin's pod, whose environment the chart sets and a test must not): with
 * $GPU_DRA_SIM_NVML unset, the file is <root>/run/gpu-dra-sim/nvml-hardware of the nearest
 * directory above this library that has one, and that directory is the root, as this
 * process sees it (a container sees the host's root at its mount point, not its host path).
 *
 * File format, one "key value..." per line ('#' starts a comment):
 *   init ok | <nvmlReturn_t>           what nvmlInit answers (12: no library, 9: no driver)
 *   driver 580.95.05                   cuda 13000
 *   fabric <NVML_GPU_FABRIC_STATE_*> <status>   clique 7   cluster <32 hex digits>
 *   fabric none                        the fabric info call answers NOT_SUPPORTED (the
 *                                  default); "fabric 0 0" is a GPU that answers it, with the
 *                                  state NOT_SUPPORTED, as a real H200 without a fabric does
 *   events <mask>                      nvmlDeviceGetSupportedEventTypes of every GPU (default
 *                                  0x8, XID); only XIDs are ever delivered
 *   gpu <minor>                        starts a GPU; the lines below describe it:
 *     uuid GPU-...   name ...   brand 14   arch 9   cc 9 0   memory <bytes>
 *     pci 0000:53:00.0   pcidevid <n>   present 0|1
 *     mig <capable 0|1> <current mode 0|1> [<pending mode 0|1>]   (pending: current when absent)
 *     link <NVML_NVLINK_DEVICE_TYPE_*> [<remote pci bus id>]
 *     gi <GI id> <GI profile index> <placement start> <CI id> <MIG device UUID>
 *                                  a GPU instance with one compute instance spanning it
 *   migprofile <profile index> <profile id> <name> <compute slices> <memory slices>
 *              <instances> <SMs> <copy engines> <decoders> <encoders> <jpeg> <ofa>
 *              <memory MiB> <placement starts, comma separated>
 *                                  a GPU instance profile of every MIG-capable GPU; before
 *                                  the first "gpu" line
 *   root <path>                        the fake driver root, where instances created at run
 *                                  time get their capability access files
 *
 * GPU and compute instances created through NVML are the node's, as the driver's are: kept
 * in a file of the root that every process of the node reads at each call and changes under
 * an flock (see "instances created at run time" below); they survive a re-init while their
 * GPU stays in MIG mode and get their access files under the root; destroying them removes
 * those.
 *   fail <minor> <pynvml function name> <nvmlReturn_t>
 *   xid <minor> <xid> [<gi> <ci>]      an XID event, delivered to each event set once; on a
 *                                  MIG-mode GPU the GPU and compute instance IDs it names
 *                                  (0xffffffff, the default: the whole GPU)
 *
 * Every query takes one mutex. Handles point into a static table that is never freed, so a
 * handle kept across a re-init stays safe: its GPU is then gone (GPU_IS_LOST) or refreshed.
 * Bad input (a malformed file, a null or foreign pointer, a short buffer) gets an error code.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
    OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6,
    INSUFFICIENT_SIZE = 7, TIMEOUT = 10, GPU_IS_LOST = 15, MEMORY = 20,
    IN_USE = 19, INSUFFICIENT_RESOURCES = 23, ARGUMENT_VERSION_MISMATCH = 25, UNKNOWN = 999,
};
#define GI_PROFILE_COUNT 0x12 /* NVML_GPU_INSTANCE_PROFILE_COUNT */
#define CI_PROFILE_COUNT 0x9  /* NVML_COMPUTE_INSTANCE_PROFILE_COUNT */
#define MAX_STARTS 8
#define MAX_MIG 1024          /* MIG devices of the whole node */
#define DYNAMIC_BASE (MAX_MIG / 2) /* slots of instances created at run time */
#define GI_SLOTS 15           /* per GPU, as the driver's capability minors count them */
#define CI_SLOTS 8

#define MAX_GPUS 512
#define MAX_LINKS 36
#define MAX_FAILS 256
#define MAX_XIDS 256
#define MAX_SETS 64
#define TEXT 96

#define EXPORT __attribute__((visibility("default")))

struct link {
    unsigned type;
    int has_remote;
    unsigned domain, bus, device, function;
};

typedef struct nvmlDevice_st {
    int defined, present;
    unsigned minor;
    char uuid[TEXT], name[TEXT];
    int brand;
    unsigned arch;
    int cc_major, cc_minor;
    unsigned long long memory;
    unsigned domain, bus, device, function, pci_device_id;
    int mig_capable, mig_enabled, mig_pending;
    int is_mig;      /* a MIG device handle: minor is its parent's, slot its GI's */
    unsigned slot;
    unsigned nlinks;
    struct link links[MAX_LINKS];
} *nvmlDevice_t;

struct mig_profile {
    int defined;
    unsigned id, slices, memslices, instances, sms, ce, dec, enc, jpeg, ofa;
    unsigned long long mem_mib;
    char name[32];
    unsigned nstarts, starts[MAX_STARTS];
};

/* A GPU instance, and its one compute instance, share a slot with their MIG device. */
typedef struct nvmlGpuInstance_st {
    int defined;
    unsigned parent, id, profile, start; /* parent minor; profile index */
    int created; /* at run time, through NVML */
} *nvmlGpuInstance_t;

typedef struct nvmlComputeInstance_st {
    int defined;
    unsigned id;
} *nvmlComputeInstance_t;

struct fail { unsigned minor; char call[64]; nvmlReturn_t code; };
struct xid { unsigned minor; unsigned long long xid; unsigned gi, ci; };

struct hardware {
    nvmlReturn_t init;
    char driver[80];
    int cuda;
    int fabric_info; /* the fabric info calls answer; else NOT_SUPPORTED */
    unsigned fabric_state, clique;
    nvmlReturn_t fabric_status;
    unsigned long long events; /* supported event types */
    unsigned char cluster[16];
    struct nvmlDevice_st gpus[MAX_GPUS];
    unsigned order[MAX_GPUS], count; /* visible GPUs by index, as minors */
    struct fail fails[MAX_FAILS];
    unsigned nfails;
    struct xid xids[MAX_XIDS];
    unsigned nxids;
    struct mig_profile profiles[GI_PROFILE_COUNT]; /* by profile index */
    struct nvmlGpuInstance_st gis[MAX_MIG];
    struct nvmlComputeInstance_st cis[MAX_MIG];
    struct nvmlDevice_st migs[MAX_MIG];
    unsigned nmig;
    char root[400];
};

typedef struct nvmlEventSet_st {
    int used;
    unsigned long long types[MAX_GPUS];
    unsigned next_xid;
} *nvmlEventSet_t;

typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;

typedef struct {
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned cliqueId, state;
} nvmlGpuFabricInfo_t;

typedef struct { unsigned start, size; } nvmlGpuInstancePlacement_t;
typedef struct { unsigned start, size; } nvmlComputeInstancePlacement_t;

#define GI_PROFILE_FIELDS                                                                    \
    unsigned id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,             \
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;                    \
    unsigned long long memorySizeMB;
typedef struct { GI_PROFILE_FIELDS } nvmlGpuInstanceProfileInfo_t;
typedef struct { unsigned version; GI_PROFILE_FIELDS char name[96]; } nvmlGpuInstanceProfileInfo_v2_t;

#define CI_PROFILE_FIELDS                                                                    \
    unsigned id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,      \
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
typedef struct { CI_PROFILE_FIELDS } nvmlComputeInstanceProfileInfo_t;
typedef struct { unsigned version; CI_PROFILE_FIELDS char name[96]; } nvmlComputeInstanceProfileInfo_v2_t;

typedef struct {
    nvmlDevice_t device;
    unsigned id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned id, profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

typedef struct {
    unsigned version;
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned cliqueId, state, healthMask;
    unsigned char healthSummary; /* v3 only */
} nvmlGpuFabricInfoV_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

#define FABRIC_INFO_V2 (0x02000000u | 36u)
#define FABRIC_INFO_V3 (0x03000000u | 40u)
#define MEMORY_V2 (0x02000000u | (unsigned)sizeof(nvmlMemory_v2_t))
#define GI_PROFILE_V2 (0x02000000u | (unsigned)sizeof(nvmlGpuInstanceProfileInfo_v2_t))
#define CI_PROFILE_V2 (0x02000000u | (unsigned)sizeof(nvmlComputeInstanceProfileInfo_v2_t))
#define EVENT_XID 0x8ull

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static struct hardware hw; /* guarded by mu; handles point into hw.gpus */
static unsigned refcount;
static struct nvmlEventSet_st sets[MAX_SETS];

/* ---- the hardware file -------------------------------------------------------------- */

static void copy_text(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src);
}

static int parse_uint(const char *s, unsigned long long max, unsigned long long *out) {
    char *end;
    if (!s || !*s || *s == '-') return -1;
    unsigned long long v = strtoull(s, &end, 0);
    while (*end == ' ') end++;
    if (*end || v > max) return -1;
    *out = v;
    return 0;
}

static int parse_code(const char *s, nvmlReturn_t *out) {
    unsigned long long v;
    if (parse_uint(s, 999, &v)) return -1;
    *out = (nvmlReturn_t)v;
    return 0;
}

static int parse_bus_id(const char *s, unsigned *d, unsigned *b, unsigned *dev, unsigned *f) {
    char tail;
    if (sscanf(s, "%x:%x:%x.%x%c", d, b, dev, f, &tail) != 4) return -1;
    return (*b > 0xff || *dev > 0x1f || *f > 7) ? -1 : 0;
}

static int parse_hex16(const char *s, unsigned char out[16]) {
    if (strlen(s) != 32) return -1;
    for (int i = 0; i < 16; i++) {
        unsigned v;
        char pair[3] = {s[2 * i], s[2 * i + 1], 0};
        if (sscanf(pair, "%2x", &v) != 1) return -1;
        out[i] = (unsigned char)v;
    }
    return 0;
}

/* "migprofile ..." (see the file format above) into h->profiles. */
static int parse_mig_profile(struct hardware *h, const char *value) {
    unsigned index;
    char name[32], starts[64];
    struct mig_profile p;
    memset(&p, 0, sizeof p);
    if (sscanf(value, "%u %u %31s %u %u %u %u %u %u %u %u %u %llu %63s", &index, &p.id, name,
               &p.slices, &p.memslices, &p.instances, &p.sms, &p.ce, &p.dec, &p.enc, &p.jpeg,
               &p.ofa, &p.mem_mib, starts) != 14)
        return -1;
    if (index >= GI_PROFILE_COUNT || h->profiles[index].defined || !p.memslices) return -1;
    char *save = NULL;
    for (char *tok = strtok_r(starts, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        unsigned long long n;
        if (p.nstarts == MAX_STARTS || parse_uint(tok, MAX_STARTS - 1, &n)) return -1;
        p.starts[p.nstarts++] = (unsigned)n;
    }
    copy_text(p.name, sizeof p.name, name);
    p.defined = 1;
    h->profiles[index] = p;
    return 0;
}

/* "gi <id> <profile index> <start> <ci id> <uuid>": one more MIG device of GPU g. */
static int parse_gpu_instance(struct hardware *h, struct nvmlDevice_st *g, const char *value) {
    unsigned id, profile, start, ci;
    char uuid[TEXT];
    if (h->nmig == DYNAMIC_BASE) return -1;
    if (sscanf(value, "%u %u %u %u %95s", &id, &profile, &start, &ci, uuid) != 5) return -1;
    if (profile >= GI_PROFILE_COUNT || !h->profiles[profile].defined || !g->mig_capable) return -1;
    unsigned slot = h->nmig++;
    h->gis[slot] = (struct nvmlGpuInstance_st){1, g->minor, id, profile, start, 0};
    h->cis[slot] = (struct nvmlComputeInstance_st){1, ci};
    struct nvmlDevice_st *m = &h->migs[slot];
    m->defined = m->present = m->is_mig = 1;
    m->minor = g->minor;
    m->slot = slot;
    m->memory = h->profiles[profile].mem_mib << 20;
    copy_text(m->uuid, sizeof m->uuid, uuid);
    copy_text(m->name, sizeof m->name, g->name);
    return 0;
}

/* One line into h; 0 on success. gpu is the GPU being described, or NULL. */
static int parse_line(struct hardware *h, char *line, struct nvmlDevice_st **gpu) {
    char *key = line, *value = strchr(line, ' ');
    unsigned long long n, m;
    if (value) *value++ = 0; else value = key + strlen(key);
    if (!strcmp(key, "init")) {
        if (!strcmp(value, "ok")) { h->init = OK; return 0; }
        return parse_code(value, &h->init);
    }
    if (!strcmp(key, "driver")) { copy_text(h->driver, sizeof h->driver, value); return 0; }
    if (!strcmp(key, "cuda")) {
        if (parse_uint(value, 1000000, &n)) return -1;
        h->cuda = (int)n;
        return 0;
    }
    if (!strcmp(key, "fabric")) {
        char status[16];
        h->fabric_info = 0;
        if (!strcmp(value, "none")) return 0;
        if (sscanf(value, "%u %15s", &h->fabric_state, status) != 2) return -1;
        h->fabric_info = 1;
        return (h->fabric_state > 3) ? -1 : parse_code(status, &h->fabric_status);
    }
    if (!strcmp(key, "events")) {
        if (parse_uint(value, 0xffffffffffffffffull, &n) || !(n & EVENT_XID)) return -1;
        h->events = n;
        return 0;
    }
    if (!strcmp(key, "clique")) {
        if (parse_uint(value, 0xffffffffu, &n)) return -1;
        h->clique = (unsigned)n;
        return 0;
    }
    if (!strcmp(key, "cluster")) return parse_hex16(value, h->cluster);
    if (!strcmp(key, "gpu")) {
        if (parse_uint(value, MAX_GPUS - 1, &n) || h->gpus[n].defined) return -1;
        *gpu = &h->gpus[n];
        (*gpu)->defined = (*gpu)->present = 1;
        (*gpu)->minor = (unsigned)n;
        return 0;
    }
    if (!strcmp(key, "fail")) {
        char call[64], code[16];
        if (h->nfails == MAX_FAILS) return -1;
        struct fail *f = &h->fails[h->nfails];
        if (sscanf(value, "%llu %63s %15s", &n, call, code) != 3 || n >= MAX_GPUS) return -1;
        if (parse_code(code, &f->code)) return -1;
        f->minor = (unsigned)n;
        copy_text(f->call, sizeof f->call, call);
        h->nfails++;
        return 0;
    }
    if (!strcmp(key, "xid")) {
        if (h->nxids == MAX_XIDS) return -1;
        unsigned gi = 0xffffffffu, ci = 0xffffffffu;
        int got = sscanf(value, "%llu %llu %u %u", &n, &m, &gi, &ci);
        if ((got != 2 && got != 4) || n >= MAX_GPUS) return -1;
        h->xids[h->nxids].minor = (unsigned)n;
        h->xids[h->nxids].xid = m;
        h->xids[h->nxids].gi = gi;
        h->xids[h->nxids].ci = ci;
        h->nxids++;
        return 0;
    }
    if (!strcmp(key, "migprofile")) return *gpu ? -1 : parse_mig_profile(h, value);
    if (!strcmp(key, "root")) {
        if (strlen(value) >= sizeof h->root) return -1;
        copy_text(h->root, sizeof h->root, value);
        return 0;
    }
    struct nvmlDevice_st *g = *gpu;
    if (!g) return -1; /* a GPU line before any "gpu" */
    if (!strcmp(key, "gi")) return parse_gpu_instance(h, g, value);
    if (!strcmp(key, "uuid")) { copy_text(g->uuid, sizeof g->uuid, value); return 0; }
    if (!strcmp(key, "name")) { copy_text(g->name, sizeof g->name, value); return 0; }
    if (!strcmp(key, "brand")) {
        if (parse_uint(value, 1000, &n)) return -1;
        g->brand = (int)n;
        return 0;
    }
    if (!strcmp(key, "arch")) {
        if (parse_uint(value, 0xffffffffu, &n)) return -1;
        g->arch = (unsigned)n;
        return 0;
    }
    if (!strcmp(key, "cc")) return sscanf(value, "%d %d", &g->cc_major, &g->cc_minor) == 2 ? 0 : -1;
    if (!strcmp(key, "memory")) return parse_uint(value, ~0ull, &g->memory);
    if (!strcmp(key, "pci")) return parse_bus_id(value, &g->domain, &g->bus, &g->device, &g->function);
    if (!strcmp(key, "pcidevid")) {
        if (parse_uint(value, 0xffffffffu, &n)) return -1;
        g->pci_device_id = (unsigned)n;
        return 0;
    }
    if (!strcmp(key, "mig")) {
        int fields = sscanf(value, "%d %d %d", &g->mig_capable, &g->mig_enabled, &g->mig_pending);
        if (fields == 2) g->mig_pending = g->mig_enabled;
        return fields >= 2 ? 0 : -1;
    }
    if (!strcmp(key, "present")) {
        if (parse_uint(value, 1, &n)) return -1;
        g->present = (int)n;
        return 0;
    }
    if (!strcmp(key, "link")) {
        char remote[32] = "";
        unsigned type;
        if (g->nlinks == MAX_LINKS) return -1;
        struct link *l = &g->links[g->nlinks];
        int fields = sscanf(value, "%u %31s", &type, remote);
        if (fields < 1 || type > 0xff) return -1;
        l->type = type;
        l->has_remote = fields == 2;
        if (l->has_remote && parse_bus_id(remote, &l->domain, &l->bus, &l->device, &l->function))
            return -1;
        g->nlinks++;
        return 0;
    }
    return -1;
}

#define INSTALLED_FILE "/run/gpu-dra-sim/nvml-hardware"

/* Installed: the root above this library's file that holds the hardware file, or "". */
static void installed_root(char *root, size_t size) {
    Dl_info info;
    char probe[sizeof ((struct hardware *)0)->root + sizeof INSTALLED_FILE];
    root[0] = '\0';
    if (!dladdr((void *)installed_root, &info) || !info.dli_fname || info.dli_fname[0] != '/')
        return;
    copy_text(root, size, info.dli_fname);
    char *slash;
    while ((slash = strrchr(root, '/')) != NULL) {
        *slash = '\0'; /* up one directory; "" is "/" */
        snprintf(probe, sizeof probe, "%s%s", root, INSTALLED_FILE);
        if (access(probe, R_OK) == 0) return;
    }
    root[0] = '\0';
}

/* The hardware file into *h; 0 on success, else the line number that failed (or -1). */
static int read_hardware(struct hardware *h) {
    const char *path = getenv("GPU_DRA_SIM_NVML");
    char line[512];
    char installed[sizeof h->root + sizeof INSTALLED_FILE];
    char root[sizeof h->root] = "";
    int number = 0;
    struct nvmlDevice_st *gpu = NULL;
    memset(h, 0, sizeof *h);
    copy_text(h->driver, sizeof h->driver, "580.95.05");
    h->cuda = 13000;
    h->events = EVENT_XID;
    if (!path || !*path) {
        installed_root(root, sizeof root);
        snprintf(installed, sizeof installed, "%s%s", root, INSTALLED_FILE);
        path = installed;
    }
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        number++;
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n') { fclose(f); return number; }
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
            line[--len] = 0;
        char *start = line;
        while (*start == ' ') start++;
        if (!*start || *start == '#') continue;
        if (parse_line(h, start, &gpu)) { fclose(f); return number; }
    }
    fclose(f);
    if (path == installed) copy_text(h->root, sizeof h->root, root); /* not the host's path */
    for (unsigned i = 0; i < MAX_GPUS; i++)
        if (h->gpus[i].defined && h->gpus[i].present) h->order[h->count++] = i;
    return 0;
}

/* ---- shared checks ------------------------------------------------------------------ */

/* The GPU behind a handle, checked: valid pointer, still on the bus, no injected fault. */
static nvmlReturn_t device(nvmlDevice_t handle, const char *call) {
    if (!refcount) return UNINITIALIZED;
    uintptr_t p = (uintptr_t)handle, base = (uintptr_t)hw.gpus;
    if (!handle || p < base || p >= base + sizeof hw.gpus || (p - base) % sizeof hw.gpus[0])
        return INVALID_ARGUMENT;
    if (!handle->defined || !handle->present) return GPU_IS_LOST;
    for (unsigned i = 0; i < hw.nfails; i++)
        if (hw.fails[i].minor == handle->minor && !strcmp(hw.fails[i].call, call))
            return hw.fails[i].code;
    return OK;
}

static int in_table(const void *handle, const void *base, size_t size, size_t each) {
    uintptr_t p = (uintptr_t)handle, b = (uintptr_t)base;
    return handle && p >= b && p < b + size && (p - b) % each == 0;
}

/* A whole GPU or a MIG device handle; a MIG device answers for its parent's faults. */
static nvmlReturn_t any_device(nvmlDevice_t handle, const char *call) {
    if (!refcount) return UNINITIALIZED;
    if (in_table(handle, hw.migs, sizeof hw.migs, sizeof hw.migs[0])) {
        if (!handle->defined) return INVALID_ARGUMENT;
        return device(&hw.gpus[handle->minor], call);
    }
    return device(handle, call);
}

static void sync_created(void);
static int lock_created(void);
static void unlock_created(int fd);

/* The call trace: with $GPU_DRA_SIM_NVML_TRACE set, each exported call appends "<name>
 * <nvmlReturn_t>" to that file, so that a foreign client's calls (NVIDIA's plugin, through
 * go-nvml) can be listed with what this library answered; unset, nothing is written. Called
 * under mu: one line per call, never interleaved. */
static void trace(const char *call, nvmlReturn_t r) {
    static int opened;
    static FILE *out;
    if (!opened) {
        const char *path = getenv("GPU_DRA_SIM_NVML_TRACE");
        opened = 1;
        out = (path && *path) ? fopen(path, "a") : NULL;
        if (out) setvbuf(out, NULL, _IOLBF, 0);
    }
    if (out) fprintf(out, "%s %d\n", call, r);
}

/* Every call sees the node's run-time instances as they are now (another process of the
 * node may have made or destroyed one since this one's last call), as the driver answers. */
#define LOCKED(expr) do { pthread_mutex_lock(&mu); sync_created(); nvmlReturn_t r_ = (expr); \
    trace(__func__, r_); pthread_mutex_unlock(&mu); return r_; } while (0)
/* A create or destroy: read, checked and written back under the node's lock, so that two
 * processes never both take one memory slice or one GPU instance ID. */
#define LOCKED_CHANGE(expr) do { pthread_mutex_lock(&mu); int fd_ = lock_created(); \
    sync_created(); nvmlReturn_t r_ = (expr); unlock_created(fd_); trace(__func__, r_); \
    pthread_mutex_unlock(&mu); return r_; } while (0)

static nvmlReturn_t put_text(char *dst, unsigned size, const char *src) {
    if (!dst) return INVALID_ARGUMENT;
    if (strlen(src) + 1 > size) return INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return OK;
}

static void fill_pci(nvmlPciInfo_t *info, unsigned d, unsigned b, unsigned dev, unsigned f,
                     unsigned id) {
    memset(info, 0, sizeof *info);
    snprintf(info->busId, sizeof info->busId, "%08X:%02X:%02X.%X", d, b, dev, f);
    snprintf(info->busIdLegacy, sizeof info->busIdLegacy, "%04X:%02X:%02X.%X", d & 0xffff, b,
             dev, f);
    info->domain = d;
    info->bus = b;
    info->device = dev;
    info->pciDeviceId = id;
}

/* ---- library ------------------------------------------------------------------------ */

/* ---- instances created at run time, kept in the root as the driver keeps them -------- */

/* The driver keeps instances for every process of the node; so does this library, in a file
 * of the root ("<root>/run/gpu-dra-sim/created": "<minor> <GI id> <profile index> <start>
 * <CI id or -1> <MIG UUID>" a line). The file is the truth: each call first makes this
 * process's table what it says (sync_created), and a create or destroy holds an flock on
 * "created.lock" from that read to its rename of the new file (LOCKED_CHANGE), so that
 * what it checks is what it changes. A process killed meanwhile loses its lock with it;
 * what it renamed in is whole. Without a root (no "root" line) instances stay in the
 * process, as before. */
static void make_dirs(char *path);

static void created_path(const struct hardware *h, char *out, size_t size, const char *suffix) {
    snprintf(out, size, "%s/run/gpu-dra-sim/created%s", h->root, suffix);
}

static int lock_created(void) {
    char dir[480], path[500];
    if (!hw.root[0]) return -1;
    snprintf(dir, sizeof dir, "%s/run/gpu-dra-sim", hw.root);
    make_dirs(dir);
    created_path(&hw, path, sizeof path, ".lock");
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    while (flock(fd, LOCK_EX) && errno == EINTR) {}
    return fd;
}

static void unlock_created(int fd) {
    if (fd >= 0) close(fd); /* the lock goes with its last descriptor */
}

static void fill_mig(struct hardware *h, unsigned slot, const char *uuid) {
    const struct nvmlGpuInstance_st *gi = &h->gis[slot];
    const struct nvmlDevice_st *parent = &h->gpus[gi->parent];
    struct nvmlDevice_st *m = &h->migs[slot];
    memset(m, 0, sizeof *m);
    m->defined = m->present = m->is_mig = 1;
    m->minor = gi->parent;
    m->slot = slot;
    m->memory = h->profiles[gi->profile].mem_mib << 20;
    copy_text(m->uuid, sizeof m->uuid, uuid);
    memcpy(m->name, parent->name, sizeof m->name);
}

static void save_created(void) {
    char path[500], tmp[520];
    if (!hw.root[0]) return;
    created_path(&hw, path, sizeof path, "");
    char dir[480];
    snprintf(dir, sizeof dir, "%s/run/gpu-dra-sim", hw.root);
    make_dirs(dir);
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    for (unsigned s = DYNAMIC_BASE; s < MAX_MIG; s++) {
        const struct nvmlGpuInstance_st *gi = &hw.gis[s];
        if (!gi->defined || !gi->created) continue;
        fprintf(f, "%u %u %u %u %d %s\n", gi->parent, gi->id, gi->profile, gi->start,
                hw.cis[s].defined ? (int)hw.cis[s].id : -1,
                hw.migs[s].defined ? hw.migs[s].uuid : "-");
    }
    fclose(f);
    rename(tmp, path);
}

/* Make h's run-time instances exactly those of the file `f` (NULL: none made yet). An
 * instance this process already has keeps its slot, so a handle to it stays valid; one
 * destroyed elsewhere goes, and a handle to it is then stale (INVALID_ARGUMENT), as the
 * driver's would be; one made elsewhere gets a free slot. */
static void load_created_from(struct hardware *h, FILE *f) {
    char line[256], uuid[96];
    unsigned char seen[MAX_MIG] = {0};
    unsigned minor, id, profile, start;
    int ci;
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "%u %u %u %u %d %95s", &minor, &id, &profile, &start, &ci, uuid) != 6)
            continue;
        if (minor >= MAX_GPUS || profile >= GI_PROFILE_COUNT) continue;
        const struct nvmlDevice_st *g = &h->gpus[minor];
        if (!g->defined || !g->present || !g->mig_enabled || !h->profiles[profile].defined)
            continue;
        unsigned slot = MAX_MIG, free_slot = MAX_MIG;
        for (unsigned s = DYNAMIC_BASE; s < MAX_MIG; s++) {
            const struct nvmlGpuInstance_st *o = &h->gis[s];
            if (o->defined && o->created && o->parent == minor && o->id == id &&
                o->profile == profile && o->start == start) {
                slot = s;
                break;
            }
            if (!o->defined && !seen[s] && free_slot == MAX_MIG) free_slot = s;
        }
        if (slot == MAX_MIG) {
            if (free_slot == MAX_MIG) continue;
            slot = free_slot;
            h->gis[slot] = (struct nvmlGpuInstance_st){1, minor, id, profile, start, 1};
            h->cis[slot].defined = 0;
            h->migs[slot].defined = 0;
        }
        seen[slot] = 1;
        if (ci < 0) {
            h->cis[slot].defined = 0;
            h->migs[slot].defined = 0;
        } else if (!h->cis[slot].defined || h->cis[slot].id != (unsigned)ci ||
                   !h->migs[slot].defined || strcmp(h->migs[slot].uuid, uuid)) {
            h->cis[slot] = (struct nvmlComputeInstance_st){1, (unsigned)ci};
            fill_mig(h, slot, uuid);
        }
    }
    for (unsigned s = DYNAMIC_BASE; s < MAX_MIG; s++)
        if (h->gis[s].defined && h->gis[s].created && !seen[s])
            h->gis[s].defined = h->cis[s].defined = h->migs[s].defined = 0;
}

/* The file last loaded, held open: a writer always renames a new file in, never writes in
 * place, so while the name still leads to this inode (which cannot be reused while it is
 * open) nothing changed, and a call costs one stat instead of a read. */
static int loaded_fd = -1;
static char loaded_root[sizeof hw.root];

static void forget_loaded(void) {
    if (loaded_fd >= 0) close(loaded_fd);
    loaded_fd = -1;
}

/* h's run-time instances as the file says now; `force`: read it even if unchanged (a new
 * table). */
static void load_created(struct hardware *h, int force) {
    char path[500];
    struct stat now, held;
    if (!h->root[0]) return;
    created_path(h, path, sizeof path, "");
    if (stat(path, &now)) {
        forget_loaded();
        load_created_from(h, NULL);
        return;
    }
    if (!force && loaded_fd >= 0 && !strcmp(loaded_root, h->root) && !fstat(loaded_fd, &held) &&
        held.st_dev == now.st_dev && held.st_ino == now.st_ino)
        return;
    forget_loaded();
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        load_created_from(h, NULL);
        return;
    }
    int mine = dup(fd); /* fclose closes the stream's; this one stays held */
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        if (mine >= 0) close(mine);
        return;
    }
    load_created_from(h, f);
    fclose(f);
    if (mine >= 0) {
        loaded_fd = mine;
        copy_text(loaded_root, sizeof loaded_root, h->root);
    }
}

static void sync_created(void) {
    if (refcount) load_created(&hw, 0);
}

static nvmlReturn_t init_locked(void) {
    struct hardware *next = malloc(sizeof *next);
    if (!next) return MEMORY;
    int bad = read_hardware(next);
    if (bad) {
        const char *path = getenv("GPU_DRA_SIM_NVML");
        if (bad < 0)
            fprintf(stderr, "simulated libnvidia-ml: cannot read $GPU_DRA_SIM_NVML (%s)\n",
                    path && *path ? path : "unset, and no " INSTALLED_FILE " above the library");
        else
            fprintf(stderr, "simulated libnvidia-ml: %s: line %d is malformed\n", path, bad);
        free(next);
        return UNKNOWN;
    }
    if (next->init != OK) {
        nvmlReturn_t r = next->init;
        free(next);
        return r;
    }
    /* Instances made through NVML stay while their GPU is still in MIG mode, in their slots
     * (a handle kept across the re-init stays valid); the file then says which are left.
     * Another root is another node: nothing of this one's is kept. */
    int same_root = !strcmp(hw.root, next->root);
    for (unsigned s = DYNAMIC_BASE; s < MAX_MIG && same_root; s++) {
        const struct nvmlDevice_st *g = &next->gpus[hw.gis[s].parent];
        if (hw.gis[s].defined && hw.gis[s].created && g->defined && g->present &&
            g->mig_enabled && next->profiles[hw.gis[s].profile].defined) {
            next->gis[s] = hw.gis[s];
            next->cis[s] = hw.cis[s];
            next->migs[s] = hw.migs[s];
        }
    }
    load_created(next, 1);
    /* Copied over the table in place, so that handles stay where they point. */
    memcpy(&hw, next, sizeof hw);
    free(next);
    refcount++;
    pthread_cond_broadcast(&changed);
    return OK;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned flags) { (void)flags; LOCKED(init_locked()); }
EXPORT nvmlReturn_t nvmlInit_v2(void) { LOCKED(init_locked()); }
EXPORT nvmlReturn_t nvmlInit(void) { LOCKED(init_locked()); }

static nvmlReturn_t shutdown_locked(void) {
    if (!refcount) return UNINITIALIZED;
    refcount--;
    pthread_cond_broadcast(&changed);
    return OK;
}
EXPORT nvmlReturn_t nvmlShutdown(void) { LOCKED(shutdown_locked()); }

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt request issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 25: return "Argument version mismatch";
    case 27: return "Not Ready";
    default: return "Unknown Error";
    }
}

/* ---- system ------------------------------------------------------------------------- */

static nvmlReturn_t driver_version(char *out, unsigned size) {
    return refcount ? put_text(out, size, hw.driver) : UNINITIALIZED;
}
EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *out, unsigned size) {
    LOCKED(driver_version(out, size));
}

static nvmlReturn_t nvml_version(char *out, unsigned size) {
    char text[96];
    if (!refcount) return UNINITIALIZED;
    snprintf(text, sizeof text, "%d.%s", hw.cuda / 1000, hw.driver);
    return put_text(out, size, text);
}
EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *out, unsigned size) {
    LOCKED(nvml_version(out, size));
}

static nvmlReturn_t cuda_version(int *out) {
    if (!refcount) return UNINITIALIZED;
    if (!out) return INVALID_ARGUMENT;
    *out = hw.cuda;
    return OK;
}
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *out) { LOCKED(cuda_version(out)); }
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *out) { LOCKED(cuda_version(out)); }

static nvmlReturn_t count(unsigned *out) {
    if (!refcount) return UNINITIALIZED;
    if (!out) return INVALID_ARGUMENT;
    *out = hw.count;
    return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *out) { LOCKED(count(out)); }
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned *out) { LOCKED(count(out)); }

static nvmlReturn_t by_index(unsigned index, nvmlDevice_t *out) {
    if (!refcount) return UNINITIALIZED;
    if (!out || index >= hw.count) return INVALID_ARGUMENT;
    nvmlDevice_t gpu = &hw.gpus[hw.order[index]];
    nvmlReturn_t r = device(gpu, "nvmlDeviceGetHandleByIndex");
    if (r == OK) *out = gpu;
    return r;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *out) {
    LOCKED(by_index(i, out));
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned i, nvmlDevice_t *out) {
    LOCKED(by_index(i, out));
}

static nvmlReturn_t by_uuid(const char *uuid, nvmlDevice_t *out) {
    if (!refcount) return UNINITIALIZED;
    if (!uuid || !out) return INVALID_ARGUMENT;
    for (unsigned i = 0; i < hw.count; i++) {
        nvmlDevice_t gpu = &hw.gpus[hw.order[i]];
        if (!strcmp(gpu->uuid, uuid)) {
            *out = gpu;
            return OK;
        }
    }
    /* NVML finds MIG devices by their UUIDs too (R470 and later): nvidia-ctk looks each up. */
    for (unsigned s = 0; s < MAX_MIG; s++) {
        if (hw.migs[s].defined && !strcmp(hw.migs[s].uuid, uuid)) {
            *out = &hw.migs[s];
            return OK;
        }
    }
    return NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *out) {
    LOCKED(by_uuid(uuid, out));
}

static nvmlReturn_t by_bus_id(const char *bus_id, nvmlDevice_t *out) {
    unsigned d, b, dev, f;
    if (!refcount) return UNINITIALIZED;
    if (!bus_id || !out || parse_bus_id(bus_id, &d, &b, &dev, &f)) return INVALID_ARGUMENT;
    for (unsigned i = 0; i < hw.count; i++) {
        nvmlDevice_t g = &hw.gpus[hw.order[i]];
        if (g->domain == d && g->bus == b && g->device == dev && g->function == f) {
            *out = g;
            return OK;
        }
    }
    return NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *id, nvmlDevice_t *out) {
    LOCKED(by_bus_id(id, out));
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *id, nvmlDevice_t *out) {
    LOCKED(by_bus_id(id, out));
}

/* ---- device ------------------------------------------------------------------------- */

/* Define an exported query: check the handle and its output pointer, then run body. */
#define QUERY(symbol, call, out_type, body)                                              \
    static nvmlReturn_t symbol##_locked(nvmlDevice_t g, out_type out) {                  \
        nvmlReturn_t r = device(g, call);                                                \
        if (r != OK) return r;                                                           \
        if (!out) return INVALID_ARGUMENT;                                               \
        body                                                                             \
    }                                                                                    \
    EXPORT nvmlReturn_t symbol(nvmlDevice_t g, out_type out) { LOCKED(symbol##_locked(g, out)); }

QUERY(nvmlDeviceGetMinorNumber, "nvmlDeviceGetMinorNumber", unsigned *,
      { *out = g->minor; return OK; })
/* NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH: a whole GPU passed through to the VM, as EC2's
 * GPU instances hold theirs (NVIDIA's plugin asks it before dynamic MIG, to skip vGPU
 * guests; the real H200's nvidia-smi -q says Pass-Through: tests/test_nvml_real_h200.py). */
QUERY(nvmlDeviceGetVirtualizationMode, "nvmlDeviceGetVirtualizationMode", unsigned *,
      { *out = 1; return OK; })
QUERY(nvmlDeviceGetBrand, "nvmlDeviceGetBrand", int *, { *out = g->brand; return OK; })
QUERY(nvmlDeviceGetArchitecture, "nvmlDeviceGetArchitecture", unsigned *,
      { *out = g->arch; return OK; })
/* Like QUERY, for the queries that MIG device handles answer too. */
#define ANY_QUERY(symbol, call, out_type, body)                                          \
    static nvmlReturn_t symbol##_locked(nvmlDevice_t g, out_type out) {                  \
        nvmlReturn_t r = any_device(g, call);                                            \
        if (r != OK) return r;                                                           \
        if (!out) return INVALID_ARGUMENT;                                               \
        body                                                                             \
    }                                                                                    \
    EXPORT nvmlReturn_t symbol(nvmlDevice_t g, out_type out) { LOCKED(symbol##_locked(g, out)); }

ANY_QUERY(nvmlDeviceGetMemoryInfo, "nvmlDeviceGetMemoryInfo", nvmlMemory_t *, {
    out->total = out->free = g->memory;
    out->used = 0;
    return OK;
})
ANY_QUERY(nvmlDeviceGetMemoryInfo_v2, "nvmlDeviceGetMemoryInfo", nvmlMemory_v2_t *, {
    if (out->version != MEMORY_V2) return ARGUMENT_VERSION_MISMATCH;
    out->total = out->free = g->memory;
    out->reserved = out->used = 0;
    return OK;
})
QUERY(nvmlDeviceGetPciInfo_v3, "nvmlDeviceGetPciInfo", nvmlPciInfo_t *, {
    fill_pci(out, g->domain, g->bus, g->device, g->function, g->pci_device_id);
    return OK;
})
QUERY(nvmlDeviceGetPciInfo_v2, "nvmlDeviceGetPciInfo", nvmlPciInfo_t *, {
    fill_pci(out, g->domain, g->bus, g->device, g->function, g->pci_device_id);
    return OK;
})
QUERY(nvmlDeviceGetPciInfo, "nvmlDeviceGetPciInfo", nvmlPciInfo_t *, {
    fill_pci(out, g->domain, g->bus, g->device, g->function, g->pci_device_id);
    return OK;
})
QUERY(nvmlDeviceGetGpuFabricInfoV, "nvmlDeviceGetGpuFabricInfoV", nvmlGpuFabricInfoV_t *, {
    if (out->version != FABRIC_INFO_V2 && out->version != FABRIC_INFO_V3)
        return ARGUMENT_VERSION_MISMATCH;
    if (!hw.fabric_info) return NOT_SUPPORTED;
    memcpy(out->clusterUuid, hw.cluster, 16);
    out->status = hw.fabric_status;
    out->cliqueId = hw.clique;
    out->state = hw.fabric_state;
    out->healthMask = 0;
    if (out->version == FABRIC_INFO_V3) out->healthSummary = 0;
    return OK;
})
QUERY(nvmlDeviceGetGpuFabricInfo, "nvmlDeviceGetGpuFabricInfo", nvmlGpuFabricInfo_t *, {
    if (!hw.fabric_info) return NOT_SUPPORTED;
    memcpy(out->clusterUuid, hw.cluster, 16);
    out->status = hw.fabric_status;
    out->cliqueId = hw.clique;
    out->state = hw.fabric_state;
    return OK;
})
QUERY(nvmlDeviceGetSupportedEventTypes, "nvmlDeviceGetSupportedEventTypes",
      unsigned long long *, { *out = hw.events; return OK; })
ANY_QUERY(nvmlDeviceIsMigDeviceHandle, "nvmlDeviceIsMigDeviceHandle", unsigned *,
          { *out = (unsigned)g->is_mig; return OK; })
QUERY(nvmlDeviceGetMaxMigDeviceCount, "nvmlDeviceGetMaxMigDeviceCount", unsigned *, {
    if (!g->mig_capable) return NOT_SUPPORTED;
    /* The most instances any profile allows, in MIG mode; 0 with MIG off, as a real H200
     * answers (the driver reads the count only to walk the MIG devices there are). */
    *out = 0;
    if (!g->mig_enabled) return OK;
    for (unsigned p = 0; p < GI_PROFILE_COUNT; p++)
        if (hw.profiles[p].defined && hw.profiles[p].instances > *out)
            *out = hw.profiles[p].instances;
    return OK;
})

static nvmlReturn_t text_locked(nvmlDevice_t g, const char *call, char *out, unsigned size) {
    nvmlReturn_t r = any_device(g, call);
    if (r != OK) return r;
    return put_text(out, size, !strcmp(call, "nvmlDeviceGetUUID") ? g->uuid : g->name);
}
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t g, char *out, unsigned size) {
    LOCKED(text_locked(g, "nvmlDeviceGetUUID", out, size));
}
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t g, char *out, unsigned size) {
    LOCKED(text_locked(g, "nvmlDeviceGetName", out, size));
}

static nvmlReturn_t cc_locked(nvmlDevice_t g, int *major, int *minor) {
    nvmlReturn_t r = device(g, "nvmlDeviceGetCudaComputeCapability");
    if (r != OK) return r;
    if (!major || !minor) return INVALID_ARGUMENT;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t g, int *major, int *minor) {
    LOCKED(cc_locked(g, major, minor));
}

static nvmlReturn_t mig_mode_locked(nvmlDevice_t g, unsigned *current, unsigned *pending) {
    nvmlReturn_t r = device(g, "nvmlDeviceGetMigMode");
    if (r != OK) return r;
    if (!current || !pending) return INVALID_ARGUMENT;
    if (!g->mig_capable) return NOT_SUPPORTED;
    *current = g->mig_enabled ? 1 : 0;
    *pending = g->mig_pending ? 1 : 0;
    return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t g, unsigned *current, unsigned *pending) {
    LOCKED(mig_mode_locked(g, current, pending));
}

/* The link slot, checked as NVML checks it: no NVLink at all, a slot out of range, unwired. */
static nvmlReturn_t link_of(nvmlDevice_t g, unsigned link, const char *call, struct link **out) {
    nvmlReturn_t r = device(g, call);
    if (r != OK) return r;
    if (!g->nlinks) return NOT_SUPPORTED;
    if (link >= MAX_LINKS) return INVALID_ARGUMENT;
    if (link >= g->nlinks) return NOT_SUPPORTED;
    *out = &g->links[link];
    return OK;
}

static nvmlReturn_t link_state_locked(nvmlDevice_t g, unsigned link, int *active) {
    struct link *l;
    nvmlReturn_t r = link_of(g, link, "nvmlDeviceGetNvLinkState", &l);
    if (r != OK) return r;
    if (!active) return INVALID_ARGUMENT;
    *active = 1;
    return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t g, unsigned link, int *active) {
    LOCKED(link_state_locked(g, link, active));
}

static nvmlReturn_t link_type_locked(nvmlDevice_t g, unsigned link, int *type) {
    struct link *l;
    nvmlReturn_t r = link_of(g, link, "nvmlDeviceGetNvLinkRemoteDeviceType", &l);
    if (r != OK) return r;
    if (!type) return INVALID_ARGUMENT;
    *type = (int)l->type;
    return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t g, unsigned link, int *type) {
    LOCKED(link_type_locked(g, link, type));
}

static nvmlReturn_t link_pci_locked(nvmlDevice_t g, unsigned link, nvmlPciInfo_t *pci) {
    struct link *l;
    nvmlReturn_t r = link_of(g, link, "nvmlDeviceGetNvLinkRemotePciInfo", &l);
    if (r != OK) return r;
    if (!pci) return INVALID_ARGUMENT;
    if (!l->has_remote) return NOT_SUPPORTED;
    fill_pci(pci, l->domain, l->bus, l->device, l->function, g->pci_device_id);
    return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t g, unsigned link,
                                                        nvmlPciInfo_t *pci) {
    LOCKED(link_pci_locked(g, link, pci));
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t g, unsigned link,
                                                     nvmlPciInfo_t *pci) {
    LOCKED(link_pci_locked(g, link, pci));
}

/* ---- events ------------------------------------------------------------------------- */

static nvmlReturn_t set_create_locked(nvmlEventSet_t *out) {
    if (!refcount) return UNINITIALIZED;
    if (!out) return INVALID_ARGUMENT;
    for (unsigned i = 0; i < MAX_SETS; i++) {
        if (!sets[i].used) {
            memset(&sets[i], 0, sizeof sets[i]);
            sets[i].used = 1;
            *out = &sets[i];
            return OK;
        }
    }
    return MEMORY;
}
EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *out) { LOCKED(set_create_locked(out)); }

static int valid_set(nvmlEventSet_t set) {
    uintptr_t p = (uintptr_t)set, base = (uintptr_t)sets;
    return set && p >= base && p < base + sizeof sets && (p - base) % sizeof sets[0] == 0 &&
           set->used;
}

static nvmlReturn_t set_free_locked(nvmlEventSet_t set) {
    if (!valid_set(set)) return INVALID_ARGUMENT;
    set->used = 0;
    pthread_cond_broadcast(&changed);
    return OK;
}
EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) { LOCKED(set_free_locked(set)); }

static nvmlReturn_t register_locked(nvmlDevice_t g, unsigned long long types, nvmlEventSet_t set) {
    nvmlReturn_t r = device(g, "nvmlDeviceRegisterEvents");
    if (r != OK) return r;
    if (!valid_set(set)) return INVALID_ARGUMENT;
    if (types & ~hw.events) return NOT_SUPPORTED;
    set->types[g->minor] |= types;
    return OK;
}
EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t g, unsigned long long types,
                                             nvmlEventSet_t set) {
    LOCKED(register_locked(g, types, set));
}

/* The next XID for a GPU this set watches; OK with *data filled, or TIMEOUT. A watched GPU
 * gone from the bus (after a re-init) makes every wait answer GPU_IS_LOST, as the driver's
 * does: the caller learns which GPU by asking each handle. */
static nvmlReturn_t wait_locked(nvmlEventSet_t set, nvmlEventData_t *data, unsigned timeout_ms) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) { deadline.tv_sec++; deadline.tv_nsec -= 1000000000L; }
    for (;;) {
        if (!refcount) return UNINITIALIZED;
        if (!valid_set(set) || !data) return INVALID_ARGUMENT;
        for (unsigned m = 0; m < MAX_GPUS; m++)
            if (set->types[m] && !(hw.gpus[m].defined && hw.gpus[m].present)) return GPU_IS_LOST;
        while (set->next_xid < hw.nxids) {
            struct xid *x = &hw.xids[set->next_xid++];
            nvmlDevice_t g = &hw.gpus[x->minor];
            if (g->defined && g->present && (set->types[x->minor] & EVENT_XID)) {
                memset(data, 0, sizeof *data);
                data->device = g;
                data->eventType = EVENT_XID;
                data->eventData = x->xid;
                data->gpuInstanceId = x->gi;
                data->computeInstanceId = x->ci;
                return OK;
            }
        }
        /* A re-init may bring new XIDs; a re-read restarts the list from the top. */
        unsigned seen = hw.nxids;
        if (pthread_cond_timedwait(&changed, &mu, &deadline)) return TIMEOUT;
        if (hw.nxids < seen) set->next_xid = 0;
    }
}
EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                        unsigned timeout_ms) {
    LOCKED(wait_locked(set, data, timeout_ms));
}

/* ---- MIG: the instances the hardware file configures; the plugin never creates them ---- */

/* A MIG-capable GPU of the bus, checked as device() checks it. */
static nvmlReturn_t mig_gpu(nvmlDevice_t g, const char *call) {
    nvmlReturn_t r = device(g, call);
    if (r != OK) return r;
    return g->mig_capable ? OK : NOT_SUPPORTED;
}

/* A GPU instance handle, checked: ours, live, its GPU on the bus and without a fault. */
static nvmlReturn_t gpu_instance(nvmlGpuInstance_t gi, const char *call) {
    if (!refcount) return UNINITIALIZED;
    if (!in_table(gi, hw.gis, sizeof hw.gis, sizeof hw.gis[0]) || !gi->defined)
        return INVALID_ARGUMENT;
    return device(&hw.gpus[gi->parent], call);
}

static unsigned slot_of_gi(nvmlGpuInstance_t gi) { return (unsigned)(gi - hw.gis); }

static nvmlReturn_t compute_instance(nvmlComputeInstance_t ci, const char *call) {
    if (!refcount) return UNINITIALIZED;
    if (!in_table(ci, hw.cis, sizeof hw.cis, sizeof hw.cis[0]) || !ci->defined)
        return INVALID_ARGUMENT;
    return device(&hw.gpus[hw.gis[ci - hw.cis].parent], call);
}

/* The GI profile at `index`: INVALID_ARGUMENT past the table's end (how callers find it),
 * NOT_SUPPORTED for a profile this GPU does not have. */
static nvmlReturn_t profile_at(unsigned index, struct mig_profile **out) {
    if (index >= GI_PROFILE_COUNT) return INVALID_ARGUMENT;
    if (!hw.profiles[index].defined) return NOT_SUPPORTED;
    *out = &hw.profiles[index];
    return OK;
}

/* The GI profile whose unique id is `id`. */
static nvmlReturn_t profile_by_id(unsigned id, unsigned *index) {
    for (unsigned p = 0; p < GI_PROFILE_COUNT; p++)
        if (hw.profiles[p].defined && hw.profiles[p].id == id) {
            *index = p;
            return OK;
        }
    return INVALID_ARGUMENT;
}

static void fill_gi_profile(nvmlGpuInstanceProfileInfo_t *o, const struct mig_profile *p) {
    memset(o, 0, sizeof *o);
    o->id = p->id;
    o->isP2pSupported = 0;
    o->sliceCount = p->slices;
    o->instanceCount = p->instances;
    o->multiprocessorCount = p->sms;
    o->copyEngineCount = p->ce;
    o->decoderCount = p->dec;
    o->encoderCount = p->enc;
    o->jpegCount = p->jpeg;
    o->ofaCount = p->ofa;
    o->memorySizeMB = p->mem_mib;
}

static nvmlReturn_t gi_profile_locked(nvmlDevice_t g, unsigned index, void *out, int v2) {
    struct mig_profile *p;
    nvmlGpuInstanceProfileInfo_t info;
    nvmlReturn_t r = mig_gpu(g, v2 ? "nvmlDeviceGetGpuInstanceProfileInfoV"
                                   : "nvmlDeviceGetGpuInstanceProfileInfo");
    if (r != OK) return r;
    if (!out) return INVALID_ARGUMENT;
    if ((r = profile_at(index, &p)) != OK) return r;
    fill_gi_profile(&info, p);
    if (!v2) {
        memcpy(out, &info, sizeof info);
        return OK;
    }
    nvmlGpuInstanceProfileInfo_v2_t *o = out;
    if (o->version != GI_PROFILE_V2) return ARGUMENT_VERSION_MISMATCH;
    o->version = 0; /* the real library checks the version in and answers 0 (H200, R580) */
    memcpy(&o->id, &info.id, offsetof(nvmlGpuInstanceProfileInfo_t, memorySizeMB));
    o->memorySizeMB = info.memorySizeMB;
    memset(o->name, 0, sizeof o->name);
    snprintf(o->name, sizeof o->name, "MIG %s", p->name);
    return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t g, unsigned p, void *info) {
    LOCKED(gi_profile_locked(g, p, info, 0));
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t g, unsigned p, void *info) {
    LOCKED(gi_profile_locked(g, p, info, 1));
}

/* placements NULL: *count is set to how many there are; else *count is the array's size. */
static nvmlReturn_t placements_locked(nvmlDevice_t g, unsigned id,
                                      nvmlGpuInstancePlacement_t *out, unsigned *count) {
    unsigned index;
    nvmlReturn_t r = mig_gpu(g, "nvmlDeviceGetGpuInstancePossiblePlacements_v2");
    if (r != OK) return r;
    if (!count) return INVALID_ARGUMENT;
    if ((r = profile_by_id(id, &index)) != OK) return r;
    const struct mig_profile *p = &hw.profiles[index];
    if (!out) {
        *count = p->nstarts;
        return OK;
    }
    if (*count < p->nstarts) {
        *count = p->nstarts;
        return INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < p->nstarts; i++) {
        out[i].start = p->starts[i];
        out[i].size = p->memslices;
    }
    *count = p->nstarts;
    return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    nvmlDevice_t g, unsigned id, nvmlGpuInstancePlacement_t *out, unsigned *count) {
    LOCKED(placements_locked(g, id, out, count));
}

/* The caller's array holds the profile's instanceCount entries, as NVML documents. */
static nvmlReturn_t gpu_instances_locked(nvmlDevice_t g, unsigned id, nvmlGpuInstance_t *out,
                                         unsigned *count) {
    unsigned index;
    nvmlReturn_t r = mig_gpu(g, "nvmlDeviceGetGpuInstances");
    if (r != OK) return r;
    if (!out || !count) return INVALID_ARGUMENT;
    if ((r = profile_by_id(id, &index)) != OK) return r;
    if (!g->mig_enabled) return INVALID_ARGUMENT; /* NVML: "MIG mode is not enabled" */
    unsigned n = 0;
    for (unsigned s = 0; s < MAX_MIG && n < hw.profiles[index].instances; s++)
        if (hw.gis[s].defined && hw.gis[s].parent == g->minor && hw.gis[s].profile == index)
            out[n++] = &hw.gis[s];
    *count = n;
    return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t g, unsigned id, nvmlGpuInstance_t *out,
                                              unsigned *count) {
    LOCKED(gpu_instances_locked(g, id, out, count));
}

static nvmlReturn_t gpu_instance_by_id_locked(nvmlDevice_t g, unsigned id, nvmlGpuInstance_t *out) {
    nvmlReturn_t r = mig_gpu(g, "nvmlDeviceGetGpuInstanceById");
    if (r != OK) return r;
    if (!out) return INVALID_ARGUMENT;
    if (!g->mig_enabled) return INVALID_ARGUMENT;
    for (unsigned s = 0; s < MAX_MIG; s++)
        if (hw.gis[s].defined && hw.gis[s].parent == g->minor && hw.gis[s].id == id) {
            *out = &hw.gis[s];
            return OK;
        }
    return NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t g, unsigned id, nvmlGpuInstance_t *out) {
    LOCKED(gpu_instance_by_id_locked(g, id, out));
}

static nvmlReturn_t gi_info_locked(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *out) {
    nvmlReturn_t r = gpu_instance(gi, "nvmlGpuInstanceGetInfo");
    if (r != OK) return r;
    if (!out) return INVALID_ARGUMENT;
    const struct mig_profile *p = &hw.profiles[gi->profile];
    memset(out, 0, sizeof *out);
    out->device = &hw.gpus[gi->parent];
    out->id = gi->id;
    out->profileId = p->id;
    out->placement.start = gi->start;
    out->placement.size = p->memslices;
    return OK;
}
EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *out) {
    LOCKED(gi_info_locked(gi, out));
}

/* Compute slices per CI profile index; 0: a profile the simulator does not offer. */
static const unsigned ci_slices[CI_PROFILE_COUNT] = {1, 2, 3, 4, 7, 8, 6, 0, 0};

/* The simulator offers one CI profile per GI: the one spanning all its compute slices. */
static int ci_profile_fits(nvmlGpuInstance_t gi, unsigned ci_profile) {
    return ci_slices[ci_profile] && ci_slices[ci_profile] == hw.profiles[gi->profile].slices;
}

static nvmlReturn_t ci_profile_locked(nvmlGpuInstance_t gi, unsigned ci_profile, unsigned engine,
                                      void *out, int v2) {
    nvmlReturn_t r = gpu_instance(gi, v2 ? "nvmlGpuInstanceGetComputeInstanceProfileInfoV"
                                         : "nvmlGpuInstanceGetComputeInstanceProfileInfo");
    if (r != OK) return r;
    if (!out || ci_profile >= CI_PROFILE_COUNT || engine != 0) return INVALID_ARGUMENT;
    if (!ci_profile_fits(gi, ci_profile)) return NOT_SUPPORTED;
    const struct mig_profile *p = &hw.profiles[gi->profile];
    nvmlComputeInstanceProfileInfo_t info = {
        .id = ci_profile, .sliceCount = p->slices, .instanceCount = 1,
        .multiprocessorCount = p->sms, .sharedCopyEngineCount = p->ce,
        .sharedDecoderCount = p->dec, .sharedEncoderCount = p->enc,
        .sharedJpegCount = p->jpeg, .sharedOfaCount = p->ofa,
    };
    if (!v2) {
        memcpy(out, &info, sizeof info);
        return OK;
    }
    nvmlComputeInstanceProfileInfo_v2_t *o = out;
    if (o->version != CI_PROFILE_V2) return ARGUMENT_VERSION_MISMATCH;
    memcpy(&o->id, &info, sizeof info);
    memset(o->name, 0, sizeof o->name);
    snprintf(o->name, sizeof o->name, "MIG %s", p->name);
    return OK;
}
EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gi, unsigned p,
                                                                 unsigned e, void *info) {
    LOCKED(ci_profile_locked(gi, p, e, info, 0));
}
EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gi, unsigned p,
                                                                  unsigned e, void *info) {
    LOCKED(ci_profile_locked(gi, p, e, info, 1));
}

static nvmlReturn_t compute_instances_locked(nvmlGpuInstance_t gi, unsigned ci_profile,
                                             nvmlComputeInstance_t *out, unsigned *count) {
    nvmlReturn_t r = gpu_instance(gi, "nvmlGpuInstanceGetComputeInstances");
    if (r != OK) return r;
    if (!out || !count || ci_profile >= CI_PROFILE_COUNT) return INVALID_ARGUMENT;
    unsigned slot = slot_of_gi(gi), n = 0;
    if (ci_profile_fits(gi, ci_profile) && hw.cis[slot].defined) out[n++] = &hw.cis[slot];
    *count = n;
    return OK;
}
EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gi, unsigned p,
                                                       nvmlComputeInstance_t *out, unsigned *count) {
    LOCKED(compute_instances_locked(gi, p, out, count));
}

static nvmlReturn_t compute_instance_by_id_locked(nvmlGpuInstance_t gi, unsigned id,
                                                  nvmlComputeInstance_t *out) {
    nvmlReturn_t r = gpu_instance(gi, "nvmlGpuInstanceGetComputeInstanceById");
    if (r != OK) return r;
    if (!out) return INVALID_ARGUMENT;
    unsigned slot = slot_of_gi(gi);
    if (!hw.cis[slot].defined || hw.cis[slot].id != id) return NOT_FOUND;
    *out = &hw.cis[slot];
    return OK;
}
EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gi, unsigned id,
                                                          nvmlComputeInstance_t *out) {
    LOCKED(compute_instance_by_id_locked(gi, id, out));
}

/* device is the MIG device handle, as NVIDIA's own DRA driver relies on. */
static nvmlReturn_t ci_info_locked(nvmlComputeInstance_t ci, nvmlComputeInstanceInfo_t *out) {
    nvmlReturn_t r = compute_instance(ci, "nvmlComputeInstanceGetInfo_v2");
    if (r != OK) return r;
    if (!out) return INVALID_ARGUMENT;
    unsigned slot = (unsigned)(ci - hw.cis);
    const struct mig_profile *p = &hw.profiles[hw.gis[slot].profile];
    memset(out, 0, sizeof *out);
    out->device = &hw.migs[slot];
    out->gpuInstance = &hw.gis[slot];
    out->id = ci->id;
    for (unsigned c = 0; c < CI_PROFILE_COUNT; c++)
        if (ci_profile_fits(&hw.gis[slot], c)) out->profileId = c;
    out->placement.start = 0;
    out->placement.size = p->slices;
    return OK;
}
EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t ci,
                                                  nvmlComputeInstanceInfo_t *out) {
    LOCKED(ci_info_locked(ci, out));
}

/* The MIG devices of GPU g in slot order; NOT_FOUND past the last. */
static nvmlReturn_t mig_by_index_locked(nvmlDevice_t g, unsigned index, nvmlDevice_t *out) {
    nvmlReturn_t r = mig_gpu(g, "nvmlDeviceGetMigDeviceHandleByIndex");
    if (r != OK) return r;
    if (!out) return INVALID_ARGUMENT;
    if (!g->mig_enabled) return INVALID_ARGUMENT;
    unsigned n = 0;
    for (unsigned s = 0; s < MAX_MIG; s++)
        if (hw.migs[s].defined && hw.migs[s].minor == g->minor && n++ == index) {
            *out = &hw.migs[s];
            return OK;
        }
    return NOT_FOUND;
}
/* A GPU's NVML index is its place among the GPUs on the bus (NVIDIA's toolkit names CDI
 * devices by it); a MIG device's is its place among its GPU's MIG devices, the index that
 * nvmlDeviceGetMigDeviceHandleByIndex takes back, as NVML documents. */
static nvmlReturn_t index_locked(nvmlDevice_t g, unsigned *out) {
    nvmlReturn_t r = any_device(g, "nvmlDeviceGetIndex");
    if (r != OK) return r;
    if (!out) return INVALID_ARGUMENT;
    if (g->is_mig) {
        unsigned n = 0;
        for (unsigned s = 0; s < MAX_MIG; s++) {
            if (&hw.migs[s] == g) { *out = n; return OK; }
            if (hw.migs[s].defined && hw.migs[s].minor == g->minor) n++;
        }
        return INVALID_ARGUMENT;
    }
    for (unsigned i = 0; i < hw.count; i++)
        if (&hw.gpus[hw.order[i]] == g) { *out = i; return OK; }
    return GPU_IS_LOST;
}
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t g, unsigned *out) {
    LOCKED(index_locked(g, out));
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t g, unsigned i,
                                                        nvmlDevice_t *out) {
    LOCKED(mig_by_index_locked(g, i, out));
}

static nvmlReturn_t parent_locked(nvmlDevice_t mig, nvmlDevice_t *out) {
    nvmlReturn_t r = any_device(mig, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
    if (r != OK) return r;
    if (!out || !mig->is_mig) return INVALID_ARGUMENT;
    *out = &hw.gpus[mig->minor];
    return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig,
                                                                 nvmlDevice_t *out) {
    LOCKED(parent_locked(mig, out));
}

/* nvmlDeviceAttributes_t, as nvml.h lays it out. */
typedef struct {
    unsigned multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount;
    unsigned sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    unsigned gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

/* A MIG device's share of its GPU, from its GPU instance's profile (nvidia-ctk reads it). */
static nvmlReturn_t attributes_locked(nvmlDevice_t device, nvmlDeviceAttributes_t *out) {
    nvmlReturn_t r = any_device(device, "nvmlDeviceGetAttributes_v2");
    if (r != OK) return r;
    if (!out) return INVALID_ARGUMENT;
    if (!device->is_mig) return NOT_SUPPORTED;
    const struct mig_profile *p = &hw.profiles[hw.gis[device->slot].profile];
    *out = (nvmlDeviceAttributes_t){p->sms, p->ce, p->dec, p->enc, p->jpeg, p->ofa,
                                    p->slices, p->slices, p->mem_mib};
    return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device,
                                               nvmlDeviceAttributes_t *out) {
    LOCKED(attributes_locked(device, out));
}
EXPORT nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributes_t *out) {
    LOCKED(attributes_locked(device, out));
}

static nvmlReturn_t instance_id_locked(nvmlDevice_t mig, unsigned *out, int compute) {
    nvmlReturn_t r = any_device(mig, compute ? "nvmlDeviceGetComputeInstanceId"
                                             : "nvmlDeviceGetGpuInstanceId");
    if (r != OK) return r;
    if (!out) return INVALID_ARGUMENT;
    if (!mig->is_mig) return NOT_SUPPORTED;
    *out = compute ? hw.cis[mig->slot].id : hw.gis[mig->slot].id;
    return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t mig, unsigned *out) {
    LOCKED(instance_id_locked(mig, out, 0));
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t mig, unsigned *out) {
    LOCKED(instance_id_locked(mig, out, 1));
}


/* ---- MIG at run time: create and destroy, as the driver checks them --------------------- */

static unsigned cap_minor(unsigned gpu, unsigned gi, int ci) {
    unsigned base = 3 + gpu * GI_SLOTS * (1 + CI_SLOTS) + gi * (1 + CI_SLOTS);
    return ci < 0 ? base : base + 1 + (unsigned)ci;
}

static void make_dirs(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(path, 0755) && errno != EEXIST) { *p = '/'; return; }
        *p = '/';
    }
    mkdir(path, 0755);
}

/* The access file of a GI (ci < 0) or CI, and its /dev/nvidia-caps node, under the root. */
static void write_access(unsigned gpu, unsigned gi, int ci) {
    char dir[600], file[640];
    if (!hw.root[0]) return;
    if (ci < 0)
        snprintf(dir, sizeof dir, "%s/proc/driver/nvidia/capabilities/gpu%u/mig/gi%u", hw.root, gpu, gi);
    else
        snprintf(dir, sizeof dir, "%s/proc/driver/nvidia/capabilities/gpu%u/mig/gi%u/ci%d", hw.root,
                 gpu, gi, ci);
    make_dirs(dir);
    snprintf(file, sizeof file, "%s/access", dir);
    FILE *f = fopen(file, "w");
    if (f) {
        fprintf(f, "DeviceFileMinor: %u\nDeviceFileMode: 292\nDeviceFileModify: 1\n",
                cap_minor(gpu, gi, ci));
        fclose(f);
    }
    snprintf(dir, sizeof dir, "%s/dev/nvidia-caps", hw.root);
    make_dirs(dir);
    snprintf(file, sizeof file, "%s/nvidia-cap%u", dir, cap_minor(gpu, gi, ci));
    if ((f = fopen(file, "a"))) fclose(f);
}

static void remove_access(unsigned gpu, unsigned gi, int ci) {
    char dir[600], file[640];
    if (!hw.root[0]) return;
    if (ci < 0)
        snprintf(dir, sizeof dir, "%s/proc/driver/nvidia/capabilities/gpu%u/mig/gi%u", hw.root, gpu, gi);
    else
        snprintf(dir, sizeof dir, "%s/proc/driver/nvidia/capabilities/gpu%u/mig/gi%u/ci%d", hw.root,
                 gpu, gi, ci);
    snprintf(file, sizeof file, "%s/access", dir);
    unlink(file);
    rmdir(dir);
}

static nvmlReturn_t create_gi_locked(nvmlDevice_t g, unsigned id,
                                     const nvmlGpuInstancePlacement_t *placement,
                                     nvmlGpuInstance_t *out) {
    unsigned index, count = 0, compute = 0;
    nvmlReturn_t r = mig_gpu(g, "nvmlDeviceCreateGpuInstanceWithPlacement");
    if (r != OK) return r;
    if (!placement || !out) return INVALID_ARGUMENT;
    if (!g->mig_enabled) return NOT_SUPPORTED;
    if ((r = profile_by_id(id, &index)) != OK) return r;
    const struct mig_profile *p = &hw.profiles[index];
    int valid = 0; /* a placement the profile lists, of its size */
    for (unsigned i = 0; i < p->nstarts; i++) valid |= p->starts[i] == placement->start;
    if (!valid || placement->size != p->memslices) return INVALID_ARGUMENT;
    int used_ids[GI_SLOTS + 1] = {0};
    for (unsigned s = 0; s < MAX_MIG; s++) {
        const struct nvmlGpuInstance_st *o = &hw.gis[s];
        if (!o->defined || o->parent != g->minor) continue;
        const struct mig_profile *q = &hw.profiles[o->profile];
        if (placement->start < o->start + q->memslices && o->start < placement->start + p->memslices)
            return INSUFFICIENT_RESOURCES; /* an occupied memory slice */
        if (o->profile == index) count++;
        compute += q->slices;
        if (o->id <= GI_SLOTS) used_ids[o->id] = 1;
    }
    if (count >= p->instances || compute + p->slices > 7) return INSUFFICIENT_RESOURCES;
    unsigned gi_id = 1;
    while (gi_id <= GI_SLOTS && used_ids[gi_id]) gi_id++;
    unsigned slot = DYNAMIC_BASE;
    while (slot < MAX_MIG && hw.gis[slot].defined) slot++;
    if (gi_id > GI_SLOTS || slot == MAX_MIG) return INSUFFICIENT_RESOURCES;
    hw.gis[slot] = (struct nvmlGpuInstance_st){1, g->minor, gi_id, index, placement->start, 1};
    hw.cis[slot].defined = 0;
    hw.migs[slot].defined = 0;
    write_access(g->minor, gi_id, -1);
    save_created();
    *out = &hw.gis[slot];
    return OK;
}
EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(
    nvmlDevice_t g, unsigned id, const nvmlGpuInstancePlacement_t *placement,
    nvmlGpuInstance_t *out) {
    LOCKED_CHANGE(create_gi_locked(g, id, placement, out));
}

/* How many more instances of the profile `id` fit now: the profile's own limit, free memory
 * slices at its placements, compute slices left. With MIG off there are no instances, and
 * the answer is the profile's count, as a real H200 gives it (7, 3, 2, 1, 1, 1, 4). */
static nvmlReturn_t remaining_locked(nvmlDevice_t g, unsigned id, unsigned *out) {
    unsigned index, count = 0, compute = 0, used = 0, n = 0;
    nvmlReturn_t r = mig_gpu(g, "nvmlDeviceGetGpuInstanceRemainingCapacity");
    if (r != OK) return r;
    if (!out) return INVALID_ARGUMENT;
    if ((r = profile_by_id(id, &index)) != OK) return r;
    const struct mig_profile *p = &hw.profiles[index];
    for (unsigned s = 0; s < MAX_MIG; s++) {
        const struct nvmlGpuInstance_st *o = &hw.gis[s];
        if (!o->defined || o->parent != g->minor) continue;
        const struct mig_profile *q = &hw.profiles[o->profile];
        used |= ((1u << q->memslices) - 1) << o->start;
        compute += q->slices;
        if (o->profile == index) count++;
    }
    /* Placements are aligned and of one size: taking the first free ones finds the most. */
    for (unsigned i = 0; i < p->nstarts; i++) {
        unsigned span = ((1u << p->memslices) - 1) << p->starts[i];
        if (count + n >= p->instances || compute + p->slices > 7) break;
        if (used & span) continue;
        used |= span;
        compute += p->slices;
        n++;
    }
    *out = n;
    return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t g, unsigned id,
                                                              unsigned *out) {
    LOCKED(remaining_locked(g, id, out));
}

static unsigned uuid_serial;

static nvmlReturn_t create_ci_locked(nvmlGpuInstance_t gi, unsigned ci_profile,
                                     nvmlComputeInstance_t *out) {
    nvmlReturn_t r = gpu_instance(gi, "nvmlGpuInstanceCreateComputeInstance");
    if (r != OK) return r;
    if (!out || ci_profile >= CI_PROFILE_COUNT) return INVALID_ARGUMENT;
    if (!ci_profile_fits(gi, ci_profile)) return NOT_SUPPORTED;
    unsigned slot = slot_of_gi(gi);
    if (hw.cis[slot].defined) return INSUFFICIENT_RESOURCES; /* one full CI per GI */
    hw.cis[slot] = (struct nvmlComputeInstance_st){1, 0};
    const struct nvmlDevice_st *parent = &hw.gpus[gi->parent];
    /* A new UUID for every instance made, as the driver gives (the pid too: another
     * process of the same root makes others). */
    unsigned long long h = 1469598103934665603ull;
    for (const char *c = parent->uuid; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    h = (h ^ gi->id) * 1099511628211ull;
    h = (h ^ ++uuid_serial) * 1099511628211ull;
    h = (h ^ (unsigned long long)getpid()) * 1099511628211ull;
    char uuid[96];
    snprintf(uuid, sizeof uuid, "MIG-%08llx-%04llx-%04llx-%04llx-%012llx", h >> 32,
             (h >> 16) & 0xffff, h & 0xffff, (h >> 48) ^ uuid_serial, (h * 31) & 0xffffffffffffull);
    fill_mig(&hw, slot, uuid);
    write_access(gi->parent, gi->id, 0);
    save_created();
    *out = &hw.cis[slot];
    return OK;
}
EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gi, unsigned p,
                                                         nvmlComputeInstance_t *out) {
    LOCKED_CHANGE(create_ci_locked(gi, p, out));
}

static nvmlReturn_t destroy_ci_locked(nvmlComputeInstance_t ci) {
    nvmlReturn_t r = compute_instance(ci, "nvmlComputeInstanceDestroy");
    if (r != OK) return r;
    unsigned slot = (unsigned)(ci - hw.cis);
    ci->defined = 0;
    hw.migs[slot].defined = 0;
    /* The file first, its access file after: a process killed in between leaves a stray
     * access file (a create there writes it anew), never an instance without one, which
     * the driver's own destroy, one ioctl, never shows either. */
    save_created();
    remove_access(hw.gis[slot].parent, hw.gis[slot].id, (int)ci->id);
    return OK;
}
EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t ci) {
    LOCKED_CHANGE(destroy_ci_locked(ci));
}

static nvmlReturn_t destroy_gi_locked(nvmlGpuInstance_t gi) {
    nvmlReturn_t r = gpu_instance(gi, "nvmlGpuInstanceDestroy");
    if (r != OK) return r;
    if (hw.cis[slot_of_gi(gi)].defined) return IN_USE; /* its compute instance goes first */
    gi->defined = 0;
    save_created(); /* as a compute instance's: the file first */
    remove_access(gi->parent, gi->id, -1);
    return OK;
}
EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gi) { LOCKED_CHANGE(destroy_gi_locked(gi)); }

/* MIG mode is never changed by the plugin; creating without a placement is not simulated. */
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define NOT_YET(symbol, ...) \
    EXPORT nvmlReturn_t symbol(__VA_ARGS__) { return NOT_SUPPORTED; }

NOT_YET(nvmlDeviceSetMigMode, nvmlDevice_t g, unsigned mode, nvmlReturn_t *status)
NOT_YET(nvmlDeviceCreateGpuInstance, nvmlDevice_t g, unsigned p, void **gi)
NOT_YET(nvmlGpuInstanceGetComputeInstanceRemainingCapacity, void *gi, unsigned p, unsigned *n)
