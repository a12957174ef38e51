/*
 * libnvidia-ml.so.1 of simulated hardware.
 *
 * The real pynvml (and go-nvml, for nvidia-ctk) drive this library exactly as they drive
 * NVIDIA's: same C symbols, same structs, same return codes. What the hardware is comes from
 * a plain-text file rendered by driver.nvml.sim from a hardware profile and its faults; its
 * path is in $GPU_DRA_SIM_NVML. The file is re-read at every nvmlInit, because the bindings
 * never unload the library: a re-init is how the simulated bus changes.
 *
 * File format, one "key value..." per line ('#' starts a comment):
 *   init ok | <nvmlReturn_t>           what nvmlInit answers (12: no library, 9: no driver)
 *   driver 580.95.05                   cuda 13000
 *   fabric <NVML_GPU_FABRIC_STATE_*> <status>   clique 7   cluster <32 hex digits>
 *   gpu <minor>                        starts a GPU; the lines below describe it:
 *     uuid GPU-...   name ...   brand 14   arch 9   cc 9 0   memory <bytes>
 *     pci 0000:53:00.0   pcidevid <n>   mig <capable 0|1> <enabled 0|1>   present 0|1
 *     link <NVML_NVLINK_DEVICE_TYPE_*> [<remote pci bus id>]
 *   fail <minor> <pynvml function name> <nvmlReturn_t>
 *   xid <minor> <xid>                  an XID event, delivered to each event set once
 *
 * Every query takes one mutex. Handles point into a static table that is never freed, so a
 * handle kept across a re-init stays safe: its GPU is then gone (GPU_IS_LOST) or refreshed.
 * Bad input (a malformed file, a null or foreign pointer, a short buffer) gets an error code.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
    OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6,
    INSUFFICIENT_SIZE = 7, TIMEOUT = 10, GPU_IS_LOST = 15, MEMORY = 20,
    ARGUMENT_VERSION_MISMATCH = 25, UNKNOWN = 999,
};

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
    int mig_capable, mig_enabled;
    unsigned nlinks;
    struct link links[MAX_LINKS];
} *nvmlDevice_t;

struct fail { unsigned minor; char call[64]; nvmlReturn_t code; };
struct xid { unsigned minor; unsigned long long xid; };

struct hardware {
    nvmlReturn_t init;
    char driver[80];
    int cuda;
    unsigned fabric_state, clique;
    nvmlReturn_t fabric_status;
    unsigned char cluster[16];
    struct nvmlDevice_st gpus[MAX_GPUS];
    unsigned order[MAX_GPUS], count; /* visible GPUs by index, as minors */
    struct fail fails[MAX_FAILS];
    unsigned nfails;
    struct xid xids[MAX_XIDS];
    unsigned nxids;
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
        if (sscanf(value, "%u %15s", &h->fabric_state, status) != 2) return -1;
        return (h->fabric_state > 3) ? -1 : parse_code(status, &h->fabric_status);
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
        if (sscanf(value, "%llu %llu", &n, &m) != 2 || n >= MAX_GPUS) return -1;
        h->xids[h->nxids].minor = (unsigned)n;
        h->xids[h->nxids].xid = m;
        h->nxids++;
        return 0;
    }
    struct nvmlDevice_st *g = *gpu;
    if (!g) return -1; /* a GPU line before any "gpu" */
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
    if (!strcmp(key, "mig")) return sscanf(value, "%d %d", &g->mig_capable, &g->mig_enabled) == 2 ? 0 : -1;
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

