/* A QEMU TCG plugin (QEMU 7.2's plugin API, version 1) for benches/guest-counts.sh: counts, per
 * vCPU, the guest instructions and translation blocks executed in user and in kernel mode, the
 * host time spent in each mode and the kernel's entries, and appends all counters to the file
 * `out=PATH` each time a guest program executes the marker `xchg %bx,%bx` (bytes 66 87 db;
 * mark.c). The counters only grow: the script takes differences between marks.
 *
 * Built by the script with the host's C compiler; the few plugin API declarations it uses are
 * written out here (QEMU's qemu-plugin.h is not packaged). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
typedef struct qemu_info_t qemu_info_t;
enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS };
typedef void (*qemu_plugin_vcpu_udata_cb_t)(unsigned int vcpu_index, void *userdata);
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *tb, qemu_plugin_vcpu_udata_cb_t cb,
                                          enum qemu_plugin_cb_flags flags, void *userdata);
void qemu_plugin_register_vcpu_insn_exec_cb(struct qemu_plugin_insn *insn,
                                            qemu_plugin_vcpu_udata_cb_t cb,
                                            enum qemu_plugin_cb_flags flags, void *userdata);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
const void *qemu_plugin_insn_data(const struct qemu_plugin_insn *insn);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *insn);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

#define MAX_VCPUS 64
#define KERNEL_START 0xffff800000000000ull /* x86-64: the upper half is the kernel's */

/* One vCPU's counters ([0] user, [1] kernel); written by that vCPU's thread only. */
struct counters {
    uint64_t insns[2], tbs[2], ns[2], entries[2];
    uint64_t since;
    int mode;
} __attribute__((aligned(64)));

static struct counters vcpus[MAX_VCPUS];
static FILE *out;
static uint64_t marks;

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* A translation block ran: `udata` holds its instruction count and mode (bit 0). */
static void tb_ran(unsigned int vcpu, void *udata)
{
    uint64_t u = (uint64_t)(uintptr_t)udata;
    int mode = (int)(u & 1);
    struct counters *c = &vcpus[vcpu % MAX_VCPUS];
    c->insns[mode] += u >> 1;
    c->tbs[mode]++;
    if (mode != c->mode) {
        uint64_t t = now_ns();
        if (c->since)
            c->ns[c->mode] += t - c->since;
        c->since = t;
        c->mode = mode;
        c->entries[mode]++;
    }
}

/* The marker ran: one line per vCPU with every counter so far. */
static void marked(unsigned int vcpu, void *udata)
{
    (void)udata;
    uint64_t t = now_ns();
    marks++;
    for (int i = 0; i < MAX_VCPUS; i++) {
        struct counters *c = &vcpus[i];
        if (!c->tbs[0] && !c->tbs[1])
            continue;
        uint64_t ns[2] = { c->ns[0], c->ns[1] };
        if (c->since)
            ns[c->mode] += t - c->since; /* (a racy look at another vCPU's: close enough) */
        fprintf(out, "mark %lu by %u vcpu %d user %lu %lu %lu %lu kernel %lu %lu %lu %lu\n",
                (unsigned long)marks, vcpu, i, (unsigned long)c->insns[0],
                (unsigned long)c->tbs[0], (unsigned long)ns[0], (unsigned long)c->entries[0],
                (unsigned long)c->insns[1], (unsigned long)c->tbs[1], (unsigned long)ns[1],
                (unsigned long)c->entries[1]);
    }
    fflush(out);
}

static void translated(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    uint64_t pc = qemu_plugin_tb_vaddr(tb);
    size_t n = qemu_plugin_tb_n_insns(tb);
    int mode = pc >= KERNEL_START;
    uint64_t udata = ((uint64_t)n << 1) | (uint64_t)mode;
    qemu_plugin_register_vcpu_tb_exec_cb(tb, tb_ran, QEMU_PLUGIN_CB_NO_REGS,
                                         (void *)(uintptr_t)udata);
    if (mode)
        return;
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        if (qemu_plugin_insn_size(insn) == 3 &&
            memcmp(qemu_plugin_insn_data(insn), "\x66\x87\xdb", 3) == 0)
            qemu_plugin_register_vcpu_insn_exec_cb(insn, marked, QEMU_PLUGIN_CB_NO_REGS, NULL);
    }
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id,
                                                               const qemu_info_t *info,
                                                               int argc, char **argv)
{
    (void)info;
    const char *path = NULL;
    for (int i = 0; i < argc; i++)
        if (strncmp(argv[i], "out=", 4) == 0)
            path = argv[i] + 4;
    if (!path) {
        fprintf(stderr, "guest-counts plugin: no out=PATH\n");
        return -1;
    }
    out = fopen(path, "w");
    if (!out) {
        perror(path);
        return -1;
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, translated);
    return 0;
}
