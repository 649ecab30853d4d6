#include "textflag.h"

// func Three(a, b, c unsafe.Pointer)
TEXT ·Three(SB), NOSPLIT|NOFRAME, $0-24
	MOVD	a+0(FP), R0
	MOVD	b+8(FP), R1
	MOVD	c+16(FP), R2
	PRFM	(R0), PLDL1KEEP
	PRFM	(R1), PLDL1KEEP
	PRFM	(R2), PLDL1KEEP
	RET

// func Frame(p unsafe.Pointer)
TEXT ·Frame(SB), NOSPLIT|NOFRAME, $0-8
	MOVD	p+0(FP), R0
	PRFM	(R0), PLDL1KEEP
	SUB	$64, R0
	PRFM	(R0), PLDL1KEEP
	ADD	$128, R0
	PRFM	(R0), PLDL1KEEP
	RET

// func Pairs(addrs []uintptr)
TEXT ·Pairs(SB), NOSPLIT|NOFRAME, $0-24
	MOVD	addrs_base+0(FP), R0
	MOVD	addrs_len+8(FP), R1
	CBZ	R1, done
loop:
	MOVD.P	8(R0), R2
	PRFM	(R2), PLDL1KEEP
	ADD	$64, R2
	PRFM	(R2), PLDL1KEEP
	SUB	$1, R1
	CBNZ	R1, loop
done:
	RET
