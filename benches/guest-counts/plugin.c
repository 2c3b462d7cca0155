/* A QEMU TCG plugin (QEMU 7.2's plugin API, version 1) for benches/guest-counts.sh: counts, per
 * vCPU, the guest instructions and translation blocks executed in user and in kernel mode, the
 * distinct blocks among them between two entries into the kernel (each block once per stretch:
 * the code a round trip's path runs through), the host time spent in each mode and the kernel's
 * entries, and appends all counters to the file `out=PATH` each time a guest program executes
 * the marker `xchg %bx,%bx` (bytes 66 87 db; mark.c). The counters only grow: the script takes
 * differences between marks. With `blocks=PATH` each mark also lists the user blocks that ran
 * since the last one (address, vCPU, runs, stretches and tails run in, whether it ends in a call
 * or a return, its instructions, and the moves into it that needed a look-up: after a return or
 * an indirect branch, and from another page), to find which code a round trip runs through; with
 * `kernel=1` too, the kernel's blocks as well (to symbolize against the guest's /proc/kallsyms:
 * functions.py sums them by function). With `pages=1` it also counts, per mode, the distinct data
 * pages the accesses of each stretch touch (each an entry of the emulator's TLB that the stretch
 * needs), models that TLB (QEMU 7.2's: direct-mapped, with an 8-entry victim table) at three
 * sizes to count its misses and page-table walks, and with `walks=PATH` lists the pages that
 * walk. It always counts, per mode, the atomic (locked) instructions run, and the fences,
 * rdtsc, pause and cpuid, the kernel's TLB flushes, and the moves between blocks that make the
 * emulator look the next block up (after a return or an indirect call or jump, or a direct jump
 * onto another page: QEMU chains the generated code of two blocks only within a page).
 *
 * Tails: a build with tail marks (corelink-perf built with `--features guest-marks`: the
 * instruction `xchg %cx,%cx`, bytes 66 87 c9, where a receive's completion is found) also gets,
 * per vCPU, the tails (each from a tail mark to the next entry into the kernel: a message's
 * arrival to its answer's doorbell), the distinct user blocks run in them, and the calls and
 * returns among those blocks' runs (each block's last instruction says whether it is one).
 *
 * Built by the script with the host's C compiler; the few plugin API declarations it uses are
 * written out here (QEMU's qemu-plugin.h is not packaged). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
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
typedef uint32_t qemu_plugin_meminfo_t;
enum qemu_plugin_mem_rw { QEMU_PLUGIN_MEM_R = 1, QEMU_PLUGIN_MEM_W, QEMU_PLUGIN_MEM_RW };
typedef void (*qemu_plugin_vcpu_mem_cb_t)(unsigned int vcpu_index, qemu_plugin_meminfo_t info,
                                          uint64_t vaddr, void *userdata);
void qemu_plugin_register_vcpu_mem_cb(struct qemu_plugin_insn *insn, qemu_plugin_vcpu_mem_cb_t cb,
                                      enum qemu_plugin_cb_flags flags, enum qemu_plugin_mem_rw rw,
                                      void *userdata);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

#define MAX_VCPUS 64
#define SEEN_VCPUS 8 /* vCPUs told apart in `struct block` (the guest runs 2) */
#define KERNEL_START 0xffff800000000000ull /* x86-64: the upper half is the kernel's */

/* One vCPU's counters ([0] user, [1] kernel); written by that vCPU's thread only. */
struct counters {
    uint64_t insns[2], tbs[2], ns[2], entries[2], distinct[2];
    uint64_t since, stretch;
    int mode;
    /* Tails: from a tail mark to the next entry into the kernel (`tails` counts them, and is
     * the current one's number), and the distinct user blocks run in them. */
    int in_tail;
    uint64_t tails, tail_distinct, tail_rets, tail_calls;
    /* With `pages=1`: the distinct data pages each mode's accesses touch in a stretch (summed
     * over stretches), in a direct-mapped table of (page, stretch) per mode. */
    uint64_t pages[2];
    uint64_t *seen_pages[2];
    /* Atomic (locked) instructions run, and fences, rdtsc, pause and cpuid (each a call out of
     * the generated code, or more), per mode. */
    uint64_t locked[2], special[2], flushes[2];
    /* Moves from one block to the next within a mode that need the emulator to look the next
     * block up (its generated code is not chained to it): after a return or an indirect call or
     * jump, and (direct) onto another page, per mode; and the last block run. */
    uint64_t indirect[2], cross_page[2];
    uint64_t tail_cross_page; /* (the moves onto another page in tails) */
    const struct block *prev;
    /* With `pages=1`, the emulator's data TLB per mode as QEMU 7.2 keeps it (a direct-mapped
     * table indexed by the page's low bits, the entry it replaces moved to an 8-entry victim
     * table, which a miss looks in before it walks the page tables), at 2^6, 2^8 and 2^10
     * entries (its size moves with use between flushes, unseen from here): the accesses that
     * miss the table, and those that miss the victims too (a page-table walk). Emptied at a
     * flush (a write to CR3, invlpg, invpcid). */
    uint64_t tlb_miss[2][3], tlb_walk[2][3];
    uint64_t *tlb[2][3];
    uint64_t victim[2][3][8];
    unsigned victim_next[2][3];
} __attribute__((aligned(64)));

