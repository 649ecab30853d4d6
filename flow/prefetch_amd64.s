#include "textflag.h"

// func ctPrefetch3(a, b, c unsafe.Pointer)
TEXT ·ctPrefetch3(SB), NOSPLIT|NOFRAME, $0-24
	MOVQ	a+0(FP), AX
	MOVQ	b+8(FP), BX
	MOVQ	c+16(FP), CX
	PREFETCHT0	(AX)
	PREFETCHT0	(BX)
	PREFETCHT0	(CX)
	RET