/* The hardware file into *h; 0 on success, else the line number that failed (or -1). */
static int read_hardware(struct hardware *h) {
    const char *path = getenv("GPU_DRA_SIM_NVML");
    char line[512];
    int number = 0;
    struct nvmlDevice_st *gpu = NULL;
    memset(h, 0, sizeof *h);
    copy_text(h->driver, sizeof h->driver, "580.95.05");
    h->cuda = 13000;
    FILE *f = path && *path ? fopen(path, "r") : NULL;
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

#define LOCKED(expr) do { pthread_mutex_lock(&mu); nvmlReturn_t r_ = (expr); \
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

static nvmlReturn_t init_locked(void) {
    struct hardware *next = malloc(sizeof *next);
    if (!next) return MEMORY;
    int bad = read_hardware(next);
    if (bad) {
        const char *path = getenv("GPU_DRA_SIM_NVML");
        if (bad < 0)
            fprintf(stderr, "simulated libnvidia-ml: cannot read $GPU_DRA_SIM_NVML (%s)\n",
                    path ? path : "unset");
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
QUERY(nvmlDeviceGetBrand, "nvmlDeviceGetBrand", int *, { *out = g->brand; return OK; })
QUERY(nvmlDeviceGetArchitecture, "nvmlDeviceGetArchitecture", unsigned *,
      { *out = g->arch; return OK; })
QUERY(nvmlDeviceGetMemoryInfo, "nvmlDeviceGetMemoryInfo", nvmlMemory_t *, {
    out->total = out->free = g->memory;
    out->used = 0;
    return OK;
})
QUERY(nvmlDeviceGetMemoryInfo_v2, "nvmlDeviceGetMemoryInfo", nvmlMemory_v2_t *, {
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
    if (hw.fabric_state == 0) return NOT_SUPPORTED;
    memcpy(out->clusterUuid, hw.cluster, 16);
    out->status = hw.fabric_status;
    out->cliqueId = hw.clique;
    out->state = hw.fabric_state;
    out->healthMask = 0;
    if (out->version == FABRIC_INFO_V3) out->healthSummary = 0;
    return OK;
})
QUERY(nvmlDeviceGetGpuFabricInfo, "nvmlDeviceGetGpuFabricInfo", nvmlGpuFabricInfo_t *, {
    if (hw.fabric_state == 0) return NOT_SUPPORTED;
    memcpy(out->clusterUuid, hw.cluster, 16);
    out->status = hw.fabric_status;
    out->cliqueId = hw.clique;
    out->state = hw.fabric_state;
    return OK;
})
QUERY(nvmlDeviceGetSupportedEventTypes, "nvmlDeviceGetSupportedEventTypes",
      unsigned long long *, { *out = EVENT_XID; return OK; })
QUERY(nvmlDeviceIsMigDeviceHandle, "nvmlDeviceIsMigDeviceHandle", unsigned *,
      { *out = 0; return OK; })
QUERY(nvmlDeviceGetMaxMigDeviceCount, "nvmlDeviceGetMaxMigDeviceCount", unsigned *, {
    if (!g->mig_capable) return NOT_SUPPORTED;
    *out = 0; /* no MIG devices until the MIG work brings them */
    return OK;
})

static nvmlReturn_t text_locked(nvmlDevice_t g, const char *call, char *out, unsigned size) {
    nvmlReturn_t r = device(g, call);
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
    *current = *pending = g->mig_enabled ? 1 : 0;
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
    if (types & ~EVENT_XID) return NOT_SUPPORTED;
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
                data->gpuInstanceId = data->computeInstanceId = 0xffffffffu;
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

/* ---- MIG: queries answer "no MIG devices", lifecycle calls are not supported yet -------- */

#pragma GCC diagnostic ignored "-Wunused-parameter"
#define NOT_YET(symbol, ...) \
    EXPORT nvmlReturn_t symbol(__VA_ARGS__) { return NOT_SUPPORTED; }

NOT_YET(nvmlDeviceSetMigMode, nvmlDevice_t g, unsigned mode, nvmlReturn_t *status)
NOT_YET(nvmlDeviceGetMigDeviceHandleByIndex, nvmlDevice_t g, unsigned i, nvmlDevice_t *out)
NOT_YET(nvmlDeviceGetDeviceHandleFromMigDeviceHandle, nvmlDevice_t g, nvmlDevice_t *out)
NOT_YET(nvmlDeviceGetGpuInstanceProfileInfo, nvmlDevice_t g, unsigned p, void *info)
NOT_YET(nvmlDeviceGetGpuInstanceProfileInfoV, nvmlDevice_t g, unsigned p, void *info)
NOT_YET(nvmlDeviceGetGpuInstancePossiblePlacements_v2, nvmlDevice_t g, unsigned p, void *pl,
        unsigned *n)
NOT_YET(nvmlDeviceGetGpuInstanceRemainingCapacity, nvmlDevice_t g, unsigned p, unsigned *n)
NOT_YET(nvmlDeviceCreateGpuInstance, nvmlDevice_t g, unsigned p, void **gi)
NOT_YET(nvmlDeviceCreateGpuInstanceWithPlacement, nvmlDevice_t g, unsigned p, const void *pl,
        void **gi)
NOT_YET(nvmlDeviceGetGpuInstances, nvmlDevice_t g, unsigned p, void **gis, unsigned *n)
NOT_YET(nvmlDeviceGetGpuInstanceById, nvmlDevice_t g, unsigned id, void **gi)
NOT_YET(nvmlGpuInstanceGetInfo, void *gi, void *info)
NOT_YET(nvmlGpuInstanceDestroy, void *gi)
NOT_YET(nvmlGpuInstanceGetComputeInstanceProfileInfo, void *gi, unsigned p, unsigned e, void *i)
NOT_YET(nvmlGpuInstanceGetComputeInstanceProfileInfoV, void *gi, unsigned p, unsigned e, void *i)
NOT_YET(nvmlGpuInstanceGetComputeInstanceRemainingCapacity, void *gi, unsigned p, unsigned *n)
NOT_YET(nvmlGpuInstanceCreateComputeInstance, void *gi, unsigned p, void **ci)
NOT_YET(nvmlGpuInstanceGetComputeInstances, void *gi, unsigned p, void **cis, unsigned *n)
NOT_YET(nvmlGpuInstanceGetComputeInstanceById, void *gi, unsigned id, void **ci)
NOT_YET(nvmlComputeInstanceGetInfo_v2, void *ci, void *info)
NOT_YET(nvmlComputeInstanceDestroy, void *ci)
