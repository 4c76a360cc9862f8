/* Reading the current process's page tables (x86-64), for the memory-growth sampler: whether a
 * fault it just took left a huge page in the PMD of its 2 MiB block.
 *
 * Page tables hold physical addresses; the kernel reads them through its direct map, which
 * starts at page_offset_base: randomised at boot (KASLR), 1 GiB aligned, and not a symbol BPF
 * can name here (/proc/kallsyms lists no data without CONFIG_KALLSYMS_ALL, and aya resolves no
 * __ksym). So it is found once, by a walk that checks itself: for each candidate base B (the
 * 1 GiB boundaries at and below mm->pgd, itself a direct-map address, down to the highest
 * physical address of RAM), translate mm->pgd through the page tables read at B + physical,
 * with 4 and with 5 levels; the candidate is the base when the translation lands on
 * mm->pgd - B. A wrong candidate reads other memory (or nothing) and does not come back to the
 * address it started from. The result, or that none was found, is kept in `pagetable_layout`.
 *
 * Entries are read without the page-table lock: a table freed meanwhile (a concurrent munmap)
 * reads as something else, at worst a misclassified sample.
 */
#ifndef SMOLDER_PAGETABLE_BPF_H
#define SMOLDER_PAGETABLE_BPF_H

#include "offcpu.h"

/* Patched in at load time: the physical address bits of entries (/proc/cpuinfo "address
 * sizes"; the bits above hold flags, or a memory-encryption bit the kernel also masks), and the
 * 1 GiB candidates to try (the highest physical address of RAM, in GiB, plus one). */
const volatile __u32 phys_address_bits = 52;
const volatile __u32 direct_map_candidates = 0;

/* The fields read here, relocated against the kernel's BTF (CO-RE): the kernel's own names. */
struct mm_struct {
	void *pgd;
} __attribute__((preserve_access_index));

struct task_struct {
	struct mm_struct *mm;
	int pid;
	int tgid;
} __attribute__((preserve_access_index));

/* x86-64 page-table entry bits (arch/x86/include/asm/pgtable_types.h). */
#define SMOLDER_PTE_PRESENT 0x1ull
#define SMOLDER_PTE_RW 0x2ull
#define SMOLDER_PTE_PSE 0x80ull /* at PUD or PMD level: the entry maps a 1 GiB or 2 MiB page */
#define SMOLDER_GIB (1ull << 30)

#define SMOLDER_LAYOUT_UNKNOWN 0
#define SMOLDER_LAYOUT_FOUND 1
#define SMOLDER_LAYOUT_NOT_FOUND 2

struct pagetable_layout {
	__u64 direct_map; /* page_offset_base */
	__u32 levels;     /* 4 or 5 */
	__u32 state;      /* SMOLDER_LAYOUT_* */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pagetable_layout);
} pagetable_layout SEC(".maps");

static __always_inline __u64 table_address_mask(void)
{
	__u32 bits = phys_address_bits;
	if (bits < 32 || bits > 52)
		bits = 52;
	return ((1ull << bits) - 1) & ~0xfffull;
}

/* The entry for `va` at the level whose index starts at bit `shift`, of the table at physical
 * `table`, read through the direct map at `base`. 0 when unreadable or not present. */
static __always_inline __u64 table_entry(__u64 base, __u64 table, __u64 va, __u32 shift)
{
	__u64 entry = 0;
	__u64 at = base + table + ((va >> shift) & 511) * 8;
	if (bpf_probe_read_kernel(&entry, sizeof(entry), (void *)at))
		return 0;
	return entry & SMOLDER_PTE_PRESENT ? entry : 0;
}

/* The PUD entry for `va` in the page tables at virtual `pgd`, `levels` deep. 0 when absent. */
static __always_inline __u64 pud_entry(__u64 base, __u64 pgd, __u64 va, __u32 levels)
{
	__u64 mask = table_address_mask();
	__u64 entry;
	if (levels == 5) {
		entry = table_entry(0, pgd, va, 48);
		if (!entry)
			return 0;
		entry = table_entry(base, entry & mask, va, 39);
	} else {
		entry = table_entry(0, pgd, va, 39);
	}
	if (!entry)
		return 0;
	return table_entry(base, entry & mask, va, 30);
}

