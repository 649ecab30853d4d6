// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * xdp_l2redirect: the device-under-test modes "xdp-redirect" and
 * "xdp-tx-1arm", the ceiling of a veth forwarding path. Every IPv4 frame
 * gets the next hop's MACs (new_dst, new_src) and is redirected with
 * bpf_redirect to out_ifindex, or, when out_ifindex is 0, sent back out
 * of the interface it came in on (XDP_TX: the one-armed path); everything
 * else is passed to the kernel. Like examples/l2fwd it forwards at layer
 * 2: no TTL decrement, no route lookup.
 *
 * A frame redirected into a veth is accepted only when the veth's peer (the
 * receiving end) has NAPI enabled: an XDP program attached there, or GRO
 * switched on. Otherwise veth_xdp_xmit drops it. The harness's sink always
 * has its counting program attached.
 */
#include "../../../bpf/xdp.h"

/* Set by the loader before the program is loaded (frozen .rodata). */
volatile const __u32 out_ifindex;
volatile const __u8 new_dst[ETH_ALEN];
volatile const __u8 new_src[ETH_ALEN];

struct redirect_counters {
	__u64 redirected; /* frames handed to bpf_redirect (or XDP_TX) */
	__u64 passed;     /* non-IPv4 frames passed to the kernel */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct redirect_counters);
} redirect_stats SEC(".maps");

SEC("xdp")
int xdp_l2redirect(struct xdp_md *ctx)
{
	__u8 *data = (__u8 *)(long)ctx->data;
	__u8 *end = (__u8 *)(long)ctx->data_end;
	__u32 key = 0;
	struct redirect_counters *c = bpf_map_lookup_elem(&redirect_stats, &key);
	if (!c)
		return XDP_PASS;

	struct eth_hdr *eth = (void *)data;
	if ((__u8 *)(eth + 1) > end || eth->proto != be16(ETH_P_IP)) {
		c->passed++;
		return XDP_PASS;
	}
	for (int i = 0; i < ETH_ALEN; i++) {
		eth->dst[i] = new_dst[i];
		eth->src[i] = new_src[i];
	}
	c->redirected++;
	if (out_ifindex == 0)
		return XDP_TX;
	return bpf_redirect(out_ifindex, 0);
}

char _license[] SEC("license") = "Dual BSD/GPL";