#define PAGE_SLOTS 65536

/* A translation block: its instruction count, mode, and the stretch (per vCPU) in which it
 * last ran. */
struct block {
    uint64_t insns, pc;
    uint32_t locked;  /* its atomic (locked) instructions */
    uint32_t special; /* its fences, rdtsc, pause and cpuid */
    uint32_t flushes;         /* its TLB flushes: writes to CR3, invlpg, invpcid */
    int mode;
    int ends_in; /* how it ends: END_RET, END_CALL, or 0 (another branch or the block's limit) */
    int indirect; /* whether it ends in a return or an indirect call or jump */
    uint64_t seen[SEEN_VCPUS];
    uint64_t runs[SEEN_VCPUS], stretches[SEEN_VCPUS]; /* since the last mark (blocks=PATH) */
    uint64_t tail_seen[SEEN_VCPUS], tails[SEEN_VCPUS]; /* (as `seen` and `stretches`, in tails) */
    /* Entries into it that needed a look-up (since the last mark): after a return or an
     * indirect branch, and by a direct jump from another page. */
    uint64_t looked[SEEN_VCPUS], crossed[SEEN_VCPUS];
};

/* With `blocks=PATH`: every user block (and kernel block, with `kernel=1`), so that each mark
 * can list those that ran. */
static FILE *blocks_out;
static int kernel_blocks;
static struct block **blocks;
static size_t nblocks, blocks_cap;
static pthread_mutex_t blocks_lock = PTHREAD_MUTEX_INITIALIZER;

enum { END_RET = 1, END_CALL = 2 };

static struct counters vcpus[MAX_VCPUS];
static FILE *out;
static uint64_t marks;

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* A translation block ran. */
static void tb_ran(unsigned int vcpu, void *udata)
{
    struct block *b = udata;
    int mode = b->mode;
    struct counters *c = &vcpus[vcpu % MAX_VCPUS];
    unsigned int s = vcpu % SEEN_VCPUS;
    c->insns[mode] += b->insns;
    c->locked[mode] += b->locked;
    c->special[mode] += b->special;
    c->flushes[mode] += b->flushes;
    if (b->flushes)
        for (int m = 0; m < 2; m++)
            for (int k = 0; k < 3; k++) {
                if (c->tlb[m][k])
                    memset(c->tlb[m][k], 0, sizeof(uint64_t) << (6 + 2 * k));
                memset(c->victim[m][k], 0, sizeof c->victim[m][k]);
            }
    c->tbs[mode]++;
    b->runs[s]++;
    if (c->prev && mode == c->mode) {
        if (c->prev->indirect) {
            c->indirect[mode]++;
            b->looked[s]++;
        } else if ((c->prev->pc >> 12) != (b->pc >> 12)) {
            c->cross_page[mode]++;
            b->crossed[s]++;
            c->tail_cross_page += c->in_tail;
        }
    }
    c->prev = b;
    if (mode && !c->mode) {
        c->stretch++; /* into the kernel: a new stretch */
        c->in_tail = 0;
    }
    if (c->in_tail) {
        if (b->tail_seen[s] != c->tails) {
            b->tail_seen[s] = c->tails;
            b->tails[s]++;
            c->tail_distinct++;
        }
        c->tail_rets += b->ends_in == END_RET;
        c->tail_calls += b->ends_in == END_CALL;
    }
    if (b->seen[s] != c->stretch + 1) {
        b->seen[s] = c->stretch + 1;
        b->stretches[s]++;
        c->distinct[mode]++;
    }
    if (mode != c->mode) {
        uint64_t t = now_ns();
        if (c->since)
            c->ns[c->mode] += t - c->since;
        c->since = t;
        c->mode = mode;
        c->entries[mode]++;
    }
}

