/*
 * fakelet's NVML-compatible library (libnvidia-ml.so.1), fed by the fake device backend.
 *
 * Written from the NVML C ABI as its consumers use it (names, argument types, struct layouts,
 * constants), not from NVIDIA's code. State comes from $FAKELET_NVML_STATE/state, which the
 * backend rewrites on every change (fake_devices/nvml/surface.py), and events from
 * $FAKELET_NVML_STATE/events, which it appends to; every call is appended to
 * $FAKELET_NVML_STATE/calls, the call log the harness reads: one line per call, the entry point's
 * name first, then key=value fields (pid, ns: CLOCK_MONOTONIC, the clock the harness's timeline
 * uses; for device calls slot and rc; for calls whose answer a check follows, value), and one
 * `@load` line per process that loads the library, with the path the loader found it at.
 * Entry points this library does not
 * implement are absent (the consumer's lookup gets NVML_ERROR_FUNCTION_NOT_FOUND from its own
 * loader) or return NVML_ERROR_NOT_SUPPORTED; none crashes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_TIMEOUT = 10, NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15, NVML_ERROR_UNKNOWN = 999,
};
/* nvmlEventType* bits */
#define EVENT_SBE 0x1ULL
#define EVENT_DBE 0x2ULL
#define EVENT_PSTATE 0x4ULL
#define EVENT_XID 0x8ULL
#define EVENT_CLOCK 0x10ULL
#define SUPPORTED_EVENTS (EVENT_SBE | EVENT_DBE | EVENT_XID)
/* nvmlClocksEventReason* bits */
#define REASON_SW_THERMAL 0x20ULL
#define REASON_HW_THERMAL 0x40ULL
/* nvmlTemperatureThresholds_t */
enum { THRESHOLD_SHUTDOWN = 0, THRESHOLD_SLOWDOWN = 1, THRESHOLD_MEM_MAX = 2, THRESHOLD_GPU_MAX = 3 };
#define SLOWDOWN_MARGIN_C 5 /* slowdown this far below the device's shutdown threshold */
#define MAX_DEVICES 64

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct fake_device *nvmlDevice_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

struct fake_device {
    int slot;
    int present, lost;
    int temperature_c, threshold_c;
    unsigned long long ecc_sbe, ecc_dbe, memory_mib;
    int numa, minor;
    unsigned int pci_device_id;
    char bdf[32], uuid[96], serial[32], name[96];
};

struct event_set {
    unsigned long long mask[MAX_DEVICES];
    long cursor; /* events before this sequence number are consumed */
};
typedef struct event_set *nvmlEventSet_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static struct fake_device devices[MAX_DEVICES];
static int ndevices;
static char driver_version[80] = "580.0.0";
static int init_error, wait_error;

static const char *state_dir(void) {
    const char *dir = getenv("FAKELET_NVML_STATE");
    return dir && *dir ? dir : NULL;
}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* One line of the call log, written with one write(2) to an O_APPEND file: lines of concurrent
 * callers (threads, processes) never interleave. `fields` come last: a path may hold spaces. */
static void log_fields(const char *name, const char *fields) {
    const char *dir = state_dir();
    if (!dir) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/calls", dir);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    char line[4352];
    int n = snprintf(line, sizeof line, "%s pid=%d ns=%lld%s%s\n", name, (int)getpid(), now_ns(),
                     fields ? " " : "", fields ? fields : "");
    if (n >= (int)sizeof line) { n = (int)sizeof line - 1; line[n - 1] = '\n'; }
    if (write(fd, line, (size_t)n) < 0) { /* the log is best effort */ }
    close(fd);
}

static void log_call(const char *name) { log_fields(name, NULL); }

/* A call and what it answered: rc, and the value when it succeeded (what a check follows). */
static nvmlReturn_t log_result(const char *name, nvmlReturn_t rc, unsigned long long value) {
    char fields[64];
    if (rc == 0) snprintf(fields, sizeof fields, "rc=0 value=%llu", value);
    else snprintf(fields, sizeof fields, "rc=%d", rc);
    log_fields(name, fields);
    return rc;
}

