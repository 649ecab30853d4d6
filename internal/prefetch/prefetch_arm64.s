#include "textflag.h"

// func Lines4(p unsafe.Pointer)
TEXT ·Lines4(SB), NOSPLIT|NOFRAME, $0-8
	MOVD	p+0(FP), R0
	PRFM	(R0), PLDL1KEEP
	ADD	$64, R0
	PRFM	(R0), PLDL1KEEP
	ADD	$64, R0
	PRFM	(R0), PLDL1KEEP
	ADD	$64, R0
	PRFM	(R0), PLDL1KEEP
	RET