static int count_pages;

/* With `walks=PATH` (and `pages=1`): the pages whose accesses walked the page tables in the
 * 2^10-entry table, per vCPU and mode, listed at each mark (those with 100 walks or more so
 * far): which memory the misses are in. */
#define WALK_SLOTS 16384
static FILE *walks_out;
struct walked { uint64_t page; uint64_t n; };
static struct walked *walked[MAX_VCPUS][2];

static void note_walk(unsigned int vcpu, int mode, uint64_t page)
{
    struct walked **t = &walked[vcpu % MAX_VCPUS][mode];
    if (!*t && !(*t = calloc(WALK_SLOTS, sizeof **t)))
        abort();
    for (uint64_t i = 0, h = (page * 0x9e3779b97f4a7c15ull) >> 50; i < WALK_SLOTS; i++) {
        struct walked *w = *t + (h + i) % WALK_SLOTS;
        if (w->page == page + 1 || !w->page) {
            w->page = page + 1;
            w->n++;
            return;
        }
    }
}

/* A data access (`pages=1`): its page counts once a stretch, per mode (the block's: `udata`). */
static void accessed(unsigned int vcpu, qemu_plugin_meminfo_t info, uint64_t vaddr, void *udata)
{
    (void)info;
    struct block *b = udata;
    struct counters *c = &vcpus[vcpu % MAX_VCPUS];
    uint64_t **seen = &c->seen_pages[b->mode];
    if (!*seen) {
        *seen = calloc(2 * PAGE_SLOTS, sizeof **seen);
        if (!*seen)
            abort();
    }
    uint64_t page = vaddr >> 12, slot = (page ^ (page >> 16)) % PAGE_SLOTS;
    int m = b->mode;
    for (int k = 0; k < 3; k++) {
        uint64_t **t = &c->tlb[m][k], tag = page + 1, size = 1ull << (6 + 2 * k);
        if (!*t && !(*t = calloc(size, sizeof **t)))
            abort();
        uint64_t *entry = *t + (page & (size - 1));
        if (*entry == tag)
            continue;
        c->tlb_miss[m][k]++;
        uint64_t *v = c->victim[m][k];
        int hit = -1;
        for (int i = 0; i < 8; i++)
            if (v[i] == tag)
                hit = i;
        if (hit >= 0) { /* swapped with the table's entry */
            v[hit] = *entry;
            *entry = tag;
            continue;
        }
        c->tlb_walk[m][k]++;
        if (walks_out && k == 2)
            note_walk(vcpu, m, page);
        if (*entry) {
            v[c->victim_next[m][k]] = *entry;
            c->victim_next[m][k] = (c->victim_next[m][k] + 1) % 8;
        }
        *entry = tag;
    }
    uint64_t *e = *seen + 2 * slot;
    if (e[0] != page || e[1] != c->stretch + 1) {
        e[0] = page;
        e[1] = c->stretch + 1;
        c->pages[b->mode]++;
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
        fprintf(out, "mark %lu by %u vcpu %d user %lu %lu %lu %lu %lu kernel %lu %lu %lu %lu %lu "
                     "tails %lu %lu %lu %lu pages %lu %lu ops %lu %lu %lu %lu flushes %lu "
                     "jumps %lu %lu %lu %lu %lu tlb %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu\n",
                (unsigned long)marks, vcpu, i, (unsigned long)c->insns[0],
                (unsigned long)c->tbs[0], (unsigned long)ns[0], (unsigned long)c->entries[0],
                (unsigned long)c->distinct[0], (unsigned long)c->insns[1],
                (unsigned long)c->tbs[1], (unsigned long)ns[1], (unsigned long)c->entries[1],
                (unsigned long)c->distinct[1], (unsigned long)c->tails,
                (unsigned long)c->tail_distinct, (unsigned long)c->tail_rets,
                (unsigned long)c->tail_calls, (unsigned long)c->pages[0],
                (unsigned long)c->pages[1], (unsigned long)c->locked[0],
                (unsigned long)c->locked[1], (unsigned long)c->special[0],
                (unsigned long)c->special[1], (unsigned long)c->flushes[1],
                (unsigned long)c->indirect[0], (unsigned long)c->cross_page[0],
                (unsigned long)c->indirect[1], (unsigned long)c->cross_page[1],
                (unsigned long)c->tail_cross_page,
                (unsigned long)c->tlb_miss[0][0], (unsigned long)c->tlb_walk[0][0],
                (unsigned long)c->tlb_miss[0][1], (unsigned long)c->tlb_walk[0][1],
                (unsigned long)c->tlb_miss[0][2], (unsigned long)c->tlb_walk[0][2],
                (unsigned long)c->tlb_miss[1][0], (unsigned long)c->tlb_walk[1][0],
                (unsigned long)c->tlb_miss[1][1], (unsigned long)c->tlb_walk[1][1],
                (unsigned long)c->tlb_miss[1][2], (unsigned long)c->tlb_walk[1][2]);
    }
    fflush(out);
    for (int i = 0; walks_out && i < MAX_VCPUS; i++)
        for (int m = 0; m < 2; m++)
            for (int j = 0; walked[i][m] && j < WALK_SLOTS; j++)
                if (walked[i][m][j].n >= 100)
                    fprintf(walks_out, "mark %lu vcpu %d mode %d page %lx walks %lu\n",
                            (unsigned long)marks, i, m,
                            (unsigned long)(walked[i][m][j].page - 1),
                            (unsigned long)walked[i][m][j].n);
    if (walks_out)
        fflush(walks_out);
    if (!blocks_out)
        return;
    /* The user blocks that ran since the last mark: pc, vCPU, runs, stretches run in. */
    pthread_mutex_lock(&blocks_lock);
    for (size_t i = 0; i < nblocks; i++) {
        struct block *b = blocks[i];
        for (int v = 0; v < SEEN_VCPUS; v++) {
            if (b->stretches[v])
                fprintf(blocks_out,
                        "mark %lu block %lx vcpu %d runs %lu stretches %lu tails %lu ends %s"
                        " insns %lu lookups %lu %lu\n",
                        (unsigned long)marks, (unsigned long)b->pc, v,
                        (unsigned long)b->runs[v], (unsigned long)b->stretches[v],
                        (unsigned long)b->tails[v],
                        b->ends_in == END_RET ? "ret" : b->ends_in == END_CALL ? "call" : "-",
                        (unsigned long)b->insns, (unsigned long)b->looked[v],
                        (unsigned long)b->crossed[v]);
            b->runs[v] = b->stretches[v] = b->tails[v] = b->looked[v] = b->crossed[v] = 0;
        }
    }
    pthread_mutex_unlock(&blocks_lock);
    fflush(blocks_out);
}