/* Where the loader found this library (LD_LIBRARY_PATH, a distribution's lib dir): the report says
 * which, from the path the dynamic loader itself recorded. */
__attribute__((constructor)) static void on_load(void) {
    Dl_info info;
    char fields[4160];
    if (!dladdr((void *)on_load, &info) || !info.dli_fname) return;
    snprintf(fields, sizeof fields, "path=%s", info.dli_fname);
    log_fields("@load", fields);
}

/* Reads the backend's state file; 0 on success. Caller holds the lock. */
static int load_state(void) {
    const char *dir = state_dir();
    if (!dir) return -1;
    char path[4096];
    snprintf(path, sizeof path, "%s/state", dir);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    char line[1024];
    int n = 0;
    init_error = wait_error = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!strncmp(line, "driver ", 7)) {
            snprintf(driver_version, sizeof driver_version, "%s", line + 7);
        } else if (!strncmp(line, "init_error ", 11)) {
            init_error = atoi(line + 11);
        } else if (!strncmp(line, "wait_error ", 11)) {
            wait_error = atoi(line + 11);
        } else if (!strncmp(line, "device ", 7) && n < MAX_DEVICES) {
            struct fake_device *d = &devices[n];
            int used = 0;
            memset(d, 0, sizeof *d);
            if (sscanf(line + 7, "%d %d %d %d %llu %llu %d %d %llu %x %31s %95s %31s %n", &d->present, &d->lost,
                       &d->temperature_c, &d->threshold_c, &d->ecc_sbe, &d->ecc_dbe, &d->numa, &d->minor,
                       &d->memory_mib, &d->pci_device_id, d->bdf, d->uuid, d->serial, &used) >= 13) {
                snprintf(d->name, sizeof d->name, "%s", line + 7 + used);
                d->slot = n++;
            }
        }
    }
    fclose(f);
    ndevices = n;
    return 0;
}

/* The nth present device, or NULL. Caller holds the lock. */
static struct fake_device *present_device(unsigned int index) {
    unsigned int seen = 0;
    for (int i = 0; i < ndevices; i++) {
        if (!devices[i].present) continue;
        if (seen++ == index) return &devices[i];
    }
    return NULL;
}

/* The slot a handle points at, or -1 for a pointer that is no handle of ours. */
static int slot_of(nvmlDevice_t device) {
    return device && device >= devices && device < devices + MAX_DEVICES ? (int)(device - devices) : -1;
}

