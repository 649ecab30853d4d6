// Package repocheck holds checks of the repository's own shape that
// anyone can run with go test: no hand-written Go file over 800 lines
// (issue 11's rule: a file that long wants splitting by concern). It has
// no code of its own.
package repocheck