/* A tail mark ran: the user blocks until this vCPU next enters the kernel are a tail's. */
static void tail_marked(unsigned int vcpu, void *udata)
{
    (void)udata;
    struct counters *c = &vcpus[vcpu % MAX_VCPUS];
    c->in_tail = 1;
    c->tails++;
}

/* What instruction `d` (`len` bytes) is: 1 atomic (a lock prefix, or xchg with memory), 2 a
 * fence, rdtsc(p), pause or cpuid, 3 a TLB flush (a write to CR3, invlpg, invpcid: each empties
 * the emulator's TLB, or a page of it), 0 another. */
static int classify(const uint8_t *d, size_t len)
{
    size_t i = 0;
    int lock = 0, rep = 0;
    for (; i < len; i++) {
        uint8_t b = d[i];
        if (b == 0xf0)
            lock = 1;
        else if (b == 0xf3)
            rep = 1;
        else if (!(b == 0xf2 || b == 0x66 || b == 0x67 || b == 0x2e || b == 0x36 || b == 0x3e ||
                   b == 0x26 || b == 0x64 || b == 0x65 || (b & 0xf0) == 0x40))
            break;
    }
    if (lock)
        return 1;
    if (i >= len)
        return 0;
    uint8_t op = d[i];
    if ((op == 0x86 || op == 0x87) && i + 1 < len && (d[i + 1] >> 6) != 3)
        return 1;
    if (op == 0x90 && rep)
        return 2; /* pause */
    if (op != 0x0f || i + 1 >= len)
        return 0;
    uint8_t op2 = d[i + 1];
    if (op2 == 0x31 || op2 == 0xa2)
        return 2; /* rdtsc, cpuid */
    if (op2 == 0x01 && i + 2 < len && d[i + 2] == 0xf9)
        return 2; /* rdtscp */
    if (op2 == 0x22 && i + 2 < len && ((d[i + 2] >> 3) & 7) == 3)
        return 3; /* mov to cr3 */
    if (op2 == 0x01 && i + 2 < len && ((d[i + 2] >> 3) & 7) == 7 && (d[i + 2] >> 6) != 3)
        return 3; /* invlpg */
    if (op2 == 0x38 && i + 2 < len && d[i + 2] == 0x82)
        return 3; /* invpcid */
    if (op2 == 0xae && i + 2 < len && d[i + 2] >= 0xe8)
        return 2; /* lfence, mfence, sfence */
    return 0;
}

