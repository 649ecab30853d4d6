#include "textflag.h"

// func Lines4(p unsafe.Pointer)
TEXT ·Lines4(SB), NOSPLIT|NOFRAME, $0-8
	MOVQ	p+0(FP), AX
	PREFETCHT0	(AX)
	PREFETCHT0	64(AX)
	PREFETCHT0	128(AX)
	PREFETCHT0	192(AX)
	RET

// func Three(a, b, c unsafe.Pointer)
TEXT ·Three(SB), NOSPLIT|NOFRAME, $0-24
	MOVQ	a+0(FP), AX
	MOVQ	b+8(FP), BX
	MOVQ	c+16(FP), CX
	PREFETCHT0	(AX)
	PREFETCHT0	(BX)
	PREFETCHT0	(CX)
	RET

// func Frame(p unsafe.Pointer)
TEXT ·Frame(SB), NOSPLIT|NOFRAME, $0-8
	MOVQ	p+0(FP), AX
	PREFETCHT0	(AX)
	PREFETCHT0	-64(AX)
	PREFETCHT0	64(AX)
	RET
