#include "textflag.h"

// func prefetchFrame(p unsafe.Pointer)
TEXT ·prefetchFrame(SB), NOSPLIT|NOFRAME, $0-8
	MOVD	p+0(FP), R0
	PRFM	(R0), PLDL1KEEP
	SUB	$64, R0
	PRFM	(R0), PLDL1KEEP
	ADD	$128, R0
	PRFM	(R0), PLDL1KEEP
	RET
