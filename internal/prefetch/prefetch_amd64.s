#include "textflag.h"

// func Lines4(p unsafe.Pointer)
TEXT ·Lines4(SB), NOSPLIT|NOFRAME, $0-8
	MOVQ	p+0(FP), AX
	PREFETCHT0	(AX)
	PREFETCHT0	64(AX)
	PREFETCHT0	128(AX)
	PREFETCHT0	192(AX)
	RET
