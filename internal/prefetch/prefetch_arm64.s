#include "textflag.h"

// func TwoPairs(a, b unsafe.Pointer)
TEXT ·TwoPairs(SB), NOSPLIT|NOFRAME, $0-16
	MOVD	a+0(FP), R0
	MOVD	b+8(FP), R1
	PRFM	(R0), PLDL1KEEP
	PRFM	(R1), PLDL1KEEP
	ADD	$64, R0
	ADD	$64, R1
	PRFM	(R0), PLDL1KEEP
	PRFM	(R1), PLDL1KEEP
	RET

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
