package header

import (
	"fmt"
	"testing"
)

// equal fails the test now when got != want. (Plain testing keeps the
// package's tests free of extra modules.)
func equal[T comparable](t testing.TB, want, got T, msgAndArgs ...any) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: got %#v, want %#v", msg(msgAndArgs), got, want)
	}
}

// noErr fails the test now when err is not nil.
func noErr(t testing.TB, err error, msgAndArgs ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: unexpected error %v", msg(msgAndArgs), err)
	}
}

func msg(msgAndArgs []any) string {
	if len(msgAndArgs) == 0 {
		return "mismatch"
	}
	if f, ok := msgAndArgs[0].(string); ok {
		return fmt.Sprintf(f, msgAndArgs[1:]...)
	}
	return fmt.Sprint(msgAndArgs...)
}
