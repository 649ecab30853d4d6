#include "textflag.h"

// func prefetchFrame(p unsafe.Pointer)
TEXT ·prefetchFrame(SB), NOSPLIT|NOFRAME, $0-8
	MOVQ	p+0(FP), AX
	PREFETCHT0	(AX)
	PREFETCHT0	-64(AX)
	PREFETCHT0	64(AX)
	RET
