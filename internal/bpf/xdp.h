// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Shared definitions for xdplb's XDP programs: engine/steer/bpf/steer.c
 * (the data path's steering program) and internal/lab/pktrate/bpf/sink.c
 * and redirect.c (the packet-rate harness's sink and redirect programs).
 * Each includes it by its path relative to its own directory.
 *
 * Self-contained on purpose: no system or libbpf header is included (the
 * programs are built with -nostdinc), so the compiled objects depend only
 * on the clang version (see engine/steer/gen.go). The few UAPI numbers
 * needed are written out below; a program defines what only it uses.
 */
#ifndef XDPLB_XDP_H
#define XDPLB_XDP_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef __u16 __be16;
typedef __u32 __be32;

#define SEC(name) __attribute__((section(name), used))
#define __always_inline inline __attribute__((always_inline))

/* BTF map definitions: each attribute is a pointer to an array whose length
 * is the value (integers) or a pointer to the type (key and value). */
#define __uint(name, val) int(*name)[val]
#define __type(name, val) typeof(val) *name

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define be16(x) ((__be16)__builtin_bswap16(x))
#else
#define be16(x) ((__be16)(x))
#endif

/* UAPI numbers (include/uapi/linux/bpf.h). */
#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_ARRAY 2
#define BPF_MAP_TYPE_PERCPU_ARRAY 6
#define BPF_MAP_TYPE_LPM_TRIE 11
#define BPF_MAP_TYPE_XSKMAP 17
#define BPF_F_NO_PREALLOC 1

#define XDP_DROP 1
#define XDP_PASS 2
#define XDP_TX 3
#define XDP_REDIRECT 4

struct xdp_md {
	__u32 data;
	__u32 data_end;
	__u32 data_meta;
	__u32 ingress_ifindex;
	__u32 rx_queue_index;
	__u32 egress_ifindex;
};

/* Helpers, by their numbers in enum bpf_func_id. A program that does not
 * call one leaves it unused. */
#define XDPLB_HELPER static __attribute__((unused))
XDPLB_HELPER void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
XDPLB_HELPER long (*bpf_redirect)(__u32 ifindex, __u64 flags) = (void *)23;
XDPLB_HELPER long (*bpf_redirect_map)(void *map, __u64 key, __u64 flags) = (void *)51;
XDPLB_HELPER long (*bpf_xdp_load_bytes)(struct xdp_md *ctx, __u32 offset, void *buf, __u32 len) = (void *)189;

/* Wire formats, only the fields the programs read or write. */
#define ETH_HLEN 14
#define ETH_ALEN 6
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_P_8021Q 0x8100
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define IPPROTO_ICMPV6 58
#define TCP_HLEN 20
#define UDP_HLEN 8
#define VXLAN_PORT 4789

struct eth_hdr {
	__u8 dst[ETH_ALEN];
	__u8 src[ETH_ALEN];
	__be16 proto;
};

struct ipv4_hdr {
	__u8 ver_ihl;
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 proto;
	__be16 check;
	__be32 saddr;
	__be32 daddr;
};

struct ipv6_hdr {
	__be32 ver_tc_flow;
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__be32 saddr[4];
	__be32 daddr[4];
};

struct udp_hdr {
	__be16 source;
	__be16 dest;
	__be16 len;
	__be16 check;
};

struct vxlan_hdr {
	__u8 flags; /* 0x08: the VNI is valid */
	__u8 reserved1[3];
	__u8 vni[3];
	__u8 reserved2;
};

#endif