/* Refreshes the state and checks a handle. Caller holds the lock. */
static nvmlReturn_t check_device(nvmlDevice_t device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (slot_of(device) < 0) return NVML_ERROR_INVALID_ARGUMENT;
    load_state();
    if (device->slot >= ndevices || !device->present || device->lost) return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

/* A device call in the log: its slot (the harness maps it to the inventory device) and rc. */
static nvmlReturn_t log_device(const char *name, nvmlDevice_t device, nvmlReturn_t rc, const char *value) {
    char fields[96];
    snprintf(fields, sizeof fields, "slot=%d rc=%d%s%s", slot_of(device), rc, value ? " value=" : "",
             value ? value : "");
    log_fields(name, fields);
    return rc;
}


/* A device call whose answer a check follows (a temperature): logged once answered, by ANSWER. */
static nvmlReturn_t answer(const char *name, nvmlDevice_t device, nvmlReturn_t rc, unsigned long long value) {
    char text[24];
    snprintf(text, sizeof text, "%llu", value);
    return log_device(name, device, rc, rc == NVML_SUCCESS ? text : NULL);
}

/* The common prologue of every device call: refresh and check the handle. The call is logged once,
 * with the rc it answers (DEVICE_RETURN), not the handle check's: a call that passes the check and
 * then answers NOT_SUPPORTED or INVALID_ARGUMENT is in the log with that rc. */
#define DEVICE_CALL(name, device)                         \
    pthread_mutex_lock(&lock);                            \
    const char *call_name_ = (name);                      \
    nvmlDevice_t call_device_ = (device);                 \
    nvmlReturn_t rc_ = check_device(call_device_);        \
    if (rc_ != NVML_SUCCESS) {                            \
        log_device(call_name_, call_device_, rc_, NULL);  \
        pthread_mutex_unlock(&lock);                      \
        return rc_;                                       \
    }

/* The end of a DEVICE_CALL: logs what the call answers, then unlocks. */
#define DEVICE_RETURN(rc)                                        \
    do {                                                         \
        nvmlReturn_t answer_ = (rc);                             \
        log_device(call_name_, call_device_, answer_, NULL);     \
        pthread_mutex_unlock(&lock);                             \
        return answer_;                                          \
    } while (0)

/* As DEVICE_CALL, but logged only on failure here: on success the call logs its answer itself. */
#define ANSWERED_CALL(name, device)                       \
    pthread_mutex_lock(&lock);                            \
    nvmlReturn_t rc_ = check_device(device);              \
    if (rc_ != NVML_SUCCESS) {                            \
        log_device(name, device, rc_, NULL);              \
        pthread_mutex_unlock(&lock);                      \
        return rc_;                                       \
    }

#define RETURN(rc)                  \
    do {                            \
        pthread_mutex_unlock(&lock); \
        return (rc);                \
    } while (0)

static nvmlReturn_t copy_string(char *out, unsigned int length, const char *value) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

/* -- init, versions, errors ----------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    log_call("nvmlInitWithFlags");
    pthread_mutex_lock(&lock);
    if (load_state() != 0) RETURN(NVML_ERROR_DRIVER_NOT_LOADED);
    if (init_error) RETURN(init_error);
    initialized++;
    RETURN(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    log_call("nvmlShutdown");
    pthread_mutex_lock(&lock);
    if (!initialized) RETURN(NVML_ERROR_UNINITIALIZED);
    initialized--;
    RETURN(NVML_SUCCESS);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    log_call("nvmlSystemGetDriverVersion");
    pthread_mutex_lock(&lock);
    if (!initialized) RETURN(NVML_ERROR_UNINITIALIZED);
    RETURN(copy_string(version, length, driver_version));
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    log_call("nvmlSystemGetNVMLVersion");
    return copy_string(version, length, "13.580.0.0");
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    log_call("nvmlSystemGetCudaDriverVersion");
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = 13000; /* CUDA 13.0: major * 1000 + minor * 10 */
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { return nvmlSystemGetCudaDriverVersion(version); }

/* -- enumeration ------------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    const char *name = "nvmlDeviceGetCount_v2";
    pthread_mutex_lock(&lock);
    if (!initialized) RETURN(log_result(name, NVML_ERROR_UNINITIALIZED, 0));
    if (!count) RETURN(log_result(name, NVML_ERROR_INVALID_ARGUMENT, 0));
    load_state();
    unsigned int n = 0;
    for (int i = 0; i < ndevices; i++) n += devices[i].present != 0;
    *count = n;
    RETURN(log_result(name, NVML_SUCCESS, n));
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    log_call("nvmlDeviceGetHandleByIndex_v2");
    pthread_mutex_lock(&lock);
    if (!initialized) RETURN(NVML_ERROR_UNINITIALIZED);
    if (!device) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    load_state();
    struct fake_device *d = present_device(index);
    if (!d) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *device = d;
    RETURN(d->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

static nvmlReturn_t handle_by(const char *name, int (*match)(const struct fake_device *, const char *),
                              const char *key, nvmlDevice_t *device) {
    log_call(name);
    pthread_mutex_lock(&lock);
    if (!initialized) RETURN(NVML_ERROR_UNINITIALIZED);
    if (!key || !device) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    load_state();
    for (int i = 0; i < ndevices; i++) {
        if (devices[i].present && match(&devices[i], key)) {
            *device = &devices[i];
            RETURN(devices[i].lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS);
        }
    }
    RETURN(NVML_ERROR_NOT_FOUND);
}
static int match_uuid(const struct fake_device *d, const char *key) { return !strcmp(d->uuid, key); }
static int match_serial(const struct fake_device *d, const char *key) { return !strcmp(d->serial, key); }
static int match_bus(const struct fake_device *d, const char *key) {
    /* "0000:01:00.0" or NVML's "00000000:01:00.0": compare the bus:device.function tail */
    const char *a = strchr(d->bdf, ':'), *b = strchr(key, ':');
    return a && b && !strcasecmp(a, b);
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    return handle_by("nvmlDeviceGetHandleByUUID", match_uuid, uuid, device);
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device) {
    return handle_by("nvmlDeviceGetHandleBySerial", match_serial, serial, device);
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *device) {
    return handle_by("nvmlDeviceGetHandleByPciBusId_v2", match_bus, bus, device);
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(bus, device);
}