/* The physical address `va` translates to, or -1. */
static __always_inline __u64 translate(__u64 base, __u64 pgd, __u64 va, __u32 levels)
{
	__u64 mask = table_address_mask();
	__u64 entry = pud_entry(base, pgd, va, levels);
	if (!entry)
		return -1;
	if (entry & SMOLDER_PTE_PSE)
		return (entry & mask & ~(SMOLDER_GIB - 1)) | (va & (SMOLDER_GIB - 1));
	entry = table_entry(base, entry & mask, va, 21);
	if (!entry)
		return -1;
	if (entry & SMOLDER_PTE_PSE)
		return (entry & mask & ~((1ull << 21) - 1)) | (va & ((1ull << 21) - 1));
	entry = table_entry(base, entry & mask, va, 12);
	if (!entry)
		return -1;
	return (entry & mask) | (va & 0xfff);
}

struct layout_search {
	__u64 pgd;
	__u64 top; /* the 1 GiB boundary at or below pgd */
	struct pagetable_layout found;
};

static long layout_step(__u64 i, void *data)
{
	struct layout_search *search = data;
	__u64 base = search->top - i * SMOLDER_GIB;
	__u64 offset = search->pgd - base;
	for (__u32 levels = 4; levels <= 5; levels++) {
		if (translate(base, search->pgd, search->pgd, levels) == offset) {
			search->found.direct_map = base;
			search->found.levels = levels;
			search->found.state = SMOLDER_LAYOUT_FOUND;
			return 1;
		}
	}
	return 0;
}

/* The layout of the kernel's page tables, found at the first call. NULL when it cannot be. */
static __always_inline struct pagetable_layout *layout(__u64 pgd)
{
	__u32 zero = 0;
	struct pagetable_layout *known = bpf_map_lookup_elem(&pagetable_layout, &zero);
	if (!known)
		return 0;
	if (known->state == SMOLDER_LAYOUT_UNKNOWN) {
		struct layout_search search = {
			.pgd = pgd,
			.top = pgd & ~(SMOLDER_GIB - 1),
			.found = { .state = SMOLDER_LAYOUT_NOT_FOUND },
		};
		bpf_loop(direct_map_candidates, layout_step, &search, 0);
		*known = search.found;
	}
	return known->state == SMOLDER_LAYOUT_FOUND ? known : 0;
}

/* What the current process's PMD for `va` holds. */
enum smolder_pmd_kind {
	SMOLDER_PMD_UNREADABLE = 0, /* the page tables could not be read */
	SMOLDER_PMD_TABLE = 1,      /* base pages (or nothing) */
	SMOLDER_PMD_HUGE = 2,       /* a writable huge page */
};

static __always_inline enum smolder_pmd_kind current_pmd(__u64 va)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct mm_struct *mm = task->mm;
	if (!mm)
		return SMOLDER_PMD_UNREADABLE;
	/* Read as a number: the verifier allows no arithmetic on a BTF pointer. */
	__u64 pgd = 0;
	if (bpf_probe_read_kernel(&pgd, sizeof(pgd), &mm->pgd) || !pgd)
		return SMOLDER_PMD_UNREADABLE;
	struct pagetable_layout *known = layout(pgd);
	if (!known)
		return SMOLDER_PMD_UNREADABLE;
	__u64 entry = pud_entry(known->direct_map, pgd, va, known->levels);
	if (!entry || (entry & SMOLDER_PTE_PSE))
		return SMOLDER_PMD_TABLE;
	entry = table_entry(known->direct_map, entry & table_address_mask(), va, 21);
	/* The huge zero page a read maps is read only: no memory of the process's own. */
	__u64 huge = SMOLDER_PTE_PRESENT | SMOLDER_PTE_RW | SMOLDER_PTE_PSE;
	return (entry & huge) == huge ? SMOLDER_PMD_HUGE : SMOLDER_PMD_TABLE;
}

#endif
