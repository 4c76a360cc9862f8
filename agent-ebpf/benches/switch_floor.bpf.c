/* The floor of any sched_switch hook, for benches/switch_hook.rs: a program that returns at
 * once, so that what remains is the kernel's dispatch to it. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

SEC("tp_btf/sched_switch")
int switch_floor(__u64 *ctx)
{
	return 0;
}