/* -- identity ---------------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEVICE_CALL("nvmlDeviceGetUUID", device);
    DEVICE_RETURN(copy_string(uuid, length, device->uuid));
}
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEVICE_CALL("nvmlDeviceGetName", device);
    DEVICE_RETURN(copy_string(name, length, device->name));
}
EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    DEVICE_CALL("nvmlDeviceGetSerial", device);
    DEVICE_RETURN(copy_string(serial, length, device->serial));
}
EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, int *brand) {
    DEVICE_CALL("nvmlDeviceGetBrand", device);
    if (!brand) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *brand = 14; /* NVML_BRAND_NVIDIA */
    DEVICE_RETURN(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    DEVICE_CALL("nvmlDeviceGetMinorNumber", device);
    if (!minor) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *minor = (unsigned int)device->minor;
    DEVICE_RETURN(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    DEVICE_CALL("nvmlDeviceGetIndex", device);
    if (!index) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int n = 0;
    for (int i = 0; i < device->slot; i++) n += devices[i].present != 0;
    *index = n;
    DEVICE_RETURN(NVML_SUCCESS);
}

static void fill_pci(const struct fake_device *d, nvmlPciInfo_t *pci) {
    unsigned int domain = 0, bus = 0, dev = 0, fn = 0;
    sscanf(d->bdf, "%x:%x:%x.%x", &domain, &bus, &dev, &fn);
    memset(pci, 0, sizeof *pci);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = d->pci_device_id;
    pci->pciSubSystemId = d->pci_device_id;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", domain, bus, dev);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", domain, bus, dev);
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEVICE_CALL("nvmlDeviceGetPciInfo_v3", device);
    if (!pci) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    fill_pci(device, pci);
    DEVICE_RETURN(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    DEVICE_CALL("nvmlDeviceGetMemoryInfo", device);
    if (!memory) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    memory->total = device->memory_mib << 20;
    memory->used = 0;
    memory->free = memory->total;
    DEVICE_RETURN(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    DEVICE_CALL("nvmlDeviceGetMemoryInfo_v2", device);
    if (!memory) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    memory->total = device->memory_mib << 20;
    memory->reserved = memory->used = 0;
    memory->free = memory->total;
    DEVICE_RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    DEVICE_CALL("nvmlDeviceGetCudaComputeCapability", device);
    if (!major || !minor) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *major = 9; /* Hopper */
    *minor = 0;
    DEVICE_RETURN(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch) {
    DEVICE_CALL("nvmlDeviceGetArchitecture", device);
    if (!arch) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *arch = 9; /* NVML_DEVICE_ARCH_HOPPER */
    DEVICE_RETURN(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    DEVICE_CALL("nvmlDeviceGetMigMode", device);
    if (!current || !pending) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *current = *pending = 0; /* NVML_DEVICE_MIG_DISABLE */
    DEVICE_RETURN(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    DEVICE_CALL("nvmlDeviceGetMaxMigDeviceCount", device);
    if (!count) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *count = 0;
    DEVICE_RETURN(NVML_SUCCESS);
}

/* -- health: temperature, throttling, power, ECC, topology --------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    const char *name = "nvmlDeviceGetTemperature";
    ANSWERED_CALL(name, device);
    if (!temp || sensor != 0 /* NVML_TEMPERATURE_GPU */) RETURN(answer(name, device, NVML_ERROR_INVALID_ARGUMENT, 0));
    *temp = device->temperature_c < 0 ? 0 : (unsigned int)device->temperature_c;
    RETURN(answer(name, device, NVML_SUCCESS, *temp));
}
EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, int which, unsigned int *temp) {
    DEVICE_CALL("nvmlDeviceGetTemperatureThreshold", device);
    if (!temp) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    switch (which) {
    case THRESHOLD_SHUTDOWN: *temp = (unsigned int)device->threshold_c; break;
    case THRESHOLD_SLOWDOWN: *temp = (unsigned int)(device->threshold_c - SLOWDOWN_MARGIN_C); break;
    case THRESHOLD_MEM_MAX:
    case THRESHOLD_GPU_MAX: *temp = (unsigned int)(device->threshold_c - SLOWDOWN_MARGIN_C); break;
    default: DEVICE_RETURN(NVML_ERROR_NOT_SUPPORTED);
    }
    DEVICE_RETURN(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    const char *name = "nvmlDeviceGetCurrentClocksEventReasons";
    ANSWERED_CALL(name, device);
    if (!reasons) RETURN(answer(name, device, NVML_ERROR_INVALID_ARGUMENT, 0));
    *reasons = device->temperature_c >= device->threshold_c - SLOWDOWN_MARGIN_C ? REASON_SW_THERMAL | REASON_HW_THERMAL
                                                                                : 0;
    RETURN(answer(name, device, NVML_SUCCESS, *reasons));
}
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}
EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *milliwatts) {
    DEVICE_CALL("nvmlDeviceGetPowerUsage", device);
    if (!milliwatts) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *milliwatts = 70000 + (unsigned int)(device->temperature_c > 0 ? device->temperature_c : 0) * 1000;
    DEVICE_RETURN(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, int *current, int *pending) {
    DEVICE_CALL("nvmlDeviceGetEccMode", device);
    if (!current || !pending) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *current = *pending = 1; /* NVML_FEATURE_ENABLED */
    DEVICE_RETURN(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type, int counter_type,
                                                unsigned long long *count) {
    DEVICE_CALL("nvmlDeviceGetTotalEccErrors", device);
    (void)counter_type; /* volatile and aggregate alike: the backend keeps one count */
    if (!count) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *count = error_type == 1 /* UNCORRECTED */ ? device->ecc_dbe : device->ecc_sbe;
    DEVICE_RETURN(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *level) {
    DEVICE_CALL("nvmlDeviceGetTopologyCommonAncestor", a);
    if (!level || !b || b < devices || b >= devices + MAX_DEVICES) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    /* same device: internal; same NUMA node: its host bridge; else across the system */
    *level = a == b ? 0 : a->numa == b->numa ? 30 : 50;
    DEVICE_RETURN(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int size, unsigned long *set) {
    DEVICE_CALL("nvmlDeviceGetCpuAffinity", device);
    if (!set || size == 0) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    memset(set, 0, size * sizeof *set);
    /* the inventory has no CPU lists: NUMA node n owns CPUs 8n..8n+7 */
    if (device->numa >= 0 && (unsigned int)device->numa * 8 / (8 * sizeof *set) < size)
        set[device->numa * 8 / (8 * sizeof *set)] = 0xffUL << ((device->numa * 8) % (8 * sizeof *set));
    DEVICE_RETURN(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    DEVICE_CALL("nvmlDeviceGetNumaNodeId", device);
    if (!node) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *node = device->numa < 0 ? 0 : (unsigned int)device->numa;
    DEVICE_RETURN(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int *active) {
    (void)link;
    (void)active;
    DEVICE_CALL("nvmlDeviceGetNvLinkState", device);
    DEVICE_RETURN(NVML_ERROR_NOT_SUPPORTED); /* no NVLink */
}

/* -- events ---------------------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    DEVICE_CALL("nvmlDeviceGetSupportedEventTypes", device);
    if (!types) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *types = SUPPORTED_EVENTS;
    DEVICE_RETURN(NVML_SUCCESS);
}

/* The sequence number the next event will have: events before it are not this set's. */
static long next_sequence(void) {
    const char *dir = state_dir();
    char path[4096];
    snprintf(path, sizeof path, "%s/events", dir ? dir : "/nonexistent");
    FILE *f = fopen(path, "re");
    if (!f) return 0;
    long seq = -1, last = -1;
    char line[256];
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%ld", &seq) == 1) last = seq;
    fclose(f);
    return last + 1;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    log_call("nvmlEventSetCreate");
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    struct event_set *s = calloc(1, sizeof *s);
    if (!s) return NVML_ERROR_UNKNOWN;
    s->cursor = next_sequence();
    *set = s;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
    DEVICE_CALL("nvmlDeviceRegisterEvents", device);
    if (!set) DEVICE_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (types & ~SUPPORTED_EVENTS) DEVICE_RETURN(NVML_ERROR_NOT_SUPPORTED);
    set->mask[device->slot] |= types;
    DEVICE_RETURN(NVML_SUCCESS);
}

/* The first event at or after the set's cursor that it registered for; 1 when found. */
static int next_event(struct event_set *set, nvmlEventData_t *data) {
    const char *dir = state_dir();
    char path[4096];
    snprintf(path, sizeof path, "%s/events", dir ? dir : "/nonexistent");
    FILE *f = fopen(path, "re");
    if (!f) return 0;
    char line[256];
    long seq;
    int slot;
    unsigned long long type, value;
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        /* A line the backend is still appending (a reader can see part of a write): read it next time, whole,
           never as a shorter value (XID 7 for 79) that moves the cursor past the real one. */
        if (!strchr(line, '\n')) break;
        if (sscanf(line, "%ld %d %llx %llu", &seq, &slot, &type, &value) != 4 || seq < set->cursor) continue;
        set->cursor = seq + 1;
        if (slot < 0 || slot >= MAX_DEVICES || !(set->mask[slot] & type)) continue;
        memset(data, 0, sizeof *data);
        data->device = &devices[slot];
        data->eventType = type;
        data->eventData = value;
        data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFF; /* not a MIG event */
        found = 1;
    }
    fclose(f);
    return found;
}

static long long now_ms(void) { return now_ns() / 1000000; }

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    log_call("nvmlEventSetWait_v2");
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    const char *dir = state_dir();
    if (!dir) return NVML_ERROR_UNKNOWN;
    /* Woken by the backend's appends (inotify on the directory), bounded by the caller's timeout. */
    int watch = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (watch >= 0) inotify_add_watch(watch, dir, IN_MODIFY | IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE);
    long long deadline = now_ms() + timeout_ms;
    nvmlReturn_t rc = NVML_ERROR_TIMEOUT;
    for (;;) {
        pthread_mutex_lock(&lock);
        load_state();
        int failing = wait_error;
        int found = failing ? 0 : next_event(set, data);
        pthread_mutex_unlock(&lock);
        if (failing) { rc = failing; break; }
        if (found) { rc = NVML_SUCCESS; break; }
        long long left = deadline - now_ms();
        if (left <= 0) break;
        struct pollfd pfd = {.fd = watch, .events = POLLIN};
        if (watch < 0 || poll(&pfd, 1, (int)left) < 0) {
            if (watch < 0) { struct timespec nap = {0, 10 * 1000000}; nanosleep(&nap, NULL); }
            continue;
        }
        char buf[4096];
        while (read(watch, buf, sizeof buf) > 0) { /* drain: the state and events files are read again */ }
    }
    if (watch >= 0) close(watch);
    return rc;
}
EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    return nvmlEventSetWait_v2(set, data, timeout_ms);
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    log_call("nvmlEventSetFree");
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    free(set);
    return NVML_SUCCESS;
}
