/* The floor of any off-CPU or memory-growth hook, for benches/hook_cost.rs: programs that
 * return at once, so that what remains is the kernel's dispatch to them. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

SEC("tp_btf/sched_switch")
int switch_floor(__u64 *ctx)
{
	return 0;
}

SEC("perf_event")
int fault_floor(void *ctx)
{
	return 0;
}