static void translated(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    uint64_t pc = qemu_plugin_tb_vaddr(tb);
    size_t n = qemu_plugin_tb_n_insns(tb);
    int mode = pc >= KERNEL_START;
    /* (one record per translation, kept for the run: blocks are few next to their runs) */
    struct block *b = calloc(1, sizeof *b);
    if (!b)
        abort();
    b->insns = n;
    b->pc = pc;
    b->mode = mode;
    if (blocks_out && (!mode || kernel_blocks)) {
        pthread_mutex_lock(&blocks_lock);
        if (nblocks == blocks_cap) {
            blocks_cap = blocks_cap ? 2 * blocks_cap : 4096;
            blocks = realloc(blocks, blocks_cap * sizeof *blocks);
            if (!blocks)
                abort();
        }
        blocks[nblocks++] = b;
        pthread_mutex_unlock(&blocks_lock);
    }
    if (n) {
        /* (a call or a return ends its block: the last instruction says which; prefixes aside) */
        struct qemu_plugin_insn *last = qemu_plugin_tb_get_insn(tb, n - 1);
        const uint8_t *d = qemu_plugin_insn_data(last);
        size_t len = qemu_plugin_insn_size(last), i = 0;
        while (i + 1 < len && (d[i] == 0xf3 || d[i] == 0xf2 || d[i] == 0x66 || (d[i] & 0xf0) == 0x40))
            i++;
        int reg = i + 1 < len ? (d[i + 1] >> 3) & 7 : -1;
        if (d[i] == 0xc3 || d[i] == 0xc2)
            b->ends_in = END_RET;
        else if (d[i] == 0xe8 || (d[i] == 0xff && reg == 2))
            b->ends_in = END_CALL;
        b->indirect = b->ends_in == END_RET || (d[i] == 0xff && (reg == 2 || reg == 4));
    }
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        int k = classify(qemu_plugin_insn_data(insn), qemu_plugin_insn_size(insn));
        b->locked += k == 1;
        b->special += k == 2;
        b->flushes += k == 3;
    }
    qemu_plugin_register_vcpu_tb_exec_cb(tb, tb_ran, QEMU_PLUGIN_CB_NO_REGS, b);
    for (size_t i = 0; count_pages && i < n; i++)
        qemu_plugin_register_vcpu_mem_cb(qemu_plugin_tb_get_insn(tb, i), accessed,
                                         QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_MEM_RW, b);
    if (mode)
        return;
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        if (qemu_plugin_insn_size(insn) == 3 &&
            memcmp(qemu_plugin_insn_data(insn), "\x66\x87\xdb", 3) == 0)
            qemu_plugin_register_vcpu_insn_exec_cb(insn, marked, QEMU_PLUGIN_CB_NO_REGS, NULL);
        else if (qemu_plugin_insn_size(insn) == 3 &&
                 memcmp(qemu_plugin_insn_data(insn), "\x66\x87\xc9", 3) == 0)
            qemu_plugin_register_vcpu_insn_exec_cb(insn, tail_marked, QEMU_PLUGIN_CB_NO_REGS, NULL);
    }
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id,
                                                               const qemu_info_t *info,
                                                               int argc, char **argv)
{
    (void)info;
    const char *path = NULL;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0) {
            path = argv[i] + 4;
        } else if (strcmp(argv[i], "pages=1") == 0) {
            count_pages = 1;
        } else if (strncmp(argv[i], "walks=", 6) == 0) {
            walks_out = fopen(argv[i] + 6, "w");
            if (!walks_out) {
                fprintf(stderr, "guest-counts plugin: cannot write %s\n", argv[i] + 6);
                return -1;
            }
        } else if (strcmp(argv[i], "kernel=1") == 0) {
            kernel_blocks = 1;
        } else if (strncmp(argv[i], "blocks=", 7) == 0) {
            blocks_out = fopen(argv[i] + 7, "w");
            if (!blocks_out) {
                perror(argv[i] + 7);
                return -1;
            }
        }
    }
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
