#include "textflag.h"

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

// func Pairs(addrs []uintptr)
TEXT ·Pairs(SB), NOSPLIT|NOFRAME, $0-24
	MOVQ	addrs_base+0(FP), AX
	MOVQ	addrs_len+8(FP), CX
	TESTQ	CX, CX
	JEQ	done
loop:
	MOVQ	(AX), BX
	PREFETCHT0	(BX)
	PREFETCHT0	64(BX)
	ADDQ	$8, AX
	DECQ	CX
	JNE	loop
done:
	RET
