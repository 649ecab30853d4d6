#include "textflag.h"

// func TwoPairs(a, b unsafe.Pointer)
TEXT ·TwoPairs(SB), NOSPLIT|NOFRAME, $0-16
	MOVQ	a+0(FP), AX
	MOVQ	b+8(FP), BX
	PREFETCHT0	(AX)
	PREFETCHT0	64(AX)
	PREFETCHT0	(BX)
	PREFETCHT0	64(BX)
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
