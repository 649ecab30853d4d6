// Package fleetlabtest is test support: it wraps package fleetlab for the
// end-to-end tests (package e2e) and the BGP announcer's tests. Every
// function takes a testing.TB, fails the test when a step fails, and ties
// what it starts to the test's cleanup: processes are stopped (SIGTERM,
// then SIGKILL) and their output is logged when the test failed or runs
// with -v.
//
// Tests create their lab with netlab.New first, so that its cleanup (which
// removes the namespaces) runs after the processes have stopped.
//
// Examples builds the example binaries once per test binary; a package
// that uses it calls Main from its TestMain to remove them afterwards.
//
// The package is Linux-only, like netlab.
package fleetlabtest
