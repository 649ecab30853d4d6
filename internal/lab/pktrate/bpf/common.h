// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Shared definitions for the packet-rate harness's two XDP programs.
 *
 * Self-contained on purpose, like engine/steer/bpf/steer.c: no system or
 * libbpf header is included, so the compiled objects depend only on the
 * clang version (see ../gen.go). The few UAPI numbers needed are below.
 */
#ifndef PKTRATE_COMMON_H
#define PKTRATE_COMMON_H

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
#define BPF_MAP_TYPE_PERCPU_ARRAY 6

#define XDP_DROP 1
#define XDP_PASS 2
#define XDP_TX 3

struct xdp_md {
	__u32 data;
	__u32 data_end;
	__u32 data_meta;
	__u32 ingress_ifindex;
	__u32 rx_queue_index;
	__u32 egress_ifindex;
};

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_redirect)(__u32 ifindex, __u64 flags) = (void *)23;
static long (*bpf_xdp_load_bytes)(struct xdp_md *ctx, __u32 offset, void *buf, __u32 len) = (void *)189;

#define ETH_HLEN 14
#define ETH_ALEN 6
#define ETH_P_IP 0x0800
#define IPPROTO_UDP 17
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
